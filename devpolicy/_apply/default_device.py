"""JAX's thread-local default device (and mesh) set for one decision, and put back.

The one place that knows how a device is swapped in: `get_device`/`set_device` (the speed
trick, with its reason beside it), `enter`/`leave` for any decision, the open entries of
a thread's scopes (`devices_local`, `close_out_of_order`), and `device_scope` for a
`with`. Each change is recorded before it is made, so that an exception at any point (a
KeyboardInterrupt included) can be undone. `jax.default_device` is thread-local:
everything here holds in the calling thread only.
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


# Why not `with jax.default_device(d)`: each entry builds a StateContextManager (argument
# parser, object, hook checks), about 0.5 us, most of a scope's cost. That manager only
# calls its thread-local state's `swap_local` and `set_local`; `get_local` and
# `set_local` called directly cost about 0.05 and 0.09 us, and each is one C call, which
# no interrupt splits. Used where this JAX has them and no thread-local hook for the
# option; otherwise the same calls with the hook called as JAX's own manager calls it.
_STATE: Any = jax.default_device
if (
    callable(getattr(_STATE, "get_local", None))
    and callable(getattr(_STATE, "set_local", None))
    and getattr(_STATE, "_update_thread_local_hook", "missing") is None
):
    #: This thread's own default device (JAX's `unset` where none), read without a change.
    get_device: Callable[[], Any] = _STATE.get_local
    #: Set this thread's own default device to what `get_device` read.
    set_device: Callable[[Any], None] = _STATE.set_local
    #: Whether reading and setting the device are single C calls, which no interrupt
    #: splits (jax 0.7.2 on). Before, JAX's own swap is Python (a thread-local hook called
    #: after the set), and a KeyboardInterrupt between its steps can leave it half done:
    #: no code outside JAX can guard that.
    ATOMIC_SWAP = True
else:  # pragma: no cover - depends on the installed JAX
    ATOMIC_SWAP = False
    from jax._src import config as _jax_config

    _UNSET = getattr(_jax_config, "unset", None) or getattr(
        getattr(_jax_config, "config_ext", None), "unset", None
    )

    def get_device() -> Any:
        getter = getattr(_STATE, "get_local", None)
        if getter is not None:
            return getter()
        value = _STATE.swap_local(_UNSET)  # read by swapping it straight back
        _STATE.set_local(value)
        return value

    def set_device(value: Any) -> None:
        _STATE.set_local(value)
        hook = getattr(_STATE, "_update_thread_local_hook", None)
        if hook is not None:  # as JAX's own manager calls it
            hook(None if value is _UNSET else value)


#: This thread's open scope entries (`open`: a list of records `[device before, mesh
#: scope, ...]`, oldest first; the device slot `NOT_SWAPPED` where the entry set none). A
#: scope may be left out of order (a generator holding it closed before one opened later):
#: `close_out_of_order` keeps the thread's device right then.
devices_local = threading.local()


def open_entries() -> list[list[Any]]:
    """This thread's open scope entries, oldest first (see `devices_local`)."""
    entries: list[list[Any]] | None = getattr(devices_local, "open", None)
    if entries is None:
        entries = devices_local.open = []
    return entries


def close_out_of_order(entries: list[list[Any]], entry: list[Any]) -> None:
    """Drop `entry`, which is not the newest open one. The newer entry that set a device
    keeps it, and takes over what was there before `entry`, so the thread ends as it was
    before the outermost entry; where no newer one set a device, the device goes back now.
    Nothing when `entry` is not open."""
    for i in range(len(entries)):
        if entries[i] is entry:
            break
    else:
        return
    if entry[0] is not NOT_SWAPPED:
        for newer in entries[i + 1 :]:
            if newer[0] is not NOT_SWAPPED:
                newer[0] = entry[0]
                break
        else:
            set_device(entry[0])
        entry[0] = NOT_SWAPPED
    del entries[i]
    if entry[1] is not None:
        mesh_scope, entry[1] = entry[1], None
        mesh_scope.__exit__(None, None, None)


#: What an entry's device slot holds while nothing was swapped (an `auto` decision, or
#: an entry an interrupt stopped before its change).
NOT_SWAPPED = object()


def entry() -> list[Any]:
    """A fresh entry for `enter`: `[device before, mesh scope]`, nothing changed yet.

    Made before `enter` is called, so that a caller that holds it can always `leave` it,
    whatever point an exception (a KeyboardInterrupt included) stopped `enter` at.
    """
    return [NOT_SWAPPED, None]


def enter(decision: Decision, entry: list[Any]) -> None:
    """Apply `decision` to this thread, recording in `entry` what to undo before each
    change (see `leave`).

    A sharded decision runs under its mesh (`jax.set_mesh`, or `use_mesh` before jax 0.7.1,
    so `jax.jit` and sharding constraints see it) with the mesh's first local device as the
    default device.
    """
    if decision.is_auto:
        return
    entry[0] = get_device()
    if decision.mesh is None:
        set_device(decision.device)
    else:
        enter_mesh(entry, decision)


def enter_mesh(entry: list[Any], decision: Decision) -> None:
    """Apply a sharded `decision` for `entry` (`[device before, mesh scope]`): its mesh
    made current, the mesh's first local device the default."""
    mesh_scope: Any = _mesh_context(decision.sharding.mesh)  # type: ignore[union-attr]
    mesh_scope.__enter__()
    entry[1] = mesh_scope
    set_device(decision.device)


def leave(entry: list[Any]) -> None:
    """Undo what `enter` recorded in `entry`, whatever part of it is done already (so it
    can be called again after an interrupt)."""
    if entry[0] is not NOT_SWAPPED:
        set_device(entry[0])
        entry[0] = NOT_SWAPPED
    if entry[1] is not None:
        mesh_scope, entry[1] = entry[1], None
        mesh_scope.__exit__(None, None, None)


class _DeviceScope:
    """`with` for one decision's device, or nothing when the decision is `auto`."""

    __slots__ = ("_decision", "_entry")

    def __init__(self, decision: Decision) -> None:
        self._decision = decision
        self._entry = entry()

    def __enter__(self) -> None:
        try:
            enter(self._decision, self._entry)
        except BaseException:
            leave(self._entry)  # the `with` never calls `__exit__` after this
            raise

    def __exit__(self, *exc_info: object) -> None:
        try:
            leave(self._entry)
        except BaseException:
            leave(self._entry)  # finish what an interrupt stopped, then raise it
            raise


def device_scope(decision: Decision) -> AbstractContextManager[None]:
    """A fresh scope for `decision`'s device (a no-op if it does not apply)."""
    return _DeviceScope(decision)
