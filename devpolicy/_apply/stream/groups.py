"""The host memory a group of batches is cut into, and how a group is sent (with its
documents' segments, where a stream has a separator).

Host buffers: a device that adopts an aligned host buffer instead of copying it (JAX's
CPU client) gets a fresh aligned buffer per group, which it then owns (zero copies, and
no batch ever changes under its user). Anywhere else the buffers are a small ring, and a
buffer is reused only once every batch placed from it is ready (its transfer finished) and
none of them holds the buffer itself (checked by address the first time a buffer is used,
so a platform that adopts buffers unexpectedly only costs the reuse, never correctness).

Segments: worked out on a device that copies host memory (an accelerator's) from the
tokens sent; for one that adopts it (the CPU's), on the host, into a small ring of their
own (`SegmentRing`, reused as the tokens' ring is), and placed with the tokens by one
jitted call a group (`documents.placed_as_given`).
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from concurrent.futures import Future
from typing import Any, Literal

import jax
import numpy as np

from ..._base.limits import ALIGN
from ..._decide.decision import Decision, single_device_sharding
from ..hostview import copies_host_memory
from .documents import (
    BLOCK,
    CALL_BATCHES,
    FEW,
    FIELDS,
    SeparatorIs,
    on_device,
    on_device_packed,
    on_device_stacked,
    patched,
    placed_as_given,
    runs,
    segments,
    starts,
)


def every_window(view: np.ndarray[Any, Any], length: int) -> np.ndarray[Any, Any]:
    """Every window of `length` rows of `view` as a row of a read-only (starts, length,
    ...) view: one fancy index gathers a whole group, with numpy's 64-bit offsets."""
    starts = view.shape[0] - length + 1
    return np.lib.stride_tricks.as_strided(
        view,
        shape=(starts, length, *view.shape[1:]),
        strides=(view.strides[0], *view.strides),
        writeable=False,
    )


def aligned(nbytes: int) -> np.ndarray[Any, Any]:
    """`nbytes` of uninitialised host memory starting at a multiple of `ALIGN`."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start : start + nbytes]


class GroupBuffer:
    """One group's host memory: `count` batches of `shape`, each at an aligned offset,
    and the batches placed from it (weakly: a batch its user dropped needs no waiting)."""

    __slots__ = ("_raw", "batches", "checked", "high", "low", "placed", "shape")

    def __init__(self, count: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        nbytes = math.prod(shape) * dtype.itemsize
        step = -(-nbytes // ALIGN) * ALIGN
        raw = aligned(max(1, step * count))
        self.low = raw.ctypes.data
        self.high = self.low + raw.nbytes
        self.shape = (count, *shape)
        self.batches = [
            raw[i * step : i * step + nbytes].view(dtype).reshape(shape) for i in range(count)
        ]
        self.placed: list[Any] = []
        self.checked = False  # whether the batches placed from it were seen to copy it
        self._raw = raw if step == nbytes else None  # the batches back to back, if so

    def whole(self) -> np.ndarray[Any, Any] | None:
        """The batches as one (count, *shape) array, where they lie back to back (a
        batch's bytes a multiple of `ALIGN`), else None."""
        raw = self._raw
        if raw is None:
            return None
        return (
            raw[: math.prod(self.shape) * self.batches[0].itemsize]
            .view(self.batches[0].dtype)
            .reshape(self.shape)
        )

    def ready(self) -> None:
        """Wait for the transfers that read this buffer."""
        for ref in self.placed:
            array = ref()
            if array is not None:
                array.block_until_ready()
        self.placed = []

    def held_by(self, arrays: list[Any]) -> bool:
        """Whether any of `arrays` (placed from this buffer) holds the buffer's memory."""
        for array in arrays:
            try:
                if len(array.sharding.device_set) == 1:
                    pointers = [array.unsafe_buffer_pointer()]
                else:
                    pointers = [s.data.unsafe_buffer_pointer() for s in array.addressable_shards]
            except Exception:  # a platform that does not say: assume the worst
                return True
            if any(self.low <= p < self.high for p in pointers):
                return True
        return False


_INT32 = np.dtype(np.int32)


class SegmentRing:
    """Host memory for groups' segment ids and positions on their way to a device that
    adopts host memory (`place_documents`): a buffer is reused once every batch placed
    from it is ready, and only where none holds it (checked by address its first time,
    as for the tokens' buffers). Fresh memory a group cost more than the call that
    places it: its pages faulted in as the ids were written (about 70 faults a group of
    8 batches of 32 x 1,025 on a 2-core CPU). A buffer kept with the rows it holds other
    than one document a row (`keep(..., differing=)`) is handed out with them again
    (`take_known`), so a group with few documents writes only the rows that change."""

    __slots__ = ("_bools", "_dtype", "_planes", "_ring", "size")

    def __init__(self, size: int = 3, planes: int = 2, dtype: np.dtype[Any] = _INT32) -> None:
        self._ring: list[tuple[GroupBuffer, list[int] | None]] = []
        self._bools = np.empty(0, np.bool_)
        self.size = size  # groups in flight, in use, being cut (`GroupPlacer.buffers`)
        self._planes = planes  # arrays a batch: 2, its ids and positions (1: its tokens)
        self._dtype = dtype

    def take(self, count: int, shape: tuple[int, ...]) -> tuple[GroupBuffer, np.ndarray[Any, Any]]:
        """A buffer for `count` batches of `shape`, and its (planes, count, *shape) array:
        the ids, then the positions (or a packed group's tokens alone)."""
        buffer, whole, _ = self.take_known(count, shape)
        return buffer, whole

    def take_known(
        self, count: int, shape: tuple[int, ...]
    ) -> tuple[GroupBuffer, np.ndarray[Any, Any], list[int] | None]:
        """What `take` gives, and the rows (of the count x rows of a plane) that differ
        from one document a row where the buffer was kept saying so, else None (its
        contents unknown: a fresh buffer, or one kept without saying)."""
        ring = self._ring
        whole = (self._planes, count, *shape)
        if len(ring) >= self.size:
            oldest, differing = ring.pop(0)
            oldest.ready()
            if oldest.shape == (1, *whole):
                return oldest, oldest.batches[0], differing
        buffer = GroupBuffer(1, whole, self._dtype)
        return buffer, buffer.batches[0], None

    def keep(
        self, buffer: GroupBuffer, placed: list[Any], differing: list[int] | None = None
    ) -> None:
        """Reuse `buffer` once `placed` (the arrays made from it) are ready, unless one of
        them holds it; `differing`, where said, the rows of its planes that differ from
        one document a row (`documents.patched`), all the others being one."""
        if buffer.checked or not buffer.held_by(placed):
            buffer.checked = True
            buffer.placed = [weakref.ref(a) for a in placed]
            self._ring.append((buffer, differing))

    def bools(self, size: int) -> np.ndarray[Any, Any]:
        """At least `size` bools, the same memory each time where `size` is the same
        (`documents.starts` compares a group's tokens into it: the group's placing is its
        only user, one group at a time)."""
        if self._bools.size < size:
            self._bools = np.empty(size, np.bool_)
        return self._bools

    def clear(self) -> None:
        """Let go of every buffer (the stream ended)."""
        self._ring.clear()
        self._bools = np.empty(0, np.bool_)


class GroupPlan:
    """What one batch shape of a stream is decided and sent as, worked out once."""

    __slots__ = ("decision", "destination", "local", "nbytes", "reuse")

    def __init__(self, decision: Decision[Any], nbytes: int, disabled: bool) -> None:
        self.decision = decision
        self.nbytes = nbytes
        self.destination = None if disabled else decision.destination
        # Several processes: each builds only its rows of a sharded global batch.
        self.local = decision.mesh is not None and not disabled and jax.process_count() > 1
        # Batches bound where the device may adopt the buffer get a fresh one per group.
        self.reuse = not disabled and copies_host_memory(decision)

    def place(self, batches: list[np.ndarray[Any, Any]]) -> list[Any]:
        """The batches placed: one `device_put` for the group where one process holds it."""
        if self.local:
            sharding = self.decision.sharding
            return [
                jax.make_array_from_process_local_data(sharding, b)  # type: ignore[no-untyped-call]
                for b in batches
            ]
        if self.destination is None:  # disabled: what JAX does without devpolicy
            return list(jax.device_put(batches))
        return list(jax.device_put(batches, self.destination))


def place_documents(
    plan: GroupPlan,
    buffer: GroupBuffer,
    separator: tuple[int, SeparatorIs],
    fields: tuple[str, str, str] = FIELDS,
    ring: SegmentRing | None = None,
) -> tuple[list[dict[str, Any]], list[Any]]:
    """A group's batches with their segment ids and positions (`documents`): the tokens
    placed as the batches alone are, the ids and positions worked out from them on the
    device, a call per `CALL_BATCHES` of them, sharded as the tokens are
    (`documents.on_device`); each batch a dict of the tokens, segment ids and positions
    under `fields`' names; and the tokens placed. On a device that adopts host memory
    (the CPU's) the host's ids and positions are placed with the tokens in one call
    (`_placed_as_given`), worked out into `ring`'s memory where given."""
    found = _on_device(plan, buffer, separator)
    if found is None:
        found = _placed_as_given(plan, buffer, separator, ring)
    if found is None:
        tokens = plan.place(buffer.batches)
        ids, positions = placed_from_host(plan, buffer.batches, buffer.whole(), separator)
    else:
        tokens, ids, positions = found
    batches = [
        dict(zip(fields, arrays, strict=True))
        for arrays in zip(tokens, ids, positions, strict=True)
    ]
    return batches, tokens


def _on_device(
    plan: GroupPlan, buffer: GroupBuffer, separator: tuple[int, SeparatorIs]
) -> tuple[list[Any], list[Any], list[Any]] | None:
    """The group's tokens, ids and positions worked out on the device, or None where the
    host's are placed instead: a device that adopts host memory (the CPU's) takes the
    host's for no transfer, and XLA's CPU code is slower than the host's (measured:
    docs/benchmarks.md, "Segment ids worked out on the device": `_placed_as_given`), and
    so is one whose function is still compiling (`_compiled`)."""
    token, separator_is = separator
    sharding = plan.decision.sharding
    if not _worked_out_there(plan):
        return None
    batches = buffer.batches
    count = len(batches)
    whole = count // CALL_BATCHES * CALL_BATCHES  # the batches sent stacked, 8 at a time
    stacked = None if plan.local else _stacked_sharding(sharding)
    if stacked is None:
        whole = 0
    tokens: list[Any] = []
    ids: list[Any] = []
    positions: list[Any] = []
    if whole:
        work = on_device_stacked(token, separator_is, sharding)
        shape = (CALL_BATCHES, *batches[0].shape)
        if not _compiled(work, shape, batches[0].dtype, stacked, call="stacked"):
            return None
        group = buffer.whole()
        for start in range(0, whole, CALL_BATCHES):
            part = batches[start : start + CALL_BATCHES]
            host = np.stack(part) if group is None else group[start : start + CALL_BATCHES]
            some = work(jax.device_put(host, stacked))
            tokens += some[0]
            ids += some[1]
            positions += some[2]
    if whole < count:
        rest = plan.place(batches[whole:])
        first = rest[0]
        work = on_device(token, separator_is, first.sharding)
        if not _compiled(work, first.shape, first.dtype, first.sharding):
            # Still compiling: these batches' ids from the host (the same values), their
            # tokens already placed (never sent twice).
            stacked_all = buffer.whole() if not whole else None
            some_ids, some_positions = placed_from_host(
                plan, batches[whole:], stacked_all, separator
            )
            return tokens + rest, ids + some_ids, positions + some_positions
        for start in range(0, len(rest), CALL_BATCHES):
            # Calls of CALL_BATCHES batches, the last one's filled with copies of its last
            # batch (outputs dropped): a shape compiles once, not once per group size (a
            # stream's first group is one batch, then 8 or up to 32, its last any size; a
            # compile cost 0.5-1.1 s on a loaded 2-core CPU, a call of 8 about 1 ms).
            part = rest[start : start + CALL_BATCHES]
            filled = (*part, *[part[-1]] * (CALL_BATCHES - len(part)))
            some_ids, some_positions = work(filled)
            ids += some_ids[: len(part)]
            positions += some_positions[: len(part)]
        tokens += rest
    return tokens, ids, positions


def _worked_out_there(plan: GroupPlan) -> bool:
    """Whether a group's segment ids and positions may be worked out on its device: a
    device that copies host memory (the CPU's adopts it: the host's are sent for
    nothing), a sharding said, and the device's own memory (`on_the_device`)."""
    sharding = plan.decision.sharding
    return not (
        plan.destination is None
        or not copies_host_memory(plan.decision)
        or sharding is None
        or not on_the_device(sharding)
    )


def _placed_as_given(
    plan: GroupPlan,
    buffer: GroupBuffer,
    separator: tuple[int, SeparatorIs],
    ring: SegmentRing | None,
) -> tuple[list[Any], list[Any], list[Any]] | None:
    """On a device that adopts host memory (the CPU's): the group's ids and positions
    worked out on the host, then each `CALL_BATCHES` batches' tokens, ids and positions
    placed by one jitted call (`documents.placed_as_given`: measured on a 2-core CPU, a
    `device_put` a batch's array cost about as much as the call does for 3 arrays a
    batch). None where the host's are placed beside the tokens instead: a device that
    copies host memory, several processes, a memory other than the device's own. A part
    whose call is still compiling is placed by `device_put` (the same values).

    A group with few documents patches only the rows of a ring's buffer that differ
    from one document a row (`documents.patched`)."""
    if not _given_whole(plan):
        return None
    batches = buffer.batches
    whole = buffer.whole()
    windows = np.stack(batches) if whole is None else whole
    token, separator_is = separator
    if ring is None:
        ids, positions = segments(windows, token, separator_is)
        return placed_together(plan, batches, list(ids), list(positions))
    found = starts(windows, token, separator_is, ring.bools(windows.size))
    into, planes, differing = ring.take_known(len(batches), batches[0].shape)
    if found.size > FEW:
        runs(found, planes[0], planes[1])
        differing = None  # every row written: none is known to be one document
    else:
        differing = patched(found, planes[0], planes[1], differing)
    placed = placed_together(plan, batches, list(planes[0]), list(planes[1]))
    assert placed is not None
    ring.keep(into, [*placed[1], *placed[2]], differing)
    return placed


def _given_whole(plan: GroupPlan) -> bool:
    """Whether a group's host arrays are placed by one jitted call (`placed_together`):
    one process, a device that adopts host memory, its own memory."""
    sharding = plan.decision.sharding
    return not (
        plan.destination is None
        or plan.local
        or copies_host_memory(plan.decision)
        or sharding is None
        or not on_the_device(sharding)
    )


def placed_together(
    plan: GroupPlan,
    tokens: list[np.ndarray[Any, Any]],
    ids: list[np.ndarray[Any, Any]],
    positions: list[np.ndarray[Any, Any]],
) -> tuple[list[Any], list[Any], list[Any]] | None:
    """A group's tokens, segment ids and positions (host arrays, a batch each) placed by
    one jitted call a `CALL_BATCHES` batches (`documents.placed_as_given`), on a device
    that adopts host memory (the CPU's: a `device_put` an array cost as much as the call
    does for 3 arrays a batch); a part whose call is still compiling by `device_put`
    (the same values). None where they are placed otherwise (`_given_whole`)."""
    if not _given_whole(plan):
        return None
    sharding = plan.decision.sharding
    first = tokens[0]
    placed: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
    for start in range(0, len(tokens), CALL_BATCHES):
        end = start + CALL_BATCHES
        arrays = [*tokens[start:end], *ids[start:end], *positions[start:end]]
        count = len(arrays) // 3
        work = placed_as_given(sharding, len(arrays))
        if _compiled(work, (count, *first.shape), first.dtype, sharding, call="given"):
            made = work(*arrays)
        else:
            made = plan.place(arrays)
        for i, part in enumerate(placed):
            part += made[i * count : (i + 1) * count]
    return placed


def _stacked_on_device(plan: GroupPlan, words: bool = False) -> Any:
    """How a group's batches are sent stacked in one array (`_stacked_sharding`) for their
    segment ids and positions to be worked out on the device from what is sent: one
    process, a device that copies host memory, its own memory (as `_on_device` asks).
    `words`: what is sent beside the tokens has another last axis (a packed group's
    `packed.start_words`), so the rows alone may be split. None where the host's ids and
    positions are placed instead."""
    if plan.local or not _worked_out_there(plan):
        return None
    stacked = _stacked_sharding(plan.decision.sharding)
    if words and isinstance(stacked, jax.sharding.NamedSharding):
        spec = tuple(stacked.spec)
        if len(spec) > 2 and spec[2] is not None:  # a row's tokens split over devices
            return None
    return stacked


def packed_on_device(plan: GroupPlan, shape: tuple[int, ...], dtype: Any) -> tuple[Any, Any] | None:
    """For a packed group of `shape` (count, rows, length) and `dtype`: the device function
    that works its ids and positions out from its rows' start words
    (`documents.on_device_packed`) and the sharding its stacked arrays are sent with; None
    where the host's ids and positions are placed instead (`_stacked_on_device`), and
    while the function compiles for this shape (on a thread of its own: the host's, the
    same values, meanwhile)."""
    stacked = _stacked_on_device(plan, words=True)
    if stacked is None:
        return None
    work = on_device_packed(plan.decision.sharding)
    if not _compiled(work, shape, dtype, stacked, call="packed"):
        return None
    return work, stacked


def placed_packed(
    device: tuple[Any, Any], tokens: np.ndarray[Any, Any], words: np.ndarray[Any, Any]
) -> tuple[list[Any], list[Any], list[Any]]:
    """A packed group's batches placed (`packed_on_device`'s `device`): its stacked tokens
    and their rows' start words sent in two transfers, one call giving each batch's
    tokens, segment ids and positions."""
    work, stacked = device
    made = work(*jax.device_put((tokens, words), stacked))
    return list(made[0]), list(made[1]), list(made[2])


def _stacked_sharding(sharding: Any) -> Any:
    """How `CALL_BATCHES` batches placed by `sharding` are sent stacked in one array (a
    new leading axis, not split), or None where that cannot be said."""
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = jax.sharding.PartitionSpec(None, *sharding.spec)  # type: ignore[no-untyped-call]
        return jax.sharding.NamedSharding(sharding.mesh, spec, memory_kind=sharding.memory_kind)
    devices = sharding.device_set
    if len(devices) == 1:  # a whole array on one device, at any rank
        return single_device_sharding(next(iter(devices)), sharding.memory_kind)
    return None


#: The device function's compile for each (function, shape, dtype, sharding), started on
#: a thread of its own at a stream's first group: one process's stream meanwhile works its
#: segments out on the host (the same values), so its first batches wait for no compile.
_COMPILING: dict[tuple[Any, ...], Future[Any]] = {}
_COMPILING_LOCK = threading.Lock()


def _after_fork() -> None:
    """A forked child has none of its parent's threads: records of its own."""
    global _COMPILING_LOCK
    _COMPILING_LOCK = threading.Lock()
    _COMPILING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


#: How a device function is called: with `CALL_BATCHES` batches placed ("batches"), one
#: stacked array placed ("stacked"), a group's tokens, ids and positions as host
#: arrays, (count, ...) of them by `shape` ("given"), or a packed group's stacked tokens
#: and their rows' start words (`documents.on_device_packed`, "packed").
Call = Literal["batches", "stacked", "given", "packed"]


def _compiled(
    work: Any, shape: tuple[int, ...], dtype: Any, sharding: Any, *, call: Call = "batches"
) -> bool:
    """Whether `work` is compiled for its input of `shape`, `dtype` and `sharding` (as
    `call` says it is called): under several processes
    always (each compiles at its first call, in step: every process must take the same
    path for a step); in one process, once the compile started on its thread is done
    (where it failed, the call then raises what it raises)."""
    if jax.process_count() > 1:
        return True
    key = (work, shape, dtype, sharding)
    with _COMPILING_LOCK:
        future = _COMPILING.get(key)
        if future is None:
            if len(_COMPILING) >= 64:  # shapes a process met: bounded
                _COMPILING.clear()
            future = _COMPILING[key] = _compiling(work, shape, dtype, sharding, call)
    return future.done()


def _compiling(
    work: Any, shape: tuple[int, ...], dtype: Any, sharding: Any, call: Call
) -> Future[Any]:
    """The compile of `work` for its input (`_compiled`), on a thread of its own that
    ends with it (no thread is left behind: a process alone with its main thread is one
    that `load_file` may pause the collector in)."""
    future: Future[Any] = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            _compile(work, shape, dtype, sharding, call)
        except BaseException as e:  # the stream's own call raises it again, in context
            future.set_exception(e)
        else:
            future.set_result(None)

    # Not a daemon: a process that ends while XLA compiles on a daemon thread aborts
    # ("terminate called ..."), so its end waits for the compile (a second or two).
    threading.Thread(target=run, name="devpolicy-compile", daemon=False).start()
    return future


def _compile(work: Any, shape: tuple[int, ...], dtype: Any, sharding: Any, call: Call) -> None:
    """One call of `work` on zeros of its input's shape, dtype and placement: compiled,
    and its compile in JAX's caches for the stream's calls."""
    zeros = np.zeros(shape, dtype)
    if call == "given":  # host arrays, as the stream hands them
        outputs = work(*zeros, *np.zeros((2, *shape), np.int32).reshape(-1, *shape[1:]))
    elif call == "packed":
        words = np.zeros((*shape[:-1], -(-shape[-1] // BLOCK) + 1), np.uint32)
        outputs = work(jax.device_put(zeros, sharding), jax.device_put(words, sharding))
    else:
        dummy = jax.device_put(zeros, sharding)
        outputs = work(dummy) if call == "stacked" else work((dummy,) * CALL_BATCHES)
    jax.block_until_ready(outputs)  # type: ignore[no-untyped-call]


def on_the_device(sharding: Any) -> bool:
    """Whether batches placed with `sharding` can have their segments worked out where
    they are: not where the decision keeps them in a host memory space of the device
    (`pinned_host`, say: a computation there runs only under `compute_on`, and would pull
    them into the device's memory), which the host reference then serves."""
    kind = sharding.memory_kind
    if kind is None:
        return True
    try:
        default = next(iter(sharding.device_set)).default_memory().kind
    except Exception:  # a platform that does not say its memories: as the tokens are
        return True
    return bool(kind == default)


def placed_from_host(
    plan: GroupPlan,
    batches: list[np.ndarray[Any, Any]],
    whole: np.ndarray[Any, Any] | None,
    separator: tuple[int, SeparatorIs],
) -> tuple[list[Any], list[Any]]:
    """The segment ids and positions of `batches` (`whole`: the same stacked, where they
    lie so) worked out on the host and placed as the tokens are (see `on_the_device` for
    where)."""
    windows = np.stack(batches) if whole is None else whole
    ids, positions = segments(windows, *separator)
    placed = plan.place([*ids, *positions])
    count = len(batches)
    return placed[:count], placed[count:]
