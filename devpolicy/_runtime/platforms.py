"""Which platforms JAX would start here, and what a policy's `platforms` becomes: read
without starting (or importing) JAX, as JAX itself finds its backends.

`JAX_PLATFORMS` is strict (every platform it names must start, or JAX starts none, the
CPU included), so a listed platform JAX would not start is dropped here, with a note
saying why; `gpu` and `accelerator` become the platforms JAX would start.

One function decides, `startable`; `devpolicy run`, `bootstrap()`, `devpolicy devices` and
`devpolicy check` all ask it (through `settings.plan_runtime`), so they agree for the same
folder. A library counts only where it is installed (a distribution on `sys.path`, or the
file `TPU_LIBRARY_PATH` names), never from the working directory or the script's folder
(`sys.path[0]`): a stray `libtpu.py` or `jax_plugins/` there is no runtime, and JAX, which
does import it, then fails to start that platform. A TPU also needs a chip, counted as
JAX's own TPU start-up counts them (`jax/_src/hardware_utils.py`); a CUDA or ROCm plugin
needs its GPU, seen as JAX sees it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.machinery
import importlib.metadata
import os
import pkgutil
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._base.errors import PolicyError, Problem

#: Where this machine's `/sys` and `/dev` are (tests point a probe at a tree of their own).
ROOT = Path("/")

# JAX counts a TPU chip as a PCI device of Google's vendor id with one of these device
# ids (`_TPU_PCI_DEVICE_IDS` in jax/_src/hardware_utils.py). Other Google PCI devices
# (the gVNIC network card of every GCE VM, 0x0042) are no chip. The installed jax's own
# table is read too, so a chip newer than this list counts where that jax knows it.
_GOOGLE_PCI_VENDOR = "0x1ae0"
_TPU_PCI_DEVICES = frozenset({"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076"})
_PCI_DEVICES = "sys/bus/pci/devices"
# JAX starts `cuda` only where one of these exists (`has_visible_nvidia_gpu`); it skips
# it quietly otherwise, and `JAX_PLATFORMS=cuda` alone then starts nothing.
_NVIDIA_DEVICES = ("dev/nvidia0", "dev/nvidiactl", "dev/dxg")
_KFD_NODES = "sys/class/kfd/kfd/topology/nodes"
_SIMD_COUNT = re.compile(r"\bsimd_count\s+(\d+)\b")
_LIBTPU_DISTRIBUTIONS = ("libtpu", "libtpu-nightly")
_ELF = b"\x7fELF"

_NO_GPU = "no GPU plugin installed (jax-cuda*-plugin, jax-rocm*-plugin)"
_NO_TPU = "no TPU runtime installed (libtpu: pip install 'jax[tpu]')"


@dataclass(frozen=True, slots=True)
class Startable:
    """The accelerator platforms JAX would start here, and why each other would not.

    Attributes:
        tpu: libtpu is installed where JAX finds it and a TPU chip is present.
        gpus: The GPU platforms (`cuda`, `rocm`) whose plugin is installed and whose GPU
            JAX sees.
        why_not: `(platform, reason)` for each accelerator JAX would not start here,
            `tpu`, `cuda` and `rocm` alike: what is missing, and any stray copy in the
            working directory that was not counted.
        libtpu: The TPU library JAX would load (`TPU_LIBRARY_PATH`, else the installed
            `libtpu` distribution's), chip or not; None where there is none.

    Example:
        >>> Startable(tpu=True, gpus=("cuda",)).accelerators
        ('tpu', 'cuda')
    """

    tpu: bool
    gpus: tuple[str, ...]
    why_not: tuple[tuple[str, str], ...] = ()
    libtpu: str | None = None

    @property
    def accelerators(self) -> tuple[str, ...]:
        """The accelerators in the order `accelerator` takes them: the TPU, then GPUs."""
        return (("tpu",) if self.tpu else ()) + self.gpus

    def reason(self, platform: str) -> str:
        """Why JAX would not start `platform` here (`gpu`: every GPU platform's reason)."""
        said = dict(self.why_not)
        if platform == "gpu":
            # Each part once: "no GPU plugin installed" is both cuda's and rocm's reason.
            parts = [part for p in ("cuda", "rocm") for part in said.get(p, "").split("; ")]
            return "; ".join(dict.fromkeys(filter(None, parts))) or _NO_GPU
        return said.get(platform) or (_NO_TPU if platform == "tpu" else _NO_GPU)


# Where libraries are looked for ----------------------------------------------------------


def _working_dirs(cwd: str | None) -> tuple[str, ...]:
    """The folders Python puts first on `sys.path` that hold no installation: the working
    directory (`python -c`, `-m`, the REPL, notebooks) and `sys.path[0]` (the script's
    folder for `python train.py`), unless `-P`/`PYTHONSAFEPATH` keeps it off. A working
    directory that was deleted (None) holds nothing to import."""
    dirs = [cwd]
    if sys.path and not getattr(sys.flags, "safe_path", False):
        dirs.append(sys.path[0] or cwd)
    return tuple(dict.fromkeys(r for r in map(_real, dirs) if r is not None))


def _cwd() -> str | None:
    """The working directory, or None when it was deleted."""
    try:
        return os.getcwd()
    except OSError:
        return None


def _real(path: str | None) -> str | None:
    """`path` resolved, or None: a relative path names nothing without a working directory."""
    try:
        return os.path.realpath(path) if path is not None else None
    except OSError:
        return None


def _installed_paths(path: Sequence[str], working: tuple[str, ...]) -> list[str]:
    return [p for p in path if p and _real(p) not in (*working, None)]


def _found_in(name: str, dirs: Iterable[str]) -> str | None:
    """Where Python's import would find module `name` in `dirs` (a module, a package, an
    extension such as `libtpu.so`, or a bare folder), without importing it."""
    for folder in dirs:
        with contextlib.suppress(ImportError, ValueError, OSError):
            spec = importlib.machinery.PathFinder.find_spec(name, [folder])
            if spec is not None:
                where = spec.origin if spec.has_location else None
                return where or os.path.join(folder, name)
    return None


def _is_library(path: str) -> bool:
    """A file a dynamic loader could load (an ELF shared object, as libtpu.so is)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == _ELF
    except OSError:
        return False


# The TPU -----------------------------------------------------------------------------------


@functools.cache
def _tpu_device_ids(installed: tuple[str, ...]) -> frozenset[str]:
    """JAX's table of TPU PCI device ids: ours and the installed jax's own (read as text)."""
    ids = set(_TPU_PCI_DEVICES)
    with contextlib.suppress(Exception):  # no jax, or a layout unlike this one: ours stands
        dist = next(iter(importlib.metadata.distributions(name="jax", path=list(installed))))
        source = Path(str(dist.locate_file("jax/_src/hardware_utils.py"))).read_text("utf-8")
        ids |= {m.lower() for m in re.findall(r"'(0x[0-9a-fA-F]{4})'\s*:\s*TpuVersion", source)}
    return frozenset(ids)


def tpu_chips(root: Path = ROOT, device_ids: frozenset[str] = _TPU_PCI_DEVICES) -> int:
    """The TPU chips attached here, counted as JAX's TPU start-up counts them
    (`num_available_tpu_chips_and_device_id`): PCI devices under `/sys/bus/pci/devices`
    whose vendor is Google's (0x1ae0) and whose device id is a TPU's.

    Args:
        root: Where the machine's `/sys` is (`/`).
        device_ids: The TPU device ids (default: the ids JAX 0.10 lists).

    Example:
        >>> import pathlib, tempfile
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> chip = root / "sys/bus/pci/devices/0000:00:05.0"
        >>> chip.mkdir(parents=True)
        >>> _ = (chip / "vendor").write_text("0x1ae0\\n"), (chip / "device").write_text("0x0063\\n")
        >>> tpu_chips(root)
        1
    """
    count = 0
    with contextlib.suppress(OSError):
        for device in (root / _PCI_DEVICES).iterdir():
            with contextlib.suppress(OSError):
                vendor = (device / "vendor").read_text().strip().lower()
                if vendor == _GOOGLE_PCI_VENDOR:
                    count += (device / "device").read_text().strip().lower() in device_ids
    return count


def _libtpu(named: str, installed: list[str], working: tuple[str, ...]) -> tuple[str | None, str]:
    """The TPU library JAX would load, as `cloud_tpu_init.get_tpu_library_path` finds it
    (the file `TPU_LIBRARY_PATH` names, else the `libtpu` module's), or why there is none."""
    fell_back = ""
    if named:
        if os.path.isfile(named):
            # JAX loads this file and no other: nothing else can stand in for it.
            if _is_library(named):
                return named, ""
            return None, f"TPU_LIBRARY_PATH={named} is not a shared library JAX can load"
        fell_back = f"; TPU_LIBRARY_PATH={named} is not a file"
    stray = _found_in("libtpu", working)
    for name in _LIBTPU_DISTRIBUTIONS:
        dist = next(iter(importlib.metadata.distributions(name=name, path=installed)), None)
        if dist is None:
            continue
        if stray is not None:
            return None, (
                f"{stray} in the working directory hides the installed {name} (JAX imports "
                "libtpu by name, the working directory first)"
            )
        library = str(dist.locate_file("libtpu/libtpu.so"))
        if _is_library(library):
            return library, ""
        return None, f"the installed {name} holds no loadable libtpu/libtpu.so"
    planted = f"; {stray} in the working directory is not an installed libtpu" if stray else ""
    return None, _NO_TPU + fell_back + planted


# The GPUs ----------------------------------------------------------------------------------


def nvidia_gpu_visible(root: Path = ROOT) -> bool:
    """Whether JAX would try its CUDA backend: an NVIDIA device file exists
    (`has_visible_nvidia_gpu`: `/dev/nvidia0`, `/dev/nvidiactl`, WSL's `/dev/dxg`)."""
    return any((root / d).exists() for d in _NVIDIA_DEVICES)


def amd_gpus(root: Path = ROOT) -> int:
    """AMD GPUs as JAX counts them (`num_available_amd_gpus`): WSL's `/dev/dxg` counts one;
    else each KFD topology node with a nonzero `simd_count`."""
    if (root / "dev/dxg").exists():
        return 1
    count = 0
    with contextlib.suppress(OSError):
        for node in (root / _KFD_NODES).iterdir():
            with contextlib.suppress(OSError, ValueError):
                found = _SIMD_COUNT.search((node / "properties").read_text("ascii")[:16384])
                count += bool(found and int(found.group(1)) > 0)
    return count


def _plugin_modules(dirs: Iterable[str]) -> set[str]:
    names: set[str] = set()
    for folder in dirs:
        plugins = os.path.join(folder, "jax_plugins")
        if os.path.isdir(plugins):
            with contextlib.suppress(OSError):
                names |= {m.name for m in pkgutil.iter_modules([plugins])}
    return names


def _gpus(
    root: Path, installed: list[str], working: tuple[str, ...]
) -> tuple[tuple[str, ...], list[tuple[str, str]]]:
    """The GPU platforms JAX would start, and why each other would not. JAX finds plugins
    as modules of the `jax_plugins` namespace or `jax_plugins` entry points (`xla_cuda12`,
    `xla_rocm7`...); so does this, in installed places only, without importing them."""
    names = _plugin_modules(installed)
    # A broken distribution's metadata must not stop start-up.
    with contextlib.suppress(Exception):
        for dist in importlib.metadata.distributions(path=installed):
            names |= {
                part
                for e in dist.entry_points
                if e.group == "jax_plugins"
                for part in (e.name, e.value)
            }
    stray = _plugin_modules(working)
    found: list[str] = []
    why: list[tuple[str, str]] = []
    for platform, seen, device in (
        ("cuda", nvidia_gpu_visible(root), "no NVIDIA GPU visible (/dev/nvidia*)"),
        ("rocm", amd_gpus(root) > 0, "no AMD GPU visible (/sys/class/kfd)"),
    ):
        mine = {n.rpartition(".")[2] for n in names if platform in n}
        planted = sorted(n for n in stray if platform in n)
        hiding = [n for n in planted if n in mine]
        if hiding:
            hides = f"jax_plugins/{hiding[0]} in the working directory hides the installed plugin"
            why.append((platform, hides))
        elif not mine:
            tail = "".join(
                f"; jax_plugins/{n} in the working directory is not an installed plugin"
                for n in planted
            )
            why.append((platform, _NO_GPU + tail))
        elif not seen:
            why.append((platform, f"its plugin is installed but {device}"))
        else:
            found.append(platform)
    return tuple(found), why


# The one answer ----------------------------------------------------------------------------


def startable(
    environ: Mapping[str, str] | None = None,
    *,
    root: Path | None = None,
    path: Sequence[str] | None = None,
    cwd: str | None = None,
) -> Startable:
    """The accelerator platforms JAX would start here, read without starting (or
    importing) JAX: the one answer `devpolicy run`, `bootstrap()`, `devices` and `check`
    ask for.

    The TPU: libtpu where JAX finds it (the file `TPU_LIBRARY_PATH` names, if it is a
    shared library; else an installed `libtpu` distribution), and a chip counted as JAX
    counts them (`tpu_chips`). A GPU: its plugin installed (a `jax_plugins` module or entry
    point) and its GPU visible as JAX sees it. Installed means on `sys.path` outside the
    working directory and the script's folder: a stray `libtpu.py`, `libtpu/`, `libtpu.so`
    or `jax_plugins/` there is no runtime (and one that shadows the installed library
    stops JAX from starting that platform).

    Args:
        environ: The environment the program will have (default `os.environ`).
        root: Where the machine's `/sys` and `/dev` are (default `/`).
        path: Where installed packages are looked for (default `sys.path`).
        cwd: The working directory (default the current one).

    Example:
        >>> import pathlib, tempfile
        >>> empty = tempfile.mkdtemp()
        >>> startable({}, root=pathlib.Path(empty), path=[empty], cwd=empty).accelerators
        ()
    """
    env = os.environ if environ is None else environ
    return _startable(
        env.get("TPU_LIBRARY_PATH", ""),
        ROOT if root is None else root,
        tuple(sys.path if path is None else path),
        _working_dirs(_cwd() if cwd is None else cwd),
    )


# Cached by everything it reads, so a changed folder or variable is read afresh.
@functools.lru_cache(maxsize=16)
def _startable(
    library_path: str, root: Path, path: tuple[str, ...], working: tuple[str, ...]
) -> Startable:
    installed = _installed_paths(path, working)
    library, why_no_tpu = _libtpu(library_path, installed, working)
    gpus, why = _gpus(root, installed, working)
    tpu = library is not None and tpu_chips(root, _tpu_device_ids(tuple(installed))) > 0
    if library is not None and not tpu:
        why_no_tpu = (
            f"libtpu is installed but no TPU chip is attached (JAX counts PCI devices of "
            f"vendor {_GOOGLE_PCI_VENDOR} under /{_PCI_DEVICES}: none here)"
        )
    tpu_why = [] if tpu else [("tpu", why_no_tpu)]
    return Startable(tpu, gpus, (*tpu_why, *why), library)


def tpu_installed() -> bool:
    """Whether libtpu is installed where JAX finds it (chip or not)."""
    return startable().libtpu is not None


# A policy's `platforms` --------------------------------------------------------------------


def translate_platforms(
    value: tuple[str, ...], origin: str, machine: Startable
) -> tuple[list[str], str]:
    """JAX_PLATFORMS for a policy's `platforms`: `gpu` as the GPU platforms JAX would start,
    `accelerator` as the TPU where JAX would start one, else those GPUs; a platform JAX
    would not start is dropped with a note saying why (JAX_PLATFORMS is strict: one
    platform that cannot start leaves JAX with no backend at all).

    Example:
        >>> translate_platforms(("accelerator", "cpu"), "p.yaml:3", Startable(False, ()))[0]
        ['cpu']

    Raises:
        PolicyError: nothing listed would start (add cpu as a fallback).
    """
    out: list[str] = []
    notes: list[str] = []
    for platform in value:
        if platform == "gpu":
            found = machine.gpus
            notes.append(
                f"gpu -> {','.join(found)} (GPU plugins installed, GPUs visible)"
                if found
                else f"gpu dropped: {machine.reason('gpu')}"
            )
        elif platform == "accelerator":
            found = machine.accelerators[:1] if machine.tpu else machine.gpus
            notes.append(
                f"accelerator -> {','.join(found)}"
                if found
                else f"accelerator dropped: {machine.reason('tpu')}; {machine.reason('gpu')}"
            )
        elif platform in ("tpu", "cuda", "rocm") and platform not in machine.accelerators:
            found = ()
            notes.append(f"{platform} dropped: {machine.reason(platform)}")
        else:
            found = (platform,)
        for p in found:
            if p not in out:
                out.append(p)
    note = "; ".join(notes)
    if not out:
        file, _, line = origin.rpartition(":")
        where = Problem(
            file or origin,
            int(line) if line.isdigit() else None,
            "runtime.platforms",
            f"{note}; add cpu as a fallback",
        )
        raise PolicyError([where])
    return out, note


def hidden_by(
    value: tuple[str, ...], started: list[str], origin: str, installed: tuple[str, ...]
) -> tuple[str, ...]:
    """The accelerators JAX would start here that `started` (JAX_PLATFORMS from the
    policy's `platforms`) leaves out: one line for each, naming it and the policy's line."""
    return tuple(
        f"{origin}: runtime.platforms [{', '.join(value)}] hides {platform}, installed here: "
        f"JAX will not use it (write `accelerator` in `platforms`, or leave `platforms` out)"
        for platform in installed
        if platform not in started
    )


def jax_platform(platforms: str | None, installed: tuple[str, ...]) -> str:
    """The platform JAX will make its default: the first of `platforms` (JAX_PLATFORMS
    text; `cuda`, `rocm` are `gpu`), or with none given the first accelerator JAX would
    start (a TPU before a GPU), else `cpu`.

    Example:
        >>> jax_platform("cuda,cpu", ()), jax_platform(None, ("tpu",)), jax_platform(None, ())
        ('gpu', 'tpu', 'cpu')
    """
    first = platforms.split(",")[0].strip() if platforms else (installed[:1] or ("cpu",))[0]
    return "gpu" if first in ("cuda", "rocm") else first
