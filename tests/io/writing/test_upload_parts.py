"""Which process uploads which part of a file saved to object storage
(`_io/writing/upload_parts.py`), for arrays laid out over the devices of several processes
(described, not run: the 2-process upload itself is tests/io/remote/test_upload.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from devpolicy._io.format.layout import Slot
from devpolicy._io.writing.upload_parts import MIN_PART, PART_BYTES, plan_parts

MIB = 2**20


@dataclass(frozen=True)
class Device:
    id: int
    process_index: int


class Sharding:
    """Each device's slice, as `devices_indices_map` gives it: rows split in `blocks`
    (or columns, `by_columns`), block k on `owners[k]`'s device."""

    def __init__(self, shape: tuple[int, ...], owners: list[int], by_columns: bool = False):
        self.shape, self.owners, self.by_columns = shape, owners, by_columns

    def devices_indices_map(self, shape: tuple[int, ...]) -> dict[Device, tuple[slice, ...]]:
        axis = 1 if self.by_columns else 0
        step = shape[axis] // len(self.owners)
        out = {}
        for k, owner in enumerate(self.owners):
            index = [slice(None)] * len(shape)
            index[axis] = slice(k * step, (k + 1) * step)
            out[Device(k, owner)] = tuple(index)
        return out


@dataclass
class Spanning:
    """What `plan_parts` reads of an array that spans processes."""

    shape: tuple[int, ...]
    sharding: Sharding
    dtype = np.dtype(np.float32)  # every tensor here is float32


def _file(
    *tensors: tuple[str, Spanning | None, int],
) -> tuple[dict[str, Any], list[Slot], dict[str, bool]]:
    """Slots in the order given; None: an array process 0 holds whole (numpy)."""
    values: dict[str, Any] = {}
    order: list[Slot] = []
    spans: dict[str, bool] = {}
    for key, value, nbytes in tensors:
        shape = value.shape if value is not None else (nbytes // 4,)
        order.append(Slot(key, "F32", shape, nbytes))
        values[key] = value
        spans[key] = value is not None
    return values, order, spans


def _rows(mib: int, owners: list[int]) -> tuple[Spanning, int]:
    rows = mib * MIB // (4 * 1024)
    return Spanning((rows, 1024), Sharding((rows, 1024), owners)), mib * MIB


def _check(plan: Any, size: int) -> None:
    """Parts numbered from 1, contiguous, covering the file; all but the last big enough."""
    assert [p.number for p in plan.parts] == list(range(1, len(plan.parts) + 1))
    assert plan.parts[0].start == 0
    assert plan.parts[-1].end == size
    for before, after in zip(plan.parts, plan.parts[1:], strict=False):
        assert before.end == after.start
    assert all(p.end - p.start >= MIN_PART for p in plan.parts[:-1])


class TestPlanParts:
    def test_a_row_split_goes_up_as_each_processs_own_parts(self) -> None:
        """A tensor split on rows, 8 MiB a process: process 0 uploads the header and its
        rows, process 1 its rows; nothing gathered."""
        rows, nbytes = _rows(16, [0, 0, 1, 1])
        values, order, spans = _file(("rows", rows, nbytes))
        plan = plan_parts(values, order, 100, spans)
        _check(plan, 100 + nbytes)
        assert [(p.start, p.end, p.process) for p in plan.parts] == [
            (0, 100 + nbytes // 2, 0),
            (100 + nbytes // 2, 100 + nbytes, 1),
        ]
        assert plan.gathered == frozenset()

    def test_a_column_split_and_a_small_split_are_gathered(self) -> None:
        """Columns interleave the processes' bytes; a 2 MiB tensor in halves is smaller
        than a part: both go to process 0 whole."""
        columns = Spanning((2048, 1024), Sharding((2048, 1024), [0, 1], by_columns=True))
        small, small_bytes = _rows(2, [0, 1])
        values, order, spans = _file(("columns", columns, 8 * MIB), ("small", small, small_bytes))
        plan = plan_parts(values, order, 100, spans)
        _check(plan, 100 + 8 * MIB + small_bytes)
        assert plan.gathered == {"columns", "small"}
        assert plan.gathered_bytes == 8 * MIB + small_bytes
        assert {p.process for p in plan.parts} == {0}

    def test_a_header_before_another_processs_rows_takes_in_that_tensor(self) -> None:
        """The header alone is too small for a part: when the first tensor's first rows
        are process 1's, that tensor is gathered so the header has a part to go in."""
        first, nbytes = _rows(16, [1, 1, 0, 0])
        second, _ = _rows(16, [0, 0, 1, 1])
        values, order, spans = _file(("first", first, nbytes), ("second", second, nbytes))
        plan = plan_parts(values, order, 100, spans)
        _check(plan, 100 + 2 * nbytes)
        assert plan.gathered == {"first"}
        owners = [(p.process, p.start) for p in plan.parts]
        first_of_1 = min(start for process, start in owners if process == 1)
        assert first_of_1 == 100 + nbytes + nbytes // 2  # the second's own rows
        assert all(process == 0 for process, start in owners if start < first_of_1)

    def test_a_long_range_is_cut_into_parts_of_about_the_part_size(self) -> None:
        """300 MiB of process 0's: parts of about the part size, all alike; 12 MiB: two
        parts of 6 MiB; 9 MiB: one part (two would be under 5 MiB each)."""
        values, order, spans = _file(("big", None, 300 * MIB))
        plan = plan_parts(values, order, 0, spans)
        _check(plan, 300 * MIB)
        assert len(plan.parts) == -(-300 * MIB // PART_BYTES)
        assert {p.end - p.start for p in plan.parts} <= {
            300 * MIB // len(plan.parts),
            300 * MIB // len(plan.parts) + 1,
        }
        for mib, count in ((9, 1), (12, 2), (5, 1)):
            values, order, spans = _file(("t", None, mib * MIB))
            assert len(plan_parts(values, order, 0, spans).parts) == count

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(["numpy", "rows", "columns"]),
                st.integers(1, 24),
                st.lists(st.integers(0, 2), min_size=1, max_size=4),
            ),
            min_size=1,
            max_size=12,
        )
    )
    def test_any_file_gets_a_valid_plan(self, tensors: list[tuple[str, int, list[int]]]) -> None:
        """Any mix of whole, row-split and column-split tensors over 3 processes: the parts
        cover the file in order, every part but the last at least 5 MiB, and a part of
        process p holds only bytes p holds (or, gathered, process 0)."""
        described = []
        for k, (kind, mib, owners) in enumerate(tensors):
            if kind == "numpy":
                described.append((f"t{k}", None, mib * MIB))
            else:
                value, nbytes = _rows(mib, owners) if kind == "rows" else (None, 0)
                if kind == "columns":
                    rows = mib * MIB // (4 * 1024)
                    value = Spanning((rows, 1024), Sharding((rows, 1024), owners, by_columns=True))
                    nbytes = mib * MIB
                described.append((f"t{k}", value, nbytes))
        values, order, spans = _file(*described)
        plan = plan_parts(values, order, 64, spans)
        _check(plan, 64 + sum(slot.nbytes for slot in order))
        offset = 64
        for slot in order:
            if spans[slot.key] and slot.key not in plan.gathered:
                owners = values[slot.key].sharding.owners
                block = slot.nbytes // len(owners)
                for k, owner in enumerate(owners):
                    start = offset + k * block
                    (part,) = [p for p in plan.parts if p.start <= start < p.end]
                    assert part.process == owner
            offset += slot.nbytes
