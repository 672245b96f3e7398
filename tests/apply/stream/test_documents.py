"""Documents' segment ids and positions from a separator token
(`devpolicy._apply.stream.documents`), placed with their batch."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

import devpolicy
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
