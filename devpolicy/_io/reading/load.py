"""`load_file`: a safetensors file or checkpoint loaded by a policy, each tensor straight to
its own device, lean and exact.

The entry of the I/O wing, and the one loop that places a file's tensors: each tensor is
mapped (`map_or_read`), read in a run of small ones or read whole, one ahead of the loop
(`readahead`, `tensor_reads`), or, sharded, read slice by slice (`ranges`), all from a byte
source (`sources`); what is mapped or read is sent in batches, several in flight
(`sending`). Filling a tree is `fill_tree`; what the load says, `progress`; the rule-use
warnings are judged by `_decide/rule_use` and said here (`silent_events`). Reads and
transfers are spans in the profiler's trace (`devpolicy.load_file.read`, `.transfer`:
`_machine/spans`), a batch of tensors each, where `readahead` and `sending` do them.
"""

from __future__ import annotations

import gc
import math
import mmap as mmap_module
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import jax
import numpy as np

from ..._apply.hostview import INDEX_LIMIT, warn_unindexable
from ..._apply.narrowing import Narrow, check_mode, narrow_into, narrowed_event
from ..._base.errors import NarrowingError
from ..._base.events import EventLog
from ..._base.progress import progress_bar
from ..._decide.decider import Decider
from ..._decide.decision import Decision
from ..._decide.rule_use import RuleUse, shadowed_notes, silent_rules, uses_of_decisions
from ..._document.schema import NamesSpec
from ..._machine.ledger import record_each
from ..._machine.spans import LOAD_READ, LOAD_TRANSFER, span
from ..format.header import Header, TensorEntry
from ..format.keys import key_impls, wrapped
from ..format.sources import ByteSource
from ..remote import options_of
from .buffers import MAP_THRESHOLD, aligned_empty
from .checkpoint_sources import Files, Where, fetched
from .fill_tree import fit_into, shards_needed, skipped_event
from .map_or_read import NARROW, map_hint, may_map, sends_from_map, x64_enabled
from .naming import (
    PathLike,
    call_naming,
    check_mmap,
    check_prefix,
    name_prefix,
    path_text,
    source_files,
    tensor_names,
)
from .progress import left_out_events, mmap_refused_event, summary_event
from .ranges import ShardReader
from .readahead import ReadAhead, reads_whole
from .reopening import map_tensor_file
from .sending import Sender
from .tensor_reads import read_tensor


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """How one `load_file` call loads: every keyword of the verb but `policy`, the one
    definition the module-level verb, `Policy.load_file` and the loader share. See
    `devpolicy.load_file` for each."""

    prefix: str | None = None
    mmap: bool | None = None
    narrow: Literal["exact", "lossy"] = "exact"
    progress: bool | None = None
    into: Any = None
    strict: bool = True
    separator: str | None = None
    remote: Mapping[str, object] | None = None


def load_file(path: PathLike, decider: Decider, options: LoadOptions) -> Any:
    """Load a safetensors file or checkpoint (local, or at a URL) by `decider`'s rules: a
    dict of its tensors, or with `options.into`, that tree filled. See `devpolicy.load_file`."""
    check_mode(options.narrow)
    if not isinstance(options.strict, bool):
        raise TypeError(f"strict= takes True or False, got {options.strict!r}")
    naming = call_naming(decider.settings.names, options.separator)
    check_prefix(options.prefix)  # before anything is read
    check_mmap("load_file", options.mmap)
    remote = options_of(decider.settings.remote_values, options.remote)
    with Files(remote, decider.events.emit) as files:
        return _load_file(path, decider, options, naming, files)


class _Collector:
    """Whether a load turned Python's cyclic collector off, to turn it on again."""

    paused = False


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off around one of the load's hot loops, where
    that harms no one; as it was after.

    A load makes a few objects per tensor that all live on (entries, decisions, arrays)
    and no cycles, so each collection its allocations trigger walks a growing heap and
    frees nothing: measured on 10,000 small tensors, a fifth to a third of the load.

    The collector is the whole process's, so it is paused only where nothing else needs
    it. Only around the loops that make those objects (reading headers, deciding,
    placing a file's tensors, recording them): each file's events and the application
    code they reach (log processors) run with it as the application left it. Only while
    no other Python thread runs (`threading.active_count()` when the loop starts): a
    thread making reference cycles meanwhile would grow without bound. The threads a
    loop starts itself (reading ahead, the progress bar) are its own. Only what the
    pause changed is undone: the collector is turned on again only if this pause turned
    it off and it is still off (an application that turned it off before keeps it off;
    one whose thread turns it off during a load made the load not pause). A child forked
    during a pause starts with the collector on (`os.register_at_fork`): the loop that
    would turn it on again does not run in it.
    """
    mine = not _Collector.paused and threading.active_count() == 1 and gc.isenabled()
    if mine:
        gc.disable()
        _Collector.paused = True
    try:
        yield
    finally:
        # Not if a fork reset it meanwhile: the forked child finishing the load.
        if mine and _Collector.paused:
            _Collector.paused = False
            if not gc.isenabled():
                gc.enable()


def _collector_after_fork() -> None:
    if _Collector.paused:
        _Collector.paused = False
        gc.enable()


os.register_at_fork(after_in_child=_collector_after_fork)


def _load_file(
    path: PathLike, decider: Decider, options: LoadOptions, naming: NamesSpec, files: Files
) -> Any:
    prefix, mmap, narrow, progress = options.prefix, options.mmap, options.narrow, options.progress
    into, strict = options.into, options.strict
    where = Where.of(path)  # parsed once: nothing below parses the path again
    checkpoint = files.checkpoint(where)
    path = where.place  # a URL from here on as shown, never with its credentials
    left_out_events(decider.events, path, checkpoint)
    unread: list[str] = []
    if into is not None and not strict:
        # An index says which file holds what: a shard no leaf needs is never opened.
        checkpoint, unread = shards_needed(into, checkpoint, naming)
    # Files are opened one at a time (a checkpoint may have more files than a process may
    # open): once for the header, again only while read, and refused if replaced between
    # (a URL: opened once, its connections let go between, every read of one version).
    with _OneFileOpen(files) as opened:
        with _collector_paused():
            headers = [(file, files.header(file)) for file in checkpoint.files]
        checkpoint.check([h for _, h in headers])
        fitted = None
        if into is not None:
            fitted = fit_into(into, headers, naming, strict, path)
            headers = fitted.headers
            skipped_event(decider.events, path, [*fitted.skipped, *unread])
        # PRNG key data the files name as such, wrapped as keys once loaded: into a tree,
        # where the leaf is a key array; a plain load, wherever a file says so.
        prng = (
            fitted.prng_keys
            if fitted is not None
            else {k: impl for _, header in headers for k, impl in key_impls(header).items()}
        )
        stem = name_prefix(checkpoint.stem, prefix, naming)
        names = [tensor_names(header, stem, naming) for _, header in headers]
        # Each file as `file:` rules see it (not the byte source its tensors are read from).
        rule_files = source_files(tuple(file for file, _ in headers), path)
        x64 = x64_enabled()
        # All files decided as one placement: memory-aware rules see the whole checkpoint.
        items = [
            (
                n,
                t.array_nbytes,
                t.shape,
                map_hint(t, mmap if files.maps(file) else False, x64),
                rule_file,
                None if fitted is None else fitted.attached.get(t.key),
            )
            for (file, header), file_names, rule_file in zip(
                headers, names, rule_files, strict=True
            )
            for n, t in zip(file_names, header.tensors, strict=True)
        ]
        with _collector_paused():
            decisions = decider.resolve_many(items, summarised=True)
        out: dict[str, jax.Array] = {}
        first = 0
        for (_, header), file_names in zip(headers, names, strict=True):
            mine = decisions[first : first + len(file_names)]
            first += len(file_names)
            started = time.perf_counter()
            source = opened.open(header)
            # Only a local file maps: a source elsewhere has every tensor read.
            local = source.fileno() is not None
            with _collector_paused():
                mapped, narrowed, counted = _load_opened(
                    source,
                    header,
                    file_names,
                    mine,
                    decider,
                    mmap if local else False,
                    x64,
                    narrow,
                    progress,
                    out,
                )
            seconds = time.perf_counter() - started
            mmap_refused_event(decider.events, header, mine, mmap, x64, local)
            summary_event(
                decider.events, header, mine, seconds, mapped, narrowed, counted,
                fetched(source),
            )  # fmt: skip
        with _collector_paused():
            _loaded(decider.events, out, [h for _, h in headers], names, decisions, x64)
            facts = [(n, nbytes, shape, rule_file) for n, nbytes, shape, _, rule_file, _ in items]
            uses = uses_of_decisions(
                decider.settings, decider.conditions, facts, decisions, rule_files
            )
        silent_events(decider.events, uses, path)
    for key, impl in prng.items():
        out[key] = wrapped(out[key], impl, str(path), key)
    if fitted is not None:
        return jax.tree_util.tree_unflatten(fitted.treedef, [out[key] for key in fitted.keys])
    return {t.key: out[t.key] for _, header in headers for t in header.tensors}


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

    def __init__(self, files: Files) -> None:
        self._files = files
        self._file: ByteSource | None = None

    def open(self, header: Header) -> ByteSource:
        self.close()
        self._file = self._files.data(header)
        return self._file

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> _OneFileOpen:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _slices_sent(
    reader: ShardReader, decision: Decision
) -> Callable[[tuple[slice, ...] | None], np.ndarray[Any, Any]]:
    """`reader`'s slices as JAX is handed them for `decision`: the slices themselves (a
    device that copies host memory copies them; one that adopts them, adopts them)."""
    return reader


def _load_opened(
    source: ByteSource,
    header: Header,
    names: list[str],
    decisions: list[Decision],
    decider: Decider,
    mmap: bool | None,
    x64: bool,
    narrow: Narrow,
    progress: bool | None,
    out: dict[str, jax.Array],
) -> tuple[int, int, tuple[int, int]]:
    """Load one open file's tensors into `out`; (mapped, narrowed, (bytes read, bytes
    mapped)): bytes copied out of the file apart from bytes left views of its map.
    `mmap`: False for a source that is not a local file."""
    mapped = narrowed = 0
    bytes_read = bytes_mapped = whole_mapped = 0
    # Every 64-bit tensor that would change, so one error can list them all. Once there is
    # one, nothing else is placed: only the 64-bit tensors are still judged.
    problems: list[tuple[str, str]] = []
    order = sorted(range(len(header.tensors)), key=lambda i: header.tensors[i].offset)
    total = sum(t.nbytes for t in header.tensors)
    region: mmap_module.mmap | None = None
    with (
        progress_bar(header.path.name, total, progress) as advance,
        ReadAhead(source, header, decisions, order, mmap, x64, advance) as ahead,
    ):
        # Sent as they are read, batched, several calls in flight: reading the next
        # tensors overlaps the transfer of the last ones (`sending`).
        file = header.path.name  # the spans' metadata: the name, never the folder
        sender = Sender(out, advance, file=file)
        position = 0
        while position < len(order):
            i = order[position]
            entry, decision = header.tensors[i], decisions[i]
            target = NARROW.get(entry.dtype_name) if not x64 else None
            if problems and target is None:
                position += 1
                continue
            if entry.packed:
                # Packed in the file (F4, two values a byte): read whole and unpacked to
                # one value a byte, as JAX holds them; never mapped, sharded after reading.
                with span(LOAD_READ, file=file, tensors=1, bytes=entry.nbytes):
                    unpacked = read_tensor(source, header, entry, advance)
                sender.add(entry.key, unpacked, decision, 0)
                position += 1
                continue
            if decision.mesh is not None:
                # Sharded: this process reads only the slices its devices hold.
                sender.flush()
                copied = target is None and sends_from_map(entry, decision, mmap, x64)
                kept = target is None and may_map(entry, decision, mmap)
                if region is None and (copied or kept):
                    region = map_tensor_file(source, header)
                assert decision.sharding is not None
                held = decision.sharding.addressable_devices_indices_map(entry.shape)
                reader = ShardReader(
                    source, header, entry, region, target, narrow, held.values(), copied
                )
                # One span: the slices are read in JAX's callbacks, then sent.
                with span(LOAD_TRANSFER, file=file, tensors=1, bytes=entry.nbytes, sharded=1):
                    try:
                        placed: jax.Array = jax.make_array_from_callback(
                            entry.shape, decision.sharding, _slices_sent(reader, decision)
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
                bytes_mapped += reader.bytes_mapped
                mapped += reader.mapped
                advance(entry.nbytes)
                position += 1
                continue
            # Sent from a view of the file's map: a tensor the device copies (at any
            # offset: nothing read into host memory first, `map_or_read`), or one kept
            # mapped on the host. One read-only map of the whole file serves them all.
            copied = sends_from_map(entry, decision, mmap, x64)
            if copied or (target is None and may_map(entry, decision, mmap)):
                if region is None:
                    region = map_tensor_file(source, header)
                array: np.ndarray[Any, Any] = np.frombuffer(
                    region, entry.dtype, count=math.prod(entry.shape), offset=entry.offset
                ).reshape(entry.shape)
                if copied:  # copied out of the file by the transfer: counted as read
                    sender.add(entry.key, array, decision, entry.nbytes)
                else:
                    sender.add(entry.key, array, decision, 0)
                    mapped += 1
                    whole_mapped += entry.nbytes
                del array
                position += 1
                continue
            if entry.nbytes < MAP_THRESHOLD:
                run, arrays = ahead.run_at(position)
                for j, array in zip(run, arrays, strict=True):
                    small = header.tensors[j]
                    wanted = NARROW.get(small.dtype_name) if not x64 else None
                    if wanted is not None:
                        array, problem = _narrowed(
                            header, small, array, wanted, narrow, decider.events, names[j]
                        )
                        if problem is not None:
                            problems.append((small.key, problem))
                        narrowed += 1
                    if not problems:
                        sender.add(small.key, array, decisions[j], small.nbytes)
                position += len(run)
                continue
            # A large tensor is read whole (in pieces, on several threads; the progress
            # bar moves within it), on the read-ahead's thread while the tensor before
            # it is sent; it is sent without waiting, the host bytes in flight bounded
            # (`sending`). On the host it is adopted without a copy.
            assert reads_whole(entry, decision, mmap, x64)
            array = ahead.tensor_at(position)
            if target is not None:
                array, problem = _narrowed(
                    header, entry, array, target, narrow, decider.events, names[i]
                )
                narrowed += 1
                if problem is not None:
                    problems.append((entry.key, problem))
            if not problems:
                sender.add(entry.key, array, decision, 0)
            del array
            position += 1
        if problems:
            raise NarrowingError(problems, str(header.path))
        sender.finish()
    whole = zip(header.tensors, decisions, strict=True)
    # Every tensor left whole was read, but those mapped.
    bytes_read += sum(t.nbytes for t, d in whole if d.mesh is None) - whole_mapped
    return mapped, narrowed, (bytes_read, bytes_mapped + whole_mapped)


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
    result = aligned_empty(entry.nbytes // 2).view(target).reshape(entry.shape)
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


def silent_events(events: EventLog, uses: tuple[RuleUse, ...], path: PathLike) -> None:
    """The warnings of `silent_rules` for one load, one event each; each shadowed rule at
    debug (`rule_shadowed`). A `DEVPOLICY_RULES` item that took nothing is left to the
    decider, which says it once a process (`override_matched_nothing`), not once a load."""
    checkpoint = path_text(path)  # a URL shown without its credentials
    for code, message in silent_rules(uses, quiet=("env",)):
        fields = {"checkpoint": checkpoint, "message": message}
        events.emit("warning", code.replace("-", "_"), fields)
    if events.enabled("debug"):
        for message in shadowed_notes(uses):
            events.emit("debug", "rule_shadowed", {"checkpoint": checkpoint, "message": message})
