"""Which process uploads which bytes of a file saved to object storage: a multipart upload
takes the file as parts, each one contiguous range uploaded by one process, every part but
the last at least `MIN_PART` bytes.

A joint save's bytes fall where the arrays' shards put them: a tensor split on its rows
across processes gives each process one range of it, and those ranges are parts as they
stand; a tensor split on its columns interleaves the processes' bytes row by row, and a
small tensor is smaller than a part. Such tensors are *gathered*: process 0 uploads them
whole (every process takes part in gathering them, so each holds one such tensor whole
for a moment). One pass over the tensors in file order decides it, so the cost grows with
the number of tensors and of their shards, never with their square.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..format.header import PACKED
from ..format.layout import Slot, slice_runs

#: S3's smallest part (all but the last), and the size parts are cut to where a process's
#: range is longer (measured: 8 MiB parts, eight at a time, took 0.62x the time of 64 MiB
#: parts four at a time and held a quarter of the memory); at most `MAX_PARTS` parts
#: (S3's limit), so the part size grows with the file beyond about 40 GiB.
MIN_PART = 5 * 2**20
PART_BYTES = 8 * 2**20
MAX_PARTS = 10_000


@dataclass(frozen=True, slots=True)
class Part:
    """One part of the upload: bytes `[start, end)` of the file, uploaded by `process`."""

    number: int  # from 1, in file order
    start: int
    end: int
    process: int


@dataclass(frozen=True, slots=True)
class PartPlan:
    """Every part of the file, and the tensors process 0 uploads whole (gathered)."""

    parts: tuple[Part, ...]
    gathered: frozenset[str]
    gathered_bytes: int


def owned_ranges(value: Any, slot: Slot) -> list[tuple[int, int, int]] | None:
    """The (start, end, process) byte ranges of a tensor spanning processes, relative to
    the tensor's start, each process's bytes one range; None when some process's bytes
    are not one contiguous range. The bytes of each distinct slice belong to the process
    of the first device holding it in the sharding's order (JAX's replica 0)."""
    sharding = value.sharding
    unit = 1 if slot.dtype_name in PACKED else np.dtype(value.dtype).itemsize
    seen: set[tuple[tuple[int, int], ...]] = set()
    spans: dict[int, list[int]] = {}  # process -> [first byte, end, bytes]
    for device, index in sharding.devices_indices_map(slot.shape).items():
        bounds = tuple(s.indices(dim)[:2] for dim, s in zip(slot.shape, index, strict=True))
        if bounds in seen:
            continue
        seen.add(bounds)
        offsets, run = slice_runs(slot.shape, unit, bounds)
        if slot.dtype_name in PACKED:  # counted in values, two a byte
            offsets, run = offsets // 2, run // 2
        if not len(offsets) or not run:
            continue
        span = spans.setdefault(device.process_index, [math.inf, 0, 0])  # type: ignore[list-item]
        span[0] = min(span[0], int(offsets[0]))
        span[1] = max(span[1], int(offsets[-1]) + run)
        span[2] += run * len(offsets)
    ranges = []
    for process, (first, end, total) in spans.items():
        if end - first != total:  # gaps: other processes' bytes lie between this one's
            return None
        ranges.append((int(first), int(end), process))
    return sorted(ranges)


def plan_parts(
    tensors: Mapping[str, Any],
    order: Sequence[Slot],
    data_start: int,
    spans: Mapping[str, bool],
) -> PartPlan:
    """The parts of a file laid out as `order` after a header of `data_start` bytes.

    `spans[key]`: whether that tensor spans processes (else process 0 holds it whole and
    uploads it). Every process computes the same plan from the same arrays.
    """
    size = data_start + sum(slot.nbytes for slot in order)
    part_bytes = max(PART_BYTES, math.ceil(2 * size / MAX_PARTS))
    gathered: set[str] = set()
    runs: list[list[int]] = [[0, data_start, 0]]  # [start, end, process], merged as they come
    # Each tensor as ranges of one process each; a process-0 stretch too short for a part
    # between two other processes' ranges takes in the tensor after it.
    offset = data_start
    for slot in order:
        ranges = [(0, slot.nbytes, 0)]
        if spans[slot.key] and slot.nbytes:
            owned = owned_ranges(tensors[slot.key], slot)
            if (
                owned is None
                or any(end - start < MIN_PART for start, end, _ in owned)
                or sum(end - start for start, end, _ in owned) != slot.nbytes
                or (owned[0][2] != 0 and _stranded(runs))  # the stretch before needs it
            ):
                gathered.add(slot.key)
            else:
                ranges = owned
        for start, end, process in ranges:
            last = runs[-1]
            if process == last[2] and offset + start == last[1]:
                last[1] = offset + end
            else:
                runs.append([offset + start, offset + end, process])
        offset += slot.nbytes
    parts: list[Part] = []
    for start, end, process in runs:
        if end == start:
            continue
        # As near `part_bytes` as the range allows, none under MIN_PART.
        count = max(1, min(-(-(end - start) // part_bytes), (end - start) // MIN_PART))
        cuts = [start + (end - start) * k // count for k in range(count + 1)]
        for low, high in itertools.pairwise(cuts):
            parts.append(Part(len(parts) + 1, low, high, process))
    if len(parts) > MAX_PARTS:
        raise ValueError(
            f"{len(parts):,} parts, more than S3's {MAX_PARTS:,}: the arrays' shards cut the "
            f"file into {len(runs):,} ranges of one process each; shard fewer ways across "
            "the processes, or save to a shared filesystem"
        )
    gathered_bytes = sum(slot.nbytes for slot in order if slot.key in gathered)
    return PartPlan(tuple(parts), frozenset(gathered), gathered_bytes)


def _stranded(runs: list[list[int]]) -> bool:
    """Whether the last run is process 0's, too short for a part, and after another
    process's range (or the file's start): it can only grow by taking in what follows."""
    start, end, process = runs[-1]
    before = runs[-2][2] if len(runs) > 1 else None
    return process == 0 and end - start < MIN_PART and before != 0
