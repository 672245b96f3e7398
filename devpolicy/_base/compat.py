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


# Implicit transfers (`_apply/transfers`): JAX's transfer guard and argument sharding. The
# guard's thread-local state (`guard_lib`) and `pxla.shard_arg_handlers` are the same from
# jax 0.6 to 0.12; they are private, so they are reached here only.
def transfer_guard_state() -> tuple[Any, Any]:
    """This thread's transfer-guard state (settable `host_to_device`, `device_to_device`,
    `device_to_host`, `explicit_device_put`) and the level enum (`ALLOW`, `LOG`, ...)."""
    from jax._src import config as jax_config

    config: Any = jax_config
    guard_lib = config.guard_lib
    return guard_lib.thread_local_state(), guard_lib.TransferGuardLevel


def transfer_guard_getter() -> Callable[[], Any]:
    """The function that returns this thread's transfer-guard state (see above)."""
    from jax._src import config as jax_config

    config: Any = jax_config
    getter: Callable[[], Any] = config.guard_lib.thread_local_state
    return getter


def shard_arg_handlers() -> dict[Any, Any]:
    """JAX's argument-sharding handler per argument type (numpy arrays, scalars, arrays)."""
    from jax._src.interpreters import pxla

    handlers: dict[Any, Any] = pxla.shard_arg_handlers
    return handlers


def device_put_owner() -> Any:
    """The module whose `batched_device_put` every JAX placement of host data and every
    argument transfer goes through (looked up there at each call, so it can be wrapped)."""
    from jax._src.interpreters import pxla

    return pxla


def array_type() -> type:
    """The type of a concrete jax.Array (`ArrayImpl`)."""
    from jax._src.array import ArrayImpl

    return ArrayImpl


def backends_started() -> bool:
    """Whether JAX's backends have started (asking which devices exist would start them)."""
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


def package_dirs() -> list[str]:
    """The folders of jax, jaxlib and numpy: frames there are never the user's code."""
    import os
    import sys

    import jax

    # jaxlib is loaded by jax; read from sys.modules so the layers below never import it.
    modules = [jax, sys.modules["jaxlib"], sys.modules["numpy"]]
    return [os.path.dirname(m.__file__ or "") + os.sep for m in modules]
