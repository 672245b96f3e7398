"""The machine decisions are made for: the devices a walk may find and meshes may span.

The fallback walk and the mesh builder ask a `Machine`, never JAX directly, so that one
walk serves both this process (`Inventory`, over JAX) and a machine described in words
(`VirtualMachine`: `gpu=8x80GiB` in each of 2 processes) that `plan` can plan for
without having it. No JAX here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from typing_extensions import TypeVar

from .._base.errors import MachineSpecError, did_you_mean
from .._base.sizes import SIZE_FORMS, format_size, parse_size
from .._document.targets import (
    ACCELERATOR,
    ACCELERATOR_PLATFORMS,
    KNOWN_PLATFORMS,
    PLATFORM_ALIASES,
    Target,
)

if TYPE_CHECKING:
    from jax.sharding import Mesh


class DeviceLike(Protocol):
    """What devpolicy reads of a device: a `jax.Device`, or a `VirtualDevice`."""

    @property
    def platform(self) -> str:
        """`cpu`, `gpu`, `tpu`."""
        ...

    @property
    def id(self) -> int:
        """Its id across every process."""
        ...

    @property
    def process_index(self) -> int:
        """The process it belongs to."""
        ...


D = TypeVar("D", bound=DeviceLike)

#: How `--devices` (and `VirtualMachine`) describe one backend.
DEVICES_FORMS = (
    "BACKEND=COUNTxSIZE such as gpu=8x80GiB or cpu=1x512GiB (BACKEND: "
    + ", ".join(PLATFORM_ALIASES)
    + "; COUNT devices in each process, SIZE the memory of each; xSIZE may be left out: "
    "memory unknown)"
)
PROCESSES_FORMS = "a whole number of processes, 1 or more"
SLICES_FORMS = "a whole number of slices that divides the processes"
#: Devices of a described machine, all processes together: a large pod is a few tens of
#: thousands; past this a typo (`--processes 65536`) would build billions of objects.
MAX_PLANNED_DEVICES = 1 << 20
MAX_DEVICES = 65536
#: What JAX 0.10 offers on every backend; a described machine is assumed to offer the same.
VIRTUAL_MEMORY_KINDS = ("device", "pinned_host", "unpinned_host")
# The order JAX prefers backends in: the default is the first one present.
_PREFERENCE = (*ACCELERATOR_PLATFORMS, "cpu")
# ASCII only, with nothing around the parts: `str.isdigit` and `int` also take '٣', '²'
# (isdigit only) and ' 3', which a count written on a command line never means.
_BACKEND = re.compile(r"([A-Za-z][A-Za-z0-9_]*)=(.*)", re.ASCII | re.DOTALL)
_COUNT = re.compile(r"([^xX]*)(?:[xX](.*))?", re.DOTALL)
_DIGITS = re.compile(r"[0-9]+", re.ASCII)


class Machine(Protocol[D]):
    """What the fallback walk and the mesh builder need to know about a machine.

    Device indices in targets (`gpu:1`) are process-local; a mesh spans every process.
    """

    @property
    def process_index(self) -> int:
        """The process decisions are made in."""
        ...

    @property
    def default_platform(self) -> str:
        """The platform `devices: auto` meshes use."""
        ...

    @property
    def accelerator(self) -> str | None:
        """The platform `accelerator` resolves to (`tpu`, then `gpu`), or None."""
        ...

    def find(self, target: Target) -> D | str:
        """The device a (non-auto) target names in this process (`accelerator`: on the
        platform `accelerator` is), or why it cannot be had."""
        ...

    def default_device(self) -> D:
        """The device `auto` stands for now."""
        ...

    def backend_devices(self, platform: str) -> list[D] | str:
        """Every process's devices of `platform`, in mesh order, or why there are none."""
        ...

    def text(self, device: D) -> str:
        """Target text of a device (`gpu:1`), by its process-local index."""
        ...

    def available(self) -> list[str]:
        """Target text of every device of this process."""
        ...

    def missing_for(self, platforms: set[str]) -> dict[str, str]:
        """Why each of `platforms` is absent, for those that are."""
        ...

    def memory_kinds(self, device: D) -> tuple[str, ...]:
        """The memory kinds a device offers."""
        ...

    def make_mesh(
        self,
        sizes: tuple[int, ...],
        names: tuple[str, ...],
        devices: list[D],
        dcn: tuple[int, ...] | None = None,
    ) -> tuple[Mesh | None, tuple[D, ...]]:
        """A mesh of `devices` of shape `sizes` (None where no JAX mesh can exist) and
        every device of it in mesh order. With `dcn` (slices per axis), a hybrid mesh:
        each slice (`slice_of`) a block of `sizes / dcn`, as JAX's
        `mesh_utils.create_hybrid_device_mesh` lays them out. May raise: the caller turns
        that into a reason."""
        ...


def slice_of(device: DeviceLike) -> int:
    """The slice a device belongs to in a hybrid (multi-slice) mesh: its `slice_index` on
    TPU, its process elsewhere (JAX's `process_is_granule=True`: CPU and GPU devices have
    no slice)."""
    if device.platform == "tpu":
        index = getattr(device, "slice_index", None)
        if isinstance(index, int):
            return index
    return device.process_index


def hybrid_order(
    devices: Sequence[D], sizes: tuple[int, ...], dcn: tuple[int, ...]
) -> tuple[D, ...]:
    """`devices` in the order of a hybrid mesh of shape `sizes` over `dcn` slices per axis:
    JAX's `mesh_utils.create_hybrid_device_mesh` without asking JAX, for a machine
    described in words. Slices (`slice_of`) in ascending order fill the `dcn` grid
    row-major; each is a block of `sizes / dcn` devices in their order (by id on GPU, as
    JAX orders a GPU slice), at its place in the grid.

    Raises:
        ValueError: the slices do not match `dcn`, or a slice does not fill its block.

    Example:
        >>> from devpolicy._machine.machine import VirtualMachine
        >>> vm = VirtualMachine(["gpu=2"], processes=2)
        >>> order = hybrid_order(vm.backend_devices("gpu"), (2, 2), (2, 1))
        >>> [(d.process_index, d.index) for d in order]
        [(0, 0), (0, 1), (1, 0), (1, 1)]
        >>> order = hybrid_order(vm.backend_devices("gpu"), (2, 2), (1, 2))
        >>> [(d.process_index, d.index) for d in order]
        [(0, 0), (1, 0), (0, 1), (1, 1)]
    """
    ici = tuple(size // slices for size, slices in zip(sizes, dcn, strict=True))
    grouped: dict[int, list[D]] = {}
    for device in devices:
        grouped.setdefault(slice_of(device), []).append(device)
    slices = [grouped[key] for key in sorted(grouped)]
    if math.prod(dcn) != len(slices):
        raise ValueError(f"{len(slices)} slices for dcn {dcn} ({math.prod(dcn)} slices)")
    per_slice = math.prod(ici)
    placed: dict[tuple[int, ...], D] = {}
    for number, members in enumerate(slices):
        if len(members) != per_slice:
            raise ValueError(f"slice {number} has {len(members)} devices, not {per_slice}")
        if members[-1].platform == "gpu":
            members = sorted(members, key=lambda d: d.id)
        corner = tuple(g * i for g, i in zip(_unravel(number, dcn), ici, strict=True))
        for position, device in enumerate(members):
            within = _unravel(position, ici)
            placed[tuple(c + w for c, w in zip(corner, within, strict=True))] = device
    return tuple(placed[_unravel(flat, sizes)] for flat in range(math.prod(sizes)))


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major coordinates of position `flat` in `shape`."""
    coords = []
    for size in reversed(shape):
        flat, coord = divmod(flat, size)
        coords.append(coord)
    return tuple(reversed(coords))


def accelerator_of(platforms: Iterable[str]) -> str | None:
    """The platform `accelerator` resolves to on a machine with `platforms`: its TPU if it
    has one, else its GPU, or None where it has neither.

    Example:
        >>> accelerator_of(["cpu", "gpu", "tpu"]), accelerator_of(["cpu"])
        ('tpu', None)
    """
    have = set(platforms)
    return next((p for p in ACCELERATOR_PLATFORMS if p in have), None)


def resolved_platforms(platforms: set[str]) -> set[str]:
    """`platforms` with `accelerator` standing for every platform it may resolve to (what
    an error lists as absent)."""
    if ACCELERATOR not in platforms:
        return platforms
    return (platforms - {ACCELERATOR}) | set(ACCELERATOR_PLATFORMS)


def no_accelerator(where: str) -> str:
    """Why `accelerator` names no device: `where` has neither a TPU nor a GPU backend."""
    return f"no accelerator ({' or '.join(ACCELERATOR_PLATFORMS)} backend) {where}"


def out_of_range(target: Target, count: int) -> str:
    """Why `target`'s index is not one of `count` local devices."""
    platform = target.platform
    have = f"{platform}:0..{platform}:{count - 1}"
    return f"index {target.index} out of range ({count} local {platform} devices: {have})"


@dataclass(frozen=True, slots=True)
class VirtualDevice:
    """One device of a `VirtualMachine`: enough of a `jax.Device` to plan with.

    Attributes:
        platform: `cpu`, `gpu` or `tpu`.
        id: Its id across every process (process-major, like JAX's).
        process_index: The process it belongs to.
        index: Its index among its process's devices of its platform (`gpu:3` has 3).
        slice_index: The slice a TPU belongs to (the processes split evenly over the
            slices, as on a multi-slice TPU job); None off TPU, where each process is a
            slice (see `slice_of`).
    """

    platform: str
    id: int
    process_index: int
    index: int
    slice_index: int | None = None

    def __str__(self) -> str:
        return f"{self.platform}:{self.index}"


@dataclass(frozen=True, slots=True)
class _Backend:
    count: int
    memory: int | None


class VirtualMachine:
    """A machine described in words, for planning where a checkpoint would go on it.

    Each item describes one backend in every process: `gpu=8x80GiB` is 8 GPUs of 80 GiB;
    `cpu=1x512GiB` one CPU device with 512 GiB (the memory may be left out: `cpu=1`, then
    it is unknown and never judged too small). `cpu` is always present (`cpu=1` unless
    given). `processes` identical processes each have these devices: a mesh over `gpu`
    spans processes x 8 devices, and targets such as `gpu:3` name each process's own.
    The TPUs of the processes are in `slices` slices (default 1: a pod of 64 hosts is one
    slice), the processes split evenly over them in order, as JAX's `slice_index` has
    them; a hybrid mesh (`dcn`) spans the slices. CPU and GPU devices have no slices: for
    them each process is one (JAX's `process_is_granule`), and `slices`, if given, must
    be the processes.
    Decisions are made in process 0; every process decides alike. It is also the capacity
    placement judges sizes by: each device has its stated memory, all of it free.

    Args:
        devices: One `BACKEND=COUNTxSIZE` text per backend.
        processes: How many identical processes.
        slices: How many TPU slices the processes are in (None: 1 with a TPU backend,
            else one per process).
        option: What names the devices in errors (`--devices` on the command line).
        slices_option: What names the slices in errors (`--slices`).

    Raises:
        MachineSpecError: naming the bad text or count and the accepted form.

    Example:
        >>> vm = VirtualMachine(["gpu=8x80GiB"], processes=2)
        >>> str(vm), len(vm.backend_devices("gpu"))
        ('cpu=1 (memory unknown), gpu=8x80GiB; 2 processes', 16)
        >>> str(VirtualMachine(["tpu=4x16GiB"], processes=64, slices=2))
        'cpu=1 (memory unknown), tpu=4x16GiB; 64 processes in 2 slices'
    """

    def __init__(
        self,
        devices: Iterable[str],
        processes: int = 1,
        slices: int | None = None,
        *,
        option: str = "devices",
        slices_option: str = "slices",
    ) -> None:
        if isinstance(devices, str):
            devices = [devices]
        backends: dict[str, _Backend] = {}
        for text in devices:
            platform, backend = parse_backend(text, option)
            if platform in backends:
                raise MachineSpecError(
                    option, text, f"{platform} is described twice", DEVICES_FORMS
                )
            backends[platform] = backend
        backends.setdefault("cpu", _Backend(1, None))
        self.processes = check_processes(processes, "processes")
        total = self.processes * sum(b.count for b in backends.values())
        if total > MAX_PLANNED_DEVICES:
            raise MachineSpecError(
                "processes",
                self.processes,
                f"{total:,} devices in all; a plan describes at most {MAX_PLANNED_DEVICES:,}",
                f"{PROCESSES_FORMS}, with processes x devices at most {MAX_PLANNED_DEVICES:,}",
            )
        self.tpu = "tpu" in backends
        #: How many slices a hybrid mesh spans: the TPU slices, or off TPU the processes.
        self.slices = check_slices(slices, self.processes, self.tpu, slices_option)
        per_slice = self.processes // self.slices
        # Listed in the order `devpolicy devices` lists backends.
        self._backends = {p: backends[p] for p in sorted(backends, key=_rank)}
        self._devices = {
            platform: [
                VirtualDevice(
                    platform,
                    process * b.count + i,
                    process,
                    i,
                    process // per_slice if platform == "tpu" else None,
                )
                for process in range(self.processes)
                for i in range(b.count)
            ]
            for platform, b in self._backends.items()
        }
        self.default_platform = next(p for p in _PREFERENCE if p in self._backends)

    @property
    def process_index(self) -> int:
        """Decisions are made in process 0 (every process decides alike)."""
        return 0

    @property
    def platforms(self) -> tuple[str, ...]:
        """The platforms described."""
        return tuple(self._backends)

    def local(self, platform: str) -> list[VirtualDevice]:
        """Process 0's devices of `platform` (none if absent)."""
        return [d for d in self._devices.get(platform, []) if d.process_index == 0]

    @property
    def accelerator(self) -> str | None:
        """The platform `accelerator` resolves to here (`tpu`, `gpu`), or None.

        Example:
            >>> VirtualMachine(["tpu=1x16GiB"]).accelerator, VirtualMachine([]).accelerator
            ('tpu', None)
        """
        return accelerator_of(self._backends)

    def find(self, target: Target) -> VirtualDevice | str:
        """The device a (non-auto) target names in process 0, or why it cannot be had;
        `accelerator` is the first TPU or GPU backend described.

        Example:
            >>> from devpolicy._document.targets import parse_target
            >>> VirtualMachine(["gpu=2x80GiB"]).find(parse_target("accelerator:1"))
            VirtualDevice(platform='gpu', id=1, process_index=0, index=1, slice_index=None)
        """
        if target.is_accelerator:
            platform = self.accelerator
            if platform is None:
                return no_accelerator(f"on the planned machine ({self})")
            target = target.on(platform)
        local = self.local(target.platform)
        if not local:
            return f"no {target.platform} backend on the planned machine ({self})"
        index = target.index or 0
        if index >= len(local):
            return out_of_range(target, len(local))
        return local[index]

    def default_device(self) -> VirtualDevice:
        """Process 0's first device of the preferred backend."""
        return self.local(self.default_platform)[0]

    def backend_devices(self, platform: str) -> list[VirtualDevice] | str:
        """Every process's devices of `platform` (`accelerator`: the first TPU or GPU
        backend), process by process."""
        if platform == ACCELERATOR:
            found = self.accelerator
            if found is None:
                return no_accelerator(f"on the planned machine ({self})")
            platform = found
        devices = self._devices.get(platform)
        if devices is None:
            return f"no {platform} backend on the planned machine ({self})"
        return list(devices)

    def text(self, device: VirtualDevice) -> str:
        """`gpu:3`: the device's process-local target text."""
        return str(device)

    def available(self) -> list[str]:
        """Target text of every device of process 0."""
        return [str(d) for p in self._backends for d in self.local(p)]

    def missing_for(self, platforms: set[str]) -> dict[str, str]:
        """Each of `platforms` the description lacks (`accelerator`: TPU and GPU)."""
        asked = resolved_platforms(platforms)
        return {
            p: f"not on the planned machine ({self})"
            for p in KNOWN_PLATFORMS
            if p in asked and p not in self._backends
        }

    def memory_kinds(self, device: VirtualDevice) -> tuple[str, ...]:
        """The memory kinds JAX offers on every backend."""
        return VIRTUAL_MEMORY_KINDS

    def make_mesh(
        self,
        sizes: tuple[int, ...],
        names: tuple[str, ...],
        devices: list[VirtualDevice],
        dcn: tuple[int, ...] | None = None,
    ) -> tuple[Mesh | None, tuple[VirtualDevice, ...]]:
        """No JAX mesh (its devices do not exist); every device in mesh order: as listed
        (process-major), or for a hybrid mesh as `hybrid_order` lays the slices out (TPU
        slices, or off TPU each process a slice)."""
        if math.prod(sizes) != len(devices):  # pragma: no cover - the sizing checks this
            raise ValueError(f"{len(devices)} devices for a mesh of {math.prod(sizes)}")
        if dcn is None:
            return None, tuple(devices)
        return None, hybrid_order(devices, sizes, dcn)

    def free_bytes(self, device: VirtualDevice) -> int | None:
        """The device's stated memory (all of it free), or None when not given."""
        return self._backends[device.platform].memory

    def memory(self, platform: str) -> int | None:
        """The stated memory of each `platform` device, or None."""
        backend = self._backends.get(platform)
        return None if backend is None else backend.memory

    def pool(self, device: VirtualDevice) -> Hashable:
        """Each device has its own stated memory."""
        return device

    def __str__(self) -> str:
        parts = [
            f"{p}={b.count}x{_compact(b.memory)}"
            if b.memory is not None
            else f"{p}={b.count} (memory unknown)"
            for p, b in self._backends.items()
        ]
        count = f"{self.processes} process{'' if self.processes == 1 else 'es'}"
        if self.tpu:
            count += f" in {self.slices} slice{'' if self.slices == 1 else 's'}"
        return f"{', '.join(parts)}; {count}"

    def __repr__(self) -> str:
        return f"<devpolicy.VirtualMachine {self}>"


def _compact(nbytes: int) -> str:
    """`80GiB`, `1.5GiB`: a size as `--devices` writes it."""
    return format_size(nbytes).replace(".0 ", "").replace(" ", "")


def _rank(platform: str) -> int:
    return KNOWN_PLATFORMS.index(platform)


def parse_backend(text: object, option: str = "devices") -> tuple[str, _Backend]:
    """One `BACKEND=COUNTxSIZE` text as (platform, its count and memory).

    Raises:
        MachineSpecError: naming `option`, the text and the accepted form.
    """
    if not isinstance(text, str):
        raise MachineSpecError(option, text, f"not text but {type(text).__name__}", DEVICES_FORMS)
    m = _BACKEND.fullmatch(text)
    if m is None:
        raise MachineSpecError(option, text, "not BACKEND=COUNTxSIZE", DEVICES_FORMS)
    name, rest = m.groups()
    platform = PLATFORM_ALIASES.get(name.lower())
    if platform is None:
        hint = did_you_mean(name, PLATFORM_ALIASES)
        raise MachineSpecError(option, text, f"unknown backend {name!r}{hint}", DEVICES_FORMS)
    counted = _COUNT.fullmatch(rest)
    if counted is None or not _DIGITS.fullmatch(counted.group(1)):
        raise MachineSpecError(
            option,
            text,
            f"{rest!r} is not COUNT or COUNTxSIZE (COUNT: the digits 0-9, nothing else)",
            DEVICES_FORMS,
        )
    count_text, size_text = counted.groups()
    count = parse_count(count_text, MAX_DEVICES)
    if count is None:
        shown = (
            f"{count_text} devices"
            if len(count_text) <= 20
            else f"{len(count_text):,} digits of devices"
        )
        raise MachineSpecError(
            option, text, f"a count of {shown} (1..{MAX_DEVICES})", DEVICES_FORMS
        )
    memory = None
    if size_text is not None:
        try:
            memory = parse_size(size_text)
        except ValueError as e:  # its own "accepted:" would come twice: SIZE_FORMS says it
            problem = str(e).split("; accepted", 1)[0]
            accepted = f"{DEVICES_FORMS}; SIZE: {SIZE_FORMS}"
            raise MachineSpecError(option, text, problem, accepted) from None
    return platform, _Backend(count, memory)


def parse_count(text: str, limit: int) -> int | None:
    """`text` as a count 1..`limit` if it is only ASCII digits and in range, else None.

    Never hands `int` more digits than it takes (a 5,000-digit count is out of range, not
    `int`'s digit-limit ValueError).

    Example:
        >>> parse_count("8", 16), parse_count("008", 16), parse_count("٣", 16), parse_count(" 3", 9)
        (8, 8, None, None)
        >>> parse_count("9" * 5000, 16) is None
        True
    """
    if not _DIGITS.fullmatch(text):
        return None
    significant = text.lstrip("0")
    if len(significant) > len(str(limit)):
        return None
    count = int(significant or "0")
    return count if 1 <= count <= limit else None


def check_processes(value: object, option: str = "processes") -> int:
    """A process count: an int of at least 1.

    Raises:
        MachineSpecError: naming `option`, the value and the accepted form.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise MachineSpecError(option, value, "not a whole number", PROCESSES_FORMS)
    if not 1 <= value <= MAX_DEVICES:
        raise MachineSpecError(option, value, "out of range", PROCESSES_FORMS)
    return value


def check_slices(value: object, processes: int, tpu: bool, option: str = "slices") -> int:
    """How many slices `processes` processes are in: `value` (None: 1 on a machine with
    TPUs, else one per process), which must divide them evenly (and, without TPUs, be
    them: CPU and GPU devices have no slices, each process is one).

    Raises:
        MachineSpecError: naming `option`, the value, and every count that would do.

    Example:
        >>> check_slices(None, 64, tpu=True), check_slices(None, 4, tpu=False)
        (1, 4)
        >>> try:
        ...     check_slices(3, 4, tpu=True)
        ... except MachineSpecError as e:
        ...     print(e.accepted)
        a whole number of slices that divides the processes, for 4 processes: 1, 2 or 4
    """
    if value is None:
        return 1 if tpu else processes
    valid = [n for n in range(1, processes + 1) if processes % n == 0] if tpu else [processes]
    shown = ", ".join(map(str, valid[:-1])) + (" or " if len(valid) > 1 else "") + str(valid[-1])
    accepted = f"{SLICES_FORMS}, for {processes} process{'' if processes == 1 else 'es'}: {shown}"
    if isinstance(value, bool) or not isinstance(value, int):
        problem = "not a whole number"
    elif value < 1:
        problem = "out of range"
    elif value > processes:
        problem = f"more slices than the {processes} processes"
    elif processes % value:
        problem = f"{processes} processes do not split evenly over {value} slices"
    elif not tpu and value != processes:
        problem = (
            "the machine has no tpu backend: CPU and GPU devices have no slices, each "
            "process is one (JAX's process_is_granule)"
        )
    else:
        return value
    raise MachineSpecError(option, value, problem, accepted)
