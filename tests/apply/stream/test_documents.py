"""Documents' segment ids and positions from a separator token
(`devpolicy._apply.stream.documents`), worked out on the device from the batch's tokens,
bit for bit the host reference's."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

import devpolicy
from devpolicy._apply.stream import documents
from tests.helpers import policy_of

TOKENS = np.arange(100_000, dtype=np.int32)


def segments_by_hand(row: list[int], separator: int, kind: str) -> tuple[list[int], list[int]]:
    ids, positions, segment, position = [], [], 1, 0
    for i, token in enumerate(row):
        starts = i > 0 and (row[i - 1] == separator if kind == "eos" else token == separator)
        if starts:
            segment, position = segment + 1, 0
        ids.append(segment)
        positions.append(position)
        position += 1
    return ids, positions


class TestDocuments:
    @given(
        tokens=st.lists(st.integers(0, 4), min_size=8, max_size=200),
        length=st.integers(1, 8),
        batch=st.integers(1, 4),
        kind=st.sampled_from(["eos", "bos"]),
    )
    @settings(max_examples=60, deadline=None)
    def test_segment_ids_and_positions_agree_with_the_separators(
        self, tokens: list[int], length: int, batch: int, kind: str
    ) -> None:
        stream = devpolicy.windows(
            np.asarray(tokens, np.uint16), length, batch, separator=0, separator_is=kind,
            policy=policy_of(),
        )  # fmt: skip
        for b in stream:
            rows = np.asarray(b["tokens"]).tolist()
            ids = np.asarray(b["segment_ids"]).tolist()
            positions = np.asarray(b["positions"]).tolist()
            for row, row_ids, row_positions in zip(rows, ids, positions, strict=True):
                assert (row_ids, row_positions) == segments_by_hand(row, 0, kind)

    def test_segments_are_placed_with_their_batch_sharded_as_it_is(self) -> None:
        policy = policy_of(
            meshes={"rows": {"axes": {"data": 4}, "devices": "cpu"}},
            rules=[{"match": "batch", "sharding": {"mesh": "rows", "spec": ["data"]}}],
        )
        stream = devpolicy.windows(
            TOKENS % 50, 64, 8, order="shuffled", seed=1, separator=0, steps=3, policy=policy
        )
        for b in stream:
            assert set(b) == {"tokens", "segment_ids", "positions"}
            assert b["segment_ids"].dtype == np.int32
            assert b["positions"].dtype == np.int32
            for key in ("segment_ids", "positions"):
                assert b[key].shape == b["tokens"].shape
                assert b[key].sharding == b["tokens"].sharding

    def test_a_mixture_carries_segments_too(self) -> None:
        """Segments are cut from whatever windows a batch holds: a mixture's alike."""
        sources = {"a": TOKENS[:5000] % 13, "b": TOKENS[5000:9000] % 7}
        stream = devpolicy.windows(
            sources, 32, 8, order="shuffled", seed=1, weights={"a": 1, "b": 1},
            separator=0, steps=20, policy=policy_of(),
        )  # fmt: skip
        for b in stream:
            for row, ids, positions in zip(
                np.asarray(b["tokens"]).tolist(),
                np.asarray(b["segment_ids"]).tolist(),
                np.asarray(b["positions"]).tolist(),
                strict=True,
            ):
                assert (ids, positions) == segments_by_hand(row, 0, "eos")

    def test_stream_ended_counts_the_segments_bytes(self) -> None:
        policy = devpolicy.load_policy({"version": 1, "logging": {"level": "info"}}, environ={})
        with structlog.testing.capture_logs() as events:
            list(devpolicy.windows(TOKENS.astype(np.uint16), 10, 4, steps=3, separator=7,
                                   policy=policy))  # fmt: skip
        ended = next(e for e in events if e["event"] == "stream_ended")
        assert ended["nbytes"] == 3 * 4 * 10 * (2 + 4 + 4)

    @pytest.mark.parametrize(
        ("tokens", "options", "error", "message"),
        [
            (TOKENS.astype(np.uint16), {"separator": 70_000}, ValueError, r"cannot occur in"),
            (TOKENS.astype(np.uint16), {"separator": "eos"}, TypeError, r"must be an int"),
            (
                np.zeros((100, 2), np.int32),
                {"separator": 0},
                ValueError,
                r"needs a 1-D array of integer token ids",
            ),
            (np.zeros(100, np.float32), {"separator": 0}, ValueError, r"integer token ids"),
            (TOKENS, {"separator": 0, "separator_is": "end"}, ValueError, r"separator_is must"),
        ],
    )
    def test_a_bad_separator_is_refused_naming_it(
        self, tokens: Any, options: dict[str, Any], error: type[Exception], message: str
    ) -> None:
        with pytest.raises(error, match=message):
            devpolicy.windows(tokens, 4, 2, policy=policy_of(), **options)


def segments_reference(
    windows: np.ndarray, separator: int, kind: str
) -> tuple[np.ndarray, np.ndarray]:
    """The host kernel as it was before rows were patched start by start: every segment
    found, then each one's id and first column repeated over its tokens."""
    length = windows.shape[-1]
    total = windows.size
    flat = windows.reshape(-1)
    found = np.flatnonzero(flat == separator)
    if kind == "eos":
        found += 1
    rows = np.arange(0, total, length, dtype=np.int64)
    firsts = np.concatenate([rows, found[found % length != 0]])
    firsts.sort()
    lengths = np.diff(firsts, append=total)
    columns = firsts % length
    row_of_first = np.searchsorted(firsts, firsts - columns)
    ids = (np.arange(1, firsts.size + 1) - row_of_first).astype(np.int32)
    starts = np.repeat(columns.astype(np.int32), lengths)
    positions = np.tile(np.arange(length, dtype=np.int32), total // length) - starts
    return np.repeat(ids, lengths).reshape(windows.shape), positions.reshape(windows.shape)


class TestOnTheHost:
    """The host kernel (`segments`) gives what it gave before it patched rows start by
    start, whatever the separators' density, into fresh arrays or into `out`."""

    @given(
        data=st.data(),
        shape=st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(1, 70)),
        kind=st.sampled_from(["eos", "bos"]),
        starts=st.integers(0, 3 * documents.FEW),
        dtype=st.sampled_from([np.uint16, np.int32, np.uint8]),
        into=st.booleans(),
    )
    @settings(max_examples=150, deadline=None)
    def test_the_kernel_agrees_with_the_reference(
        self, data: st.DataObject, shape: tuple[int, int, int], kind: str, starts: int,
        dtype: type, into: bool,
    ) -> None:  # fmt: skip
        """Separators from none to every token: around `FEW` (rows patched start by
        start) and above it (every segment worked out), at rows' first and last tokens."""
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
        windows = rng.integers(1, 200, shape).astype(dtype)
        flat = windows.reshape(-1)
        flat[rng.integers(0, flat.size, min(starts, flat.size))] = 0
        if data.draw(st.booleans(), label="edges"):
            windows[..., 0] = windows[..., -1] = 0
        out = (np.full(shape, -9, np.int32), np.full(shape, -9, np.int32)) if into else None
        got = documents.segments(windows, 0, kind, out)  # type: ignore[arg-type]
        expected = segments_reference(windows, 0, kind)
        if out is not None:
            assert got[0] is out[0]
            assert got[1] is out[1]
        for a, b in zip(got, expected, strict=True):
            assert a.dtype == np.int32
            assert a.shape == windows.shape
            np.testing.assert_array_equal(a, b)

    @given(
        data=st.data(),
        shape=st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(1, 40)),
        kind=st.sampled_from(["eos", "bos"]),
        groups=st.integers(2, 6),
    )
    @settings(max_examples=100, deadline=None)
    def test_arrays_used_again_hold_each_groups_own_segments(
        self, data: st.DataObject, shape: tuple[int, int, int], kind: str, groups: int
    ) -> None:
        """The same two arrays used for group after group, as a ring's buffer is: each
        group patched only in the rows the one before left differing from one document a
        row (or written whole where it had many starts, and nothing then known), and every
        group's ids and positions are the reference's, whatever came before."""
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
        ids, positions = np.full(shape, -9, np.int32), np.full(shape, -9, np.int32)
        scratch = np.empty(data.draw(st.integers(0, 3), label="spare") + ids.size, np.bool_)
        differing: list[int] | None = None
        for _ in range(groups):
            windows = rng.integers(1, 200, shape).astype(np.uint16)
            flat = windows.reshape(-1)
            count = data.draw(st.integers(0, 2 * documents.FEW), label="separators")
            flat[rng.integers(0, flat.size, min(count, flat.size))] = 0
            found = documents.starts(windows, 0, kind, scratch)  # type: ignore[arg-type]
            np.testing.assert_array_equal(found, documents.starts(windows, 0, kind))  # type: ignore[arg-type]
            if found.size > documents.FEW:
                documents.runs(found, ids, positions)
                differing = None
            else:
                differing = documents.patched(found, ids, positions, differing)
            expected = segments_reference(windows, 0, kind)
            np.testing.assert_array_equal(ids, expected[0])
            np.testing.assert_array_equal(positions, expected[1])
            one_document = [
                row
                for row in range(flat.size // shape[-1])
                if not (expected[0].reshape(-1, shape[-1])[row] == 1).all()
            ]
            if differing is not None:
                assert sorted(differing) == one_document

    @pytest.mark.parametrize("kind", ["eos", "bos"])
    def test_a_group_of_batches_at_a_streams_shape_agrees_with_the_reference(
        self, kind: str
    ) -> None:
        """8 batches of 32 x 1,025: a separator one token in 65,536 (a few starts: rows
        patched) and one in 500 (hundreds: every segment worked out)."""
        rng = np.random.default_rng(7)
        for every in (65_536, 500):
            windows = rng.integers(0, every, (8, 32, 1025)).astype(np.uint16)
            got = documents.segments(windows, 0, kind)  # type: ignore[arg-type]
            for a, b in zip(got, segments_reference(windows, 0, kind), strict=True):
                np.testing.assert_array_equal(a, b)


def on_device(windows: np.ndarray, separator: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """The device's ids and positions of one batch, through the stream's own jitted call."""
    placed = jax.device_put(windows, jax.devices("cpu")[0])
    (ids,), (positions,) = documents.on_device(separator, kind, placed.sharding)((placed,))
    assert ids.dtype == positions.dtype == np.int32
    return np.asarray(ids), np.asarray(positions)


class TestOnTheDevice:
    """The ids and positions worked out on the device from the tokens are the host
    reference's (`segments`), bit for bit."""

    @given(
        data=st.data(),
        length=st.integers(1, 64),
        batch=st.integers(1, 8),
        kind=st.sampled_from(["eos", "bos"]),
        share=st.sampled_from([0.0, 0.02, 0.2, 0.5, 1.0]),
        dtype=st.sampled_from([np.uint16, np.int32, np.uint8]),
    )
    @settings(max_examples=40, deadline=None)
    def test_random_separators_agree_with_the_host(
        self, data: st.DataObject, length: int, batch: int, kind: str, share: float,
        dtype: type,
    ) -> None:  # fmt: skip
        seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
        rng = np.random.default_rng(seed)
        windows = rng.integers(1, 200, (batch, length)).astype(dtype)
        windows[rng.random((batch, length)) < share] = 0
        expected = documents.segments(windows, 0, kind)  # type: ignore[arg-type]
        got = on_device(windows, 0, kind)
        np.testing.assert_array_equal(got[0], expected[0])
        np.testing.assert_array_equal(got[1], expected[1])

    @pytest.mark.parametrize("kind", ["eos", "bos"])
    @pytest.mark.parametrize(
        "columns",
        [
            [],  # one document a row
            [0],  # the row starts at a separator
            [1024],  # ... and ends at one
            [31, 32, 63, 64, 95],  # at the edges of the blocks of 32
            list(range(0, 1025, 7)),
            list(range(1025)),  # every token a separator
        ],
        ids=["none", "first", "last", "block-edges", "every-7th", "all"],
    )
    def test_separators_at_the_edges_agree_with_the_host(
        self, kind: str, columns: list[int]
    ) -> None:
        """A 1,025-token window (a row of 33 blocks, the last one token): separators at
        a row's first and last token and at the blocks' edges."""
        windows = np.full((3, 1025), 5, np.uint16)
        windows[0, columns] = 7
        windows[2, [c for c in columns if c % 2]] = 7
        expected = documents.segments(windows, 7, kind)  # type: ignore[arg-type]
        got = on_device(windows, 7, kind)
        np.testing.assert_array_equal(got[0], expected[0])
        np.testing.assert_array_equal(got[1], expected[1])

    @pytest.mark.usefixtures("copying_device")
    def test_a_stream_makes_its_jitted_function_once(self) -> None:
        """Bound for a device that copies host memory (an accelerator's path): one jitted
        function a separator and sharding, a second stream of the same kind reuses it."""
        tokens = TOKENS.astype(np.uint16) % 50
        list(devpolicy.windows(tokens, 40, 4, steps=20, separator=3, policy=policy_of()))
        before = documents.on_device.cache_info()
        list(devpolicy.windows(tokens, 40, 4, steps=20, separator=3, policy=policy_of()))
        after = documents.on_device.cache_info()
        assert after.misses == before.misses
        assert after.hits > before.hits

    def test_a_device_that_adopts_host_memory_is_sent_the_hosts_ids(self) -> None:
        """The CPU adopts a host buffer: the host's ids and positions cost it no transfer,
        so no device function works them out there (XLA's CPU code is slower than the
        host's)."""
        tokens = TOKENS.astype(np.uint16) % 50
        before = documents.on_device.cache_info()
        batches = list(devpolicy.windows(tokens, 40, 4, steps=5, separator=7, policy=policy_of()))
        assert documents.on_device.cache_info() == before
        ids, positions = documents.segments(
            np.stack([np.asarray(b["tokens"]) for b in batches]), 7, "eos"
        )
        np.testing.assert_array_equal(
            np.stack([np.asarray(b["segment_ids"]) for b in batches]), ids
        )
        np.testing.assert_array_equal(
            np.stack([np.asarray(b["positions"]) for b in batches]), positions
        )
