"""The policy's meshes, built against a machine's devices, and shardings over them.

A mesh is built from its `axes` (and, over several slices, its `dcn`: the hybrid layout
JAX's `create_hybrid_device_mesh` gives), or is one the program built and handed over
(`Meshes.use`), which every rule naming it then shards over as it is.

A mesh that cannot be built here (a missing backend, too few devices) and an array that
does not divide over its axes are not errors but reasons: the rule's fallback chain is
tried next, so one policy runs on a laptop and on a pod.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._base.errors import did_you_mean
from .._document.schema import MeshSpec
from .._document.targets import AUTO, PLATFORM_ALIASES, ShardingTarget, SpecEntry, parse_target
from .machine import D, Machine, slice_of


@dataclass(frozen=True, slots=True)
class BuiltMesh(Generic[D]):
    """A mesh as built for a machine, with what placement needs to know about it.

    Attributes:
        name: Its name in the policy.
        shape: Each axis with its size, in order (for a hybrid mesh, slices x within).
        size: How many devices it spans (every process).
        local: This process's devices of the mesh, in mesh order.
        mesh: The JAX mesh; None on a machine whose devices do not exist here (a plan
            for a `VirtualMachine`).
        devices: Every device of the mesh, every process's, in mesh order (row-major).
        dcn: For a hybrid (multi-slice) mesh, how many slices each axis spans; else None.
        given: Whether the program gave this mesh (`use_mesh`) rather than the policy
            building it.
    """

    name: str
    shape: dict[str, int]
    size: int
    local: tuple[D, ...]
    mesh: Mesh | None
    devices: tuple[D, ...] = ()
    dcn: dict[str, int] | None = None
    given: bool = False

    @property
    def described(self) -> str:
        """`data=2 x fsdp=4` (see `shape_text`); `, given in code` for a given mesh."""
        return shape_text(self.shape, self.dcn) + (", given in code" if self.given else "")


def shape_text(shape: Mapping[str, int], dcn: Mapping[str, int] | None) -> str:
    """`data=2 x fsdp=4`, or for a hybrid mesh each axis as slices x within a slice:
    `data=2 (2x1) x fsdp=4 (1x4)`.

    Example:
        >>> shape_text({"data": 2, "fsdp": 4}, {"data": 2})
        'data=2 (2x1) x fsdp=4 (1x4)'
    """
    parts = []
    for axis, size in shape.items():
        slices = None if dcn is None else dcn.get(axis, 1)
        split = "" if slices is None else f" ({slices}x{size // slices})"
        parts.append(f"{axis}={size}{split}")
    return " x ".join(parts)


#: How many of a mesh's devices a layout lists (a pod's mesh has thousands).
LAYOUT_SHOWN = 16


@dataclass(frozen=True, slots=True)
class MeshLayout:
    """A mesh as a plan shows it: its shape, its split across slices, its first devices.

    Attributes:
        name: Its name in the policy.
        shape: Each axis with its size, in order.
        dcn: For a hybrid mesh, how many slices each axis spans; else None.
        size: How many devices it spans (every process).
        first: Its first devices in mesh order (row-major), at most `LAYOUT_SHOWN`, as
            `p1:gpu:0` (process 1's first GPU) when it spans several processes, else `gpu:0`.
        given: Whether the program gave it (`use_mesh`).
    """

    name: str
    shape: dict[str, int]
    dcn: dict[str, int] | None
    size: int
    first: tuple[str, ...]
    given: bool = False

    @property
    def described(self) -> str:
        """`train: data=2 (2x1) x fsdp=4 (1x4), 8 devices: p0:cpu:0 p0:cpu:1 ...`."""
        more = " ..." if self.size > len(self.first) else ""
        given = ", given in code" if self.given else ""
        return (
            f"{self.name}: {shape_text(self.shape, self.dcn)}{given}, {self.size} devices in "
            f"mesh order: {' '.join(self.first)}{more}"
        )


def layout(built: BuiltMesh[D], text: Callable[[D], str]) -> MeshLayout:
    """What a plan shows of `built`; `text` names a device by its process-local target."""
    devices = built.devices or built.local
    several = len({d.process_index for d in devices}) > 1
    first = tuple(
        f"p{d.process_index}:{text(d)}" if several else text(d) for d in devices[:LAYOUT_SHOWN]
    )
    return MeshLayout(built.name, dict(built.shape), built.dcn, built.size, first, built.given)


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

    def use(self, name: str, mesh: Mesh) -> None:
        """Use `mesh`, built by the program, as the policy's mesh `name` from now on.

        The policy must declare `name` under `meshes:` with the same axis names; each
        size it states (not -1) must be the mesh's. Decisions made before keep the mesh
        they were made with: the caller forgets them (`Decider.use_mesh`).

        Raises:
            TypeError: `mesh` is not a `jax.sharding.Mesh`.
            ValueError: the policy declares no mesh `name`, or declares other axes.
        """
        if not isinstance(mesh, Mesh):
            raise TypeError(
                f"use_mesh({name!r}, mesh) takes a jax.sharding.Mesh, got "
                f"{type(mesh).__name__} {mesh!r}"
            )
        spec = self._specs.get(name)
        if spec is None:
            hint = did_you_mean(name, self._specs)
            listed = ", ".join(self._specs) or "none"
            axes = ", ".join(f"{axis}: {size}" for axis, size in mesh.shape.items())
            raise ValueError(
                f"use_mesh({name!r}, ...): the policy declares no mesh {name!r}{hint}; "
                f"meshes: {listed}. Declare it under `meshes:` with its axes, e.g. "
                f"`{name}: {{axes: {{{axes}}}}}`, so that rules can name it and `check` can "
                "check them"
            )
        problem = _given_problem(spec, dict(mesh.shape))
        if problem is not None:
            raise ValueError(f"use_mesh({name!r}, ...): {problem}")
        index = self.machine.process_index
        devices = tuple(mesh.devices.flat)
        local = tuple(d for d in devices if d.process_index == index)
        self._built[name] = (
            BuiltMesh(name, dict(mesh.shape), len(devices), local, mesh, devices, given=True)
            if local
            else f"mesh {name!r} (given in code) has no device of this process ({index})"
        )

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


def _given_problem(spec: MeshSpec, shape: dict[str, int]) -> str | None:
    """Why a mesh of `shape` (axis to size) is not the mesh `spec` declares, or None."""
    declared = list(spec.axes)
    if set(declared) != set(shape):
        return (
            f"the mesh has axes ({', '.join(shape)}), the policy declares "
            f"({', '.join(declared)}): rules name axes by these names, so they must be the same"
        )
    for axis, size in spec.axes.items():
        slices = 1 if spec.dcn is None else spec.dcn.get(axis, 1)
        if size == -1 or slices == -1:
            continue
        if shape[axis] != size * slices:
            stated = f"{size}" if slices == 1 else f"{slices}x{size} (dcn x axes)"
            return (
                f"axis {axis!r} has {shape[axis]} devices in the mesh, {stated} in the policy; "
                "make them agree, or write -1 in the policy for a size the program decides"
            )
    return None


def _build(name: str, spec: MeshSpec, machine: Machine[D]) -> BuiltMesh[D] | str:
    devices = _devices(spec.devices, machine)
    if isinstance(devices, str):
        return f"mesh {name!r}: {devices}"
    names = list(spec.axes)
    where = _where(spec.devices, machine)
    dcn: list[int] | None = None
    if spec.dcn is None:
        sizes = _sizes(list(spec.axes.values()), len(devices))
        if isinstance(sizes, str):
            described = shape_text(spec.axes, None)
            return f"mesh {name!r} ({described}) needs {sizes} {where} devices, {len(devices)} here"
    else:
        hybrid = _hybrid_sizes(name, spec, devices, where)
        if isinstance(hybrid, str):
            return hybrid
        sizes, dcn = hybrid
    try:
        mesh, order = machine.make_mesh(
            tuple(sizes), tuple(names), devices, None if dcn is None else tuple(dcn)
        )
    except Exception as e:  # JAX's own reason, in its words
        return f"mesh {name!r}: {type(e).__name__}: {e}"
    index = machine.process_index
    local = tuple(d for d in order if d.process_index == index)
    if not local:
        return f"mesh {name!r} has no device of this process ({index})"
    return BuiltMesh(
        name,
        dict(zip(names, sizes, strict=True)),
        len(devices),
        local,
        mesh,
        order,
        None if dcn is None else dict(zip(names, dcn, strict=True)),
    )


def _sizes(sizes: list[int], count: int) -> list[int] | str:
    """`sizes` with a -1 made the `count` left over, or how many the fixed sizes need
    (`8`, `a multiple of 4`)."""
    fixed = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if count % fixed or not count:
            return f"a multiple of {fixed}"
        sizes = list(sizes)
        sizes[sizes.index(-1)] = count // fixed
        return sizes
    return sizes if fixed == count else f"{fixed}"


def _hybrid_sizes(
    name: str, spec: MeshSpec, devices: list[D], where: str
) -> tuple[list[int], list[int]] | str:
    """A hybrid mesh's total size and slices per axis, the -1s resolved by the slices
    `devices` fall into and the devices in each, or why they do not fit."""
    assert spec.dcn is not None
    counts: dict[int, int] = {}
    for device in devices:
        key = slice_of(device)
        counts[key] = counts.get(key, 0) + 1
    tpu = bool(devices) and devices[0].platform == "tpu"
    unit = "slice" if tpu else "process"
    plural = "slices" if tpu else "processes"
    within = shape_text(spec.axes, None)
    across = shape_text(spec.dcn, None)
    described = f"mesh {name!r} (in each slice {within}; slices {across})"
    per_slice = set(counts.values())
    if len(per_slice) > 1:
        held = ", ".join(f"{unit} {k}: {n}" for k, n in sorted(counts.items()))
        return (
            f"{described}: its {plural} hold different numbers of {where} devices ({held}); "
            "a hybrid mesh needs the same in each"
        )
    count = per_slice.pop() if per_slice else 0
    ici = _sizes(list(spec.axes.values()), count)
    dcn = _sizes([spec.dcn.get(n, 1) for n in spec.axes], len(counts))
    if isinstance(ici, str) or isinstance(dcn, str):
        need_ici = ici if isinstance(ici, str) else str(math.prod(ici))
        need_dcn = dcn if isinstance(dcn, str) else str(math.prod(dcn))
        slices = "slice" if need_dcn == "1" else "slices"
        have = f"{len(counts)} {unit if len(counts) == 1 else plural}"
        return (
            f"{described} needs {need_dcn} {slices} of {need_ici} {where} devices each, "
            f"{have} of {count} here" + ("" if tpu else " (each process is a slice)")
        )
    return [i * d for i, d in zip(ici, dcn, strict=True)], dcn


def _where(devices: str | list[str], machine: Machine[D]) -> str:
    if isinstance(devices, list):
        return "listed"
    return machine.default_platform if devices == AUTO else PLATFORM_ALIASES.get(devices, devices)


def _devices(devices: str | list[str], machine: Machine[D]) -> list[D] | str:
    if isinstance(devices, list):
        found = []
        for text in devices:
            device = machine.find(parse_target(text))
            if isinstance(device, str):
                return f"{text}: {device}"
            found.append(device)
        return found
    # `accelerator` is resolved by the machine (its first TPU or GPU backend).
    platform = (
        machine.default_platform if devices == AUTO else PLATFORM_ALIASES.get(devices, devices)
    )
    return machine.backend_devices(platform)
