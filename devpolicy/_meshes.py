"""The policy's meshes, built against this process's devices, and shardings over them.

A mesh that cannot be built here (a missing backend, too few devices) and an array that
does not divide over its axes are not errors but reasons: the rule's fallback chain is
tried next, so one policy runs on a laptop and on a pod.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from ._inventory import inventory
from ._schema import MeshSpec
from ._targets import AUTO, PLATFORM_ALIASES, ShardingTarget, parse_target


@dataclass(frozen=True, slots=True)
class BuiltMesh:
    """A mesh as built here, with what placement needs to know about it.

    Attributes:
        name: Its name in the policy.
        mesh: The JAX mesh.
        local: This process's devices of the mesh, in mesh order.
    """

    name: str
    mesh: Mesh
    local: tuple[jax.Device, ...]


class Meshes:
    """The policy's meshes by name, each built once, on first use.

    Example:
        >>> from devpolicy._schema import MeshSpec
        >>> meshes = Meshes({"dp": MeshSpec(axes={"data": -1}, devices="cpu")})
        >>> built = meshes.build("dp")
        >>> dict(built.mesh.shape)
        {'data': 4}
    """

    def __init__(self, specs: Mapping[str, MeshSpec]) -> None:
        self._specs = dict(specs)
        self._built: dict[str, BuiltMesh | str] = {}

    @property
    def names(self) -> tuple[str, ...]:
        """The names of the policy's meshes."""
        return tuple(self._specs)

    def build(self, name: str) -> BuiltMesh | str:
        """The mesh called `name` on this machine, or why it cannot be built here."""
        built = self._built.get(name)
        if built is None:
            built = self._built[name] = _build(name, self._specs[name])
        return built

    def sharding(
        self,
        target: ShardingTarget,
        memory_kind: str | None,
        shape: Sequence[int] | None,
    ) -> tuple[BuiltMesh, NamedSharding] | str:
        """The NamedSharding for `target` (an array of `shape`, when known), or why not."""
        built = self.build(target.mesh)
        if isinstance(built, str):
            return built
        if shape is not None:
            problem = divides(target, dict(built.mesh.shape), shape)
            if problem is not None:
                return problem
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


def _build(name: str, spec: MeshSpec) -> BuiltMesh | str:
    devices = _devices(spec.devices)
    if isinstance(devices, str):
        return f"mesh {name!r}: {devices}"
    names = list(spec.axes)
    sizes = list(spec.axes.values())
    fixed = math.prod(s for s in sizes if s != -1)
    where = _where(spec.devices)
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
        # Auto axes: the classic sharding propagation a device_put or jit user expects;
        # Explicit axes would change how every computation under the mesh is typed.
        auto = (AxisType.Auto,) * len(names)
        mesh = jax.make_mesh(tuple(sizes), tuple(names), auto, devices=devices)
    except Exception as e:  # JAX's own reason, in its words
        return f"mesh {name!r}: {type(e).__name__}: {e}"
    index = inventory().process_index
    local = tuple(d for d in mesh.devices.flat if d.process_index == index)
    if not local:
        return f"mesh {name!r} has no device of this process ({index})"
    return BuiltMesh(name, mesh, local)


def _where(devices: str | list[str]) -> str:
    if isinstance(devices, list):
        return "listed"
    return jax.default_backend() if devices == AUTO else PLATFORM_ALIASES[devices]


def _devices(devices: str | list[str]) -> list[jax.Device] | str:
    if isinstance(devices, list):
        inv = inventory()
        found = []
        for text in devices:
            device = inv.find(parse_target(text))
            if isinstance(device, str):
                return f"{text}: {device}"
            found.append(device)
        return found
    platform = None if devices == AUTO else PLATFORM_ALIASES[devices]
    if platform is not None and platform not in inventory().devices:
        why = inventory().missing.get(platform, "not started")
        return f"no {platform} backend in this process ({why})"
    try:
        # Every process's devices: a mesh of a jax.distributed job spans them all.
        return list(jax.devices(platform))
    except Exception as e:
        return f"{type(e).__name__}: {e}"
