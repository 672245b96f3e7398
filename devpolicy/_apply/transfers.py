"""Implicit transfers: the copies JAX makes on its own, seen, counted and refused by a policy.

How they are seen (docs/transfers.md, "How devpolicy sees them"): while a policy with
`transfers:` is active in a thread, JAX's thread-local transfer guard is set to `disallow`
for the directions it watches where something can be reported (`Watch.levels`). An
implicit transfer then fails inside JAX's argument sharding (`pxla.shard_arg_handlers`,
the one Python step every jit call, operation and `jnp.asarray` takes to move an
argument), before anything was copied. Each handler is wrapped once: the wrapper catches
that failure, finds the user's line on the live stack (`_site`), refuses it, or runs the
same handler again at the level the user set in JAX (`allow` unless they set one) and
reports it. Only the argument sharding is run again: it has no side effects before its
transfer, and no user code is rerun. Explicit placements (`jax.device_put`,
`device_get`, devpolicy's verbs) are marked explicit to JAX's guard, which lets them
through, so they never get here.

Each thread keeps its open entries (`Armed`) in order, so that scopes left out of order
and interrupts leave the thread as it was (see `Armed`, `enter`, `leave`).

`device_to_host` is handed to JAX's own guard as it is: a read of an accelerator's array
by the host (`np.asarray(x)`) goes through jaxlib's C++ buffer protocol, where no Python
hook sees it.

Nothing here runs until a policy with `transfers:` is first activated or entered: without
one, JAX is untouched.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import jax
import numpy as np

from .._base import compat
from .._base.errors import TransferRefusedError
from .._base.events import EventLog
from .._machine.inventory import inventory
from .._machine.ledger import count_transfer
from .sites import site_of

T = TypeVar("T")
P = ParamSpec("P")

H2D = "host_to_device"
D2D = "device_to_device"
D2H = "device_to_host"
HOST_LOCAL = "host_local"
# JAX's guard error names the direction in its message: the only place it says it.
_DIRECTIONS = (
    ("Disallowed host-to-device transfer", H2D),
    ("Disallowed device-to-device transfer", D2D),
)

_local = threading.local()
# (this thread's guard state getter, the level enum), set by `_install`: `arm` is on the
# scope path, so it takes them from here rather than asking compat each time.
_guard: list[Any] = []
_install_lock = threading.Lock()
_installed: list[bool] = [False]


@dataclass(frozen=True, slots=True)
class Move:
    """One array an implicit transfer moves."""

    direction: str
    source: str
    devices: tuple[str, ...]
    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    #: An index, or a Python or numpy scalar: not data (jax#16002): never refused.
    scalar: bool
    #: Whether it crosses between the host (or a CPU device) and an accelerator.
    crosses: bool


class Watch:
    """One policy's `transfers:`, compiled: the mode and origin of each field.

    Attributes:
        modes: The mode of every field (`allow` where no layer set one).
        origins: Where each set field was written (`policy.yaml:7`, `env:DEVPOLICY_TRANSFERS`).
        events: The policy's event log.
    """

    __slots__ = ("_levels", "events", "modes", "origins")

    def __init__(self, settings: Mapping[str, Any], events: EventLog) -> None:
        self.modes = {
            name: settings[name].value if name in settings else "allow"
            for name in (H2D, D2D, D2H, HOST_LOCAL)
        }
        self.origins = {name: setting.origin for name, setting in settings.items()}
        self.events = events
        self._levels: tuple[Any, Any, Any] | None = None

    def mode_of(self, move: Move) -> str:
        """The mode that applies to `move` (`host_local` for host data into a CPU device)."""
        if move.direction == H2D and not move.crosses:
            return self.modes[HOST_LOCAL]
        return self.modes[move.direction]

    def levels(self) -> tuple[Any, Any, Any]:
        """JAX guard levels (h2d, d2d, d2h) to set while this watch is armed (`KEEP`: leave
        that direction as it is).

        A direction is armed only where one of its outcomes can be logged or refused here
        (issue 42, T1): an armed direction takes every transfer off JAX's fast path. Host
        data into a CPU device is `host_local`; a copy between devices needs two; a
        device-to-host read needs an accelerator. Before JAX's backends start which
        devices exist is not known: every direction whose mode is not allow is armed, and
        nothing is kept, so that an entry armed then is `Armed.provisional` until a
        refusal finds the devices (`narrow`).
        """
        if self._levels is not None:
            return self._levels
        _state, level = compat.transfer_guard_state()
        started = compat.backends_started()
        devices = inventory().devices if started else {}
        accelerators = not started or any(p != "cpu" for p in devices)
        several = not started or sum(len(d) for d in devices.values()) > 1
        h2d_watched = self.modes[HOST_LOCAL] != "allow" or (
            self.modes[H2D] != "allow" and accelerators
        )
        d2d_watched = self.modes[D2D] != "allow" and several
        levels = (
            level.DISALLOW if h2d_watched else KEEP,
            level.DISALLOW if d2d_watched else KEEP,
            _JAX_LEVEL[self.modes[D2H]](level) if accelerators else KEEP,
        )
        if started:
            self._levels = levels
        return levels


#: A direction `arm` leaves as it is.
KEEP: Any = object()

_JAX_LEVEL: dict[str, Callable[[Any], Any]] = {
    "allow": lambda level: KEEP,
    "log": lambda level: level.LOG,
    "disallow": lambda level: level.DISALLOW,
}


def watch_of(settings: Mapping[str, Any], events: EventLog) -> Watch | None:
    """The compiled `transfers:` of a policy, or None when no layer has one."""
    return Watch(settings, events) if settings else None


class Armed:
    """One entry that changed this thread's watch: what it set, and what was there before.

    Each thread keeps its open entries in order (`_open`). An entry left on top restores
    what was there before it; one left from below (a generator holding a scope closed
    before one opened after it) hands what was before it to the entry above, so the thread
    ends as it was before the outermost entry however the exits are ordered (issue 42, M3).
    """

    __slots__ = ("levels", "prev", "provisional", "rule", "watch")

    def __init__(self, watch: Watch | None, rule: str | None, levels: tuple[Any, Any, Any]) -> None:
        self.watch = watch
        self.rule = rule
        #: The guard levels set (h2d, d2d, d2h), `KEEP` where left as it was.
        self.levels = levels
        #: Whether `levels` was worked out before the backends started (see `narrow`).
        self.provisional = watch is not None and watch._levels is None
        #: (watch, rule, h2d, d2d, d2h) of the thread before this entry.
        self.prev: tuple[Any, Any, Any, Any, Any] = (None, None, None, None, None)


def armed(watch: Watch, rule: str | None = None) -> Armed:
    """An entry that watches by `watch` (and reports `rule`), not yet applied: `enter` it.

    Made apart from `enter` so that a caller holds it before anything changes, and can
    always `leave` it (nothing happens for one never entered).
    """
    if not _installed[0]:
        _install()
    return Armed(watch, rule, watch.levels())


def enter(entry: Armed) -> None:
    """Apply `entry` to this thread. On any exception, a KeyboardInterrupt included, the
    thread is left as it was (issue 42, M4)."""
    state = _guard[0]()
    entry.prev = (
        getattr(_local, "watch", None),
        getattr(_local, "rule", None),
        state.host_to_device,
        state.device_to_device,
        state.device_to_host,
    )
    try:
        try:
            _local.open.append(entry)
        except AttributeError:  # this thread's first entry
            _local.open = [entry]
        # Attribute stores only from here on: CPython takes no interrupt between them.
        _local.watch = entry.watch
        _local.rule = entry.rule
        h2d, d2d, d2h = entry.levels
        if h2d is not KEEP:
            state.host_to_device = h2d
        if d2d is not KEEP:
            state.device_to_device = d2d
        if d2h is not KEEP:
            state.device_to_host = d2h
    except BaseException:
        leave(entry)
        raise


def leave(entry: Armed) -> None:
    """Undo `entry` in this thread, in whatever order the entries are left; nothing when
    it is not open (never entered, or left already)."""
    entries: list[Armed] = getattr(_local, "open", None) or []
    if entries and entries[-1] is entry:
        state = _guard[0]()
        # Stores and the delete only: no interrupt lands between them.
        _local.watch, _local.rule, h2d, d2d, d2h = entry.prev
        state.host_to_device = h2d
        state.device_to_device = d2d
        state.device_to_host = d2h
        del entries[-1]
        return
    for i in range(len(entries) - 1):
        if entries[i] is entry:
            entries[i + 1].prev = entry.prev
            del entries[i]
            return


def _open() -> list[Armed]:
    """This thread's open entries, oldest first."""
    entries: list[Armed] | None = getattr(_local, "open", None)
    if entries is None:
        entries = _local.open = []
    return entries


def arm(watch: Watch, rule: str | None = None) -> Armed:
    """Watch this thread's implicit transfers by `watch` until `disarm(token)`.

    `rule` is the origin of the rule whose scope armed it (reported as the `rule` of
    transfers into the scope's devices).
    """
    entry = armed(watch, rule)
    enter(entry)
    return entry


def disarm(token: Armed) -> None:
    """Undo the `arm` (or `suspend`) that returned `token` (arms nest, per thread)."""
    leave(token)


def suspend() -> Armed | None:
    """Stop watching this thread until `disarm(token)` (a policy without `transfers:`
    activated inside one with it); None, and nothing done, when nothing is watched.

    The guard goes back to what this thread had before devpolicy first armed it: the
    user's own levels, never `allow` over them."""
    if getattr(_local, "watch", None) is None:
        return None
    entries = _open()
    user = entries[0].prev[2:] if entries else (None, None, None)
    entry = Armed(None, None, user)
    enter(entry)
    return entry


def narrow(state: Any) -> None:
    """Arm this thread's provisional entries by what the started backends show (a
    direction where nothing can be reported is left as it was before devpolicy), and
    set the thread to the result: the first refusal after JAX starts pays for it once."""
    entries = _open()
    if not any(e.provisional for e in entries) or not compat.backends_started():
        return
    current = entries[0].prev
    for entry in entries:
        if entry.provisional and entry.watch is not None:
            entry.levels = entry.watch.levels()
            entry.provisional = False
        entry.prev = current
        kept = current[2:]
        current = (
            entry.watch,
            entry.rule,
            *(old if new is KEEP else new for old, new in zip(kept, entry.levels, strict=True)),
        )
    _local.watch, _local.rule, h2d, d2d, d2h = current
    state.host_to_device = h2d
    state.device_to_device = d2d
    state.device_to_host = d2h


@contextmanager
def watching(watch: Watch | None, rule: str | None = None) -> Iterator[None]:
    """`arm`/`disarm` around a block; nothing at all when `watch` is None."""
    if watch is None:
        yield
        return
    entry = armed(watch, rule)
    try:
        enter(entry)
        yield
    finally:
        leave(entry)


def current_watch() -> Watch | None:
    """The watch on this thread's implicit transfers now, or None."""
    watch: Watch | None = getattr(_local, "watch", None)
    return watch


def explicitly(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Call `fn` as an explicit placement: JAX's guard lets its transfers through.

    devpolicy's verbs (`put`, `to`, `load_file`) place arrays on purpose, sometimes with
    JAX calls the guard does not know are explicit (`jax.make_array_from_callback`); in
    a watched thread they run under this marker. Unwatched, `fn` is simply called.
    """
    if getattr(_local, "watch", None) is None:
        return fn(*args, **kwargs)
    state, _level = compat.transfer_guard_state()
    return _as_explicit(state, fn, *args, **kwargs)


def _as_explicit(state: Any, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Call `fn` with this thread's guard `state` marking device_puts explicit (JAX lets
    them through), then put the mark back as it was."""
    before = state.explicit_device_put
    state.explicit_device_put = True
    try:
        return fn(*args, **kwargs)
    finally:
        state.explicit_device_put = before


def _install() -> None:
    """Wrap each of JAX's argument-sharding handlers once (for the life of the process)."""
    with _install_lock:
        if _installed[0]:
            return
        state, level = compat.transfer_guard_state()
        del state
        _guard[:] = [compat.transfer_guard_getter(), level]
        handlers = compat.shard_arg_handlers()
        array_type = compat.array_type()
        for kind, handler in list(handlers.items()):
            if not getattr(handler, "_devpolicy_watched", False):
                handlers[kind] = _watched(handler, host=kind is not array_type)
        owner = compat.device_put_owner()
        put = owner.batched_device_put
        if not getattr(put, "_devpolicy_watched", False):
            owner.batched_device_put = _explicit_put(put)
        _installed[0] = True


def _watched(handler: Callable[..., Any], host: bool) -> Callable[..., Any]:
    """`handler`, with a transfer JAX's guard refused caught, reported and run again."""

    def watched(xs: Sequence[Any], shardings: Sequence[Any], layouts: Any, semantics: Any) -> Any:
        try:
            return handler(xs, shardings, layouts, semantics)
        except Exception as e:
            direction = _direction(e)
            if direction is None or getattr(_local, "watch", None) is None:
                raise  # not ours: a guard the user set, or another failure
            return _caught(e, direction, handler, host, xs, shardings, layouts, semantics)

    watched._devpolicy_watched = True  # type: ignore[attr-defined]
    return watched


# The code of every argument handler's wrapper: how `_explicit_put` knows one is running.
_WATCHED_CODE = _watched(lambda *a: None, host=True).__code__


def _explicit_put(put: Callable[..., Any]) -> Callable[..., Any]:
    """JAX's `batched_device_put`, run again when the guard refuses it outside an argument
    transfer: JAX's own placement helpers (`jax.make_array_from_callback`,
    `make_array_from_single_device_arrays`) go straight to it, and JAX's guard takes them
    for implicit (jax#40285). They place on purpose: never counted, never refused."""

    def watched_put(*args: Any, **kwargs: Any) -> Any:
        try:
            return put(*args, **kwargs)
        except Exception as e:
            if _direction(e) is None or getattr(_local, "watch", None) is None:
                raise
            if _in_argument_transfer(sys._getframe(1)):
                raise  # the argument handler's wrapper reports it
            state, level = compat.transfer_guard_state()
            return _as_explicit(state, _as_users, state, level, put, *args, **kwargs)

    watched_put._devpolicy_watched = True  # type: ignore[attr-defined]
    return watched_put


def _in_argument_transfer(frame: Any) -> bool:
    """Whether a watched argument handler is on the stack (the error is its to report)."""
    while frame is not None:
        if frame.f_code is _WATCHED_CODE:
            return True
        frame = frame.f_back
    return False


def _direction(error: BaseException) -> str | None:
    """The direction of a transfer JAX's guard refused, or None for any other error."""
    message = error.args[0] if error.args else None
    if not isinstance(message, str) or "Disallowed" not in message:
        return None
    return next((d for text, d in _DIRECTIONS if text in message), None)


def _caught(
    error: BaseException,
    direction: str,
    handler: Callable[..., Any],
    host: bool,
    xs: Sequence[Any],
    shardings: Sequence[Any],
    layouts: Any,
    semantics: Any,
) -> Any:
    state, level = compat.transfer_guard_state()
    narrow(state)
    watch: Watch = _local.watch
    moves = _moves(direction, host, xs, shardings)
    site, function, library = site_of(sys._getframe(1))
    for move in moves:
        if watch.mode_of(move) == "disallow" and not move.scalar:
            field = HOST_LOCAL if move.direction == H2D and not move.crosses else move.direction
            raise TransferRefusedError(
                site,
                move.direction,
                move.source,
                move.devices,
                move.nbytes,
                f"{move.dtype}{list(move.shape)}",
                field,
                watch.origins.get(field, "default"),
            ) from error
    # Run again at the user's own level, not `allow`: a guard the user set in JAX refuses
    # (JAX's error) or logs as it would have without devpolicy (issue 42, M1).
    result = _as_users(state, level, handler, xs, shardings, layouts, semantics)
    rule: str | None = getattr(_local, "rule", None)
    for move in moves:
        if watch.mode_of(move) != "allow":
            _report(watch, site, function, library, move, rule)
    return result


def _as_users(state: Any, level: Any, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Call `fn` with this thread's h2d and d2d guard at the levels the user set in JAX
    (`jax_transfer_guard*`, the thread's own or the global one), then put devpolicy's back."""
    before = (state.host_to_device, state.device_to_device)
    state.host_to_device = _users_level(H2D, level)
    state.device_to_device = _users_level(D2D, level)
    try:
        return fn(*args, **kwargs)
    finally:
        state.host_to_device, state.device_to_device = before


def _users_level(direction: str, level: Any) -> Any:
    """The guard level the user set in JAX for `direction` (None: JAX's default)."""
    value = getattr(jax.config, f"jax_transfer_guard_{direction}", None)
    return None if value is None else getattr(level, str(value).upper())


def _report(
    watch: Watch, site: str, function: str, library: str | None, move: Move, rule: str | None
) -> None:
    """Count `move` at `site`; its event at info the first time (warning if it crosses
    host/accelerator), at debug after."""
    shown = f"{move.direction}:scalar" if move.scalar else move.direction
    seen = count_transfer(site, shown, move.nbytes, move.devices, function)
    events = watch.events
    level = ("warning" if move.crosses and not move.scalar else "info") if not seen else "debug"
    if not events.enabled(level):
        return
    events.emit(
        level,
        "transfer",
        {
            "direction": move.direction,
            "site": site,
            "function": function,
            "library_site": library,
            "source": move.source,
            "devices": list(move.devices),
            "nbytes": move.nbytes,
            "shape": list(move.shape),
            "dtype": move.dtype,
            "scalar": move.scalar,
            "rule": rule,
            "count": seen + 1,
        },
    )


def _moves(direction: str, host: bool, xs: Sequence[Any], shardings: Sequence[Any]) -> list[Move]:
    """What each argument of a refused sharding step would have moved."""
    inv = inventory()
    found = (
        move_into(x, sharding, host, direction, inv)
        for x, sharding in zip(xs, shardings, strict=False)
    )
    return [move for move in found if move is not None]


def move_into(x: Any, sharding: Any, host: bool, direction: str, inv: Any) -> Move | None:
    """What placing `x` (host data when `host`, else an array) as `sharding` moves, or
    None where it already is so. `x` needs `shape` and `dtype` (and, an array, `sharding`).

    A destination device that already holds all of the array gets nothing; every other
    gets its shard, so the bytes are the bytes that cross, once per destination.
    """
    devices = list(sharding.addressable_devices)
    shape = tuple(int(n) for n in getattr(x, "shape", ()))
    dtype = np.dtype(x.dtype)
    shard = math.prod(sharding.shard_shape(shape)) * dtype.itemsize
    on_cpu = all(d.platform == "cpu" for d in devices)
    if host:
        targets = devices
        source = "numpy"
        crosses = not on_cpu
    else:
        held = x.sharding
        if held.is_equivalent_to(sharding, len(shape)):
            return None
        here = set(held.device_set)
        whole = held.is_fully_replicated
        targets = [d for d in devices if d not in here or not whole]
        source = ",".join(inv.text(d) for d in sorted(here, key=lambda d: d.id))
        crosses = any(d.platform == "cpu" for d in here) != on_cpu
    texts = tuple(inv.text(d) for d in sorted(targets, key=lambda d: d.id))
    return Move(
        direction, source, texts, shard * len(targets), shape, str(dtype), len(shape) == 0, crosses
    )


def lint_transfers(
    transfers: Mapping[str, Any], devices: Sequence[str], where: str
) -> list[tuple[str, str, str]]:
    """(origin, code, message) of each `transfers:` field that does not do what it reads as
    on a machine with `devices` (target texts): `device_to_host` is JAX's own guard (no
    event, no count, JAX's error), and `host_to_device` watches nothing where every device
    is a CPU while `host_local` allows."""
    found = []
    d2h = transfers.get(D2H)
    if d2h is not None and d2h.value != "allow":
        what = (
            "JAX's own C++ log line on stderr (no transfer event, not counted)"
            if d2h.value == "log"
            else "JAX's own JaxRuntimeError (not TransferRefusedError, not counted)"
        )
        found.append((
            d2h.origin,
            "transfers-left-to-jax",
            f"transfers.device_to_host: {d2h.value} is handed to JAX's transfer guard: "
            f"{what}; a host read of an array goes through jaxlib's C++ buffer protocol, "
            "where devpolicy cannot see it (docs: Transfers, What cannot be seen)",
        ))  # fmt: skip
    h2d, local = transfers.get(H2D), transfers.get(HOST_LOCAL)
    quiet_local = local is None or local.value == "allow"
    cpu_only = all(text.startswith("cpu") for text in devices)
    if h2d is not None and h2d.value != "allow" and quiet_local and cpu_only:
        found.append((
            h2d.origin,
            "transfers-watch-nothing",
            f"transfers.host_to_device: {h2d.value} watches nothing on {where}: every "
            "device is a CPU, and host data into a CPU device is host_local, which "
            f"allows; set host_local: {h2d.value} to watch it",
        ))  # fmt: skip
    return found
