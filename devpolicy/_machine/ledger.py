"""The live ledger: where the bytes of JAX's live arrays are now, and which rule put them there.

Placing code (`put`, `to`, committed `@place` results, `load_file`, `prefetch`,
`windows`) records each array it makes under its name and the origin of its rule; the
record holds only a weak reference, so it never keeps an array alive and goes with it.
`report()` reads `jax.live_arrays()`: arrays freed since are gone, and arrays devpolicy
never placed show as `unplaced`.

The records and their reading stay in one module (the table's keys, weak references and
pruning are what `report` reads); the rows a report gives (`rows`), its picture
(`picture`), the fallbacks counted (`fallbacks`) and the streams (`streams`) live apart.
"""

from __future__ import annotations

import bisect
import os
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import jax

from .._base.sizes import format_size
from . import picture
from .capacity import Capacity, DeviceMemory, measured
from .fallbacks import FallbackCount, fallbacks
from .inventory import inventory
from .rows import LedgerDevice, LedgerEntry, TransferSite
from .streams import LedgerStream, recent_batches, stream_lines, streams
from .streams import printable as _shown

#: The origin shown for live arrays devpolicy did not place.
UNPLACED = "unplaced"

# id(array) -> (weak reference, name, origin, rule index). Keyed by id because JAX arrays
# are unhashable. A plain weak reference (no callback: about 0.3 us against 1.7 us with a
# closure per array) never keeps an array alive; a record whose array has gone is skipped
# where read (its reference is dead, or no longer the array now at that id) and pruned
# once the table has doubled since the last pruning, so it stays within twice the live
# records at an amortised constant cost.
_Record = tuple["weakref.ref[Any]", str, str, "int | None"]
_placed: dict[int, _Record] = {}
_prune_at = [1024]


def record(array: Any, name: str, origin: str, rule: int | None) -> None:
    """Note that `array` was placed as `name` by the rule at `origin`."""
    try:
        ref = weakref.ref(array)
    except TypeError:  # not an array object (nothing to account for)
        return
    _placed[id(array)] = (ref, name, origin, rule)
    if len(_placed) >= _prune_at[0]:
        _prune()


def _prune() -> None:
    """Drop the records whose array has gone. Safe while other threads record.

    It walks a copy taken by one C call (`dict.copy` runs no Python code): walking the
    table itself, even through `list(_placed.items())`, lets a collection run finalizers
    half-way, and another thread (or a finalizer) recording then made the walk raise
    `RuntimeError: dictionary changed size during iteration` out of `put`.
    """
    for key, entry in _placed.copy().items():
        if entry[0]() is not None:
            continue
        gone = _placed.pop(key, None)
        if gone is not None and gone is not entry:
            # The dead array's id was reused by an array recorded since the copy: keep it.
            _placed.setdefault(key, gone)
    _prune_at[0] = max(1024, 2 * len(_placed))


def record_all(arrays: Iterable[Any], name: str, origin: str, rule: int | None) -> None:
    """`record` for each array of `arrays` (what one `device_put` returned)."""
    placed = _placed
    for array in arrays:
        # `record`, inlined: a call and an isinstance against jax.Array's ABC cost more
        # than the record itself.
        placed[id(array)] = (weakref.ref(array), name, origin, rule)
    if len(placed) >= _prune_at[0]:
        _prune()


def record_each(records: Iterable[tuple[Any, str, str, int | None]]) -> None:
    """`record` for many (array, name, origin, rule) at once: a file's tensors.

    One call with the loop inlined: per array, a call and the `TypeError` guard cost
    more than the record (JAX arrays always take a weak reference).
    """
    placed = _placed
    ref = weakref.ref
    for array, name, origin, rule in records:
        placed[id(array)] = (ref(array), name, origin, rule)
    if len(placed) >= _prune_at[0]:
        _prune()


@dataclass(frozen=True, slots=True)
class Ledger:
    """Where the bytes of this process's live JAX arrays are now; see `devpolicy.report`.

    Attributes:
        devices: One entry per device of this process (memory kinds apart), in inventory
            order, those holding nothing included.
        arrays: How many live arrays, each counted once however many devices it spans.
        sharded: Of those, how many are spread over several devices.
        shards: How many pieces those are in all (an array split or replicated over 4
            devices is 4 shards).
    """

    devices: tuple[LedgerDevice, ...]
    arrays: int = 0
    sharded: int = 0
    shards: int = 0
    #: The implicit transfers JAX made while a policy with `transfers:` watched, by site,
    #: most bytes first (see `TransferSite`); empty when nothing watched.
    transfers: tuple[TransferSite, ...] = ()
    #: The streams of batches (`windows`, `prefetch`) open now and the latest that ended,
    #: oldest first, with a mixture's windows from each source (see `LedgerStream`).
    streams: tuple[LedgerStream, ...] = ()
    #: The decisions that took a fallback in this process, by rule and way taken, most
    #: first (see `FallbackCount`); empty when none did.
    fallbacks: tuple[FallbackCount, ...] = ()

    @property
    def by_device(self) -> Mapping[str, LedgerDevice]:
        """The devices by target text: `ledger.by_device["cpu:1"].nbytes`."""
        return {d.device: d for d in self.devices}

    @property
    def nbytes(self) -> int:
        """Bytes of every live array, over every device."""
        return sum(d.nbytes for d in self.devices)

    @property
    def file_backed(self) -> int:
        """Of those, bytes mapped from files."""
        return sum(d.file_backed for d in self.devices)

    def __str__(self) -> str:
        """A table: per device its arrays, bytes and free memory, then each rule's share.

        Example:
            >>> import devpolicy, numpy as np
            >>> p = devpolicy.load_policy({"version": 1, "rules": [
            ...     {"match": "ledger/*", "device": "cpu:3"}]})
            >>> doc = p.put("ledger/doc", np.zeros(256, np.float32))
            >>> cpu3 = devpolicy.report().by_device["cpu:3"]
            >>> [(e.origin, e.nbytes) for e in cpu3.entries if e.names == ("ledger/doc",)]
            [('<mapping>:rules[0]', 1024)]
            >>> print(str(devpolicy.report()).splitlines()[0])
            live arrays by device (devpolicy.report):
        """
        labels = picture.labels(self.devices)
        cells = [
            (
                labels[e.origin, e.rule],
                _names_text(e.names),
                _count(e.arrays, e.sharded),
                format_size(e.nbytes),
            )
            for d in self.devices
            for e in d.entries
        ]
        widths = [max((len(c[i]) for c in cells), default=0) for i in range(4)]
        lines = ["live arrays by device (devpolicy.report):"]
        rows = iter(cells)
        for d in self.devices:
            free = "free memory unknown" if d.free is None else f"{format_size(d.free)} free"
            if d.pool and d.pool != d.device and d.free is not None:
                free += f" ({d.pool})"
            count = _count(d.arrays, d.sharded)
            held = f"{count}, {format_size(d.nbytes)}{_backed(d.file_backed)}"
            lines.append(f"{d.device}: {held}; {free}")
            for e in d.entries:
                label, names, count, size = next(rows)
                line = (
                    f"  {label:{widths[0]}}  {names:{widths[1]}}  {count:>{widths[2]}}  "
                    f"{size:>{widths[3]}}{_backed(e.file_backed)}"
                )
                lines.append(line.rstrip())
        lines += stream_lines(self.streams)
        lines.append(
            f"total: {_total(self.arrays, self.sharded, self.shards)}, "
            f"{format_size(self.nbytes)}{_backed(self.file_backed)}"
        )
        lines += transfer_lines(self.transfers)
        return "\n".join(lines)

    def __rich__(self) -> Any:
        """`rich.print(ledger)`: the same table, never read as markup."""
        from rich.text import Text

        return Text(str(self))

    def bars(self, width: int = 40, *, ascii_only: bool | None = None) -> str:
        """The ledger as bars for a terminal: per device its bytes by rule against its
        memory, then the streams with their waited share, the rules by bytes and the
        fallbacks taken.

        Each device's bar is its memory in all where measured, else its arrays alone
        ("capacity unknown"); a rule's share under one cell still takes one. The lines
        under each bar give the figures and where they were read.

        Args:
            width: The bar's cells (8..1000).
            ascii_only: Draw in ASCII (`#=+`, `.` unplaced, `-` in use otherwise);
                default: where `sys.stdout`'s encoding cannot write `█▓░╌│`.

        Raises:
            ValueError: `width` is not a whole number 8..1000.

        Example:
            >>> import devpolicy, numpy as np
            >>> p = devpolicy.load_policy({"version": 1, "rules": [
            ...     {"match": "model/*", "device": "cpu:2"},
            ...     {"match": "bars/*", "device": "cpu:1"}]})
            >>> w = p.put("bars/w", np.zeros(1024, np.uint8))
            >>> text = devpolicy.report().bars(width=20, ascii_only=True)
            >>> [line.split()[1:] for line in text.splitlines() if line.endswith(": bars/w")]
            [['1.0', 'KiB', '<mapping>:rules[1]', '(1', 'array):', 'bars/w']]
        """
        return picture.bars(self.devices, self.streams, self.fallbacks, width, ascii_only)

    def to_html(self, title: str = "devpolicy report") -> str:
        """The ledger as one self-contained HTML page: per device a bar of its bytes by
        rule against its memory, the streams, the rules by bytes, the fallbacks taken and
        the implicit transfers, each section saying where its figures come from.

        The page fetches nothing (its style is inline, its bars are plain `div`s), so it
        opens offline. Names are escaped: a name with markup shows as text. A ledger of
        no devices (`Ledger(())`) is a page that says so.

        Example:
            >>> import devpolicy
            >>> page = devpolicy.report().to_html()
            >>> page.startswith("<!DOCTYPE html>"), "cpu:0" in page, "http" in page
            (True, True, False)
        """
        return picture.page(
            title, self.devices, self.streams, self.fallbacks, self.transfers, self.arrays
        )

    def write_html(self, path: str | os.PathLike[str], title: str = "devpolicy report") -> Path:
        """Write `to_html()` to `path`, whole or not at all (a temporary file in the same
        folder, renamed over it); returns the path.

        Raises:
            OSError: `path` cannot be written (`IsADirectoryError`, `FileNotFoundError`
                for a missing folder, `PermissionError`); the message names the path and
                why, and nothing is left behind.

        Example:
            >>> import devpolicy, tempfile, pathlib
            >>> folder = pathlib.Path(tempfile.mkdtemp())
            >>> devpolicy.report().write_html(folder / "report.html").name
            'report.html'
        """
        return picture.write_page(self.to_html(title), path)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _count(arrays: int, sharded: int = 0) -> str:
    """Arrays on one device: `3 arrays`, `24 shards` (each a shard of an array spread over
    several devices), `26 arrays (24 as shards)`."""
    if not sharded:
        return _plural(arrays, "array")
    if sharded == arrays:
        return _plural(arrays, "shard")
    return f"{_plural(arrays, 'array')} ({sharded} as shards)"


def _total(arrays: int, sharded: int, shards: int) -> str:
    """Every array once: `4 arrays`, `24 arrays in 96 shards`, `28 arrays (24 of them in
    96 shards)`."""
    if not sharded:
        return _plural(arrays, "array")
    if sharded == arrays:
        return f"{_plural(arrays, 'array')} in {_plural(shards, 'shard')}"
    return f"{_plural(arrays, 'array')} ({sharded} of them in {_plural(shards, 'shard')})"


def _backed(nbytes: int) -> str:
    return f" ({format_size(nbytes)} file-backed)" if nbytes else ""


def _names_text(names: tuple[str, ...], limit: int = 3) -> str:
    shown = ", ".join(_shown(n) for n in names[:limit])
    return shown + (f", ... ({len(names)} names)" if len(names) > limit else "")


def _file_ranges() -> tuple[list[int], list[int]]:
    """Starts and ends of this process's file-backed mappings, sorted; empty where the
    system does not say (no /proc/self/maps)."""
    starts: list[int] = []
    ends: list[int] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                # address perms offset dev inode [path]: inode 0 is anonymous memory.
                if len(fields) < 6 or fields[4] == "0":
                    continue
                start, _, end = fields[0].partition("-")
                starts.append(int(start, 16))
                ends.append(int(end, 16))
    except (OSError, ValueError):
        return [], []
    order = sorted(range(len(starts)), key=starts.__getitem__)
    return [starts[i] for i in order], [ends[i] for i in order]


def _in_file(pointer: int, ranges: tuple[list[int], list[int]]) -> bool:
    starts, ends = ranges
    i = bisect.bisect_right(starts, pointer) - 1
    return i >= 0 and pointer < ends[i]


#: A buffer's address, or (id of its array, shard index): for a shard, and where none is given.
_Buffer: TypeAlias = "int | tuple[int, int]"


_Piece: TypeAlias = "tuple[jax.Device, str | None, _Buffer, int]"


def _pieces(array: jax.Array, views: dict[int, jax.Array]) -> tuple[list[_Piece], bool]:
    """(device, memory kind, buffer, bytes) of each local piece of `array`, and whether it
    is spread over several devices (here or in other processes); no pieces for an array
    deleted before or while it is read. The arrays JAX keeps for a spread array's shards
    go into `views` (by id), to be counted as those shards and never read on their own.

    Another thread may donate or delete the array at any moment: reading it then raises
    (`RuntimeError: Array has been deleted`, or a `TypeError` where `devices()` gave None)
    or reads a pointer no longer there. An array deleted by the end of the reading is
    gone, as if freed before the report; an error from an array still alive is raised.
    """
    if array.is_deleted():
        return [], False
    try:
        out = _read_pieces(array, views)
    except Exception:
        if array.is_deleted():
            return [], False
        raise
    return ([], False) if array.is_deleted() else out


def _read_pieces(array: jax.Array, views: dict[int, jax.Array]) -> tuple[list[_Piece], bool]:
    kind = getattr(array.sharding, "memory_kind", None)
    devices = array.devices()
    if len(devices) == 1:
        (device,) = devices
        return [(device, kind, _buffer(array), array.nbytes)], False
    out: list[_Piece] = []
    for i, shard in enumerate(array.addressable_shards):
        # A shard's buffer address is never read: jaxlib 0.12.1 crashed the process
        # (a segmentation fault in `unsafe_buffer_pointer`) when another thread donated
        # the sharded array meanwhile. The array JAX keeps for the shard is known by id.
        data = shard.data
        views[id(data)] = data
        out.append((shard.device, kind, (id(array), i), data.nbytes))
    return out, True


def _buffer(array: jax.Array) -> _Buffer:
    """The array's buffer address; a key no other buffer shares where a backend does not
    say, or for an empty array (empty buffers' addresses may coincide)."""
    try:
        pointer = int(array.unsafe_buffer_pointer())
    except Exception:
        return (id(array), 0)
    return pointer if pointer > 0 and array.size else (id(array), 0)


def _spread_first(array: jax.Array) -> bool:
    """Sorts arrays spread over several devices before those on one."""
    try:
        return len(array.sharding.device_set) == 1
    except Exception:  # read in full (and found deleted) by _pieces
        return True


def _live_arrays() -> list[jax.Array]:
    seen: dict[int, jax.Array] = {}
    for platform in inventory().devices:
        try:
            arrays = jax.live_arrays(platform)  # type: ignore[no-untyped-call]
        except Exception:  # a backend that cannot list them contributes nothing
            continue
        for array in arrays:
            seen.setdefault(id(array), array)
    return list(seen.values())


def report(*, capacity: Capacity | None = None) -> Ledger:
    """Where the bytes of this process's live JAX arrays are, by device and by rule.

    Reads `jax.live_arrays()` of every backend: arrays freed since they were placed are
    gone, and arrays devpolicy did not place (made by JAX outside `put`, `to`, `@place`
    results, `load_file`, `prefetch` and `windows`) show as `unplaced`. For each device:
    its live arrays and bytes, the bytes mapped from files apart (found in
    `/proc/self/maps`; 0 where the system does not say), its free memory, and the bytes
    split by the rule (its origin, `policy.yaml:9`) that placed them, with the names
    placed. An array counts once in the ledger's `arrays`; one spread over several
    devices (sharded or replicated) counts on each device it has a shard on, as a shard,
    and the ledger's `shards` counts those pieces; the arrays JAX keeps for its shards
    (`addressable_shards[i].data`) are those shards, not arrays apart. Single-device
    arrays sharing one buffer (an array and its committed copy of the same memory) count
    once. The single-device arrays a sharded array was assembled from count apart while
    they live (a shard's buffer address is never read: on jaxlib 0.12.1 reading one while
    another thread donated the sharded array crashed the process). An array donated or
    deleted by another thread while the report reads it is gone.

    Args:
        capacity: Where free memory is read (default: the devices' own statistics, and
            available host RAM for devices without them).

    Returns:
        A `Ledger`: `print(ledger)` (or `rich.print`) shows the table; `ledger.devices`
        and `ledger.by_device["cpu:1"]` hold the numbers.

    Example:
        >>> import devpolicy, numpy as np
        >>> p = devpolicy.load_policy({"version": 1, "default": "cpu:2"})
        >>> w = p.put("report/w", np.zeros(1024, np.uint8))
        >>> cpu2 = devpolicy.report().by_device["cpu:2"]
        >>> [(e.origin, e.nbytes) for e in cpu2.entries if e.names == ("report/w",)]
        [('<mapping>:default', 1024)]
    """
    memory: Capacity = capacity if capacity is not None else DeviceMemory()
    placed = _placed.copy()  # one C call: safe against other threads recording
    _stream_records(placed)  # a stream's recent batches, under the stream's name
    files = _file_ranges()
    # (device, kind, buffer) -> bytes, record, (id of its array, whether that array is
    # spread over several devices): a buffer seen twice is counted once, under the record
    # that names it if either does.
    buffers: dict[
        tuple[jax.Device, str | None, _Buffer], tuple[int, _Record | None, tuple[int, bool]]
    ] = {}
    # Spread arrays first: the arrays JAX keeps for their shards are then known, and
    # counted once, as those shards.
    views: dict[int, jax.Array] = {}
    for array in sorted(_live_arrays(), key=_spread_first):
        if id(array) in views:
            continue
        entry = placed.get(id(array))
        if entry is not None and entry[0]() is not array:
            entry = None
        pieces, spread = _pieces(array, views)
        for device, kind, pointer, nbytes in pieces:
            key = (device, kind, pointer)
            found = buffers.get(key)
            if found is None or (found[1] is None and entry is not None):
                buffers[key] = (nbytes, entry, (id(array), spread))
    inv = inventory()
    # (device, kind) -> (origin, rule) -> [arrays, bytes, file-backed, names, sharded]
    tally: dict[tuple[jax.Device, str | None], dict[tuple[str, int | None], list[Any]]] = {}
    kinds: dict[tuple[jax.Device, str | None], tuple[jax.Device, str | None]] = {}
    owners: set[tuple[int, bool]] = set()
    shards = 0
    for (device, kind, pointer), (nbytes, entry, owner) in buffers.items():
        by = (entry[2], entry[3]) if entry is not None else (UNPLACED, None)
        slot = kinds.get((device, kind))
        if slot is None:
            slot = kinds[device, kind] = (device, _kind(device, kind))
        row = tally.setdefault(slot, {}).setdefault(by, [set(), 0, 0, set(), set()])
        row[0].add(owner)
        row[1] += nbytes
        row[2] += nbytes if isinstance(pointer, int) and _in_file(pointer, files) else 0
        if entry is not None:
            row[3].add(entry[1])
        owners.add(owner)
        if owner[1]:
            row[4].add(owner)
            shards += 1
    slots: list[tuple[jax.Device, str | None]] = [
        (d, None) for devices in inv.devices.values() for d in devices
    ]
    listed = set(slots)
    slots += sorted((k for k in tally if k not in listed), key=lambda k: (k[0].id, k[1] or ""))
    devices = []
    for device, kind in slots:
        rows = tally.get((device, kind), {})
        entries = sorted(
            (
                LedgerEntry(
                    origin, rule, tuple(sorted(names)), len(arrays), nbytes, backed, len(sharded)
                )
                for (origin, rule), (arrays, nbytes, backed, names, sharded) in rows.items()
            ),
            key=lambda e: (e.origin == UNPLACED, -e.nbytes, e.origin),
        )
        free, free_from, total, total_from, pool = measured(memory, device, kind)
        text = inv.text(device) if kind is None else f"{inv.text(device)} [{kind}]"
        devices.append(
            LedgerDevice(
                text,
                sum(e.arrays for e in entries),
                sum(e.nbytes for e in entries),
                sum(e.file_backed for e in entries),
                free,
                pool,
                tuple(entries),
                sum(e.sharded for e in entries),
                total,
                free_from,
                total_from,
            )
        )
    return Ledger(
        tuple(devices),
        len(owners),
        sum(spread for _, spread in owners),
        shards,
        transfer_sites(),
        streams(),
        fallbacks(),
    )


def _kind(device: jax.Device, kind: str | None) -> str | None:
    """None for the device's default memory kind, else the kind."""
    if kind is None:
        return None
    try:
        default = device.default_memory().kind
    except Exception:  # a device without memory kinds: its one memory
        return None
    return None if kind == default else kind


def _stream_records(placed: dict[int, _Record]) -> None:
    """Add the streams' recent batches to `placed` (a copy), where not recorded already."""
    for array, ref, tally in recent_batches():
        found = placed.get(id(array))
        # A record of a dead array whose id this batch now has is no record of it.
        if found is None or found[0]() is not array:
            placed[id(array)] = (ref, tally.name, tally.origin, tally.rule)


# Implicit transfers (`transfers:` of a policy): counted by site while a policy watches.
# Sites are lines of code, so the table is bounded by the program's size; a program that
# generates code without end is cut off at _TRANSFER_SITES_LIMIT (the rest are counted
# under the last row's key, never lost from the totals).
_TRANSFER_SITES_LIMIT = 4096
#: How many sites `str(report())` shows (`Ledger.transfers` holds them all).
TRANSFER_LINES = 10
# (site, direction) -> [count, nbytes, function, devices]
_transfers: dict[tuple[str, str], list[Any]] = {}


def count_transfer(
    site: str, direction: str, nbytes: int, devices: tuple[str, ...], function: str
) -> int:
    """Count one implicit transfer; returns how many there have been at `site` before it."""
    key = (site, direction)
    row = _transfers.get(key)
    if row is None:
        if len(_transfers) >= _TRANSFER_SITES_LIMIT:
            key = ("<other sites>", direction)
            row = _transfers.get(key)
        if row is None:
            row = _transfers[key] = [0, 0, function, set()]
    seen: int = row[0]
    row[0] = seen + 1
    row[1] += nbytes
    row[3].update(devices)
    return seen


def transfer_sites() -> tuple[TransferSite, ...]:
    """Every site counted so far, most bytes first."""
    rows = [
        TransferSite(site, direction, count, nbytes, tuple(sorted(devices)), function)
        for (site, direction), (count, nbytes, function, devices) in list(_transfers.items())
    ]
    return tuple(sorted(rows, key=lambda r: (-r.nbytes, -r.count, r.site)))


def forget_transfers() -> None:
    """Start counting implicit transfers afresh (tests, or a job between phases)."""
    _transfers.clear()


def transfer_lines(sites: tuple[TransferSite, ...]) -> list[str]:
    """The report's lines for implicit transfers: the top sites by bytes."""
    if not sites:
        return []
    total = sum(s.nbytes for s in sites)
    count = sum(s.count for s in sites)
    lines = [
        f"implicit transfers: {_plural(count, 'transfer')}, {format_size(total)} "
        f"at {_plural(len(sites), 'site')}:"
    ]
    for s in sites[:TRANSFER_LINES]:
        lines.append(
            f"  {s.site}  {s.direction}  {_plural(s.count, 'transfer')}  "
            f"{format_size(s.nbytes)}  to {', '.join(s.devices)}"
        )
    if len(sites) > TRANSFER_LINES:
        lines.append(f"  ... {len(sites) - TRANSFER_LINES} more (Ledger.transfers)")
    return lines
