"""A stream's groups of batches cut (`devpolicy._apply.stream.cutting`): narrowed once and
checked each batch, gathered with 64-bit offsets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from tests.apply.streams import TOKEN_RULES, sparse_tokens
from tests.helpers import policy_of


class TestCut:
    def test_64_bit_tokens_are_narrowed_once_checked_each_batch(self) -> None:
        """int64 tokens with x64 off: every batch is narrowed to int32 and checked; one
        `narrowed` event for the stream; a batch that would change is refused, naming
        the batch; with narrow='lossy' it is narrowed with one warning."""
        tokens = np.arange(1000, dtype=np.int64)
        policy = policy_of(rules=TOKEN_RULES)
        with capture_logs() as logs:
            out = list(devpolicy.windows(tokens, 10, 4, steps=20, policy=policy))
        assert {b.dtype for b in out} == {np.dtype(np.int32)}
        assert [e["event"] for e in logs].count("narrowed") == 1
        tokens[500] = 2**40
        with pytest.raises(devpolicy.errors.NarrowingError, match=r"tensor 'batch'"):
            list(devpolicy.windows(tokens, 10, 4, policy=policy))
        with capture_logs() as logs:
            lossy = list(devpolicy.windows(tokens, 10, 4, narrow="lossy", policy=policy))
        assert len(lossy) == 25
        warned = [e for e in logs if e["event"] == "narrowed" and e["log_level"] == "warning"]
        assert len(warned) == 1

    def test_windows_past_2_31_are_gathered_with_64_bit_offsets(self, tmp_path: Path) -> None:
        """A mapped 2**31 + 2**20 token file: sequential windows that start past 2**31
        hold the values written there (one fancy index of the window view)."""
        n = 2**31 + 2**20
        first = 2**31 + 12345
        path = tmp_path / "big.safetensors"
        sparse_tokens(path, n, {first: np.arange(1, 65)})
        tokens = devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]
        (batch,) = devpolicy.windows(tokens, 64, 2, stride=first, policy=policy_of())
        assert np.asarray(batch).tolist() == [[0] * 64, list(range(1, 65))]
