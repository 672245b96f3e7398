"""Device discovery: the only module that asks JAX which devices exist."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import jax
import jax.extend
from jax.sharding import AxisType, Mesh

from .._base.errors import DeviceUnavailableError, did_you_mean
from .._document.targets import (
    ACCELERATOR,
    KNOWN_PLATFORMS,
    PLATFORM_ALIASES,
    Target,
    parse_target,
)
from .._runtime.platforms import tpu_installed
from .machine import accelerator_of, no_accelerator, out_of_range, resolved_platforms

GPU_HINT = "pip install 'devpolicy[cuda13]'"
TPU_HINT = "pip install 'jax[tpu]'"


@dataclass(frozen=True)
class Inventory:
    """The backends this process can use, and why the others are absent.

    Device indices are process-local (`jax.local_devices(backend=...)`): in a
    multi-process run `gpu:0` is each process's own first GPU, never another's.

    Attributes:
        devices: Each available platform's local devices, in JAX's order.
        missing: Each known platform that is absent, with JAX's reason.
        process_index: This process's index in a multi-process run (0 otherwise).
        default_platform: The platform JAX uses by default.
    """

    devices: dict[str, tuple[jax.Device, ...]]
    missing: dict[str, str]
    process_index: int
    default_platform: str
    _texts: dict[jax.Device, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for platform, devices in self.devices.items():
            for i, device in enumerate(devices):
                self._texts[device] = f"{platform}:{i}"

    def text(self, device: jax.Device) -> str:
        """Target text of a device (`gpu:1`), using its process-local index."""
        text = self._texts.get(device)
        return text if text is not None else f"{device.platform}:id{device.id}"

    def memory_kinds(self, device: jax.Device) -> tuple[str, ...]:
        """The memory kinds `device` offers (`device`, `pinned_host`, ...); () if it says none.

        Example:
            >>> import devpolicy
            >>> "unpinned_host" in devpolicy.inventory().memory_kinds(devpolicy.get_device("cpu"))
            True
        """
        return memory_kinds(device)

    def available(self) -> list[str]:
        """Target text of every device this process can use."""
        return [self.text(d) for devices in self.devices.values() for d in devices]

    def missing_for(self, platforms: set[str]) -> dict[str, str]:
        """Why each of `platforms` is absent, for those that are (errors name only these;
        `accelerator` stands for TPU and GPU)."""
        asked = resolved_platforms(platforms)
        return {p: why for p, why in self.missing.items() if p in asked}

    @property
    def accelerator(self) -> str | None:
        """The platform `accelerator` resolves to in this process (`tpu`, `gpu`), or None."""
        return accelerator_of(self.devices)

    def find(self, target: Target) -> jax.Device | str:
        """The device a (non-auto) target names, or why it cannot be had; `accelerator`
        is the first TPU or GPU backend this process has."""
        if target.is_accelerator:
            platform = self.accelerator
            if platform is None:
                return no_accelerator("in this process")
            target = target.on(platform)
        devices = self.devices.get(target.platform)
        if devices is None:
            return f"no {target.platform} backend in this process"
        index = target.index or 0
        if index >= len(devices):
            return out_of_range(target, len(devices))
        return devices[index]

    # The rest of `Machine` (see `_machine`): what the walk and the mesh builder ask.

    def default_device(self) -> jax.Device:
        """The device JAX places new arrays on in this thread now (see
        `current_default_device`)."""
        return current_default_device()

    def backend_devices(self, platform: str) -> list[jax.Device] | str:
        """Every process's devices of `platform` (a mesh of a jax.distributed job spans
        them all; `accelerator`: the first TPU or GPU backend), or why there are none."""
        if platform == ACCELERATOR:
            found = self.accelerator
            if found is None:
                return no_accelerator("in this process")
            platform = found
        if platform not in self.devices:
            why = self.missing.get(platform, "not started")
            return f"no {platform} backend in this process ({why})"
        try:
            return list(jax.devices(platform))
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    def make_mesh(
        self,
        sizes: tuple[int, ...],
        names: tuple[str, ...],
        devices: list[jax.Device],
        dcn: tuple[int, ...] | None = None,
    ) -> tuple[Mesh | None, tuple[jax.Device, ...]]:
        """A JAX mesh of `devices` and every device of it, in mesh order. With `dcn`
        (slices per axis) JAX's own hybrid layout, `create_hybrid_device_mesh`: slices by
        `slice_index` on TPU, each process a slice elsewhere (`process_is_granule`)."""
        # Auto axes: the classic sharding propagation a device_put or jit user expects;
        # Explicit axes would change how every computation under the mesh is typed.
        auto = (AxisType.Auto,) * len(names)
        if dcn is None:
            # axis_types by keyword (keyword-only before jax 0.7.0); sizes by position (the
            # parameter is `axis_shapes` before jax 0.11.1, `axis_sizes` from it).
            mesh = jax.make_mesh(sizes, names, axis_types=auto, devices=devices)
        else:
            from jax.experimental import mesh_utils

            ici = tuple(size // slices for size, slices in zip(sizes, dcn, strict=True))
            grid = mesh_utils.create_hybrid_device_mesh(
                ici, dcn, devices, process_is_granule=devices[0].platform != "tpu"
            )
            mesh = Mesh(grid, names, axis_types=auto)
        return mesh, tuple(mesh.devices.flat)


def _probe(platform: str) -> tuple[jax.Device, ...] | Exception:
    try:
        devices = tuple(jax.local_devices(backend=platform))
    # JAX reports a missing backend as RuntimeError, but a broken plugin can raise anything
    # (JAX_PLATFORMS=cuda without a plugin: a bare AssertionError); the inventory's contract
    # is to never raise.
    except Exception as e:
        return e
    return devices if devices else RuntimeError("backend has no local devices")


def _installed(prefixes: tuple[str, ...]) -> list[str]:
    names = _distribution_names()
    return sorted(n for n in names if n.lower().replace("_", "-").startswith(prefixes))


_NAME = re.compile(r"^Name:[ \t]*(\S.*?)[ \t]*$", re.MULTILINE)


@functools.cache
def _distribution_names() -> frozenset[str]:
    """Every installed distribution's name, read once per process. Each name is found
    in its metadata's text: `Distribution.metadata` parses every file as an email
    message, which made the first inventory cost a tenth of a second or more."""
    names = set()
    try:
        for dist in importlib.metadata.distributions():
            text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
            found = _NAME.search(text.split("\n\n", 1)[0])
            if found:
                names.add(found.group(1))
    except Exception:  # a broken installation must not break the inventory
        return frozenset()
    return frozenset(names)


def _jax_says(error: Exception) -> str:
    text = str(error).splitlines()[0] if str(error).strip() else "no message"
    return f"{type(error).__name__}: {text}"


def missing_reason(platform: str, error: Exception, environ: Mapping[str, str]) -> str:
    """Why `platform` is absent, in words a user can act on (with JAX's own text last).

    A backend that `JAX_PLATFORMS` leaves out (often set by a policy's `runtime: platforms`)
    is also one whose plugin may be missing: that is the reason that would still hold
    without `JAX_PLATFORMS`, so it is said first.

    Example:
        >>> missing_reason("cpu", RuntimeError("x"), {"JAX_PLATFORMS": "cuda"})
        'JAX_PLATFORMS=cuda excludes cpu'
    """
    raw = environ.get("JAX_PLATFORMS", "").strip()
    asked = [p.strip().lower() for p in raw.split(",") if p.strip()]
    unknown = [p for p in asked if p not in PLATFORM_ALIASES]
    if unknown:
        hint = did_you_mean(unknown[0], PLATFORM_ALIASES)
        return (
            f"JAX_PLATFORMS={raw} names unknown platform {unknown[0]!r}{hint}, so JAX started "
            f"no backend; accepted: {', '.join(PLATFORM_ALIASES)} (or unset it)"
        )
    prefix = ""
    if asked:
        if platform not in {PLATFORM_ALIASES[p] for p in asked}:
            excluded = f"JAX_PLATFORMS={raw} excludes {platform}"
            if platform == "gpu" and not _installed(("jax-cuda", "jax-rocm")):
                return f"no CUDA or ROCm plugin is installed ({excluded} too): {GPU_HINT}"
            if platform == "tpu" and not tpu_installed():
                return f"no TPU runtime (libtpu) is installed ({excluded} too): {TPU_HINT}"
            return excluded
        prefix = f"JAX_PLATFORMS={raw} but "
    if platform == "gpu":
        plugins = _installed(("jax-cuda", "jax-rocm"))
        if not plugins:
            return f"{prefix}no CUDA or ROCm plugin is installed: {GPU_HINT}"
        return (
            f"{prefix}the GPU plugin ({', '.join(plugins)}) did not start: no usable GPU or "
            f"driver? ({_jax_says(error)})"
        )
    if platform == "tpu" and not tpu_installed():
        return f"{prefix}no TPU runtime (libtpu) is installed: {TPU_HINT}"
    return f"{prefix}JAX could not start it ({_jax_says(error)})"


@functools.cache
def inventory() -> Inventory:
    """Probe every known backend once per process (JAX backends do not change after start).

    Example:
        >>> inv = inventory()
        >>> "cpu" in inv.devices
        True
    """
    devices: dict[str, tuple[jax.Device, ...]] = {}
    missing: dict[str, str] = {}
    try:
        present = list(jax.extend.backend.backends())
    except Exception:
        present = []
    for platform in [*KNOWN_PLATFORMS, *sorted(set(present) - set(KNOWN_PLATFORMS))]:
        found = _probe(platform)
        if isinstance(found, Exception):
            missing[platform] = missing_reason(platform, found, os.environ)
        else:
            devices[platform] = found
    try:
        default_platform = jax.default_backend()
        process_index = jax.process_index()
    except Exception:
        default_platform, process_index = next(iter(devices), "none"), 0
    return Inventory(devices, missing, process_index, default_platform)


def available_backends() -> dict[str, list[jax.Device]]:
    """Every available backend with its process-local devices. Never raises.

    JAX has no call for this (jax-ml/jax#6459): it makes you probe `jax.devices(name)`
    and catch `RuntimeError`. Why each absent backend is absent is in
    `devpolicy.inventory().missing`. `devpolicy.available_backends` is deprecated: use
    `devpolicy.inventory().devices`.

    Returns:
        Platform name (`cpu`, `gpu`, `tpu`, ...) mapped to its local devices.

    Example:
        >>> "cpu" in available_backends()
        True
    """
    return {platform: list(devices) for platform, devices in inventory().devices.items()}


def get_device(target: str) -> jax.Device:
    """Resolve one target text (`cpu`, `gpu:1`, `cuda`, `accelerator`, `auto`) to a device,
    without fallback.

    `auto` is the device JAX would use for a new array in this thread right now;
    `accelerator` the first device of this process's TPU backend, else its GPU backend.

    Raises:
        ValueError: if `target` is not target text.
        DeviceUnavailableError: if the backend is absent or the index out of range,
            listing what is available.

    Example:
        >>> import devpolicy
        >>> devpolicy.get_device("cpu:0").platform
        'cpu'
    """
    parsed = parse_target(target)
    if parsed.is_auto:
        return current_default_device()
    found = inventory().find(parsed)
    if isinstance(found, str):
        inv = inventory()
        missing = inv.missing_for({parsed.platform})
        raise DeviceUnavailableError(target, [(target, found)], inv.available(), missing)
    return found


def current_default_device() -> jax.Device:
    """The device JAX places new arrays on in this thread now (scopes included).

    Raises:
        DeviceUnavailableError: JAX has no device at all (every backend failed to start),
            saying why each is absent.
    """
    value = jax.config.jax_default_device  # type: ignore[attr-defined]  # set by jax at import
    if isinstance(value, jax.Device):
        return value
    try:
        if isinstance(value, str):
            return jax.local_devices(backend=value)[0]
        return jax.local_devices()[0]
    except Exception as e:
        inv = inventory()
        raise DeviceUnavailableError(
            "auto",
            [("auto", f"JAX has no default device ({_jax_says(e)})")],
            inv.available(),
            inv.missing,
        ) from None


def memory_kinds(device: jax.Device) -> tuple[str, ...]:
    """The memory kinds a device offers (`device`, `pinned_host`, ...)."""
    try:
        return tuple(m.kind for m in device.addressable_memories())
    except Exception:
        return ()


class ThisProcess:
    """This process's devices as a `Machine`, probed on first use, not when made.

    A policy is loaded before `bootstrap` applies its runtime settings, which must come
    before JAX starts a backend: so the inventory is asked only when a decision needs it.

    Example:
        >>> THIS_PROCESS.text(THIS_PROCESS.default_device())
        'cpu:0'
    """

    __slots__ = ()

    @property
    def process_index(self) -> int:
        """This process's index in a multi-process run (0 otherwise)."""
        return inventory().process_index

    @property
    def default_platform(self) -> str:
        """The platform JAX uses by default."""
        return inventory().default_platform

    @property
    def accelerator(self) -> str | None:
        """See `Inventory.accelerator`."""
        return inventory().accelerator

    def find(self, target: Target) -> jax.Device | str:
        """See `Inventory.find`."""
        return inventory().find(target)

    def default_device(self) -> jax.Device:
        """See `current_default_device`."""
        return current_default_device()

    def backend_devices(self, platform: str) -> list[jax.Device] | str:
        """See `Inventory.backend_devices`."""
        return inventory().backend_devices(platform)

    def text(self, device: jax.Device) -> str:
        """See `Inventory.text`."""
        return inventory().text(device)

    def available(self) -> list[str]:
        """See `Inventory.available`."""
        return inventory().available()

    def missing_for(self, platforms: set[str]) -> dict[str, str]:
        """See `Inventory.missing_for`."""
        return inventory().missing_for(platforms)

    def memory_kinds(self, device: jax.Device) -> tuple[str, ...]:
        """See `memory_kinds`."""
        return memory_kinds(device)

    def make_mesh(
        self,
        sizes: tuple[int, ...],
        names: tuple[str, ...],
        devices: list[jax.Device],
        dcn: tuple[int, ...] | None = None,
    ) -> tuple[Mesh | None, tuple[jax.Device, ...]]:
        """See `Inventory.make_mesh`."""
        return inventory().make_mesh(sizes, names, devices, dcn)

    def __repr__(self) -> str:
        return "<devpolicy this process>"


#: The machine every policy decides for unless told otherwise.
THIS_PROCESS = ThisProcess()
