"""`Policy`: the public front of one loaded policy. Each verb is one call into the layer
that owns it (the decider, placement, the safetensors loader, prefetch)."""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

import jax

from .._apply.calls import Inputs
from .._apply.moves import move_to
from .._apply.put import put, shardings
from .._apply.scope import Scope, Scopes, make_place
from .._apply.stream import owner as _owner
from .._apply.stream import prefetch as _prefetch
from .._apply.stream import windows as _windows
from .._apply.stream.arguments import WindowsArguments
from .._apply.transfers import Watch, explicitly, watch_of
from .._base.errors import DevicePolicyError
from .._base.events import EventLog
from .._decide.decider import Decider, virtual_decider
from .._decide.decision import Decision, Explanation
from .._decide.routing import UNKNOWN_NAMES
from .._document.axes import Attached
from .._document.layers import RuleEntry, Settings
from .._io.planning import plan as _planning
from .._io.planning.plan import Plan, PlanOptions
from .._io.reading import load as _safetensors
from .._machine.capacity import Capacity, DeviceMemory
from .._machine.inventory import THIS_PROCESS
from .._machine.machine import VirtualMachine
from .._names.matching import source_file

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def attached_of(axes: Sequence[str | None] | None) -> Attached:
    """`explain(axes=...)` as the walk reads a leaf's names: None is not known here.

    Raises:
        TypeError: `axes` is not a sequence of names and Nones.
    """
    if axes is None:
        return UNKNOWN_NAMES
    if isinstance(axes, str) or not all(a is None or isinstance(a, str) for a in axes):
        raise TypeError(
            f"axes= takes one axis name (or None) per dimension, e.g. ('embed', 'mlp'), "
            f"got {axes!r}"
        )
    return Attached(tuple(axes))


class Policy:
    """A loaded policy: ordered rules, a default, fallbacks, and settings from every layer.

    Make one with `devpolicy.load_policy`. Every module-level function of devpolicy is
    also a method here, deciding by this policy instead of the active one.

    Example:
        >>> import devpolicy
        >>> rules = [{"match": "dataset/*", "device": "cpu:1"}]
        >>> p = devpolicy.load_policy({"version": 1, "rules": rules})
        >>> p.resolve("dataset/train").device_text
        'cpu:1'
    """

    __slots__ = ("_found", "_scope_of", "_scopes", "decider", "watch")

    def __init__(
        self, settings: Settings, found: str = "", capacity: Capacity | None = None
    ) -> None:
        #: The decision engine: what every verb of this policy decides with.
        self.decider: Decider = Decider(
            settings, capacity if capacity is not None else DeviceMemory(), THIS_PROCESS
        )
        self._found = found
        #: The policy's `transfers:` compiled, or None when it has none (nothing watched).
        self.watch: Watch | None = watch_of(settings.transfers, self.decider.events)
        self._scopes = Scopes(self.decider, self.watch)
        self._scope_of = self._scopes.by_name.get

    @property
    def settings(self) -> Settings:
        """The merged settings of every layer."""
        return self.decider.settings

    @property
    def found(self) -> str:
        """How the policy was found (`DEVPOLICY_FILE`, a path, `given to load_policy`)."""
        return self._found

    @property
    def file(self) -> str | None:
        """The policy file, or None for a mapping or no file."""
        return self.decider.settings.file

    @property
    def strict(self) -> bool:
        """Whether fallbacks are refused (`strict: true`)."""
        return bool(self.decider.settings.strict.value)

    @property
    def disabled(self) -> bool:
        """Whether DEVPOLICY_DISABLE is in force (nothing is placed, nothing fails)."""
        return self.decider.disabled

    @property
    def capacity(self) -> Capacity:
        """Where memory-aware rules learn free memory."""
        return self.decider.capacity

    @property
    def events(self) -> EventLog:
        """Where this policy's events go."""
        return self.decider.events

    @property
    def rules(self) -> tuple[RuleEntry, ...]:
        """Every rule, in the order tried: code, then environment, then the policy file."""
        return self.decider.settings.rules

    def __repr__(self) -> str:
        default = self.settings.default.value
        return f"<Policy file={self.file!r} rules={len(self.rules)} default={default!r}>"

    def use_mesh(self, name: str, mesh: jax.sharding.Mesh) -> None:
        """Use a mesh the program built as this policy's mesh `name`: every rule naming
        `name` shards over `mesh` itself. See `devpolicy.use_mesh`.

        Example:
            >>> import devpolicy, jax
            >>> p = devpolicy.load_policy({"version": 1,
            ...     "meshes": {"train": {"axes": {"data": -1}}},
            ...     "rules": [{"match": "batch", "sharding": {"mesh": "train", "spec": ["data"]}}]})
            >>> mesh = jax.sharding.Mesh(jax.devices("cpu"), ("data",))
            >>> p.use_mesh("train", mesh)
            >>> p.resolve("batch").sharding.mesh is mesh
            True
        """
        self.decider.use_mesh(name, mesh)

    def resolve(
        self,
        name: str,
        *,
        nbytes: int | None = None,
        shape: tuple[int, ...] | None = None,
        file: str | os.PathLike[str] | None = None,
    ) -> Decision:
        """Decide where `name` goes, and log the decision.

        The first decision for a (name, device, rule) is logged at info, repeats at debug.
        A repeated name is a cached lookup.

        Args:
            name: What is being placed (`dataset/train`, `model/layer0/w`).
            nbytes: Its size, if known; rules with `min_bytes`/`max_bytes` match only when given.
            shape: Its shape, if known: whether it divides over a sharding rule's mesh.
            file: The file it comes from, if any: rules with `file:` match only then.

        Raises:
            DeviceUnavailableError: when neither the target nor its fallbacks can be had,
                or at once under `strict: true`.

        Example:
            >>> import devpolicy
            >>> p = devpolicy.load_policy({"version": 1, "rules": [
            ...     {"match": "*", "min_bytes": "1KiB", "device": "cpu:2"}]})
            >>> p.resolve("x", nbytes=4096).device_text, p.resolve("x").rule
            ('cpu:2', None)
        """
        return self.decider.resolve(name, nbytes, shape, source_file(file))

    def resolve_many(self, items: Iterable[tuple[str, int | None]]) -> list[Decision]:
        """Resolve several (name, nbytes) pairs as one placement, each logged.

        Memory-aware checks (`fits`, sized `auto`) count the bytes earlier items were
        given on each device, so the tensors of one file cannot overfill a device
        together. `load_file` and `put` decide this way. Raises like `resolve`.

        Example:
            >>> import devpolicy
            >>> p = devpolicy.load_policy({"version": 1, "fallback": ["cpu:1"]},
            ...     capacity=devpolicy.StaticCapacity({"cpu:0": 1000}), environ={})
            >>> [d.device_text for d in p.resolve_many([("a", 600), ("b", 600)])]
            ['cpu:0', 'cpu:1']
        """
        return self.decider.resolve_many(items)

    def decide_many(
        self, items: Iterable[tuple[str, int | None]]
    ) -> list[Decision | DevicePolicyError]:
        """Like `resolve_many`, logging nothing, with each failure returned in its place."""
        return self.decider.decide_many(items)

    def decide(
        self,
        name: str,
        *,
        nbytes: int | None = None,
        shape: tuple[int, ...] | None = None,
        file: str | os.PathLike[str] | None = None,
    ) -> Decision:
        """Like `resolve`, but logs nothing and caches nothing: for plans and tools.

        Example:
            >>> import devpolicy
            >>> devpolicy.load_policy({"version": 1, "default": "cpu:3"}).decide("x").device_text
            'cpu:3'
        """
        return self.decider.decide(name, nbytes, shape, source_file(file))

    def explain(
        self,
        name: str,
        *,
        nbytes: int | None = None,
        shape: tuple[int, ...] | None = None,
        machine: VirtualMachine | None = None,
        file: str | os.PathLike[str] | None = None,
        axes: Sequence[str | None] | None = None,
    ) -> Explanation[Any]:
        """Every rule tried for `name` and every fallback step, without logging.

        `machine`: explain the decision on a machine you do not have (a `VirtualMachine`,
        also the capacity judged by), as `plan(..., machine=...)` does. `file`: the file
        the array comes from (rules with `file:` match only with one, and say so).
        `axes`: the axis names the model attaches to the array, one per dimension (None
        for an unnamed one), for a rule with `axes: attached`; without them such a rule
        cannot decide, and the explanation says so (`()`: the array carries none).

        Example:
            >>> import devpolicy
            >>> rules = [{"match": "a/*", "device": "cpu"}]
            >>> p = devpolicy.load_policy({"version": 1, "rules": rules})
            >>> [step.matched for _, step in p.explain("b/x").steps]
            [False]
            >>> vm = devpolicy.VirtualMachine(["gpu=2x16GiB"])
            >>> p2 = devpolicy.load_policy({"version": 1, "default": "gpu:1"})
            >>> p2.explain("w", machine=vm).decision.device_text
            'gpu:1'
        """
        source = source_file(file)
        attached = attached_of(axes)
        if machine is None:
            return self.decider.explain(name, nbytes, shape, source, attached)
        decider = virtual_decider(self.decider.settings, machine, "explain")
        return decider.explain(name, nbytes, shape, source, attached)

    def scope(self, name: str, *, nbytes: int | None = None) -> Scope:
        """A scope (context manager and decorator) for `name`. See `devpolicy.scope`."""
        if nbytes is None:
            try:
                found = self._scope_of(name)  # the repeat: one lookup, no further call
            except TypeError:  # unhashable: the scope made below says what is wrong
                found = None
            if found is not None:
                return found
        return self._scopes.make(name, nbytes)

    @overload
    def place(self, name: F, /, *, commit: bool | None = None, inputs: Inputs = None) -> F: ...
    @overload
    def place(
        self, name: str | None = None, /, *, commit: bool | None = None, inputs: Inputs = None
    ) -> Callable[[F], F]: ...
    def place(
        self, name: Any = None, /, *, commit: bool | None = None, inputs: Inputs = None
    ) -> Any:
        """Decorator: run the function in this policy's scope for `name`. See `devpolicy.place`."""
        return make_place(self.decider, name, commit, inputs, self.watch)

    def to(self, x: T, name: str) -> T:
        """Move `x`'s arrays to where `name` goes by this policy. See `devpolicy.to`."""
        return explicitly(move_to, self.decider, x, name)

    def put(self, name: str, x: T, *, narrow: Literal["exact", "lossy"] = "exact") -> T:
        """Place an array or pytree by this policy. See `devpolicy.put`."""
        return explicitly(put, self.decider, name, x, narrow)

    def shardings(self, name: str, tree: T) -> T:
        """The sharding `put(name, ...)` would give each leaf, by this policy. See
        `devpolicy.shardings`."""
        return shardings(self.decider, name, tree)

    @overload
    def load_file(
        self, path: str | os.PathLike[str], *, into: None = None, **options: Any
    ) -> dict[str, jax.Array]: ...

    @overload
    def load_file(self, path: str | os.PathLike[str], *, into: T, **options: Any) -> T: ...

    def load_file(self, path: str | os.PathLike[str], *, into: Any = None, **options: Any) -> Any:
        """Load a safetensors file by this policy (with `into`, filling that tree). See
        `devpolicy.load_file`."""
        given = _options_from(_safetensors.LoadOptions, "load_file", {"into": into, **options})
        return explicitly(_safetensors.load_file, path, self.decider, given)

    def plan(self, path: str | os.PathLike[str], **options: Any) -> Plan:
        """Where each tensor of a file would go by this policy (on `machine`, if given;
        with the model's names from `into` or `axes`). See `devpolicy.plan`."""
        return _planning.plan(path, self.decider, _options_from(PlanOptions, "plan", options))

    def prefetch(
        self,
        iterable: Iterable[T],
        name: str = "batch",
        size: int = 2,
        *,
        narrow: Literal["exact", "lossy"] = "exact",
    ) -> _prefetch.BatchStream[T]:
        """Place each element by this policy, ahead of use. See `devpolicy.prefetch`."""
        return _prefetch.prefetch(iterable, self.decider, name, size, narrow)

    def windows(self, tokens: Any, length: int, batch: int, **options: Any) -> _owner.WindowStream:
        """Batches of windows of a host array, placed by this policy ahead of use.

        The keywords are `devpolicy.windows`'s (`name`, `order`, `seed`, `stride`, `steps`,
        `epochs`, `weights`, `separator`, `separator_is`, `fields`, `reads`, `size`,
        `narrow`, `start`, `resume`, `report_every`, `pack`, `pad`, `open_rows`, `index`),
        defined once (`WindowsArguments`); a
        keyword it does not take is a TypeError naming it.

        Example:
            >>> import devpolicy, numpy as np
            >>> p = devpolicy.load_policy({"version": 1, "default": "cpu:1"})
            >>> with p.windows(np.arange(64), length=8, batch=2, steps=1) as stream:
            ...     [b.shape for b in stream]
            [(2, 8)]
        """
        given = {"tokens": tokens, "length": length, "batch": batch, **options}
        return _windows.windows(self.decider, _options_from(WindowsArguments, "windows", given))


OptionsT = TypeVar("OptionsT")


def options_record(options: type[OptionsT], keywords: Mapping[str, Any]) -> OptionsT:
    """A verb's options record (`LoadOptions`, `PlanOptions`: the one definition of its
    keywords) from the verb's own arguments, `locals()` taken before anything else: each
    field by its name, so the verb's body never lists the keywords again."""
    return options(**{f.name: keywords[f.name] for f in dataclasses.fields(options)})  # type: ignore[arg-type]


def _options_from(options: type[OptionsT], verb: str, given: Mapping[str, Any]) -> OptionsT:
    """A verb's keywords as its options record (`LoadOptions`, `PlanOptions`: the one
    definition of their names and defaults); a keyword it has no field for is the
    `TypeError` Python raises for a function's."""
    known = {f.name for f in dataclasses.fields(options)}  # type: ignore[arg-type]
    for name in given:
        if name not in known:
            raise TypeError(f"{verb}() got an unexpected keyword argument {name!r}")
    return options(**given)


def _verb_signature(
    keywords: list[inspect.Parameter], *leading: inspect.Parameter, returns: str
) -> inspect.Signature:
    """The signature a method taking `**options` shows at run time (`help`, a notebook's
    hints), made from where its keywords are defined so that they are written once:
    `leading` (self, the positional arguments), then `keywords`."""
    return inspect.Signature([*leading, *keywords], return_annotation=returns)


def _fields_as_keywords(options: type) -> list[inspect.Parameter]:
    """Every field of an options record as a keyword with its default."""
    return [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                          annotation=f.type)
        for f in dataclasses.fields(options)
    ]  # fmt: skip


_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
Policy.plan.__signature__ = _verb_signature(  # type: ignore[attr-defined]
    _fields_as_keywords(PlanOptions),
    inspect.Parameter("self", _POSITIONAL),
    inspect.Parameter("path", _POSITIONAL, annotation="str | os.PathLike[str]"),
    returns="Plan",
)
Policy.windows.__signature__ = _verb_signature(  # type: ignore[attr-defined]
    _fields_as_keywords(WindowsArguments)[3:],
    inspect.Parameter("self", _POSITIONAL),
    *(inspect.Parameter(n, _POSITIONAL) for n in ("tokens", "length", "batch")),
    returns="WindowStream",
)
