"""The decision engine: names (and sizes) in, logged `Decision`s out.

Everything that decides goes through `Decider._outcome`: `resolve` (cached and logged),
`decide` (neither), `explain` (the same walk, reported) and the `*_many` forms (memory
claimed by earlier items passed along explicitly).
"""

from __future__ import annotations

import numbers
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Generic

import jax
from jax.sharding import SingleDeviceSharding
from typing_extensions import TypeVar

from .._base.errors import DevicePolicyError, DeviceUnavailableError, UnmatchedNameError
from .._base.events import EventLog
from .._base.limits import CACHE_GENERATION
from .._base.sizes import format_size
from .._base.visible import visible
from .._document.axes import ATTACHED, Attached, logical_text, resolve_axes
from .._document.layers import RuleEntry, Settings
from .._document.schema import MeshSpec, RuleSpec, Source
from .._document.targets import (
    REJECT,
    AttachedTarget,
    ShardingTarget,
    SpecEntry,
    Target,
    parse_target,
)
from .._machine.capacity import Capacity
from .._machine.machine import DeviceLike, Machine
from .._machine.meshes import Meshes, shards
from .._names.matching import Matcher, SourceFile, Step, compile_condition
from .routing import ALWAYS_MAPPED, NEVER_MAPPED, NOTHING_CLAIMED, Choice, Fit, Route

#: The devices decided between: JAX's, or a planned machine's (`VirtualDevice`).
DeviceT = TypeVar("DeviceT", bound=DeviceLike, default=jax.Device)


@dataclass(frozen=True, slots=True)
class Decision(Generic[DeviceT]):
    """Where one name goes, and why.

    Attributes:
        name: The name resolved (`dataset/train`, `model/w`).
        device: The device chosen (for a sharding, the mesh's first device of this
            process); a `VirtualDevice` in a plan for a `VirtualMachine`.
        device_text: The device as target text (`cpu:2`, `gpu:0`; process-local index).
        memory_kind: JAX memory kind asked for, or None for the device's default.
        requested: The target text the rule (or default) asked for.
        rule: Index of the matching rule in its layer (YAML `rules[i]`, env item i), or None.
        origin: Where the deciding rule or setting was written (`policies/x.yaml:9`,
            `env:DEVPOLICY_RULES`, `default`).
        source: `code`, `env`, `policy`, `default`, or `disabled` under DEVPOLICY_DISABLE.
        fallback_reason: None, or why `requested` could not be had and what was used instead.
        nbytes: The size the decision was made for, when known.
        commit: Whether `@place` commits results to `device`.
        is_auto: Whether the decision defers to JAX's own default device (`auto`, and
            everything under DEVPOLICY_DISABLE).
        mmap: Whether loaders may map the tensor from its file (the rule's `mmap`).
        sharding: Where arrays go: a `SingleDeviceSharding` on `device`, or the rule's
            `NamedSharding` over its mesh; None in a plan for a `VirtualMachine` (no
            sharding can be made for devices that do not exist).
        mesh: The mesh's name for a sharded decision, else None.
        spec: The spec (one entry per dimension) for a sharded decision, else None.
        mesh_devices: How many devices the mesh spans (all processes), else 1.
        shards: Into how many pieces the spec cuts an array (the rest replicates), else 1.
        move_inputs: Whether `@place` moves committed array arguments found on another
            device to `device` before the call (the rule's `inputs: move`).
        local_devices: This process's devices that hold the array: `device`, or the
            mesh's devices of this process for a sharded decision.
        axes: The logical axis names the spec was resolved from (a rule's `axes`, or the
            leaf's own under `axes: attached`), else None.
        attached: Whether the deciding rule shards by each leaf's own names (`axes:
            attached`); then `axes` are the names the leaf carried (None: mesh axes, as
            flax's `Partitioned` attaches, or no names at all, see `fallback_reason`).

    Example:
        >>> import devpolicy
        >>> rules = [{"match": "data/*", "device": "cpu"}]
        >>> p = devpolicy.load_policy({"version": 1, "rules": rules})
        >>> d = p.resolve("data/train")
        >>> d.device_text, d.rule, d.source
        ('cpu:0', 0, 'policy')
    """

    name: str
    device: DeviceT
    device_text: str
    memory_kind: str | None
    requested: str
    rule: int | None
    origin: str
    source: Source
    fallback_reason: str | None
    nbytes: int | None
    commit: bool
    is_auto: bool
    mmap: bool = False
    move_inputs: bool = False
    sharding: jax.sharding.Sharding | None = None
    mesh: str | None = None
    spec: tuple[SpecEntry, ...] | None = None
    mesh_devices: int = 1
    shards: int = 1
    local_devices: tuple[DeviceT, ...] = ()
    axes: tuple[str | None, ...] | None = None
    attached: bool = False

    def __post_init__(self) -> None:
        if not self.local_devices:
            object.__setattr__(self, "local_devices", (self.device,))
        if self.sharding is None and self.mesh is None and isinstance(self.device, jax.Device):
            sharding = SingleDeviceSharding(self.device, memory_kind=self.memory_kind)
            object.__setattr__(self, "sharding", sharding)

    @property
    def applies(self) -> bool:
        """Whether a scope for this decision changes JAX's default device."""
        return not self.is_auto

    @property
    def described(self) -> str:
        """`device_text`, with the logical axes a sharded spec came from (`mt[tensor,fsdp]
        from axes (vocab, embed)`; `from attached axes` where the leaf carried them)."""
        if self.axes is None:
            if self.attached and self.mesh is not None and self.fallback_reason is None:
                return f"{self.device_text} from attached mesh axes"
            return self.device_text
        whose = "attached axes" if self.attached else "axes"
        return f"{self.device_text} from {whose} {logical_text(self.axes)}"

    @property
    def is_sharded(self) -> bool:
        """Whether arrays are sharded over a mesh (a `NamedSharding`)."""
        return self.mesh is not None

    @property
    def destination(self) -> Any:
        """What `jax.device_put` is given: the bare device where that says it all (the
        cheaper call, about 17 us against 25 us), else the sharding."""
        if self.mesh is None and self.memory_kind is None:
            return self.device
        return self.sharding

    def bytes_per_device(self) -> int | None:
        """The bytes each device holds (a shard's share for a sharded decision)."""
        return None if self.nbytes is None else -(-self.nbytes // self.shards)

    def __str__(self) -> str:
        """One line a user can read: name, device, by which rule, and any fallback.

        Example:
            >>> import devpolicy
            >>> p = devpolicy.load_policy({"version": 1, "rules": [
            ...     {"match": "data/*", "device": "cpu:1"}]})
            >>> print(p.decide("data/x", nbytes=2048))
            data/x (2.0 KiB) -> cpu:1 by <mapping>:rules[0] (policy)
        """
        size = f" ({format_size(self.nbytes)})" if self.nbytes is not None else ""
        where = f"{self.device_text} (auto)" if self.is_auto else self.described
        if self.memory_kind is not None:
            where += f" [{self.memory_kind}]"
        share = self.bytes_per_device()
        if self.mesh is not None and share is not None:
            where += f" ({format_size(share)} per device, {self.mesh_devices} devices)"
        line = f"{self.name}{size} -> {where} by {self.origin} ({self.source})"
        if self.fallback_reason is not None:
            line += f"; asked {self.requested}: {self.fallback_reason}"
        return visible(line)

    def __rich__(self) -> Any:
        """`rich.print(decision)`: the same line, never read as markup."""
        return _rich_text(str(self))

    def event_fields(self) -> dict[str, Any]:
        """The flat fields of this decision's `placement` event."""
        sharded: dict[str, Any] = {}
        if self.mesh is not None:
            sharded = {
                "mesh": self.mesh,
                "spec": self.device_text.removeprefix(self.mesh),
                "bytes_per_device": self.bytes_per_device(),
            }
            if self.axes is not None:
                sharded["axes"] = logical_text(self.axes)
            if self.attached:
                sharded["attached"] = True
        return {
            "name": self.name,
            "device": self.device_text,
            **sharded,
            "device_id": self.device.id,
            "requested": self.requested,
            "rule": self.rule,
            "origin": self.origin,
            "source": self.source,
            "fallback_reason": self.fallback_reason,
            "nbytes": self.nbytes,
            "memory_kind": self.memory_kind,
            "process_index": self.device.process_index,
        }


@dataclass(frozen=True, slots=True)
class Explanation(Generic[DeviceT]):
    """How a name was decided, step by step.

    Attributes:
        name: The name explained.
        nbytes: The size given, if any.
        steps: Each rule tried, in order, with its origin and why it did or did not match.
        fallback: Each target tried on the way to the device, with why it was passed over.
        decision: The decision, or None when no device could be had.
        error: The error resolving would raise, or None.
    """

    name: str
    nbytes: int | None
    steps: tuple[tuple[RuleEntry, Step], ...]
    fallback: tuple[tuple[str, str], ...]
    decision: Decision[DeviceT] | None
    error: str | None

    def __str__(self) -> str:
        """Each rule tried, each fallback step and the outcome, one per line.

        Example:
            >>> import devpolicy
            >>> p = devpolicy.load_policy({"version": 1, "rules": [
            ...     {"match": "a/*", "device": "cpu:1"}, {"match": "b/*", "device": "cpu:2"}]})
            >>> print(p.explain("b/x"))
            b/x
              rule <mapping>:rules[0] 'a/*': no: glob 'a/*' does not match
              rule <mapping>:rules[1] 'b/*': matched: glob 'b/*' matches
              decision: b/x -> cpu:2 by <mapping>:rules[1] (policy)
        """
        size = f" ({format_size(self.nbytes)})" if self.nbytes is not None else ""
        lines = [f"{self.name}{size}"]
        for entry, step in self.steps:
            verdict = "matched" if step.matched else "no"
            lines.append(f"  rule {entry.origin} {entry.spec.label}: {verdict}: {step.reason}")
        if not self.steps or not self.steps[-1][1].matched:
            lines.append("  no rule matched: the default applies")
        for target, why in self.fallback:
            lines.append(f"  passed over {target}: {why}")
        if self.decision is not None:
            lines.append(f"  decision: {self.decision}")
        else:
            error = (self.error or "").splitlines()
            lines.append(f"  no device: {error[0] if error else ''}")
            lines += [f"  {line}" for line in error[1:]]
        return "\n".join(visible(line) for line in lines)

    def __rich__(self) -> Any:
        """`rich.print(explanation)`: the same lines, never read as markup."""
        return _rich_text(str(self))


def _rich_text(text: str) -> Any:
    # rich is a dependency, imported only when something is printed with it. `text` is
    # already visible-safe (`__str__`); Text never reads it as markup.
    from rich.text import Text

    return Text(text)


@dataclass(frozen=True, slots=True)
class _Outcome(Generic[DeviceT]):
    """What deciding one name came to: the rule (None: the default), and the walk's end."""

    rule: int | None
    route: Route[DeviceT]
    choice: Choice[DeviceT] | DevicePolicyError


def _first_target(
    rule: RuleSpec, meshes: Mapping[str, MeshSpec]
) -> Target | ShardingTarget | AttachedTarget:
    sharding = rule.sharding
    if sharding is not None:
        if sharding.axes == ATTACHED:
            mesh = meshes[sharding.mesh]
            return AttachedTarget(
                sharding.mesh, tuple(mesh.axis_rules or ()), tuple(mesh.axes), sharding.indivisible
            )
        if sharding.axes is not None:
            # Resolved once, here: the table and the names do not change while deciding.
            rules = meshes[sharding.mesh].axis_rules or ()
            logical = tuple(sharding.axes)
            resolved = resolve_axes(logical, rules)
            return ShardingTarget(sharding.mesh, resolved, logical, sharding.indivisible)
        spec = tuple(tuple(e) if isinstance(e, list) else e for e in sharding.spec)
        return ShardingTarget(sharding.mesh, spec, None, sharding.indivisible)
    assert rule.device is not None  # the schema requires one of the two
    return parse_target(rule.device)


#: An array's shape, where sharding must know whether it divides.
Shape = tuple[int, ...]
#: One item of a placement: (name, nbytes), (name, nbytes, shape), with a fourth
#: element saying whether a loader would map it from its file (`_routing.NEVER_MAPPED`...),
#: a fifth naming the file it comes from (for `file:` rules), and a sixth holding the axis
#: names its framework attached to it (`_apply.leaves.leaf_names_and_axes`; for rules with
#: `axes: attached`).
Item = (
    tuple[str, int | None]
    | tuple[str, int | None, Shape | None]
    | tuple[str, int | None, Shape | None, int]
    | tuple[str, int | None, Shape | None, int, SourceFile | None]
    | tuple[str, int | None, Shape | None, int, SourceFile | None, Attached | None]
)
_Unpacked = tuple[str, int | None, Shape | None, int, SourceFile | None, Attached | None]


def _unpacked(item: Item) -> _Unpacked:
    if len(item) == 6:
        return item
    if len(item) == 2:
        return item[0], item[1], None, NEVER_MAPPED, None, None
    if len(item) == 3:
        return item[0], item[1], item[2], NEVER_MAPPED, None, None
    if len(item) == 4:
        return item[0], item[1], item[2], item[3], None, None
    return item[0], item[1], item[2], item[3], item[4], None


#: How many leaf names a warning about many leaves gives as examples.
_EXAMPLES = 3

#: A tensor at least this large decided only by the default gets a warning naming the
#: rule to write: 1 GiB is past what any accelerator holds without noticing, and below
#: a token dataset's size.
LARGE_BY_DEFAULT = 2**30


def _rule_to_write(name: str, source: SourceFile | None) -> str:
    """The rule that would name a tensor's place: by its file where it has one."""
    if source is not None:
        return f'- file: "{source.names[0]}"\n  device: cpu'
    return f'- match: "{name}"\n  device: cpu'


def _claim(
    claimed: dict[Hashable, int], decision: Decision[DeviceT], fit: Fit[DeviceT], maps: int
) -> None:
    """Count a decision's bytes against the memory pools of the devices that will hold them
    (none when the loader maps the array from its file)."""
    if maps_from_file(decision, maps):
        return
    share = decision.bytes_per_device() or 0
    for device in decision.local_devices:
        pool = fit.pool(device)
        claimed[pool] = claimed.get(pool, 0) + share


def maps_from_file(decision: Decision[Any], maps: int) -> bool:
    """Whether a loader maps this decision's array from its file (no memory taken), given
    what the loader said of it (`maps`: `_routing.NEVER_MAPPED`, ...)."""
    if maps == NEVER_MAPPED or decision.mesh is not None:
        return False
    on_host = getattr(decision.device, "platform", None) == "cpu"
    return on_host and (maps == ALWAYS_MAPPED or decision.mmap)


def _checked(nbytes: object, shape: object) -> tuple[int | None, Shape | None]:
    """A size and a shape as plain ints (a plain int and a tuple of ints pass at once)."""
    if nbytes is not None and (type(nbytes) is not int or nbytes < 0):
        nbytes = checked_nbytes(nbytes)
    return nbytes, None if shape is None else checked_shape(shape)


def checked_shape(shape: object) -> Shape:
    """A shape as a tuple of non-negative ints."""
    if type(shape) is tuple:
        # The common case (file headers, numpy shapes), without the abstract-class checks.
        for d in shape:
            if type(d) is not int or d < 0:
                break
        else:
            return shape
    if isinstance(shape, tuple | list) and all(
        isinstance(d, numbers.Integral) and not isinstance(d, bool) and int(d) >= 0 for d in shape
    ):
        return tuple(int(d) for d in shape)
    raise ValueError(f"shape must be None or a tuple of non-negative ints, got {shape!r}")


def checked_nbytes(nbytes: object) -> int:
    """A size as a plain int; numpy integers are fine, bools, floats and negatives are not."""
    if isinstance(nbytes, numbers.Integral) and not isinstance(nbytes, bool) and int(nbytes) >= 0:
        return int(nbytes)
    raise ValueError(f"nbytes must be None or a non-negative int, got {nbytes!r}")


class _Alike(Generic[DeviceT]):
    """One placement's decisions so far by (route, maps, shape where judged), with the
    placement's memory snapshot and claims: what `Decider._alike` decides runs by."""

    __slots__ = ("claimed", "fit", "made")

    def __init__(self, fit: Fit[DeviceT], claimed: Mapping[Hashable, int]) -> None:
        self.fit = fit
        self.claimed = claimed
        self.made: dict[
            tuple[Route[DeviceT], int, Shape | None, Attached | None],
            tuple[Choice[DeviceT], Decision[DeviceT]],
        ] = {}


def _renamed(like: Decision[DeviceT], name: str, nbytes: int) -> Decision[DeviceT]:
    """`like` for another name and size: every other field is the same walk's outcome.

    Slot by slot rather than `dataclasses.replace`, which runs `__init__` and
    `__post_init__` again: made once per tensor of a load, `replace` was a fifth of
    deciding 10,000 small tensors (20 us a copy against 9 us). Every field is copied
    (the slots are read from the class), so a new field cannot be dropped.
    """
    made: Decision[DeviceT] = object.__new__(Decision)
    for slot in _KEPT_SLOTS:
        slot.__set__(made, slot.__get__(like))
    _NAME_SLOT.__set__(made, name)
    _NBYTES_SLOT.__set__(made, nbytes)
    return made


# The member descriptors of Decision's slots: what `_renamed` copies.
_NAME_SLOT = Decision.__dict__["name"]
_NBYTES_SLOT = Decision.__dict__["nbytes"]
_KEPT_SLOTS = tuple(
    Decision.__dict__[f.name] for f in fields(Decision) if f.name not in ("name", "nbytes")
)


class Decider(Generic[DeviceT]):
    """Decides where names go by one policy's settings; logs each decision once at info.

    Built once per policy: patterns compiled, chains parsed. A repeated unsized name is
    one lookup in a bounded two-generation cache (recently used names survive a turnover;
    no cliff where everything is forgotten at once).

    Attributes:
        settings: The merged settings decided by.
        capacity: Where memory-aware rules learn free memory.
        machine: The devices decided between: this process's (`inventory()`), or a
            planned machine's (`VirtualMachine`).
        events: Where events go.
        disabled: Whether DEVPOLICY_DISABLE is in force.
    """

    __slots__ = (
        "_attached",
        "_attached_origin",
        "_default",
        "_fit",
        "_matcher",
        "_old",
        "_quiet_repeats",
        "_recent",
        "_rejects",
        "_routes",
        "_singles",
        "_walked",
        "capacity",
        "disabled",
        "events",
        "machine",
        "meshes",
        "settings",
    )

    def __init__(
        self, settings: Settings, capacity: Capacity[DeviceT], machine: Machine[DeviceT]
    ) -> None:
        self.settings = settings
        self.capacity = capacity
        self.machine = machine
        self.disabled: bool = settings.disable.value
        self.events = EventLog(settings.log_level.value, settings.log_format.value)
        # Decided once: whether a repeat can be seen by anyone (devpolicy's level is applied
        # before any renderer, so a repeat below it costs nothing).
        self._quiet_repeats = not self.events.enabled("debug")
        self._fit = Fit(capacity, settings.headroom.value)
        self._matcher = Matcher(
            [
                compile_condition(
                    *r.spec.name_pattern,
                    r.spec.min_bytes,
                    r.spec.max_bytes,
                    r.spec.file,
                    search=r.spec.search,
                    shape_test=r.spec.shape_test,
                )
                for r in settings.rules
            ]
        )
        fallback = tuple(settings.fallback.value)
        strict: bool = settings.strict.value
        self.meshes = Meshes(settings.meshes, machine)
        self._routes = tuple(
            Route(
                _first_target(r.spec, settings.meshes),
                tuple(r.spec.fallback) if r.spec.fallback is not None else fallback,
                r.spec.memory,
                strict,
                f" (rule {r.origin})",
                r.spec.fits,
                self.meshes,
                r.spec.mmap,
            )
            for r in settings.rules
        )
        # Rules with `axes: attached`, by (source, index) as their decisions name them.
        self._attached: dict[tuple[Source, int | None], AttachedTarget] = {}
        self._attached_origin: dict[tuple[Source, int | None], str] = {}
        for r, route in zip(settings.rules, self._routes, strict=True):
            if route.attached is not None:
                self._attached[(r.source, r.index)] = route.attached
                self._attached_origin[(r.source, r.index)] = r.origin
        self._rejects = settings.default.value == REJECT
        self._default = Route(
            parse_target("auto" if self._rejects else settings.default.value),
            fallback,
            None,
            strict,
            f" (default, {settings.default.origin})",
            True,
            self.meshes,
        )
        self._recent: dict[object, Decision[DeviceT]] = {}
        self._old: dict[object, Decision[DeviceT]] = {}
        self._singles: dict[tuple[Any, str | None], SingleDeviceSharding] = {}
        # Sized decisions: (route, walk's end, decision) by key, checked by walking again.
        self._walked: dict[object, tuple[Route[DeviceT], Choice[DeviceT], Decision[DeviceT]]] = {}

    @property
    def routes(self) -> tuple[Route[DeviceT], ...]:
        """Each rule's route, in rule order."""
        return self._routes

    @property
    def default_route(self) -> Route[DeviceT] | None:
        """The default's route, or None under `default: reject`."""
        return None if self._rejects else self._default

    def resolve(
        self,
        name: str,
        nbytes: int | None = None,
        shape: Shape | None = None,
        source: SourceFile | None = None,
    ) -> Decision[DeviceT]:
        """Decide where `name` goes and log it: info the first time, debug on repeats.

        `source`: the file the array comes from, for rules with `file:`."""
        if nbytes is None and shape is None and source is None:
            # The hot path (`@place`, `scope`): one lookup, nothing built, nothing logged
            # unless someone can see a debug event.
            decision = self._recent.get(name)
            if decision is not None and self._quiet_repeats and not decision.is_auto:
                return decision
        return self._resolve(name, nbytes, shape, NOTHING_CLAIMED, "info", NEVER_MAPPED, source)

    def _resolve(
        self,
        name: str,
        nbytes: int | None,
        shape: Shape | None,
        claimed: Mapping[Hashable, int],
        first_level: str,
        maps: int = NEVER_MAPPED,
        source: SourceFile | None = None,
        fit: Fit[DeviceT] | None = None,
        alike: _Alike[DeviceT] | None = None,
        attached: Attached | None = None,
    ) -> Decision[DeviceT]:
        nbytes, shape = _checked(nbytes, shape)
        key: object = (
            name
            if nbytes is None and shape is None and source is None and attached is None
            else (name, nbytes, shape, maps, source, attached)
        )
        decision = self._cached(key)
        # An `auto` decision follows JAX's default device: still good while that is the same.
        if decision is not None and (
            not decision.is_auto or decision.device == self.machine.default_device()
        ):
            self.events.repeat("placement", decision.event_fields)
            return decision
        fit = self._fit if fit is None else fit
        walked = self._walked.get(key)
        if walked is not None:
            # Judged by free memory: the rule is the same, but the walk is taken again
            # (memory changes); when it ends the same way, the decision built is reused.
            route, before, decision = walked
            same = (
                nbytes is not None and route.ends_again(before, nbytes, fit, claimed)
            ) or route.walk(name, nbytes, fit, claimed, shape, maps, attached) == before
            if same and (not decision.is_auto or decision.device == self.machine.default_device()):
                self.events.repeat("placement", decision.event_fields)
                return decision
        made = (
            None
            if alike is None
            else self._alike(alike, name, nbytes, shape, maps, source, attached)
        )
        if made is None:
            made = self._decision(name, nbytes, shape, claimed, maps, source, fit, attached)
            if alike is not None and nbytes is not None and not self.disabled:
                decision, choice, route = made
                shaped = shape if route.judges_shape() else None
                named = attached if route.attached is not None else None
                alike.made[(route, maps, shaped, named)] = (choice, decision)
        decision, choice, route = made
        if not choice.sized:
            self._remember(key, decision)
        else:
            if len(self._walked) >= CACHE_GENERATION:
                self._walked.clear()
            self._walked[key] = (route, choice, decision)
        first = (name, decision.device_text, decision.rule, decision.origin)
        if (
            decision.fallback_reason is not None
            # A leaf without names of its own under `axes: attached` is said by the
            # `no_attached_axes` warning of its placement (`resolve_many`), with the count
            # and the fix; a name resolved alone gets the fallback warning.
            and not (
                alike is not None
                and decision.attached
                and attached is None
                and decision.mesh is not None
            )
            and self.events.first_time(
                (
                    "fallback",
                    decision.origin,
                    decision.requested,
                    decision.device_text,
                    choice.short,
                )
            )
        ):
            # The event a user most needs: their rule's device was not had (or could not
            # hold the bytes). Once per rule and outcome at warning, however many names
            # follow it down the chain.
            first_level = "warning"
        self.events.decided(first, "placement", decision.event_fields, first_level)
        if (
            decision.rule is None
            and nbytes is not None
            and nbytes >= LARGE_BY_DEFAULT
            and not self.disabled
            and self.events.first_time(("large_by_default", source or name))
        ):
            self._large_by_default(decision, source)
        return decision

    def _large_by_default(self, decision: Decision[DeviceT], source: SourceFile | None) -> None:
        """Warn that a large tensor went where no rule said: the default decided it."""
        fields: dict[str, Any] = {
            "name": decision.name,
            "nbytes": decision.nbytes,
            "device": decision.device_text,
            "origin": decision.origin,
        }
        if source is not None:
            fields["file"] = source.shown
        fields["suggested_rule"] = _rule_to_write(decision.name, source)
        fields["hint"] = (
            f"no rule names it, so the default put {format_size(decision.nbytes or 0)} on "
            f"{decision.device_text}, which differs between machines; add this rule "
            "(device: cpu keeps it on the host; gpu:0 if it belongs on the accelerator)"
        )
        self.events.emit("warning", "large_by_default", fields)

    def _cached(self, key: object) -> Decision[DeviceT] | None:
        decision = self._recent.get(key)
        if decision is None:
            decision = self._old.get(key)
            if decision is not None:
                self._remember(key, decision)
        return decision

    def _remember(self, key: object, decision: Decision[DeviceT]) -> None:
        if len(self._recent) >= CACHE_GENERATION:
            # Turn over: what was used in the last generation stays reachable for one more.
            self._old = self._recent
            self._recent = {}
        self._recent[key] = decision

    def resolve_many(
        self, items: Iterable[Item], *, summarised: bool = False
    ) -> list[Decision[DeviceT]]:
        """Resolve (name, nbytes[, shape]) items as one placement, earlier items' bytes claimed.

        `summarised`: the caller logs one summary (a file load), so each item's first
        decision is debug, not info; a fallback's first occurrence is a warning either way.
        """
        claimed: dict[Hashable, int] = {}
        decisions = []
        first_level = "debug" if summarised else "info"
        fit = self._fit.snapshot()  # one placement: each pool's free memory read once
        alike = _Alike(fit, claimed)
        # What leaves carried, for rules with `axes: attached` (only where there are any).
        carried: list[tuple[Attached | None, Shape | None]] | None = (
            [] if self._attached and not self.disabled else None
        )
        for item in items:
            name, nbytes, shape, maps, source, attached = _unpacked(item)
            decision = self._resolve(
                name, nbytes, shape, claimed, first_level, maps, source, fit, alike, attached
            )
            _claim(claimed, decision, fit, maps)
            decisions.append(decision)
            if carried is not None:
                carried.append((attached, shape))
        if carried:
            self._report_attached(decisions, carried)
        return decisions

    def _report_attached(
        self,
        decisions: list[Decision[DeviceT]],
        carried: list[tuple[Attached | None, Shape | None]],
    ) -> None:
        """One placement's warnings for rules with `axes: attached`: per rule, the leaves
        that carried no names (replicated), and each logical name its table lacks (that
        dimension is not sharded, as flax does)."""
        unnamed: dict[tuple[Source, int | None], list[str]] = {}
        unknown: dict[tuple[tuple[Source, int | None], str], list[str]] = {}
        for decision, (attached, shape) in zip(decisions, carried, strict=True):
            if not decision.attached:
                continue
            rule = (decision.source, decision.rule)
            if attached is None:
                if shape != ():
                    unnamed.setdefault(rule, []).append(decision.name)
                continue
            if attached.mesh_axes:
                continue
            target = self._attached[rule]
            known = target.known
            for n in attached.names:
                if isinstance(n, str) and n not in known:
                    unknown.setdefault((rule, n), []).append(decision.name)
        for rule, names in unnamed.items():
            target = self._attached[rule]
            origin = self._attached_origin[rule]
            count = len(names)
            level = (
                "warning"
                if self.events.first_time(("no_attached_axes", origin, count, names[0]))
                else "debug"
            )
            self.events.emit(
                level,
                "no_attached_axes",
                {
                    "rule": origin,
                    "mesh": target.mesh,
                    "leaves": count,
                    "examples": names[:_EXAMPLES],
                    "hint": f"`axes: attached` shards a leaf by the axis names its framework "
                    f"attached to it, and {'this leaf carries' if count == 1 else 'these carry'}"
                    f" none, so {'it is' if count == 1 else 'they are'} replicated over mesh "
                    f"{target.mesh!r}: name the axes in the model (flax "
                    "nn.with_logical_partitioning, nnx.with_partitioning, haliax axes), or give "
                    f"{'it a rule of its own' if count == 1 else 'them a rule of their own'} "
                    "before this one "
                    f'(e.g. `- match: "{names[0]}"` with `sharding: {{mesh: {target.mesh}, '
                    "spec: []}`)",
                },
            )
        for (rule, axis), names in unknown.items():
            target = self._attached[rule]
            origin = self._attached_origin[rule]
            level = (
                "warning"
                if self.events.first_time(("unknown_logical_axis", origin, axis))
                else "debug"
            )
            listed = ", ".join(sorted(target.known)) or "none"
            self.events.emit(
                level,
                "unknown_logical_axis",
                {
                    "rule": origin,
                    "axis": axis,
                    "mesh": target.mesh,
                    "leaves": len(names),
                    "examples": names[:_EXAMPLES],
                    "axis_rules": listed,
                    "hint": f"logical axis {axis!r} is not in the axis_rules of mesh "
                    f"{target.mesh!r} ({listed}), so that dimension is not sharded (as flax's "
                    f"logical_to_mesh_axes does); add a pair `[{axis}, MESH_AXIS]` to "
                    f"axis_rules, or `[{axis}, null]` to replicate it on purpose",
                },
            )

    def _alike(
        self,
        alike: _Alike[DeviceT],
        name: str,
        nbytes: int | None,
        shape: Shape | None,
        maps: int,
        source: SourceFile | None,
        attached: Attached | None = None,
    ) -> tuple[Decision[DeviceT], Choice[DeviceT], Route[DeviceT]] | None:
        """The decision for `name` made like an earlier one of this placement by the same
        rule (same `maps`, shape where the rule judges it), where its route says the walk
        would end the same way (`Route.ends_again`); None: decide it in full.

        Why: a file's tensors are mostly decided by a few rules, and a walk with its
        memory judgement and a `Decision` built from it cost most of a small tensor's
        load (10,000 tensors: 10,000 walks). The rule is still matched per name.
        """
        if nbytes is None or self.disabled or type(name) is not str:
            return None
        index = self._matcher.first(name, nbytes, source)
        if index is None and self._rejects:
            return None
        route = self._default if index is None else self._routes[index]
        shaped = shape if route.judges_shape() else None
        named = attached if route.attached is not None else None
        found = alike.made.get((route, maps, shaped, named))
        if found is None:
            return None
        choice, like = found
        if not route.ends_again(choice, nbytes, alike.fit, alike.claimed):
            return None
        return _renamed(like, name, nbytes), choice, route

    def decide(
        self,
        name: str,
        nbytes: int | None = None,
        shape: Shape | None = None,
        source: SourceFile | None = None,
        attached: Attached | None = None,
    ) -> Decision[DeviceT]:
        """Like `resolve`, but nothing is logged or cached. `attached`: the axis names the
        leaf carries, for rules with `axes: attached`."""
        return self._decision(
            name, nbytes, shape, NOTHING_CLAIMED, NEVER_MAPPED, source, None, attached
        )[0]

    def rule_for(
        self,
        name: str,
        nbytes: int | None = None,
        shape: Shape | None = None,
        source: SourceFile | None = None,
    ) -> int | None:
        """The position in `settings.rules` of the rule that takes `name`, or None for
        the default: matching only, no device looked up (lint against real names)."""
        nbytes, shape = _checked(nbytes, shape)
        return self._matcher.first(name, nbytes, source, shape)

    def decide_many(self, items: Iterable[Item]) -> list[Decision[DeviceT] | DevicePolicyError]:
        """Like `resolve_many`, logging nothing, each failure returned in its place."""
        claimed: dict[Hashable, int] = {}
        results: list[Decision[DeviceT] | DevicePolicyError] = []
        fit = self._fit.snapshot()
        for item in items:
            name, nbytes, shape, maps, source, attached = _unpacked(item)
            try:
                decision = self._decision(
                    name, nbytes, shape, claimed, maps, source, fit, attached
                )[0]
            except DevicePolicyError as e:
                results.append(e)
                continue
            _claim(claimed, decision, fit, maps)
            results.append(decision)
        return results

    def explain(
        self,
        name: str,
        nbytes: int | None = None,
        shape: Shape | None = None,
        source: SourceFile | None = None,
        attached: Attached | None = None,
    ) -> Explanation[DeviceT]:
        """Every rule tried for `name` and every fallback step, from the walk that decides."""
        nbytes, shape = _checked(nbytes, shape)
        outcome = self._outcome(
            name, nbytes, shape, NOTHING_CLAIMED, NEVER_MAPPED, source, None, attached
        )
        rules = self.settings.rules
        steps = tuple((rules[s.rule], s) for s in self._matcher.trace(name, nbytes, source, shape))
        error = outcome.choice
        if isinstance(error, DevicePolicyError):
            tried = error.tried if isinstance(error, DeviceUnavailableError) else ()
            return Explanation(name, nbytes, steps, tried, None, str(error))
        decision = self._build(name, nbytes, outcome.rule, outcome.route, error)
        return Explanation(name, nbytes, steps, error.tried, decision, None)

    def _decision(
        self,
        name: str,
        nbytes: int | None,
        shape: Shape | None,
        claimed: Mapping[Hashable, int],
        maps: int = NEVER_MAPPED,
        source: SourceFile | None = None,
        fit: Fit[DeviceT] | None = None,
        attached: Attached | None = None,
    ) -> tuple[Decision[DeviceT], Choice[DeviceT], Route[DeviceT]]:
        """The decision (or its error, raised), the walk's end (unsized: cacheable) and
        the route walked."""
        outcome = self._outcome(name, nbytes, shape, claimed, maps, source, fit, attached)
        if isinstance(outcome.choice, DevicePolicyError):
            raise outcome.choice
        choice = outcome.choice
        decision = self._build(name, nbytes, outcome.rule, outcome.route, choice)
        return decision, choice, outcome.route

    def _outcome(
        self,
        name: str,
        nbytes: int | None,
        shape: Shape | None,
        claimed: Mapping[Hashable, int],
        maps: int = NEVER_MAPPED,
        source: SourceFile | None = None,
        fit: Fit[DeviceT] | None = None,
        attached: Attached | None = None,
    ) -> _Outcome[DeviceT]:
        if not isinstance(name, str):
            raise TypeError(f"a placement name must be a str, got {type(name).__name__} {name!r}")
        # `decide` and the `*_many` forms come here directly: every way in is checked.
        nbytes, shape = _checked(nbytes, shape)
        index = self._matcher.first(name, nbytes, source, shape)
        route = self._default if index is None else self._routes[index]
        if self.disabled:
            # The kill switch works where the policy cannot: nothing is looked up, and
            # nothing (not even `default: reject`) can fail a call.
            return _Outcome(index, route, Choice(None, route.chain[0], (), False))
        if index is None and self._rejects:
            patterns = [c.pattern for c in self._matcher.conditions]
            error = UnmatchedNameError(name, self.settings.default.origin, patterns)
            return _Outcome(None, route, error)
        try:
            choice = route.choose(
                name, nbytes, self._fit if fit is None else fit, claimed, shape, maps, attached
            )
        except DeviceUnavailableError as e:
            return _Outcome(index, route, e)
        return _Outcome(index, route, choice)

    def _build(
        self,
        name: str,
        nbytes: int | None,
        index: int | None,
        route: Route[DeviceT],
        choice: Choice[DeviceT],
    ) -> Decision[DeviceT]:
        entry = None if index is None else self.settings.rules[index]
        source: Source = "default" if entry is None else entry.source
        if self.disabled:
            source = "disabled"
        device = choice.device if choice.device is not None else self.machine.default_device()
        reason = None
        if choice.tried:
            passed = "; ".join(f"{t}: {why}" for t, why in choice.tried)
            reason = f"{passed}; used {choice.target.text}"
            host = getattr(device, "platform", None) == "cpu"
            if choice.short_accelerator and host and nbytes is not None:
                reason += f" (the host: no accelerator in the chain can hold {format_size(nbytes)})"
        sharded: dict[str, Any] = {}
        if choice.mesh is not None and not self.disabled:
            target = choice.target
            assert isinstance(target, ShardingTarget)
            # The mesh's shape says it all; the NamedSharding exists only where its devices
            # do (None in a plan for a VirtualMachine).
            sharded = {
                "sharding": choice.sharding,
                "mesh": target.mesh,
                "spec": target.spec,
                "mesh_devices": choice.mesh.size,
                "shards": shards(target, choice.mesh.shape),
                "local_devices": choice.mesh.local,
                "axes": target.logical,
            }
        elif isinstance(device, jax.Device):
            # One sharding object per device and memory kind, shared by its decisions.
            key = (device, route.memory_kind)
            single = self._singles.get(key)
            if single is None:
                single = SingleDeviceSharding(device, memory_kind=route.memory_kind)
                self._singles[key] = single
            sharded["sharding"] = single
        if route.attached is not None and not self.disabled:
            sharded["attached"] = True
        return Decision(
            name=name,
            device=device,
            device_text=choice.target.text if "mesh" in sharded else self.machine.text(device),
            memory_kind=route.memory_kind,
            requested=route.requested,
            rule=None if entry is None else entry.index,
            origin=self.settings.default.origin if entry is None else entry.origin,
            source=source,
            fallback_reason=reason,
            nbytes=nbytes,
            commit=True if entry is None else entry.spec.commit,
            is_auto=choice.device is None or self.disabled,
            mmap=False if entry is None else entry.spec.mmap,
            **sharded,
            move_inputs=entry is not None and entry.spec.inputs == "move",
        )
