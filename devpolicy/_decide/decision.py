"""What deciding gives back: `Decision` (where one name goes, and why) and `Explanation`
(how it was decided, step by step), as values to read, print and log.

Nothing here decides: both are made by `Decider`. `renamed` copies a decision for
another name of the same walk without running its constructor again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Generic

import jax
from typing_extensions import TypeVar

from .._base.sizes import format_size
from .._base.visible import visible
from .._document.axes import logical_text
from .._document.layers import RuleEntry
from .._document.schema import Source
from .._document.targets import SpecEntry
from .._machine.machine import DeviceLike
from .._names.matching import Step

#: The devices decided between: JAX's, or a planned machine's (`VirtualDevice`).
DeviceT = TypeVar("DeviceT", bound=DeviceLike, default=jax.Device)


#: JAX's maker of a one-device sharding: `make_single_device_sharding` where JAX has it
#: (0.12.1 deprecates naming the class), else the class itself.
_MAKE_SINGLE: Any = getattr(jax.sharding, "make_single_device_sharding", None)


def single_device_sharding(device: Any, memory_kind: str | None = None) -> Any:
    """A sharding that puts a whole array on `device` (in `memory_kind`), as every JAX
    release since 0.6 spells it.

    Example:
        >>> import jax
        >>> single_device_sharding(jax.devices("cpu")[0]).device_set == {jax.devices("cpu")[0]}
        True
    """
    if _MAKE_SINGLE is not None:
        return _MAKE_SINGLE(device, memory_kind=memory_kind)
    return jax.sharding.SingleDeviceSharding(device, memory_kind=memory_kind)


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
        fallback_declared: Whether that fallback went the way the deciding rule wrote (its
            own `fallback:` chain, `sharding.indivisible: replicate`): logged at info, where
            one the policy's chain took is a warning, and so is one taken because an
            accelerator could not hold the bytes.
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
        resolved: What the accelerator-neutral target used resolved to on this machine
            (`accelerator:0 -> tpu:0`), else None.

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
    fallback_declared: bool = False
    resolved: str | None = None
    #: What `jax.device_put` is given: the bare device where that says it all (the cheaper
    #: call, about 17 us against 25 us), else the sharding. Worked out once, in
    #: `__post_init__`, not as a property: a repeat `@place` call that commits its result
    #: reads it, and that path stays in the wrapper's module, the decider and the ledger.
    destination: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.local_devices:
            object.__setattr__(self, "local_devices", (self.device,))
        if self.sharding is None and self.mesh is None and isinstance(self.device, jax.Device):
            sharding = single_device_sharding(self.device, self.memory_kind)
            object.__setattr__(self, "sharding", sharding)
        direct = self.mesh is None and self.memory_kind is None
        object.__setattr__(self, "destination", self.device if direct else self.sharding)

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
        if self.resolved is not None:
            sharded["resolved"] = self.resolved
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
        if self.decision is not None and self.decision.resolved is not None:
            lines.append(f"  resolved: {self.decision.resolved}")
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


def renamed(like: Decision[DeviceT], name: str, nbytes: int) -> Decision[DeviceT]:
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


# The member descriptors of Decision's slots: what `renamed` copies.
_NAME_SLOT = Decision.__dict__["name"]
_NBYTES_SLOT = Decision.__dict__["nbytes"]
_KEPT_SLOTS = tuple(
    Decision.__dict__[f.name] for f in fields(Decision) if f.name not in ("name", "nbytes")
)
