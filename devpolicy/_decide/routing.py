"""The fallback walk: a target and its chain tried against a machine, in one place.

The decider, `explain`, lint and `plan` all ask this module how a chain resolves, so
they can never disagree. The machine is this process's (`Inventory`) or one described in
words (`VirtualMachine`, for planning): the walk only asks it. Memory claimed by earlier
items of one placement is passed in, never read from hidden state.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Generic

from jax.sharding import NamedSharding

from .._base.errors import AxisNamesError, DevicePolicyError, DeviceUnavailableError
from .._base.sizes import format_size
from .._document.axes import Attached
from .._document.targets import AttachedTarget, ShardingTarget, Target, parse_chain_item
from .._machine.capacity import Capacity, pool_of
from .._machine.machine import D
from .._machine.meshes import BuiltMesh, Meshes, Sharded, shards
from .._names.matching import SourceFile

#: Whether a loader would map an item from its file instead of reading it, were it placed
#: on a host device: never (not aligned, narrowed, or `mmap=False`), if its rule says
#: `mmap: true`, or always (`mmap=True`).
NEVER_MAPPED, MAPPED_IF_RULE, ALWAYS_MAPPED = 0, 1, 2

#: Nothing claimed yet: the usual case, shared rather than built per call. Claims are
#: keyed by memory pool (`Fit.pool`): devices sharing one memory share their claims.
NOTHING_CLAIMED: Mapping[Hashable, int] = {}


class _NamesUnknown(Attached):
    """The axis names of a leaf that tools cannot see: `plan` and `explain` read a
    checkpoint's header or a bare name, which carry none (see `UNKNOWN_NAMES`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNKNOWN_NAMES"


#: What `plan` and `explain` pass as a leaf's attached names when they do not have the
#: model's tree: a rule with `axes: attached` cannot be decided without them (unlike a
#: leaf known to carry none, which is replicated), so its walk ends in `NamesNeededError`.
UNKNOWN_NAMES: Attached = _NamesUnknown(())


class NamesNeededError(DevicePolicyError):
    """A rule with `axes: attached` met a tensor whose names are not known here (a plan of
    a checkpoint's header, an `explain` without the names): not decided, rather than
    guessed replicated.

    Attributes:
        name: The tensor's name.
    """

    def __init__(self, name: str, rule: str, mesh: str) -> None:
        self.name = name
        super().__init__(
            f"not decided: {name!r} matches{rule}, which shards over mesh {mesh!r} by the "
            "axis names the model attaches to each leaf (`axes: attached`), and a checkpoint "
            "carries none; give the model's abstract tree (plan(path, into=tree), "
            "`devpolicy plan --tree tree.json`; explain(name, axes=[...]), "
            "`devpolicy explain NAME --tree tree.json`)"
        )


@dataclass(frozen=True, slots=True)
class Choice(Generic[D]):
    """Where a walk ended.

    Attributes:
        device: The device (for a sharding, the mesh's first device of this process), or
            None for `auto` (JAX's default device at the time of use).
        target: The target of the chain that was used.
        tried: Each target passed over before it, with why.
        sized: Whether free memory was consulted (then the choice holds for this call only).
        sharding: The NamedSharding when the target is a sharding (None also on a machine
            whose devices do not exist here), else None.
        mesh: The mesh it shards over, else None.
        short: Whether a target was passed over because the bytes did not fit its memory.
        short_accelerator: Whether that happened to an accelerator (not a host device).
        declared: Whether what was passed over was passed along a way the rule itself
            wrote (its own `fallback:` chain, `sharding.indivisible: replicate`), not the
            policy's chain taking over.
    """

    device: D | None
    target: Target | ShardingTarget
    tried: tuple[tuple[str, str], ...]
    sized: bool
    sharding: NamedSharding | None = None
    mesh: BuiltMesh[D] | None = None
    short: bool = False
    short_accelerator: bool = False
    declared: bool = False


@dataclass(frozen=True, slots=True)
class _Short:
    """A sharding passed over because a device's share did not fit: why, and its platform."""

    reason: str
    platform: str


class _Once(Generic[D]):
    """A capacity that asks its source once per device (and keeps its pools)."""

    __slots__ = ("_free", "_pools", "_source")

    def __init__(self, source: Capacity[D]) -> None:
        self._source = source
        self._free: dict[D, int | None] = {}
        self._pools: dict[D, Hashable] = {}

    def free_bytes(self, device: D) -> int | None:
        if device in self._free:
            return self._free[device]
        free = self._free[device] = self._source.free_bytes(device)
        return free

    def pool(self, device: D) -> Hashable:
        # Asked for every sized item of a placement (its claim, its judgement).
        pool = self._pools.get(device)
        if pool is None:
            pool = self._pools[device] = pool_of(self._source, device)
        return pool


@dataclass(frozen=True, slots=True)
class Fit(Generic[D]):
    """How memory-aware placement judges a size: by `capacity`, keeping `headroom` free."""

    capacity: Capacity[D]
    headroom: float

    def snapshot(self) -> Fit[D]:
        """This fit with free memory read once per device: for one placement (a file's
        tensors, a pytree's leaves), whose earlier items are counted as claims instead."""
        return Fit(_Once(self.capacity), self.headroom)

    def pool(self, device: D) -> Hashable:
        """The memory pool `device` draws on (every CPU device shares the host's)."""
        capacity = self.capacity
        if isinstance(capacity, _Once):
            return capacity.pool(device)
        return pool_of(capacity, device)

    def problem(self, device: D, nbytes: int, claimed: int, text: Callable[[D], str]) -> str | None:
        """Why `nbytes` does not fit `device` with `claimed` bytes already given, or None;
        `text` names the device."""
        free = self.capacity.free_bytes(device)
        if free is None:
            return None
        budget = int(free * (1 - self.headroom)) - claimed
        if nbytes <= budget:
            return None
        where = text(device)
        kept = f", keeping {self.headroom:.0%} free" if self.headroom else ""
        earlier = f", {format_size(claimed)} of it taken by earlier items" if claimed else ""
        return f"needs {format_size(nbytes)}, {format_size(free)} free on {where}{earlier}{kept}"


#: One name asked of the rules: (name, nbytes, shape, maps, source, attached, fit, claimed),
#: built once per decision (`items.make_query`, which checks it) and handed down: the
#: decider's `_resolve`, `_alike`, `_decision`, `_outcome` and `_build`, and `Route.choose`.
#: Each unpacks it in one line. `maps` says whether a loader would map the array from its
#: file (`NEVER_MAPPED`, ...), `source` the file it comes from (rules with `file:`),
#: `attached` the axis names its framework attached to it (`axes: attached`); `fit` judges
#: memory (the decider's own, or one placement's snapshot), beside what earlier items of
#: the placement `claimed`. Its first six elements are the cache key of a sized decision.
#:
#: A plain tuple, not a NamedTuple or a frozen dataclass: as immutable, and built for every
#: item of a placement at the cost of a tuple. Measured, a NamedTuple costs about 15 times
#: as much to build and a frozen dataclass about 50 times (each field set through
#: `object.__setattr__`), which showed in a cold decision and in a placement's items.
Query = tuple[
    str,
    int | None,
    tuple[int, ...] | None,
    int,
    SourceFile | None,
    Attached | None,
    Fit[D],
    Mapping[Hashable, int],
]


class Route(Generic[D]):
    """A target with its fallback chain, parsed once; walked against its meshes' machine.

    Attributes:
        requested: The first target's text, as written.
        chain: The target and its fallbacks, in order.
        memory_kind: The memory kind asked for, or None.
        strict: Whether only the first target may be used.
        context: Where the chain was written, for error messages (` (rule x.yaml:4)`).
        fits: Whether every target is judged by size (the rule's `fits`, true unless it
            says `false`), not only `auto`.
        attached: The rule's sharding by each leaf's own names (`axes: attached`), else
            None. Its chain starts with what a leaf that carries none gets (the mesh,
            replicated); a leaf's names put their own sharding there (see `walk`).
        declared: Whether the fallbacks are the rule's own (it wrote `fallback:`), not
            the policy's chain.
    """

    __slots__ = (
        "_fixed",
        "_judges_shape",
        "_judges_size",
        "attached",
        "chain",
        "context",
        "declared",
        "fits",
        "memory_kind",
        "meshes",
        "mmap",
        "requested",
        "strict",
    )

    def __init__(
        self,
        requested: Target | ShardingTarget | AttachedTarget,
        fallback: tuple[str, ...],
        memory_kind: str | None,
        strict: bool,
        context: str,
        fits: bool,
        meshes: Meshes[D],
        mmap: bool = False,
        declared: bool = False,
    ) -> None:
        self.requested = requested.text
        self.declared = declared
        # `replicate` is over the rule's own mesh; a device rule has none, so it skips it.
        mesh = requested.mesh if not isinstance(requested, Target) else None
        items = (parse_chain_item(t, mesh) for t in fallback)
        self.attached = requested if isinstance(requested, AttachedTarget) else None
        first = requested.unnamed() if isinstance(requested, AttachedTarget) else requested
        self.chain: tuple[Target | ShardingTarget, ...] = (
            first,
            *(t for t in items if t is not None),
        )
        self.memory_kind = memory_kind
        self.strict = strict
        self.context = context
        self.fits = fits
        self.meshes = meshes
        self.mmap = mmap
        self._judges_size = fits or any(t.is_auto for t in self.chain)
        # A sharding's choice depends on the array's shape (does it divide?).
        self._judges_shape = any(isinstance(t, ShardingTarget) for t in self.chain)
        self._fixed: Choice[D] | None = None

    def forget(self) -> None:
        """Drop the walk's end kept for size-blind calls (a mesh was replaced)."""
        self._fixed = None

    @property
    def tried_chain(self) -> tuple[Target | ShardingTarget, ...]:
        """The targets a walk may try: only the first under strict."""
        return self.chain[:1] if self.strict else self.chain

    def judges_size(self) -> bool:
        """Whether a known size can change where this chain ends."""
        return self._judges_size

    def choose(self, query: Query[D]) -> Choice[D]:
        """`walk` for `query`, raising when no device can be had; a size-blind result is
        kept."""
        name, nbytes, shape, maps, _, attached, fit, claimed = query
        blind = (
            (nbytes is None or not self._judges_size)
            and (shape is None or not self._judges_shape)
            and self.attached is None  # each leaf's names make their own sharding
        )
        if self._fixed is not None and blind:
            return self._fixed
        choice = self.walk(name, nbytes, fit, claimed, shape, maps, attached)
        if isinstance(choice, DeviceUnavailableError):
            raise choice
        if choice.device is not None and not choice.sized and blind:
            # Devices do not come and go in a process: the same walk ends the same way.
            self._fixed = choice
        return choice

    def judges_shape(self) -> bool:
        """Whether a known shape can change where this chain ends (it has a sharding)."""
        return self._judges_shape

    def ends_again(
        self, choice: Choice[D], nbytes: int, fit: Fit[D], claimed: Mapping[Hashable, int]
    ) -> bool:
        """Whether `walk` for `nbytes` would end at `choice` again, sure without walking:
        `choice` is where a walk of this route ended for a known size (any) with the same
        `maps` and shape. False means "walk to know", never "it would not".

        Nothing judged by memory ends the same way for any size (devices do not come and
        go). A first target taken unpassed ends the same way while the bytes still fit
        it: the one judgement the walk would make again. Anything passed over (a smaller
        size might fit it now) or a sharding is walked again.
        """
        if not choice.sized:
            return True
        device = choice.device
        if choice.tried or choice.mesh is not None or device is None:
            return False
        taken = claimed.get(fit.pool(device), 0) if claimed else 0
        return fit.problem(device, nbytes, taken, self.meshes.machine.text) is None

    def walk(
        self,
        name: str,
        nbytes: int | None,
        fit: Fit[D],
        claimed: Mapping[Hashable, int] = NOTHING_CLAIMED,
        shape: tuple[int, ...] | None = None,
        maps: int = NEVER_MAPPED,
        attached: Attached | None = None,
    ) -> Choice[D] | DeviceUnavailableError:
        """Try each target of the chain in order (only the first under strict).

        With a size known, every target (`auto`, each fallback; a sharding by each
        device's share) is used only if the bytes fit its free memory beside `claimed`,
        keeping the headroom; one that cannot hold them is passed over with the reason,
        and when no target can, the result is the error (nothing is taken "anyway"). A
        rule's `fits: false` takes its targets unjudged (`auto` is still judged). A
        sharding is used only if its mesh can be built here and, with a shape known, the
        array divides over it. An array a loader would map from its file (`maps`) takes
        no memory on a host device: it is not judged there.

        Under `axes: attached` the first target is the sharding the leaf's own names
        (`attached`) resolve to, read as JAX reads a `PartitionSpec`: names for fewer
        dimensions than the array has leave the rest unsharded. Names that cannot be had
        (a mesh axis the mesh lacks, a logical name on two dimensions) pass it over with
        the reason; names for more dimensions than the array has are the model's naming
        problem, not a device's: `AxisNamesError` is raised. Names not known here
        (`UNKNOWN_NAMES`: a plan without the model's tree) raise `NamesNeededError`. A
        leaf that
        carries no names is replicated over the mesh, said like a fallback (0-d leaves
        have nothing to name: they are replicated without a word).
        """
        mapped = maps == ALWAYS_MAPPED or (maps == MAPPED_IF_RULE and self.mmap)
        machine = self.meshes.machine
        tried: list[tuple[str, str]] = []
        chain = self.tried_chain
        sized = short = accelerator = False
        unbuilt = ""  # a mesh this machine cannot build: said once, not for each spec on it
        unnamed = None  # why a leaf under `axes: attached` is replicated
        for position, target in enumerate(chain):
            shown = None  # the target as a reason names it, where not its own text
            if position == 0 and self.attached is not None:
                found_target = self._attached_target(name, attached, shape)
                if isinstance(found_target, str):
                    tried.append((self.requested, found_target))
                    continue
                if found_target is None:
                    shown = self.requested
                    if shape != ():
                        unnamed = "the leaf carries no axis names of its own"
                else:
                    target = found_target
            if isinstance(target, ShardingTarget):
                if target.mesh == unbuilt:
                    continue
                sharded = self._sharded(target, nbytes, fit, claimed, shape)
                if isinstance(sharded, str):
                    if isinstance(self.meshes.build(target.mesh), str):
                        unbuilt = target.mesh
                    tried.append((shown or target.described, sharded))
                    continue
                if isinstance(sharded, _Short):
                    tried.append((shown or target.described, sharded.reason))
                    short = True
                    accelerator = accelerator or sharded.platform != "cpu"
                    continue
                found_sharding, judged = sharded
                sized = sized or judged
                built, used = found_sharding.built, found_sharding.target
                if unnamed is not None and position == 0:
                    tried.append((self.requested, unnamed))
                if found_sharding.note is not None:
                    # Degraded, not refused (`indivisible: replicate`): said like a fallback.
                    tried.append((target.described, found_sharding.note))
                return Choice(
                    built.local[0],
                    used,
                    tuple(tried),
                    sized,
                    found_sharding.sharding,
                    built,
                    short,
                    accelerator,
                    # The first target's only notes: the rule's `indivisible`, or a leaf
                    # without names (not the rule's choice: said as a warning).
                    self.declared if position else unnamed is None,
                )
            found: D | str
            found = machine.default_device() if target.is_auto else machine.find(target)
            if not isinstance(found, str) and self.memory_kind is not None:
                kinds = machine.memory_kinds(found)
                if self.memory_kind not in kinds:
                    found = (
                        f"no memory kind {self.memory_kind!r} (has: {', '.join(kinds) or 'none'})"
                    )
            if isinstance(found, str):
                tried.append((target.text, found))
                continue
            if (
                nbytes is not None
                and (self.fits or target.is_auto)
                and not (mapped and getattr(found, "platform", None) == "cpu")
            ):
                sized = True
                too_small = fit.problem(
                    found, nbytes, claimed.get(fit.pool(found), 0), machine.text
                )
                if too_small is not None:
                    tried.append((target.text, too_small))
                    short = True
                    accelerator = accelerator or getattr(found, "platform", None) != "cpu"
                    continue
            device = None if target.is_auto else found
            return Choice(
                device, target, tuple(tried), sized, None, None, short, accelerator, self.declared
            )
        context = f" for name {name!r}{self.context}"
        platforms = {t.platform for t in chain if not isinstance(t, ShardingTarget)}
        if short and nbytes is not None:
            context += f": nothing in the chain can hold {format_size(nbytes)}"
        if self.strict:
            context += " (strict: no fallback)"
        elif len(self.chain) == 1:
            context += " (no fallback given)"
        missing = machine.missing_for(platforms)
        return DeviceUnavailableError(self.requested, tried, machine.available(), missing, context)

    def _attached_target(
        self, name: str, attached: Attached | None, shape: tuple[int, ...] | None
    ) -> ShardingTarget | str | None:
        """The sharding a leaf's attached names ask for, why they cannot, or None when
        the leaf carries none; names the leaf's shape cannot take raise.

        The spec keeps one entry per name, as JAX builds `PartitionSpec(*names)`: the
        dimensions past the names are unsharded, and the `NamedSharding` is the one JAX
        builds from the same names (`P('a')` and `P('a', None)` compare unequal, so the
        spec is never padded here).
        """
        assert self.attached is not None
        if attached is None:
            return None
        if attached is UNKNOWN_NAMES:
            if shape == ():  # nothing to name: replicated, as for any 0-d leaf
                return None
            raise NamesNeededError(name, self.context, self.attached.mesh)
        if shape is not None and len(attached.names) > len(shape):
            raise AxisNamesError(name, attached.names, shape, self.context)
        return self.attached.resolved(attached)

    def _sharded(
        self,
        target: ShardingTarget,
        nbytes: int | None,
        fit: Fit[D],
        claimed: Mapping[Hashable, int],
        shape: tuple[int, ...] | None,
    ) -> tuple[Sharded[D], bool] | str | _Short:
        found = self.meshes.sharding(target, self.memory_kind, shape)
        if isinstance(found, str):
            return found
        built = found.built
        if self.memory_kind is not None:
            kinds = self.meshes.machine.memory_kinds(built.local[0])
            if self.memory_kind not in kinds:
                return f"no memory kind {self.memory_kind!r} (has: {', '.join(kinds) or 'none'})"
        if nbytes is None or not self.fits:
            return found, False
        share = -(-nbytes // shards(found.target, built.shape))
        pools: dict[Hashable, int] = {}  # devices sharing one memory hold their shares together
        for device in built.local:
            pool = fit.pool(device)
            pools[pool] = pools.get(pool, 0) + share
            too_small = fit.problem(
                device, pools[pool], claimed.get(pool, 0), self.meshes.machine.text
            )
            if too_small is not None:
                return _Short(f"each device's share: {too_small}", getattr(device, "platform", ""))
        return found, True
