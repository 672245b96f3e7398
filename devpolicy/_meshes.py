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

from ._machine import D, Machine
from ._schema import MeshSpec
from ._targets import AUTO, PLATFORM_ALIASES, ShardingTarget, parse_target


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
        >>> from devpolicy._inventory import inventory
        >>> from devpolicy._schema import MeshSpec
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
            built = self._built[name] = _build(name, self._specs[name], self.machine)
        return built

    def sharding(
        self,
        target: ShardingTarget,
        memory_kind: str | None,
        shape: Sequence[int] | None,
    ) -> tuple[BuiltMesh[D], NamedSharding | None] | str:
        """The mesh for `target` (an array of `shape`, when known) and its NamedSharding
        (None where the mesh has no JAX mesh), or why not."""
        built = self.build(target.mesh)
        if isinstance(built, str):
            return built
        if shape is not None:
            problem = divides(target, built.shape, shape)
            if problem is not None:
                return problem
        if built.mesh is None:
            return built, None
        spec = PartitionSpec(*target.spec)  # type: ignore[no-untyped-call]
        try:
            return built, NamedSharding(built.mesh, spec, memory_kind=memory_kind)
        except ValueError as e:  # a memory kind these devices lack, in JAX's words
            return f"mesh {target.mesh!r}: {e}"


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
