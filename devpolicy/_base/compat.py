"""What differs between the jax/jaxlib versions devpolicy supports, in one place.

Supported: jax and jaxlib 0.6.0 to 0.12 (README, "Supported versions"); nothing else in
devpolicy looks at a version number. A leaf: it never imports JAX at module level, because the
runtime wing reads jaxlib's version in `devpolicy run` without starting JAX.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

#: XLA_PYTHON_CLIENT_ALLOCATOR values every supported jaxlib accepts, in jaxlib's order.
_ALLOCATORS = ("default", "platform", "bfc", "cuda_async")
#: Values added later: (first jaxlib that accepts it, value). jaxlib 0.9 and older refuse
#: `vmm`; jaxlib 0.10 refuses `address`.
_LATER_ALLOCATORS = (((0, 10), "vmm"), ((0, 11), "address"))


def release(distribution: str) -> tuple[int, ...] | None:
    """The installed `distribution`'s release numbers (`0.10.2` -> `(0, 10, 2)`; a suffix
    such as `.dev20260101` or `rc1` is dropped), or None when it is not installed."""
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    m = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in m.group().split(".")) if m else None


def allocators(jaxlib: tuple[int, ...] | None) -> tuple[str, ...]:
    """The allocators jaxlib `jaxlib` accepts in XLA_PYTHON_CLIENT_ALLOCATOR (its
    `generate_pjrt_gpu_plugin_options`); None (no jaxlib installed) gives the newest list."""
    return _ALLOCATORS + tuple(
        name for since, name in _LATER_ALLOCATORS if jaxlib is None or jaxlib >= since
    )


def mesh_context() -> Callable[[Any], AbstractContextManager[Any]]:
    """JAX's context manager that makes a mesh current for `jax.jit` and sharding
    constraints: `jax.set_mesh` from jax 0.7.1, `jax.sharding.use_mesh` before it (gone by
    0.12)."""
    import jax

    set_mesh: Callable[[Any], AbstractContextManager[Any]] | None = getattr(jax, "set_mesh", None)
    if set_mesh is not None:
        return set_mesh
    sharding: Any = jax.sharding  # Any: not every jax has `use_mesh` for the type checker
    use_mesh: Callable[[Any], AbstractContextManager[Any]] = sharding.use_mesh
    return use_mesh
