"""Policy-aware safetensors loading: each tensor straight to its own device, lean and exact."""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import mmap as _mmap
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO

import jax
import numpy as np

from .._apply.hostview import INDEX_LIMIT, warn_unindexable
from .._apply.leaves import ARRAY_LIKE, leaf_names, leaf_names_and_axes, leaf_shape_dtype
from .._apply.narrowing import Narrow, check_mode, loss_in_pieces, narrow_into, narrowed_event
from .._base.errors import CheckpointMismatchError, NarrowingError, SafetensorsFileError
from .._base.events import EventLog
from .._base.limits import ALIGN, CHUNK_BYTES
from .._base.sizes import format_size
from .._base.visible import visible
from .._decide.decider import Decider
from .._decide.decision import Decision, DeviceT
from .._decide.items import maps_from_file
from .._decide.routing import ALWAYS_MAPPED, MAPPED_IF_RULE, NEVER_MAPPED
from .._document.axes import Attached
from .._document.layers import RuleEntry, Settings
from .._document.schema import NamesSpec, separator_problem
from .._machine.capacity import pool_of, pool_text
from .._machine.ledger import record_each
from .._machine.machine import VirtualMachine
from .._names.matching import SourceFile, compile_file_glob
from .._names.prefixes import literal_prefix
from .format import (
    DEFAULT_ALIGN,
    Checkpoint,
    Header,
    TensorEntry,
    as_array,
    check_align,
    map_tensor_file,
    open_checkpoint,
    open_tensor_file,
    os_error,
    read_header,
    read_header_from,
    reopen_tensor_file,
    save_arrays,
)

PathLike = str | os.PathLike[str]

_MAP_THRESHOLD = 2**20  # below this a map per tensor costs more than it saves
_TRIED_FIRST = {"code": 0, "env": 1, "policy": 2}
_READ_BATCH = 1024  # tensors per scattered read (Linux's IOV_MAX)
# A sharded tensor's slices are read through their covering range, in chunks of this
# size, when that costs less than a system call per run; a call costs about as much as
# reading this many more bytes from the page cache (measured: 2.7 us a call, 0.6 ns a byte).
_GATHER_BYTES = 8 * 2**20
_CALL_BYTES = 4096
# Arrays per `device_put`: JAX's per-array cost grows with the list (measured on 10,000
# 16 KiB arrays: 0.23 s in lists of 32-128, 0.30 s in lists of 1,024, 0.60 s one by one).
_PUT_BATCH = 128
PROGRESS_THRESHOLD = 256 * 2**20
_NARROW = {"I64": np.dtype(np.int32), "U64": np.dtype(np.uint32), "F64": np.dtype(np.float32)}


def _names(header: Header, stem: str, names: NamesSpec) -> list[str]:
    """Each tensor's name: `<prefix>/<key>`, or the key alone under an empty prefix, the
    key's parts separated by `/` whatever the policy's `names.separator` says they are."""
    sep = names.separator
    keys = [t.key if sep == "/" else t.key.replace(sep, "/") for t in header.tensors]
    return [f"{stem}/{key}" if stem else key for key in keys]


def _stem(stem: str, prefix: str | None, names: NamesSpec) -> str:
    """The prefix of a checkpoint's names: the call's, else the policy's, else `stem`."""
    if prefix is not None:
        return prefix
    return stem if names.prefix is None else names.prefix


def _sources(files: tuple[Any, ...], path: PathLike) -> list[SourceFile]:
    """Each file's source for `file:` rules: its own path and the path it was loaded by
    (a checkpoint's directory or index; the same file otherwise)."""
    return [SourceFile.of(file, path) for file in files]


def _aligned_empty(nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """A 64-byte-aligned buffer that `device_put` to a CPU device adopts without a copy.

    numpy's large allocations come out 16 mod 64, which XLA must copy. Large buffers are
    anonymous maps instead: page-aligned, and given back to the OS as soon as the last
    array using them goes. No `MADV_HUGEPAGE`, decided by medians on these machines (THP
    in `madvise` mode): a bf16 model loaded in a median 1.62 s with it and 0.86 s without,
    a 1 GiB buffer's worst run took 2.9 s against 1.0 s, and 10,000 small tensors read
    into huge-page batch buffers loaded in 1.24-1.58 s against 0.81-0.88 s without (a
    bare 64 MiB read alone was faster with it: the load as a whole is what counts).
    """
    if nbytes >= _MAP_THRESHOLD:
        region = _mmap.mmap(-1, nbytes, flags=_mmap.MAP_PRIVATE | _mmap.MAP_ANONYMOUS)
        return np.frombuffer(region, np.uint8)
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start : start + nbytes]


def _host_buffer(header: Header, key: str, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """`_aligned_empty`, with running out of memory said as an error naming file and tensor."""
    try:
        return _aligned_empty(nbytes)
    except OSError as e:
        raise os_error(header.path, e, "cannot allocate a host buffer", tensor=key) from None


def _x64() -> bool:
    return bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined]


class _Transfers:
    """Arrays waiting to be sent to their devices, sent together in one `device_put`.

    One call for many small tensors instead of one each: JAX's per-call cost (~25 us) is
    most of what a small tensor costs. Each batch is waited for, so host staging stays
    bounded by one batch.
    """

    __slots__ = ("_advance", "_arrays", "_destinations", "_keys", "_nbytes", "_out")

    def __init__(self, out: dict[str, jax.Array], advance: Callable[[int], None]) -> None:
        self._out = out
        self._advance = advance
        self._keys: list[str] = []
        self._arrays: list[np.ndarray[Any, Any]] = []
        self._destinations: list[Any] = []
        self._nbytes = 0

    def add(self, key: str, array: np.ndarray[Any, Any], decision: Decision, nbytes: int) -> None:
        self._keys.append(key)
        self._arrays.append(array)
        self._destinations.append(decision.destination)
        self._nbytes += nbytes
        if self._nbytes >= CHUNK_BYTES or len(self._keys) >= _PUT_BATCH:
            self.flush()

    def flush(self) -> None:
        if not self._keys:
            return
        placed: list[jax.Array] = jax.device_put(self._arrays, self._destinations)
        for array in placed:
            array.block_until_ready()
        self._out.update(zip(self._keys, placed, strict=True))
        self._advance(self._nbytes)
        self._keys, self._arrays, self._destinations, self._nbytes = [], [], [], 0


def load_file(
    path: PathLike,
    decider: Decider,
    *,
    prefix: str | None = None,
    mmap: bool | None = None,
    narrow: Narrow = "exact",
    progress: bool | None = None,
    into: Any = None,
    strict: bool = True,
    separator: str | None = None,
) -> Any:
    """Load a safetensors file or checkpoint by `decider`'s rules: a dict of its tensors,
    or with `into`, that tree filled. See `devpolicy.load_file`."""
    check_mode(narrow)
    if not isinstance(strict, bool):
        raise TypeError(f"strict= takes True or False, got {strict!r}")
    naming = _naming(decider.settings.names, separator)
    with _collector_paused():
        return _load_file(path, decider, prefix, mmap, narrow, progress, naming, into, strict)


def _naming(names: NamesSpec, separator: str | None) -> NamesSpec:
    """The policy's `names`, with the call's separator where one is given."""
    if separator is None:
        return names
    problem = separator_problem(separator)
    if problem is not None:
        raise ValueError(f"separator= takes {problem}")
    return names.model_copy(update={"separator": separator})


# Loads in progress that paused the cyclic collector (several threads may load at once:
# the last one out turns it back on).
_paused_by: list[int] = [0]
_paused_lock = threading.Lock()


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a file loads, back on after (where it
    was on).

    A load makes a few objects per tensor that all live on (arrays, entries, decisions)
    and no cycles, so each collection the allocations trigger walks a growing heap and
    frees nothing: measured on 10,000 small tensors, a fifth to a third of the load.
    """
    with _paused_lock:
        if _paused_by[0] == 0 and not gc.isenabled():
            paused = False  # the application turned it off: leave it so
        else:
            paused = True
            _paused_by[0] += 1
            gc.disable()
    try:
        yield
    finally:
        if paused:
            with _paused_lock:
                _paused_by[0] -= 1
                if _paused_by[0] == 0:
                    gc.enable()


def _load_file(
    path: PathLike,
    decider: Decider,
    prefix: str | None,
    mmap: bool | None,
    narrow: Narrow,
    progress: bool | None,
    naming: NamesSpec,
    into: Any,
    strict: bool,
) -> Any:
    checkpoint = open_checkpoint(path)
    _left_out(decider.events, path, checkpoint)
    # Files are opened one at a time (a checkpoint may have more files than a process may
    # open): once for the header, again only while read, and refused if replaced between.
    with _OneFileOpen() as opened:
        headers = []
        for file in checkpoint.files:
            with open_tensor_file(file) as f:
                headers.append((file, read_header_from(f, file)))
        checkpoint.check([h for _, h in headers])
        fitted = None
        if into is not None:
            fitted = _fit_into(into, headers, naming, strict, path)
            headers = fitted.headers
            _skipped_event(decider.events, path, fitted.skipped)
        stem = _stem(checkpoint.stem, prefix, naming)
        names = [_names(header, stem, naming) for _, header in headers]
        sources = _sources(tuple(file for file, _ in headers), path)
        x64 = _x64()
        # All files decided as one placement: memory-aware rules see the whole checkpoint.
        decisions = decider.resolve_many(
            [
                (
                    n,
                    t.array_nbytes,
                    t.shape,
                    _maps(t, mmap, x64),
                    source,
                    None if fitted is None else fitted.attached.get(t.key),
                )
                for (_, header), file_names, source in zip(headers, names, sources, strict=True)
                for n, t in zip(file_names, header.tensors, strict=True)
            ],
            summarised=True,
        )
        out: dict[str, jax.Array] = {}
        first = 0
        for (_, header), file_names in zip(headers, names, strict=True):
            mine = decisions[first : first + len(file_names)]
            first += len(file_names)
            started = time.perf_counter()
            mapped, narrowed, bytes_read = _load_opened(
                opened.open(header), header, file_names, mine, decider, mmap, narrow, progress, out
            )
            seconds = time.perf_counter() - started
            _mmap_refused(decider.events, header, mine, mmap, _x64())
            _summary(decider.events, header, mine, seconds, mapped, narrowed, bytes_read)
        _loaded(decider.events, out, [h for _, h in headers], names, decisions, x64)
        flat = [n for file_names in names for n in file_names]
        uses = _uses_of_decisions(decider.settings, flat, list(decisions), sources)
        _silent_events(decider.events, uses, path)
    if fitted is not None:
        return jax.tree_util.tree_unflatten(fitted.treedef, [out[key] for key in fitted.keys])
    return {t.key: out[t.key] for _, header in headers for t in header.tensors}


@dataclass(frozen=True, slots=True)
class _Fitted:
    """A checkpoint matched to an `into=` tree: what to read, and which tensor fills
    each leaf."""

    #: The files and headers to read, each header holding only the tensors leaves take.
    headers: list[tuple[Any, Header]]
    #: Per leaf, in `tree_leaves` order, the key of the tensor that fills it.
    keys: list[str]
    treedef: Any
    #: Tensors no leaf takes, left unread (`strict=False`).
    skipped: list[str]
    #: By tensor key, the axis names its leaf's framework attached (`axes: attached`).
    attached: dict[str, Attached | None]


def _fit_into(
    into: Any,
    headers: list[tuple[Any, Header]],
    naming: NamesSpec,
    strict: bool,
    path: PathLike,
) -> _Fitted:
    """Match each leaf of `into` to the tensor of the same name, every difference found
    before anything is read (`CheckpointMismatchError` lists them all)."""
    leaves, treedef = jax.tree_util.tree_flatten(into)
    # Named as `put` names them, less its first part: `layers/0/kernel`.
    full_names, axes = leaf_names_and_axes("", into)
    paths = [name[1:] for name in full_names]
    attached: dict[str, Attached | None] = {}
    if not leaves or paths == [""]:
        raise TypeError(
            "load_file(into=...) takes a tree whose leaves have names (a dict, nnx.State, "
            f"flax params; their paths are matched to tensor keys), got {type(into).__name__}"
        )
    separator = naming.separator
    by_name: dict[str, TensorEntry] = {}
    mismatched: list[tuple[str, str]] = []
    for _, header in headers:
        # Named as a load names them, without the prefix: the leaf's own name.
        for name, entry in zip(_names(header, "", naming), header.tensors, strict=True):
            other = by_name.setdefault(name, entry)
            if other is not entry:
                mismatched.append(
                    (name, f"both tensors {other.key!r} and {entry.key!r} are named so")
                )
    x64 = _x64()
    keys: list[str] = []
    missing: list[str] = []
    taken: set[str] = set()
    for leaf_path, leaf, leaf_axes in zip(paths, leaves, axes, strict=True):
        # Split as the file's keys are: a leaf named `model.layers.0.w` (a flat dict of
        # Hugging Face keys) finds `model.layers.0.w` under separator '.'.
        name = leaf_path if separator == "/" else leaf_path.replace(separator, "/")
        found = by_name.get(name)
        if found is None:
            missing.append(leaf_path)
            continue
        if name in taken:
            mismatched.append((leaf_path, "another leaf of the tree has the same name"))
            continue
        taken.add(name)
        shape, dtype = leaf_shape_dtype(leaf, "load_file(into=...)", leaf_path)
        held, wanted = _held(found.dtype, x64), _held(dtype, x64)
        if found.shape != shape or held != wanted:
            mismatched.append(
                (
                    leaf_path,
                    f"the file's {found.key!r} is {_typed(held, found.shape)}, "
                    f"the leaf is {_typed(wanted, shape)}",
                )
            )
        keys.append(found.key)
        attached[found.key] = leaf_axes
    unexpected = [entry.key for name, entry in by_name.items() if name not in taken]
    if missing or mismatched or (unexpected and strict):
        raise CheckpointMismatchError(
            os.fspath(path),
            missing=missing,
            unexpected=unexpected if strict else (),
            mismatched=mismatched,
            hint=None if taken else _naming_hint(missing, unexpected, separator),
        )
    if not unexpected:
        return _Fitted(headers, keys, treedef, [], attached)
    wanted_keys = set(keys)
    kept = []
    for file, header in headers:
        tensors = tuple(t for t in header.tensors if t.key in wanted_keys)
        if tensors:  # a file no leaf takes from is not opened again
            kept.append((file, replace(header, tensors=tensors)))
    return _Fitted(kept, keys, treedef, unexpected, attached)


def _held(dtype: np.dtype[Any], x64: bool) -> np.dtype[Any]:
    """The dtype JAX holds for `dtype`: 64-bit types in 32 bits with x64 disabled."""
    return dtype if x64 else np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _typed(dtype: np.dtype[Any], shape: tuple[int, ...]) -> str:
    return f"{dtype.name}[{', '.join(map(str, shape))}]"


def _naming_hint(missing: list[str], unexpected: list[str], separator: str) -> str | None:
    """When no leaf found its tensor, the two namings side by side."""
    if not missing or not unexpected:
        return None
    return (
        f"leaves are named by their path, parts joined by '/' (first: {missing[0]!r}); "
        f"the file's keys are split at {separator!r} (first unmatched: {unexpected[0]!r}). "
        "Where they differ in separator, pass separator= (or set names.separator in the "
        "policy); where the file's keys carry an extra first part, load into a tree that "
        "has it ({'model': tree})."
    )


def _skipped_event(events: EventLog, path: PathLike, skipped: list[str]) -> None:
    if skipped and events.enabled("info"):
        events.emit(
            "info",
            "into_skipped",
            {
                "file": visible(os.fspath(path)),
                "count": len(skipped),
                "first": [visible(key) for key in skipped[:5]],
                "reason": "strict=False: tensors no leaf of the tree takes are not read",
            },
        )


_SCALARS = (np.generic, bool, int, float, complex)


def _flat_tensors(tensors: Any) -> bool:
    """A mapping of arrays (keys as written), not a tree to be named leaf by leaf: its
    values arrays, numbers, or lists of numbers (one tensor each, as `np.asarray` makes)."""
    return isinstance(tensors, Mapping) and all(
        isinstance(value, ARRAY_LIKE)
        or (
            isinstance(value, (list, tuple))
            and all(isinstance(x, _SCALARS) for x in jax.tree_util.tree_leaves(value))
        )
        for value in tensors.values()
    )


def save_file(
    tensors: Any,
    path: PathLike,
    *,
    align: int = DEFAULT_ALIGN,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write arrays (numpy or JAX) as a safetensors file laid out for zero-copy loading.

    `tensors` is a mapping of keys to arrays (written under those keys), or any pytree:
    nested dicts, flax params, `nnx.state(model)`, each leaf written under its name as
    `put` names it, less the first part (`layers/0/kernel`; no `/value`), so that
    `load_file(path, into=tree)` fills the same tree back.

    The header is padded and tensors ordered so the largest start at `align`-byte file
    offsets (the format allows no holes between tensors). Any safetensors reader reads it.
    Written to a temporary file and renamed: an error leaves nothing behind.

    Raises:
        SafetensorsFileError: `path` exists but is not a regular file (a device, a FIFO, a
            directory), or cannot be written; nothing is written.
        ValueError: a bad `align`, dtype, name or metadata; two leaves of the same name.
        TypeError: a leaf that is not an array or number.

    Example:
        >>> import devpolicy, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
        >>> devpolicy.save_file({"w": np.ones((4, 4), np.float32)}, path)
        >>> from safetensors.numpy import load_file
        >>> float(load_file(path)["w"].sum())
        16.0
        >>> devpolicy.save_file({"layers": [{"w": np.ones(2)}], "step": np.int32(3)}, path)
        >>> sorted(load_file(path))
        ['layers/0/w', 'step']
    """
    check_align(align)  # before any array is converted or anything written
    if _flat_tensors(tensors):
        save_arrays(dict(tensors), path, align=align, metadata=metadata)
        return
    leaves = jax.tree_util.tree_leaves(tensors)
    names = [name[1:] for name in leaf_names("", tensors)]
    if names == [""]:
        raise TypeError(
            "save_file() takes a mapping of names to arrays or a tree whose leaves have "
            f"names, got one {type(tensors).__name__}"
        )
    arrays: dict[str, Any] = {}
    for name, leaf in zip(names, leaves, strict=True):
        if name in arrays:
            raise ValueError(f"save_file(): two leaves of the tree are named {name!r}")
        if not isinstance(leaf, ARRAY_LIKE):
            raise TypeError(
                f"save_file(): leaf {name!r} is a {type(leaf).__name__}, not an array or number"
            )
        arrays[name] = leaf
    save_arrays(arrays, path, align=align, metadata=metadata)


def _loaded(
    events: EventLog,
    out: dict[str, jax.Array],
    headers: list[Header],
    names: list[list[str]],
    decisions: list[Decision],
    x64: bool,
) -> None:
    """Each loaded array into the ledger under its name and rule; the once-per-process
    warning for an array JAX cannot index (over 2**31 elements with x64 off)."""
    flat = [
        (entry, name)
        for header, file_names in zip(headers, names, strict=True)
        for entry, name in zip(header.tensors, file_names, strict=True)
    ]
    record_each(
        (out[entry.key], name, decision.origin, decision.rule)
        for (entry, name), decision in zip(flat, decisions, strict=True)
    )
    for (entry, name), decision in zip(flat, decisions, strict=True):
        if not x64 and entry.nbytes > INDEX_LIMIT:  # fewer bytes: fewer elements too
            warn_unindexable(events, name, entry.shape, decision.device_text, x64)


class _OneFileOpen:
    """The checkpoint file being read: opening the next closes the one before.

    A map of a file (for `mmap`) holds its own descriptor for as long as arrays use it.
    """

    def __init__(self) -> None:
        self._file: BinaryIO | None = None

    def open(self, header: Header) -> BinaryIO:
        self.close()
        self._file = reopen_tensor_file(header)
        return self._file

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> _OneFileOpen:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _load_opened(
    f: BinaryIO,
    header: Header,
    names: list[str],
    decisions: list[Decision],
    decider: Decider,
    mmap: bool | None,
    narrow: Narrow,
    progress: bool | None,
    out: dict[str, jax.Array],
) -> tuple[int, int, int]:
    """Load one open file's tensors into `out`; (mapped, narrowed, bytes read)."""
    x64 = _x64()
    mapped = narrowed = 0
    bytes_read = 0
    # Every 64-bit tensor that would change, so one error can list them all. Once there is
    # one, nothing else is placed: only the 64-bit tensors are still judged.
    problems: list[tuple[str, str]] = []
    order = sorted(range(len(header.tensors)), key=lambda i: header.tensors[i].offset)
    total = sum(t.nbytes for t in header.tensors)
    fd = f.fileno()
    region: _mmap.mmap | None = None
    with (
        _progress(header, total, progress) as advance,
        _ReadAhead(fd, header, decisions, order, mmap, x64) as ahead,
    ):
        transfers = _Transfers(out, advance)
        position = 0
        while position < len(order):
            i = order[position]
            entry, decision = header.tensors[i], decisions[i]
            target = _NARROW.get(entry.dtype_name) if not x64 else None
            if problems and target is None:
                position += 1
                continue
            if entry.packed:
                # Packed in the file (F4, two values a byte): read whole and unpacked to
                # one value a byte, as JAX holds them; never mapped, sharded after reading.
                transfers.flush()
                unpacked = jax.device_put(_read(fd, header, entry, advance), decision.destination)
                unpacked.block_until_ready()
                out[entry.key] = unpacked
                position += 1
                continue
            if decision.mesh is not None:
                # Sharded: this process reads only the slices its devices hold.
                transfers.flush()
                if region is None and target is None and _may_map(entry, decision, mmap):
                    region = map_tensor_file(f, header)
                assert decision.sharding is not None
                held = decision.sharding.addressable_devices_indices_map(entry.shape)
                reader = _ShardReader(fd, header, entry, region, target, narrow, held.values())
                try:
                    placed: jax.Array = jax.make_array_from_callback(
                        entry.shape, decision.sharding, reader
                    )
                except NarrowingError as e:
                    problems += e.problems
                    position += 1
                    continue
                placed.block_until_ready()
                if target is not None:
                    narrowed_event(
                        decider.events,
                        names[i],
                        np.empty(0, entry.dtype),
                        target,
                        not reader.lost,
                        from_dtype=entry.dtype_name,
                        file=str(header.path),
                    )
                    narrowed += 1
                out[entry.key] = placed
                bytes_read += reader.bytes_read
                mapped += reader.mapped
                advance(entry.nbytes)
                position += 1
                continue
            if target is None and _may_map(entry, decision, mmap):
                if region is None:
                    # One read-only map of the whole file serves every mapped tensor.
                    region = map_tensor_file(f, header)
                count = math.prod(entry.shape)
                array: np.ndarray[Any, Any] = np.frombuffer(
                    region, entry.dtype, count=count, offset=entry.offset
                ).reshape(entry.shape)
                transfers.add(entry.key, array, decision, 0)
                mapped += 1
                position += 1
                continue
            if entry.nbytes < _MAP_THRESHOLD:
                run, arrays = ahead.run_at(position)
                for j, array in zip(run, arrays, strict=True):
                    small = header.tensors[j]
                    wanted = _NARROW.get(small.dtype_name) if not x64 else None
                    if wanted is not None:
                        array, problem = _narrowed(
                            header, small, array, wanted, narrow, decider.events, names[j]
                        )
                        if problem is not None:
                            problems.append((small.key, problem))
                        narrowed += 1
                    if not problems:
                        transfers.add(small.key, array, decisions[j], small.nbytes)
                position += len(run)
                continue
            # A large tensor goes alone, read in chunks (the progress bar moves within
            # it), and is waited for: for an accelerator its host buffer is freed
            # before the next is read; on the host it is adopted without a copy.
            transfers.flush()
            array = _read(fd, header, entry, advance)
            if target is not None:
                array, problem = _narrowed(
                    header, entry, array, target, narrow, decider.events, names[i]
                )
                narrowed += 1
                if problem is not None:
                    problems.append((entry.key, problem))
            if problems:
                position += 1
                continue
            placed = jax.device_put(array, decision.destination)
            placed.block_until_ready()
            out[entry.key] = placed
            del array
            position += 1
        if problems:
            raise NarrowingError(problems, str(header.path))
        transfers.flush()
    whole = zip(header.tensors, decisions, strict=True)
    bytes_read += sum(t.nbytes for t, d in whole if d.mesh is None)
    return mapped, narrowed, bytes_read


_Bounds = tuple[tuple[int, int], ...]  # per dimension, [start, stop) of a slice


class _ShardReader:
    """`make_array_from_callback`'s callback for one tensor: reads the slices this process's
    devices hold, and nothing else it can avoid.

    A slice is contiguous runs of the file (the trailing dimensions it spans whole, one run
    per index of the leading ones). Devices that hold the same slice share one read. When
    runs are short (a split on a trailing dimension), one system call per run costs far
    more than the bytes: then the range covering every slice is read once, in chunks of
    at most `_GATHER_BYTES`, and each slice cut from it in memory. Which way is cheaper is
    judged from the layout (`_CALL_BYTES`). A single run at an aligned offset of a mapped
    file is a zero-copy view.
    """

    def __init__(
        self,
        fd: int,
        header: Header,
        entry: TensorEntry,
        region: _mmap.mmap | None,
        narrow_to: np.dtype[Any] | None,
        narrow: Narrow,
        wanted: Iterable[tuple[slice, ...] | None] = (),
    ) -> None:
        self._fd = fd
        self._header = header
        self._entry = entry
        self._region = region
        self._narrow_to = narrow_to
        self._narrow = narrow
        self._done: dict[_Bounds, np.ndarray[Any, Any]] = {}
        # Every distinct slice the process will ask for, so they can be read together.
        self._wanted = list(dict.fromkeys(self._bounds(index) for index in wanted))
        self.bytes_read = 0
        self.mapped = 0
        self.lost = False  # some value changed when narrowed (under "lossy")

    def _bounds(self, index: tuple[slice, ...] | None) -> _Bounds:
        shape = self._entry.shape
        given = tuple(index or ())
        given += (slice(None),) * (len(shape) - len(given))
        return tuple(s.indices(dim)[:2] for dim, s in zip(shape, given, strict=True))

    def __call__(self, index: tuple[slice, ...] | None) -> np.ndarray[Any, Any]:
        bounds = self._bounds(index)
        found = self._done.get(bounds)
        if found is None and self._wanted:  # the first call: read what can be together
            wanted, self._wanted = self._wanted, []
            self._gather(wanted)
            found = self._done.get(bounds)
        if found is None:
            found = self._done[bounds] = self._narrowed(self._read(bounds))
        return found

    def _runs(self, bounds: _Bounds) -> tuple[int, int, int]:
        """(split, run bytes, runs): dimensions after `split` are spanned whole, so each run
        covers them and `bounds[split]`, one run per index of the dimensions before it."""
        shape, itemsize = self._entry.shape, self._entry.dtype.itemsize
        if not shape:
            return 0, itemsize, 1
        extents = [stop - start for start, stop in bounds]
        split = len(shape) - 1
        while split > 0 and extents[split] == shape[split]:
            split -= 1
        return split, math.prod(extents[split:]) * itemsize, math.prod(extents[:split])

    def _gather(self, wanted: list[_Bounds]) -> None:
        """Read every slice in `wanted` through their covering range, where that is cheaper
        than their runs one by one (see the class); else leave them to `_read`."""
        entry, shape = self._entry, self._entry.shape
        wanted = [b for b in wanted if all(stop > start for start, stop in b)]
        if not shape or not wanted:
            return
        runs = [self._runs(b) for b in wanted]
        if all(count == 1 for _, _, count in runs):
            self._read_together(wanted)  # one run each: read (or mapped) directly
            return
        by_runs = sum(count * (_CALL_BYTES + run) for _, run, count in runs)
        box = tuple(
            (min(b[d][0] for b in wanted), max(b[d][1] for b in wanted)) for d in range(len(shape))
        )
        itemsize = entry.dtype.itemsize
        strides = [math.prod(shape[d + 1 :]) * itemsize for d in range(len(shape))]
        best: tuple[float, int] | None = None
        for d in range(self._runs(box)[0] + 1):
            if strides[d] > _GATHER_BYTES:
                continue  # a chunk must hold one whole index of dimension d
            blocks = math.prod(stop - start for start, stop in box[:d])
            rows = box[d][1] - box[d][0]
            chunks = blocks * -(-rows // max(1, _GATHER_BYTES // strides[d]))
            covered = blocks * (rows * strides[d])
            cost = chunks * _CALL_BYTES * (1 + len(wanted) / 2) + covered
            if best is None or cost < best[0]:
                best = (cost, d)
        if best is None or best[0] >= by_runs:
            return
        self._gather_along(wanted, box, best[1], strides)

    def _gather_along(
        self, wanted: list[_Bounds], box: _Bounds, d: int, strides: list[int]
    ) -> None:
        """Read `box` in chunks of whole indices of dimension `d` (one chunk per index of
        the dimensions before it, or several), copying each slice's part out of each."""
        entry, shape = self._entry, self._entry.shape
        itemsize = entry.dtype.itemsize
        outs = [
            _host_buffer(self._header, entry.key, math.prod(b - a for a, b in bounds) * itemsize)
            .view(entry.dtype)
            .reshape(tuple(b - a for a, b in bounds))
            for bounds in wanted
        ]
        # Within one index of dimension d: the bytes from the box's first to its last item.
        inner_start = sum(box[k][0] * strides[k] for k in range(d + 1, len(shape)))
        inner_end = sum((box[k][1] - 1) * strides[k] for k in range(d + 1, len(shape)))
        inner_end += itemsize
        per_chunk = max(1, _GATHER_BYTES // strides[d])
        scratch = np.empty(min(per_chunk, box[d][1] - box[d][0]) * strides[d], np.uint8)
        for outer in itertools.product(*(range(a, b) for a, b in box[:d])):
            base = entry.offset + sum(i * strides[k] for k, i in enumerate(outer))
            for j0 in range(box[d][0], box[d][1], per_chunk):
                j1 = min(j0 + per_chunk, box[d][1])
                length = (j1 - j0 - 1) * strides[d] + inner_end - inner_start
                into = scratch[inner_start : inner_start + length]
                _pread_fully(
                    self._fd, self._header, entry, into, base + j0 * strides[d] + inner_start
                )
                self.bytes_read += length
                view = scratch[: (j1 - j0) * strides[d]].view(entry.dtype)
                view = view.reshape((j1 - j0, *shape[d + 1 :]))
                for bounds, out in zip(wanted, outs, strict=True):
                    if not all(a <= i < b for i, (a, b) in zip(outer, bounds, strict=False)):
                        continue
                    lo, hi = max(j0, bounds[d][0]), min(j1, bounds[d][1])
                    if lo >= hi:
                        continue
                    where: tuple[int | slice, ...] = tuple(
                        i - a for i, (a, _) in zip(outer, bounds, strict=False)
                    )
                    part = slice(lo - bounds[d][0], hi - bounds[d][0])
                    inner = tuple(slice(a, b) for a, b in bounds[d + 1 :])
                    out[(*where, part)] = view[(slice(lo - j0, hi - j0), *inner)]
        for bounds, out in zip(wanted, outs, strict=True):
            self._done[bounds] = self._narrowed(out)

    def _read_together(self, wanted: list[_Bounds]) -> None:
        """Read every slice of `wanted` that is one run and not mapped, on several
        threads where they are large (`_pread_pieces`); mapped ones are left to `_read`."""
        entry = self._entry
        runs = [(bounds, *self._run_start(bounds)) for bounds in wanted]
        if self._region is not None:
            runs = [r for r in runs if r[1] % ALIGN]
        if sum(run for _, _, run in runs) < _THREADED_BYTES:
            return  # small: each read when asked (nothing to overlap)
        pieces: list[tuple[np.ndarray[Any, Any], int]] = []
        arrays: list[tuple[_Bounds, np.ndarray[Any, Any]]] = []
        for bounds, start, run in runs:
            buffer = _host_buffer(self._header, entry.key, run)
            for at in range(0, run, _PIECE_BYTES):
                pieces.append((buffer[at : at + _PIECE_BYTES], start + at))
            extents = tuple(stop - first for first, stop in bounds)
            arrays.append((bounds, buffer.view(entry.dtype).reshape(extents)))
        _pread_pieces(self._fd, self._header, entry, pieces, lambda _n: None)
        self.bytes_read += sum(run for _, _, run in runs)
        for bounds, array in arrays:
            self._done[bounds] = self._narrowed(array)

    def _run_start(self, bounds: _Bounds) -> tuple[int, int]:
        """(file offset, bytes) of a slice that is one run."""
        entry, shape = self._entry, self._entry.shape
        itemsize = entry.dtype.itemsize
        split, run, _ = self._runs(bounds)
        strides = [math.prod(shape[d + 1 :]) * itemsize for d in range(len(shape))]
        start = entry.offset + sum(bounds[d][0] * strides[d] for d in range(split + 1))
        return start, run

    def _read(self, bounds: _Bounds) -> np.ndarray[Any, Any]:
        entry, shape = self._entry, self._entry.shape
        itemsize = entry.dtype.itemsize
        extents = tuple(stop - start for start, stop in bounds)
        split, run, _ = self._runs(bounds)
        inner = math.prod(shape[split + 1 :]) if shape else 1
        strides = [math.prod(shape[d + 1 :]) * itemsize for d in range(len(shape))]
        first = bounds[split][0] * inner * itemsize if shape else 0  # a scalar: one item
        starts = [
            entry.offset + sum(i * strides[d] for d, i in enumerate(outer)) + first
            for outer in itertools.product(*(range(a, b) for a, b in bounds[:split]))
        ]
        count = math.prod(extents)
        if count and len(starts) == 1 and self._region is not None and starts[0] % ALIGN == 0:
            self.mapped += 1
            self.bytes_read += run
            view = np.frombuffer(self._region, entry.dtype, count=count, offset=starts[0])
            return view.reshape(extents)
        buffer = _host_buffer(self._header, entry.key, max(run * len(starts), 1))
        for n, start in enumerate(starts):
            _pread_fully(self._fd, self._header, entry, buffer[n * run : (n + 1) * run], start)
        self.bytes_read += run * len(starts)
        return buffer[: run * len(starts)].view(entry.dtype).reshape(extents)

    def _narrowed(self, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """`array` in 32 bits where JAX will hold it so (x64 off); raises on a loss, saying
        what the whole tensor loses (not only this slice)."""
        if self._narrow_to is None:
            return array
        narrowed, problem = narrow_into(array, np.empty(array.shape, self._narrow_to))
        self.lost = self.lost or problem is not None
        if problem is not None and self._narrow == "exact":
            whole = loss_in_pieces(self._pieces(), self._narrow_to) or problem
            raise NarrowingError([(self._entry.key, whole)], str(self._header.path))
        return narrowed

    def _pieces(self) -> Iterator[np.ndarray[Any, Any]]:
        """The whole tensor, flat, in consecutive pieces of at most `_GATHER_BYTES`."""
        entry = self._entry
        step = max(1, _GATHER_BYTES // entry.dtype.itemsize) * entry.dtype.itemsize
        buffer = np.empty(min(step, entry.nbytes), np.uint8)
        for start in range(0, entry.nbytes, step):
            piece = buffer[: min(step, entry.nbytes - start)]
            _pread_fully(self._fd, self._header, entry, piece, entry.offset + start)
            yield piece.view(entry.dtype)


def _pread_fully(
    fd: int, header: Header, entry: TensorEntry, into: np.ndarray[Any, Any], offset: int
) -> None:
    view = memoryview(into)  # type: ignore[arg-type]
    done = 0
    while done < len(view):
        try:
            count = os.preadv(fd, [view[done:]], offset + done)
        except OSError as e:
            raise os_error(header.path, e, "cannot read", tensor=entry.key) from None
        if count <= 0:
            reached = offset + done - entry.offset  # bytes of the tensor the file holds
            raise SafetensorsFileError(
                header.path,
                f"file ended after {reached} of {entry.nbytes} bytes: truncated?",
                tensor=entry.key,
            )
        done += count


def _maps(entry: TensorEntry, mmap: bool | None, x64: bool) -> int:
    """Whether this tensor would be mapped, were it placed on a host device (for `fits`)."""
    if mmap is False or not entry.nbytes or entry.offset % ALIGN or entry.packed:
        return NEVER_MAPPED
    if not x64 and entry.dtype_name in _NARROW:
        return NEVER_MAPPED  # narrowed: read into a new buffer
    return ALWAYS_MAPPED if mmap else MAPPED_IF_RULE


def _may_map(entry: TensorEntry, decision: Decision, mmap: bool | None) -> bool:
    wanted = decision.mmap if mmap is None else mmap
    return wanted and entry.nbytes > 0 and entry.offset % ALIGN == 0 and not entry.packed


def _read_in_runs(entry: TensorEntry, decision: Decision, mmap: bool | None, x64: bool) -> bool:
    """Whether `_load_opened` reads a tensor as part of a run of small ones: small, and
    neither packed (unpacked on its own), sharded (read slice by slice) nor mapped."""
    narrowed = not x64 and entry.dtype_name in _NARROW  # narrowing reads, never maps
    return (
        entry.nbytes < _MAP_THRESHOLD
        and not entry.packed
        and decision.mesh is None
        and (narrowed or not _may_map(entry, decision, mmap))
    )


def _small_run(
    header: Header,
    decisions: list[Decision],
    order: list[int],
    start: int,
    mmap: bool | None,
    x64: bool,
) -> list[int]:
    """Tensors from `order[start]` on that are small, not mapped and back to back in the
    file, up to one batch: they are read with one system call."""
    run = [order[start]]
    end = header.tensors[order[start]].offset + header.tensors[order[start]].nbytes
    nbytes = header.tensors[order[start]].nbytes
    # Indexed, not `order[start + 1:]`: a slice copies the rest of the file's order on
    # every run, which made many small tensors quadratic (400,000 took 197 s).
    for position in range(start + 1, len(order)):
        i = order[position]
        entry = header.tensors[i]
        if (
            not _read_in_runs(entry, decisions[i], mmap, x64)
            or entry.offset != end
            or len(run) >= _READ_BATCH
            or nbytes + entry.nbytes > CHUNK_BYTES
        ):
            break
        run.append(i)
        end += entry.nbytes
        nbytes += entry.nbytes
    return run


class _ReadAhead:
    """Runs of small tensors, each read while the run before it is placed: the next run's
    read is started on a second thread as a run is handed out.

    A read into fresh memory is mostly the kernel faulting in pages (the GIL released);
    placing is JAX's per-array work in Python. On two cores they overlap: 10,000 tensors
    of 1-64 KiB loaded in 1.10-1.36 s against 1.62-1.93 s without (interleaved runs). At
    most one run is read ahead, so host staging stays bounded by two runs.
    """

    def __init__(
        self,
        fd: int,
        header: Header,
        decisions: list[Decision],
        order: list[int],
        mmap: bool | None,
        x64: bool,
    ) -> None:
        self._fd, self._header, self._decisions = fd, header, decisions
        self._order, self._mmap, self._x64 = order, mmap, x64
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[int, Future[_Run]] | None = None

    def run_at(self, position: int) -> _Run:
        """The run of small tensors starting at `order[position]`, read."""
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == position:
            found = pending[1].result()  # a read error is raised here, where it belongs
        else:
            if pending is not None:
                _settled(pending[1])
            found = self._read(position)
        following = position + len(found[0])
        if following < len(self._order) and self._starts_run(following):
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, "devpolicy-read-ahead")
            self._pending = (following, self._pool.submit(self._read, following))
        return found

    def _read(self, position: int) -> _Run:
        header, order = self._header, self._order
        run = _small_run(header, self._decisions, order, position, self._mmap, self._x64)
        return run, _read_run(self._fd, header, run)

    def _starts_run(self, position: int) -> bool:
        i = self._order[position]
        return _read_in_runs(self._header.tensors[i], self._decisions[i], self._mmap, self._x64)

    def __enter__(self) -> _ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        # The file is closed after this: no read may still be running on it.
        if self._pending is not None:
            _settled(self._pending[1])
            self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)


#: A run of small tensors: their positions in the header, and their arrays.
_Run = tuple[list[int], list[np.ndarray[Any, Any]]]


def _settled(future: Future[Any]) -> None:
    """Wait for a read ahead that is no longer wanted; its error, if any, is not ours."""
    if not future.cancel():
        with contextlib.suppress(Exception):
            future.result()


def _read_run(fd: int, header: Header, run: list[int]) -> list[np.ndarray[Any, Any]]:
    """Read back-to-back tensors with one scattered read, each into its own 64-byte-aligned
    slot of one buffer (so host-bound ones are adopted without a copy)."""
    entries = [header.tensors[i] for i in run]
    starts = []
    size = 0
    for entry in entries:
        starts.append(size)
        size += -(-entry.nbytes // ALIGN) * ALIGN
    buffer = _host_buffer(header, entries[0].key, max(size, 1))
    whole = memoryview(buffer)  # type: ignore[arg-type]
    views = [whole[s : s + e.nbytes] for s, e in zip(starts, entries, strict=True)]
    offset, done, total = entries[0].offset, 0, sum(e.nbytes for e in entries)
    first = 0  # the first view not yet filled
    while done < total:
        try:
            count = os.preadv(fd, views[first:] if first else views, offset + done)
        except OSError as e:
            raise os_error(header.path, e, "cannot read", tensor=entries[0].key) from None
        if count <= 0:
            raise SafetensorsFileError(
                header.path,
                f"file ended after {done} of {total} bytes of a run of tensors: truncated?",
                tensor=entries[0].key,
            )
        done += count
        while first < len(views) and count >= len(views[first]):  # resume after the filled
            count -= len(views[first])
            first += 1
        if count:
            views[first] = views[first][count:]
    # One constructor per tensor over the shared buffer: no intermediate views.
    return [
        np.ndarray(e.shape, e.dtype, buffer=buffer, offset=s)
        for s, e in zip(starts, entries, strict=True)
    ]


def _read(
    fd: int, header: Header, entry: TensorEntry, advance: Callable[[int], None]
) -> np.ndarray[Any, Any]:
    buffer = _host_buffer(header, entry.key, entry.nbytes)
    # Piece by piece, so the progress bar moves within a large tensor.
    step = _PIECE_BYTES if entry.nbytes >= _THREADED_BYTES and _READERS > 1 else CHUNK_BYTES
    pieces = [
        (buffer[start : start + step], entry.offset + start)
        for start in range(0, entry.nbytes, step)
    ]
    _pread_pieces(fd, header, entry, pieces, advance)
    return as_array(entry, buffer)


# Threads reading one large tensor (or a sharded tensor's slices) at once. A read into
# fresh memory is mostly the kernel faulting in pages and copying from the page cache,
# with the GIL released: on two cores two readers take about half the time of one.
_READERS = min(4, os.cpu_count() or 1)
_PIECE_BYTES = 16 * 2**20  # a reader's piece: large enough that a call costs nothing
_THREADED_BYTES = 2 * _PIECE_BYTES  # below this one thread reads


def _pread_pieces(
    fd: int,
    header: Header,
    entry: TensorEntry,
    pieces: list[tuple[np.ndarray[Any, Any], int]],
    advance: Callable[[int], None],
) -> None:
    """Read each (buffer, file offset) piece of `entry`; on several threads when the
    pieces are many and large (`_THREADED_BYTES`), `advance` called here, in order."""
    total = sum(len(into) for into, _ in pieces)
    if len(pieces) < 2 or _READERS < 2 or total < _THREADED_BYTES:
        for into, offset in pieces:
            _pread_fully(fd, header, entry, into, offset)
            advance(len(into))
        return
    with ThreadPoolExecutor(min(_READERS, len(pieces)), "devpolicy-read") as pool:
        futures = [
            pool.submit(_pread_fully, fd, header, entry, into, offset) for into, offset in pieces
        ]
        try:
            for future, (into, _) in zip(futures, pieces, strict=True):
                future.result()  # an error (truncated file, EIO) is raised here, as it is
                advance(len(into))
        finally:
            for future in futures:
                future.cancel()  # nothing more is read once one piece failed


def _narrowed(
    header: Header,
    entry: TensorEntry,
    array: np.ndarray[Any, Any],
    target: np.dtype[Any],
    mode: Narrow,
    events: EventLog,
    name: str,
) -> tuple[np.ndarray[Any, Any], str | None]:
    """The tensor in 32 bits (into an aligned buffer) and, under "exact", what it lost."""
    result = _aligned_empty(entry.nbytes // 2).view(target).reshape(entry.shape)
    result, problem = narrow_into(array, result)
    if problem is not None and mode == "exact":
        return result, problem
    narrowed_event(
        events,
        name,
        array,
        target,
        problem is None,
        from_dtype=entry.dtype_name,
        file=str(header.path),
    )
    return result, None


def _mmap_refused(
    events: EventLog, header: Header, decisions: list[Decision], mmap: bool | None, x64: bool
) -> None:
    """Once per file: why tensors that were to be mapped were read instead, and the fix."""
    unaligned: list[TensorEntry] = []
    wide: list[TensorEntry] = []
    packed: list[TensorEntry] = []
    for entry, decision in zip(header.tensors, decisions, strict=True):
        if not (decision.mmap if mmap is None else mmap) or entry.nbytes == 0:
            continue
        if entry.packed:
            packed.append(entry)
        elif not x64 and entry.dtype_name in _NARROW:
            wide.append(entry)
        elif entry.offset % ALIGN:
            unaligned.append(entry)
    if not unaligned and not wide and not packed:
        return
    reasons = []
    if unaligned:
        first = unaligned[0]
        aligned = header.path.with_name(header.path.stem + ".aligned.safetensors")
        reasons.append(
            f"{len(unaligned)} tensor{'s' if len(unaligned) > 1 else ''} at a file offset not "
            f"{ALIGN}-byte aligned (first: {first.key!r} at {first.offset}); rewrite the file "
            f"aligned with `devpolicy align {header.path} {aligned}` (or devpolicy.save_file)"
        )
    if wide:
        reasons.append(
            f"{len(wide)} 64-bit tensor{'s' if len(wide) > 1 else ''} narrowed to 32 bits "
            f"(first: {wide[0].key!r}); enable x64 to map them"
        )
    if packed:
        reasons.append(
            f"{len(packed)} F4 tensor{'s' if len(packed) > 1 else ''} unpacked from two values "
            f"a byte to one (first: {packed[0].key!r}); JAX holds F4 one value a byte"
        )
    events.emit(
        "warning",
        "mmap_refused",
        {
            "file": str(header.path),
            "tensors": len(unaligned) + len(wide) + len(packed),
            "nbytes": sum(e.nbytes for e in (*unaligned, *wide, *packed)),
            "reason": "; ".join(reasons),
        },
    )


@contextmanager
def _progress(header: Header, total: int, wanted: bool | None) -> Iterator[Any]:
    show = (
        wanted is not False
        and (wanted is True or total > PROGRESS_THRESHOLD)
        and sys.stderr.isatty()
    )
    if not show:
        yield lambda _n: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(header.path.name, total=total)
        yield lambda n: bar.advance(task, n)


def _summary(
    events: EventLog,
    header: Header,
    decisions: list[Decision],
    seconds: float,
    mapped: int,
    narrowed: int,
    bytes_read: int,
) -> None:
    """One info event per file: where its bytes went, by which rules, and what fell back."""
    per_device: dict[str, list[int]] = {}
    per_rule: dict[str, int] = {}
    rank: dict[str, tuple[int, int]] = {}  # rules in the order they are tried
    fallbacks = 0
    for decision in decisions:
        tensors_bytes = per_device.setdefault(decision.device_text, [0, 0])
        tensors_bytes[0] += 1
        tensors_bytes[1] += decision.nbytes or 0
        per_rule[decision.origin] = per_rule.get(decision.origin, 0) + 1
        rank[decision.origin] = (_TRIED_FIRST.get(decision.source, 3), decision.rule or 0)
        fallbacks += decision.fallback_reason is not None
    events.emit(
        "warning" if fallbacks else "info",
        "load_file",
        {
            "file": str(header.path),
            "tensors": len(decisions),
            "nbytes": sum(n for _, n in per_device.values()),
            "devices": ", ".join(
                f"{d} {format_size(n)} ({count} tensor{'' if count == 1 else 's'})"
                for d, (count, n) in sorted(per_device.items())
            ),
            "rules": ", ".join(
                f"{origin} x{per_rule[origin]}" for origin in sorted(per_rule, key=rank.__getitem__)
            ),
            "fallbacks": fallbacks,
            "mapped": mapped,
            "file_backed": mapped > 0,
            "narrowed": narrowed,
            "bytes_read": bytes_read,
            "seconds": round(seconds, 4),
            "metadata": dict(header.metadata or {}),
        },
    )


def _left_out(events: EventLog, path: PathLike, checkpoint: Checkpoint) -> None:
    """One info event per file of a checkpoint directory that is not loaded, and why."""
    for file, reason in checkpoint.left_out:
        events.emit(
            "info",
            "checkpoint_file_left_out",
            {"checkpoint": str(path), "file": str(file), "reason": reason},
        )


#: Patterns that take every name: a rule written with one is a catch-all.
_CATCH_ALL = {("*", False), (".*", True), ("(?s).*", True), ("(?s:.*)", True)}
_SEARCH_ALL = ("", ".*", "(?s).*", "^", "(?s:.*)")


@dataclass(frozen=True, slots=True)
class RuleUse:
    """How many tensors one rule (or the default) took in a load, a plan or a name list.

    Attributes:
        origin: Where the rule is written (`policy.yaml:7`), or the default's origin.
        label: The rule's pattern (`'model/*'`, `search 'wo/kernel'`), or `default`.
        tensors: Tensors it took.
        nbytes: Their bytes.
        shards: Whether it asks for a sharding.
        sharded: Tensors it sharded (a sharding that fell back to a device is not).
        catch_all: Whether it takes every name (`*`, `.*`; the default too).
        applies: False for a rule that could not have taken anything here: its `file:`
            matches none of the files, or its pattern starts with a word (`dataset` of
            `dataset/*`) that is no part of any name.
        example: The first name it took, or "".
    """

    origin: str
    label: str
    tensors: int
    nbytes: int
    shards: bool
    sharded: int = 0
    catch_all: bool = False
    applies: bool = True
    example: str = ""


def _catch_all(entry: RuleEntry) -> bool:
    spec = entry.spec
    conditions = (spec.min_bytes, spec.max_bytes, spec.ndim, spec.min_elements, spec.max_elements)
    if any(c is not None for c in conditions):
        return False
    if spec.search is not None:
        return spec.search in _SEARCH_ALL
    return spec.name_pattern in _CATCH_ALL


def rule_uses(
    settings: Settings,
    taken: Iterable[tuple[str, int | None, int, bool]],
    sources: Iterable[SourceFile] = (),
) -> tuple[RuleUse, ...]:
    """Every rule of `settings` in order, then the default, with what it took of `taken`:
    (name, position of its rule in `settings.rules` or None for the default, bytes,
    whether it was sharded).

    Example:
        >>> import devpolicy
        >>> p = devpolicy.load_policy({"version": 1, "rules": [
        ...     {"match": "a/*", "device": "cpu"}, {"match": "b/*", "device": "cpu"}]})
        >>> [(u.label, u.tensors) for u in rule_uses(p.settings, [("a/x", 0, 4, False)])]
        [("'a/*'", 1), ("'b/*'", 0), ('default', 0)]
    """
    rules = settings.rules
    files = list(sources)
    tensors = [0] * (len(rules) + 1)
    nbytes = [0] * (len(rules) + 1)
    sharded = [0] * (len(rules) + 1)
    examples = [""] * (len(rules) + 1)
    parts: set[str] = set()  # every part of every name, split at `/` and `.`
    for name, position, size, was_sharded in taken:
        parts.update(name.replace(".", "/").split("/"))
        i = len(rules) if position is None else position
        if not tensors[i]:
            examples[i] = name
        tensors[i] += 1
        nbytes[i] += size
        sharded[i] += was_sharded
    uses = []
    for i, entry in enumerate(rules):
        applies = True
        if entry.spec.file is not None and files:
            glob = compile_file_glob(entry.spec.file)
            applies = any(glob(f) for f in files)
        if applies and not tensors[i]:
            # A rule whose names start with a word no name holds (`dataset/*` in a model's
            # load) was written for other names, not misspelt for these.
            lead = re.split(r"[/.]", literal_prefix(*entry.spec.name_pattern), maxsplit=1)[0]
            applies = not lead or lead in parts
        uses.append(
            RuleUse(
                entry.origin,
                entry.spec.label,
                tensors[i],
                nbytes[i],
                entry.spec.sharding is not None,
                sharded[i],
                _catch_all(entry),
                applies,
                examples[i],
            )
        )
    # The default is a device target (never a sharding) and takes every name.
    default = RuleUse(settings.default.origin, "default", tensors[-1], nbytes[-1], False)
    uses.append(replace(default, catch_all=True, example=examples[-1]))
    return tuple(uses)


def silent_rules(uses: tuple[RuleUse, ...]) -> list[tuple[str, str]]:
    """What a load, plan or name list should not pass over in silence, as (code, message):

    - `rule-matched-nothing`: a rule took no tensor while the default or a catch-all took
      some (the names it was written for are probably spelled otherwise);
    - `not-sharded`: the policy shards, yet the default or a catch-all device rule placed
      tensors whole.

    Example:
        >>> uses = (RuleUse("p.yaml:3", "'model/*'", 0, 0, True),
        ...         RuleUse("default", "default", 2, 8, False, catch_all=True, example="m/w"))
        >>> [code for code, _ in silent_rules(uses)]
        ['rule-matched-nothing', 'not-sharded']
    """
    fell = [u for u in uses if u.catch_all and u.tensors]
    found: list[tuple[str, str]] = []
    if fell:
        took = " and ".join(
            f"{'the default' if u.label == 'default' else f'rule {u.origin} ({u.label})'} "
            f"took {u.tensors}"
            for u in fell
        )
        example = fell[0].example
        for u in uses:
            if u.tensors == 0 and u.applies and not u.catch_all:
                found.append(
                    (
                        "rule-matched-nothing",
                        f"rule {u.origin} ({u.label}) took no tensor, while {took}; names "
                        f"look like {example!r}: check the rule against them "
                        "(devpolicy check --names), or set the policy's `names:` (separator, "
                        "prefix)",
                    )
                )
    if any(u.shards for u in uses):
        whole = [u for u in fell if not u.shards]
        count = sum(u.tensors for u in whole)
        if count:
            nbytes = sum(u.nbytes for u in whole)
            by = " and ".join(
                "the default" if u.label == "default" else f"catch-all rule {u.origin}"
                for u in whole
            )
            found.append(
                (
                    "not-sharded",
                    f"{count} tensor{'' if count == 1 else 's'} ({format_size(nbytes)}) placed "
                    f"whole by {by} (e.g. {whole[0].example!r}), while the policy shards others",
                )
            )
    return found


def checkpoint_names(
    path: PathLike, settings: Settings, prefix: str | None = None
) -> list[tuple[str, int | None, tuple[int, ...] | None, SourceFile | None]]:
    """Every tensor of a checkpoint as `load_file` and `plan` name it (prefix, the
    policy's `names:`), with its size, shape and file; only headers are read."""
    checkpoint = open_checkpoint(path)
    headers = [read_header(file) for file in checkpoint.files]
    checkpoint.check(headers)
    stem = _stem(checkpoint.stem, prefix, settings.names)
    sources = _sources(checkpoint.files, path)
    return [
        (name, t.nbytes, t.shape, source)
        for header, source in zip(headers, sources, strict=True)
        for name, t in zip(_names(header, stem, settings.names), header.tensors, strict=True)
    ]


def _uses_of_decisions(
    settings: Settings,
    names: list[str],
    decisions: list[Decision | None],
    sources: list[SourceFile],
) -> tuple[RuleUse, ...]:
    """`rule_uses` for decided tensors (one without a device counts for no rule)."""
    position = {(e.source, e.index): i for i, e in enumerate(settings.rules)}
    return rule_uses(
        settings,
        (
            (
                name,
                None if d.rule is None else position.get((d.source, d.rule)),
                d.nbytes or 0,
                d.is_sharded,
            )
            for name, d in zip(names, decisions, strict=True)
            if d is not None and d.source != "disabled"
        ),
        sources,
    )


def _silent_events(events: EventLog, uses: tuple[RuleUse, ...], path: PathLike) -> None:
    """The warnings of `silent_rules` for one load, as one event each."""
    for code, message in silent_rules(uses):
        events.emit(
            "warning", code.replace("-", "_"), {"checkpoint": os.fspath(path), "message": message}
        )


@dataclass(frozen=True, slots=True)
class PlannedTensor:
    """Where one tensor of a file would go.

    Attributes:
        name: The name it is resolved under (`train/tokens`).
        key: Its key in the file.
        dtype: safetensors dtype name.
        shape: Its shape.
        nbytes: Its size as an array (F4, two values a byte in the file, one in memory).
        offset: Its absolute file offset (64-aligned ones can be mapped zero-copy).
        decision: The decision, or None when no device could be had (its device a
            `VirtualDevice` in a plan for a `VirtualMachine`).
        error: Why no device could be had, or None.
        file: The file holding it, for a checkpoint of several files; else "".
    """

    name: str
    key: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    offset: int
    decision: Decision[Any] | None
    error: str | None
    file: str = ""


@dataclass(frozen=True, slots=True)
class DeviceLoad:
    """Planned bytes for one device against its free memory.

    Attributes:
        device: Target text (`gpu:0`), process-local.
        nbytes: Bytes planned for it (a sharded tensor's share on it).
        tensors: How many tensors (or shards of them) it holds.
        free: Free bytes now, or None when unknown (for a shared pool, the pool's); for a
            `VirtualMachine`, the device's stated memory.
        fits: False when the bytes that take memory (`nbytes` less `file_backed`, summed
            over every device of its pool) exceed `free` less the policy's `headroom`.
        file_backed: Bytes that will be mapped from the file (host devices, `mmap`,
            64-byte-aligned offset): they take no anonymous memory.
        pool: The memory it draws on: `host RAM` (shared by every CPU device of the
            process) or its own target text.
        pool_nbytes: Bytes that take memory in the whole pool.
    """

    device: str
    nbytes: int
    tensors: int
    free: int | None
    fits: bool
    file_backed: int = 0
    pool: str = ""
    pool_nbytes: int = 0


@dataclass(frozen=True, slots=True)
class Plan:
    """Every tensor of a file with its decision, and totals per device and per process.

    Attributes:
        file: The file.
        tensors: One entry per tensor, in header order.
        devices: One entry per device of the deciding process, by target text.
        machine: The machine planned for: `this process`, or a `VirtualMachine`'s
            description (`cpu=1 (memory unknown), gpu=8x80GiB; 2 processes`).
        processes: How many processes load it, each alike (a `VirtualMachine`'s
            `processes`; 1 for this process).
        metadata: Each file's `__metadata__` (`{}` when it has none), keyed by the
            file's path as the `load_file` event's `file` gives it.
        left_out: For a checkpoint directory, each of its `*.safetensors` files that is
            not part of the checkpoint, as (file, why); see `devpolicy.load_file`.
        rules: What each rule of the policy took, in order, then the default
            (`RuleUse`: tensors, bytes, how many sharded); see `warnings`.
    """

    file: str
    tensors: tuple[PlannedTensor, ...]
    devices: tuple[DeviceLoad, ...]
    machine: str = "this process"
    processes: int = 1
    metadata: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    left_out: tuple[tuple[str, str], ...] = ()
    rules: tuple[RuleUse, ...] = ()

    @property
    def warnings(self) -> list[tuple[str, str]]:
        """What the plan should not pass over in silence (see `silent_rules`), as (code,
        message): a rule that took no tensor while the default or a catch-all took some; a
        policy that shards, with tensors placed whole by the default or a catch-all."""
        return silent_rules(self.rules)

    @property
    def sharded_nothing(self) -> bool:
        """Whether the policy has sharding rules and no tensor of this plan is sharded,
        although some asked for it (a sharding rule's tensors fell back to a device) or
        fell through to the default or a catch-all (`devpolicy plan` exits 3)."""
        if not any(u.shards for u in self.rules) or any(u.sharded for u in self.rules):
            return False
        return any(u.tensors and (u.shards or u.catch_all) for u in self.rules)

    @property
    def bytes_per_process(self) -> int:
        """The bytes each process holds: the sum over its devices (every process alike)."""
        return sum(d.nbytes for d in self.devices)

    def __str__(self) -> str:
        """The plan as text: each tensor's device, then each device against its memory.

        Example:
            >>> import devpolicy, numpy as np, tempfile, os
            >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
            >>> devpolicy.save_file({"w": np.zeros(256, np.float32)}, path)
            >>> policy = devpolicy.load_policy({"version": 1, "default": "cpu:2"},
            ...     capacity=devpolicy.StaticCapacity({"cpu:2": "1MiB"}))
            >>> text = str(devpolicy.plan(path, policy=policy))
            >>> print(text[text.index("m.safetensors"):])
            m.safetensors: 1 tensor, fits
              m/w  F32 256  1.0 KiB  -> cpu:2 by <mapping>:default (default)
            cpu:2: 1 tensor, 1.0 KiB, 1.0 MiB free (0%): fits
        """
        count = len(self.tensors)
        lines = [
            f"{self.file}: {count} tensor{'' if count == 1 else 's'}, "
            + ("fits" if self.fits else "DOES NOT FIT")
        ]
        if self.machine != "this process":
            lines[0] += f" on {self.machine}"
        for t in self.tensors:
            shape = "x".join(map(str, t.shape)) or "()"
            reasons: list[str] = []
            if t.decision is not None:
                where = f"-> {t.decision.described} by {t.decision.origin} ({t.decision.source})"
                if t.decision.is_sharded:
                    share = format_size(t.decision.bytes_per_device() or 0)
                    where += f", {share} on each of {t.decision.mesh_devices} devices"
                if t.decision.fallback_reason is not None:
                    where += f"; asked {t.decision.requested}: {t.decision.fallback_reason}"
            else:
                error = (t.error or "").splitlines() or [""]
                where = f"-> no device: {error[0]}"
                # Why each target was passed over (a sharding that does not divide, a device
                # too small), not the devices this process has: that list is the same for all.
                tried = itertools.takewhile(lambda s: not s.startswith("  available:"), error[1:])
                reasons = [f"    {reason.strip()}" for reason in tried]
            lines.append(f"  {t.name}  {t.dtype} {shape}  {format_size(t.nbytes)}  {where}")
            lines += reasons
        for d in self.devices:
            size = format_size(d.nbytes)
            backed = f" ({format_size(d.file_backed)} file-backed)" if d.file_backed else ""
            if d.free is None:
                free = "free memory unknown"
            else:
                shared = f" {d.pool}" if d.pool and d.pool != d.device else ""
                free = f"{format_size(d.free)} free{shared} ({d.pool_nbytes / max(d.free, 1):.0%})"
            tensors = f"{d.tensors} tensor{'' if d.tensors == 1 else 's'}"
            verdict = "fits" if d.fits else "DOES NOT FIT"
            lines.append(f"{d.device}: {tensors}, {size}{backed}, {free}: {verdict}")
        if self.processes > 1:
            lines.append(
                f"each of {self.processes} processes: {format_size(self.bytes_per_process)}"
            )
        if len(self.rules) > 1:  # the default alone says nothing the tensors do not
            lines.append("rules:")
            for u in self.rules:
                took = f"{u.tensors} tensor{'' if u.tensors == 1 else 's'}"
                lines.append(f"  {u.origin} {u.label}: {took}, {format_size(u.nbytes)}")
        lines += [f"warning: {message} [{code}]" for code, message in self.warnings]
        if self.sharded_nothing:
            lines.append(
                "warning: the policy shards, but no tensor is sharded on "
                f"{self.machine} [sharded-nothing]"
            )
        lines += [f"left out: {file}: {why}" for file, why in self.left_out]
        return "\n".join(visible(line) for line in lines)

    def __rich__(self) -> Any:
        """`rich.print(plan)`: the same text (visible-safe), never read as markup."""
        from rich.text import Text

        return Text(str(self))

    @property
    def fits(self) -> bool:
        """Whether every tensor has a device and every device has room."""
        return all(t.decision is not None for t in self.tensors) and all(
            d.fits for d in self.devices
        )


def plan(
    path: PathLike,
    decider: Decider,
    *,
    prefix: str | None = None,
    mmap: bool | None = None,
    machine: VirtualMachine | None = None,
    separator: str | None = None,
) -> Plan:
    """Where every tensor of a file or checkpoint would go by `decider`, or by its settings
    on `machine` (which is then also the capacity judged by). See `devpolicy.plan`."""
    naming = _naming(decider.settings.names, separator)
    if machine is not None:
        if not isinstance(machine, VirtualMachine):
            raise TypeError(
                f"plan(machine=...) takes a devpolicy.VirtualMachine, got "
                f"{type(machine).__name__} {machine!r}"
            )
        virtual = Decider(decider.settings, machine, machine)
        return _plan(path, virtual, prefix, mmap, str(machine), machine.processes, naming)
    return _plan(path, decider, prefix, mmap, "this process", 1, naming)


def _plan(
    path: PathLike,
    decider: Decider[DeviceT],
    prefix: str | None,
    mmap: bool | None,
    machine: str,
    processes: int,
    naming: NamesSpec,
) -> Plan:
    checkpoint = open_checkpoint(path)
    headers = [read_header(file) for file in checkpoint.files]
    checkpoint.check(headers)
    stem = _stem(checkpoint.stem, prefix, naming)
    entries = [(header, entry) for header in headers for entry in header.tensors]
    names = [n for header in headers for n in _names(header, stem, naming)]
    by_file = dict(zip(checkpoint.files, _sources(checkpoint.files, path), strict=True))
    x64 = _x64()
    hints = [_maps(e, mmap, x64) for _, e in entries]
    outcomes = decider.decide_many(
        [
            (n, e.array_nbytes, e.shape, hint, by_file[header.path])
            for n, (header, e), hint in zip(names, entries, hints, strict=True)
        ]
    )
    tensors = []
    # Per device: [bytes, tensors or shards, file-backed bytes].
    loads: dict[DeviceT, list[int]] = {}
    for name, (header, entry), outcome, hint in zip(names, entries, outcomes, hints, strict=True):
        decision, error = (outcome, None) if isinstance(outcome, Decision) else (None, str(outcome))
        if decision is not None:
            share = decision.bytes_per_device() or 0
            mapped = maps_from_file(decision, hint)
            for device in decision.local_devices:
                totals = loads.setdefault(device, [0, 0, 0])
                totals[0] += share
                totals[1] += 1
                totals[2] += share if mapped else 0
        tensors.append(
            PlannedTensor(
                name,
                entry.key,
                entry.dtype_name,
                entry.shape,
                entry.array_nbytes,
                entry.offset,
                decision,
                error,
                str(header.path) if len(headers) > 1 else "",
            )
        )
    # Devices sharing one memory (every CPU device) are judged together.
    capacity = decider.capacity
    pools = {device: pool_of(capacity, device) for device in loads}
    in_pool: dict[object, int] = {}
    for device, (nbytes, _, backed) in loads.items():
        in_pool[pools[device]] = in_pool.get(pools[device], 0) + nbytes - backed
    text = decider.machine.text
    # The policy's headroom is kept free, as memory-aware placement keeps it.
    headroom: float = decider.settings.headroom.value
    devices = []
    for device, (nbytes, count, backed) in sorted(
        loads.items(), key=lambda kv: _in_order(text(kv[0]))
    ):
        free = capacity.free_bytes(device)
        taken = in_pool[pools[device]]
        devices.append(
            DeviceLoad(
                text(device),
                nbytes,
                count,
                free,
                free is None or taken <= int(free * (1 - headroom)),
                backed,
                pool_text(pools[device]),
                taken,
            )
        )
    uses = _uses_of_decisions(
        decider.settings, names, [t.decision for t in tensors], list(by_file.values())
    )
    return Plan(
        str(path),
        tuple(tensors),
        tuple(devices),
        machine,
        processes,
        metadata={str(header.path): dict(header.metadata or {}) for header in headers},
        left_out=tuple((str(file), why) for file, why in checkpoint.left_out),
        rules=uses,
    )


def _in_order(text: str) -> tuple[str, int]:
    """`gpu:2` before `gpu:10`."""
    platform, _, index = text.partition(":")
    return platform, int(index) if index.isdigit() else -1
