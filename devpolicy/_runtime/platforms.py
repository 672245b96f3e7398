"""Which platforms JAX could start here, and what a policy's `platforms` becomes: read
without starting (or importing) JAX, as JAX itself finds its backends.

`JAX_PLATFORMS` is strict (every platform it names must start, or JAX starts none, the
CPU included), so a listed platform that is not installed is dropped here, with a note;
`gpu` and `accelerator` become the plugins installed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import os
import pkgutil

from .._base.errors import PolicyError, Problem


@functools.cache
def installed_gpu_platforms() -> tuple[str, ...]:
    """GPU platforms whose JAX plugin is installed: `cuda`, `rocm` (ROCm only with /dev/kfd).

    JAX finds plugins as modules of the `jax_plugins` namespace or `jax_plugins` entry
    points (`xla_cuda12`, `xla_cuda13`, `xla_rocm7`...); so does this, without importing them.
    """
    names: set[str] = set()
    # A broken distribution's metadata must not stop start-up.
    with contextlib.suppress(Exception):
        names |= {e.name for e in importlib.metadata.entry_points(group="jax_plugins")}
    try:
        spec = importlib.util.find_spec("jax_plugins")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        names |= {m.name for m in pkgutil.iter_modules(list(spec.submodule_search_locations))}
    found = []
    if any("cuda" in n for n in names):
        found.append("cuda")
    # JAX_PLATFORMS=rocm fails start-up on a machine without an AMD GPU (cuda is skipped).
    if any("rocm" in n for n in names) and os.path.exists("/dev/kfd"):
        found.append("rocm")
    return tuple(found)


@functools.cache
def tpu_installed() -> bool:
    """Whether JAX could start a TPU backend here: libtpu is installed (the `libtpu`
    module, found without importing it) or `TPU_LIBRARY_PATH` names a file, as JAX's
    `cloud_tpu_init.get_tpu_library_path` looks for it."""
    path = os.environ.get("TPU_LIBRARY_PATH")
    if path and os.path.isfile(path):
        return True
    try:
        return importlib.util.find_spec("libtpu") is not None
    except (ImportError, ValueError):
        return False


def installed_accelerators(
    gpus: tuple[str, ...] | None = None, tpu: bool | None = None
) -> tuple[str, ...]:
    """The accelerator platforms JAX could start here, in the order `accelerator` takes
    them (`tpu`, then the GPU plugins `cuda`, `rocm`), read without starting (or importing)
    JAX.

    Example:
        >>> installed_accelerators(gpus=("cuda",), tpu=True)
        ('tpu', 'cuda')
    """
    has_tpu = tpu_installed() if tpu is None else tpu
    return (("tpu",) if has_tpu else ()) + (installed_gpu_platforms() if gpus is None else gpus)


_NO_GPU = "no GPU plugin installed (jax-cuda*-plugin, jax-rocm*-plugin)"
_NO_TPU = "no TPU runtime installed (libtpu: pip install 'jax[tpu]')"


def translate_platforms(
    value: tuple[str, ...], origin: str, gpus: tuple[str, ...], tpu: bool
) -> tuple[list[str], str]:
    """JAX_PLATFORMS for a policy's `platforms`: `gpu` as the GPU plugins installed,
    `accelerator` as the TPU if libtpu is installed, else those plugins; a platform that
    is not installed is dropped with a note (JAX_PLATFORMS is strict: one platform that
    cannot start leaves JAX with no backend at all).

    Raises:
        PolicyError: nothing listed is installed (add cpu as a fallback).
    """
    accelerators = ("tpu",) if tpu else gpus
    out: list[str] = []
    notes: list[str] = []
    for platform in value:
        if platform == "gpu":
            found = gpus
            notes.append(
                f"gpu -> {','.join(gpus)} (installed GPU plugins)"
                if gpus
                else f"gpu dropped: {_NO_GPU}"
            )
        elif platform == "accelerator":
            found = accelerators
            notes.append(
                f"accelerator -> {','.join(accelerators)}"
                if accelerators
                else f"accelerator dropped: {_NO_TPU}; {_NO_GPU}"
            )
        elif platform == "tpu" and not tpu:
            found = ()
            notes.append(f"tpu dropped: {_NO_TPU}")
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
    """The accelerators installed here that `started` (JAX_PLATFORMS from the policy's
    `platforms`) leaves out: one line for each, naming it and the policy's line."""
    return tuple(
        f"{origin}: runtime.platforms [{', '.join(value)}] hides {platform}, installed here: "
        f"JAX will not use it (write `accelerator` in `platforms`, or leave `platforms` out)"
        for platform in installed
        if platform not in started
    )


def jax_platform(platforms: str | None, installed: tuple[str, ...]) -> str:
    """The platform JAX will make its default: the first of `platforms` (JAX_PLATFORMS
    text; `cuda`, `rocm` are `gpu`), or with none given the first accelerator installed
    (a TPU before a GPU), else `cpu`. A GPU plugin that finds no GPU leaves JAX on the
    CPU: this cannot be told without starting JAX, so such a machine counts as a GPU one.

    Example:
        >>> jax_platform("cuda,cpu", ()), jax_platform(None, ("tpu",)), jax_platform(None, ())
        ('gpu', 'tpu', 'cpu')
    """
    first = platforms.split(",")[0].strip() if platforms else (installed[:1] or ("cpu",))[0]
    return "gpu" if first in ("cuda", "rocm") else first
