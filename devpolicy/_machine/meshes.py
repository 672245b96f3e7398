"""The policy's meshes, built against a machine's devices, and shardings over them.

A mesh that cannot be built here (a missing backend, too few devices) and an array that
does not divide over its axes are not errors but reasons: the rule's fallback chain is
tried next, so one policy runs on a laptop and on a pod.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._document.schema import MeshSpec
from .._document.targets import AUTO, PLATFORM_ALIASES, ShardingTarget, SpecEntry, parse_target
from .machine import D, Machine


@dataclass(frozen=True, slots=True)
class BuiltMesh(Generic[D]):
    """A mesh as built for a machine, with what placement needs to know about it.

    Attributes:
        name: Its name in the policy.
        shape: Each axis with its size, in order.
        size: How many devices it spans (every process).
        local: This process's devices of the mesh, in mesh order.
        mesh: The JAX mesh; None on a machine whose devices do not exist here (a plan
            for a `VirtualMachine`).
    """

    name: str
    shape: dict[str, int]
    size: int
    local: tuple[D, ...]
    mesh: Mesh | None


class Meshes(Generic[D]):
    """The policy's meshes by name, each built for one machine once, on first use.

    Example:
        >>> from devpolicy._machine.inventory import inventory
        >>> from devpolicy._document.schema import MeshSpec
        >>> meshes = Meshes({"dp": MeshSpec(axes={"data": -1}, devices="cpu")}, inventory())
        >>> built = meshes.build("dp")
        >>> built.shape, built.size
        ({'data': 4}, 4)
    """

    def __init__(self, specs: Mapping[str, MeshSpec], machine: Machine[D]) -> None:
        self._specs = dict(specs)
        self.machine = machine
        self._built: dict[str, BuiltMesh[D] | str] = {}

    def build(self, name: str) -> BuiltMesh[D] | str:
        """The mesh called `name` on this machine, or why it cannot be built there."""
        built = self._built.get(name)
        if built is None:
            spec = self._specs.get(name)
            if spec is None:  # a sharding in the policy's `fallback` naming no mesh
                listed = ", ".join(self._specs) or "none"
                return f"no mesh {name!r} in the policy's meshes ({listed})"
            built = self._built[name] = _build(name, spec, self.machine)
        return built

    def sharding(
        self,
        target: ShardingTarget,
        memory_kind: str | None,
        shape: Sequence[int] | None,
    ) -> Sharded[D] | str:
        """The mesh for `target` (an array of `shape`, when known) and its NamedSharding
        (None where the mesh has no JAX mesh), or why not.

        A 0-d array is replicated over the mesh (a spec has nothing to cut in it). Under
        `indivisible: replicate`, a dimension that does not divide gives up the axes that
        do not divide it (see `divisible`) and the rest of the spec holds.
        """
        built = self.build(target.mesh)
        if isinstance(built, str):
            return built
        used, note = target, None
        if shape is not None:
            if len(shape) == 0 and target.spec:
                used = target.replicated()
            elif target.indivisible == "replicate":
                used, note = divisible(target, built.shape, shape)
            problem = divides(used, built.shape, shape)
            if problem is not None:
                return problem
        if built.mesh is None:
            return Sharded(built, None, used, note)
        spec = PartitionSpec(*used.spec)  # type: ignore[no-untyped-call]
        try:
            sharding = NamedSharding(built.mesh, spec, memory_kind=memory_kind)
        except ValueError as e:  # a memory kind these devices lack, in JAX's words
            return f"mesh {target.mesh!r}: {e}"
        return Sharded(built, sharding, used, note)


@dataclass(frozen=True, slots=True)
class Sharded(Generic[D]):
    """A sharding that can be had: its mesh, its NamedSharding (None where the mesh has
    no JAX mesh), the target as used, and why that differs from the one asked (or None)."""

    built: BuiltMesh[D]
    sharding: NamedSharding | None
    target: ShardingTarget
    note: str | None


def divisible(
    target: ShardingTarget, axis_sizes: Mapping[str, int], shape: Sequence[int]
) -> tuple[ShardingTarget, str | None]:
    """`target` with each dimension that does not divide keeping only the longest leading
    run of its axes that does (none: the dimension is replicated), and why; unchanged
    (reason None) when every dimension divides or the spec does not fit the rank.

    Example:
        >>> t = ShardingTarget("tp", (("tensor", "data"), "data"), indivisible="replicate")
        >>> used, why = divisible(t, {"tensor": 2, "data": 4}, (32001, 8))
        >>> used.text, why
        ('tp[-,data]', "dim 0 of 32001 does not divide by axes 'tensor' (2) x 'data' (4)")
    """
    if len(target.spec) > len(shape):
        return target, None
    spec: list[SpecEntry] = []
    reasons = []
    for dim, entry in enumerate(target.spec):
        axes = [] if entry is None else [entry] if isinstance(entry, str) else list(entry)
        kept = list(axes)
        while kept and shape[dim] % math.prod(axis_sizes[a] for a in kept):
            kept.pop()
        if kept != axes:
            named = " x ".join(f"{a!r} ({axis_sizes[a]})" for a in axes)
            what = "axis" if len(axes) == 1 else "axes"
            reasons.append(f"dim {dim} of {shape[dim]} does not divide by {what} {named}")
        spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    if not reasons:
        return target, None
    used = ShardingTarget(target.mesh, tuple(spec), target.logical, target.indivisible)
    return used, "; ".join(reasons)


def shards(target: ShardingTarget, axis_sizes: Mapping[str, int]) -> int:
    """Into how many pieces the spec cuts an array (the rest of the mesh replicates)."""
    axes = [a for e in target.spec if e is not None for a in ([e] if isinstance(e, str) else e)]
    return math.prod(axis_sizes[a] for a in axes)


def divides(
    target: ShardingTarget, axis_sizes: Mapping[str, int], shape: Sequence[int]
) -> str | None:
    """Why an array of `shape` cannot be sharded by `target`'s spec, or None."""
    if len(target.spec) > len(shape):
        return (
            f"spec {target.text} has {len(target.spec)} entries but the array has "
            f"{len(shape)} dimensions {tuple(shape)}"
        )
    for dim, entry in enumerate(target.spec):
        if entry is None:
            continue
        axes = [entry] if isinstance(entry, str) else list(entry)
        size = math.prod(axis_sizes[a] for a in axes)
        if shape[dim] % size:
            named = " x ".join(f"{a!r} ({axis_sizes[a]})" for a in axes)
            what = "axis" if len(axes) == 1 else "axes"
            return f"dim {dim} of {shape[dim]} does not divide by {what} {named}"
    return None


def _build(name: str, spec: MeshSpec, machine: Machine[D]) -> BuiltMesh[D] | str:
    devices = _devices(spec.devices, machine)
    if isinstance(devices, str):
        return f"mesh {name!r}: {devices}"
    names = list(spec.axes)
    sizes = list(spec.axes.values())
    fixed = math.prod(s for s in sizes if s != -1)
    where = _where(spec.devices, machine)
    described = " x ".join(f"{n}={s}" for n, s in spec.axes.items())
    if -1 in sizes:
        if len(devices) % fixed or not devices:
            return (
                f"mesh {name!r} ({described}) needs a multiple of {fixed} {where} devices, "
                f"{len(devices)} here"
            )
        sizes[sizes.index(-1)] = len(devices) // fixed
    elif fixed != len(devices):
        return f"mesh {name!r} ({described}) needs {fixed} {where} devices, {len(devices)} here"
    try:
        mesh, local = machine.make_mesh(tuple(sizes), tuple(names), devices)
    except Exception as e:  # JAX's own reason, in its words
        return f"mesh {name!r}: {type(e).__name__}: {e}"
    if not local:
        return f"mesh {name!r} has no device of this process ({machine.process_index})"
    return BuiltMesh(name, dict(zip(names, sizes, strict=True)), len(devices), local, mesh)


def _where(devices: str | list[str], machine: Machine[D]) -> str:
    if isinstance(devices, list):
        return "listed"
    return machine.default_platform if devices == AUTO else PLATFORM_ALIASES[devices]


def _devices(devices: str | list[str], machine: Machine[D]) -> list[D] | str:
    if isinstance(devices, list):
        found = []
        for text in devices:
            device = machine.find(parse_target(text))
            if isinstance(device, str):
                return f"{text}: {device}"
            found.append(device)
        return found
    platform = machine.default_platform if devices == AUTO else PLATFORM_ALIASES[devices]
    return machine.backend_devices(platform)
