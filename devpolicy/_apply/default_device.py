"""JAX's thread-local default device (and mesh) set for one decision, and put back.

The one place that knows how a device is swapped in: `swap_device`/`restore_device` (the
speed trick, with its reason beside it), `enter`/`leave` for any decision, and
`device_scope` for a `with`. `jax.default_device` is thread-local: everything here holds
in the calling thread only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import jax

from .._base.compat import mesh_context
from .._decide.decision import Decision

#: Makes a mesh current (looked up once: which function depends on the jax version).
_mesh_context = mesh_context()


def _swap_public(device: jax.Device) -> Any:
    # A fresh manager per entry: one `jax.default_device` object entered twice leaks.
    manager = jax.default_device(device)
    manager.__enter__()
    return manager


def _restore_public(token: Any) -> None:
    token.__exit__(None, None, None)


# Why not `with jax.default_device(d)`: each entry builds a StateContextManager (argument
# parser, object, hook checks), about 0.5 us, most of a scope's cost. That manager only
# calls its thread-local state's `swap_local` and `set_local`; called directly they cost
# about 0.09 us. Used where this JAX has them and no thread-local hook for the option
# (the manager would call it); otherwise the public manager, with the same effect.
_STATE: Any = jax.default_device
if (
    callable(getattr(_STATE, "swap_local", None))
    and callable(getattr(_STATE, "set_local", None))
    and callable(getattr(_STATE, "get_local", None))
    and getattr(_STATE, "_update_thread_local_hook", "missing") is None
):
    swap_device: Callable[[jax.Device], Any] = _STATE.swap_local
    restore_device: Callable[[Any], None] = _STATE.set_local
    #: This thread's own default device (JAX's `unset` where none), read without a change.
    get_device: Callable[[], Any] = _STATE.get_local
    #: Set this thread's own default device to what `get_device` read (one C call: no
    #: interrupt lands inside it).
    set_device: Callable[[Any], None] = _STATE.set_local
else:  # pragma: no cover - depends on the installed JAX
    swap_device, restore_device = _swap_public, _restore_public

    from jax._src import config as _jax_config

    get_device = _STATE.get_local
    _UNSET = getattr(getattr(_jax_config, "config_ext", None), "unset", None)

    def set_device(value: Any) -> None:
        _STATE.set_local(value)
        hook = getattr(_STATE, "_update_thread_local_hook", None)
        if hook is not None:  # as JAX's own manager calls it
            hook(None if value is _UNSET else value)


#: This thread's open scope entries (`open`: a list of `[device before, mesh scope or
#: None]`, oldest first). A scope may be left out of order (a generator holding it closed
#: before one opened later): `close_out_of_order` keeps the thread's device right then.
devices_local = threading.local()


def open_entries() -> list[list[Any]]:
    """This thread's open scope entries, oldest first (see `devices_local`)."""
    entries: list[list[Any]] | None = getattr(devices_local, "open", None)
    if entries is None:
        entries = devices_local.open = []
    return entries


def close_out_of_order(entries: list[list[Any]], entry: list[Any]) -> None:
    """Drop `entry`, which is not the newest open one: the device stays the newer entry's,
    and the entry above it inherits what was there before `entry`, so the thread ends as
    it was before the outermost entry. Nothing when `entry` is not open."""
    for i in range(len(entries) - 1):
        if entries[i] is entry:
            # Stores and the delete only: no interrupt lands between them.
            entries[i + 1][0] = entry[0]
            del entries[i]
            if entry[1] is not None:
                entry[1].__exit__(None, None, None)
            return


#: The token of an entry that changed nothing (an `auto` decision).
NOT_SWAPPED = object()


class MeshToken:
    """What a sharded decision's entry changed: the mesh context and the default device."""

    __slots__ = ("mesh_scope", "previous")

    def __init__(self, mesh_scope: Any, previous: Any) -> None:
        self.mesh_scope = mesh_scope
        self.previous = previous


def enter(decision: Decision) -> Any:
    """Apply `decision` to this thread; the token says what to undo (see `leave`).

    A sharded decision runs under its mesh (`jax.set_mesh`, or `use_mesh` before jax 0.7.1,
    so `jax.jit` and sharding constraints see it) with the mesh's first local device as the
    default device.
    """
    if decision.is_auto:
        return NOT_SWAPPED
    if decision.mesh is None:
        return swap_device(decision.device)
    mesh_scope: Any = _mesh_context(decision.sharding.mesh)  # type: ignore[union-attr]
    mesh_scope.__enter__()
    return MeshToken(mesh_scope, swap_device(decision.device))


def enter_mesh(entry: list[Any], decision: Decision) -> None:
    """Apply a sharded `decision` for a scope's `entry` (`[device before, mesh scope]`):
    its mesh made current, the mesh's first local device the default."""
    mesh_scope: Any = _mesh_context(decision.sharding.mesh)  # type: ignore[union-attr]
    mesh_scope.__enter__()
    entry[1] = mesh_scope
    set_device(decision.device)


def leave(token: Any) -> None:
    """Undo what `enter` did."""
    if token is NOT_SWAPPED:
        return
    if type(token) is MeshToken:
        restore_device(token.previous)
        token.mesh_scope.__exit__(None, None, None)
        return
    restore_device(token)


class _DeviceScope:
    """`with` for one decision's device, or nothing when the decision is `auto`."""

    __slots__ = ("_decision", "_token")

    def __init__(self, decision: Decision) -> None:
        self._decision = decision

    def __enter__(self) -> None:
        self._token = enter(self._decision)

    def __exit__(self, *exc_info: object) -> None:
        leave(self._token)


def device_scope(decision: Decision) -> AbstractContextManager[None]:
    """A fresh scope for `decision`'s device (a no-op if it does not apply)."""
    return _DeviceScope(decision)
