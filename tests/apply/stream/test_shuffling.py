"""Epochs without replacement (`devpolicy._apply.stream.shuffling`): every window once an
epoch, in an order drawn anew each epoch from counters, resumed at any step."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import devpolicy
from devpolicy._apply.stream import shuffling
from tests.helpers import policy_of

TOKENS = np.arange(100_000, dtype=np.int32)


def firsts(stream: Any) -> list[list[int]]:
    """Each batch's windows by their first token (windows of an arange: their start)."""
    return [np.asarray(b)[:, 0].tolist() for b in stream]


def every(stream: Any) -> list[np.ndarray]:
    return [np.asarray(b) for b in stream]


class TestShuffledEpochs:
    @pytest.mark.parametrize("stride", [1, 2, 3])
    def test_each_epoch_hands_out_every_window_exactly_once_exhaustively(self, stride: int) -> None:
        """Every small array (4 to 30 rows), batch (1 to 5) and 1 to 3 epochs: each epoch
        is the windows at 0, stride, 2*stride, ... each exactly once, in an order drawn anew
        each epoch; batches run on across an epoch's end, the last holding what is left."""
        policy = policy_of()
        length = 4
        for rows in range(length, 31):
            tokens = np.arange(rows, dtype=np.int32)
            expected = list(range(0, rows - length + 1, stride))
            for batch in range(1, 6):
                for epochs in (1, 2, 3):
                    got = firsts(
                        devpolicy.windows(
                            tokens, length, batch, order="shuffled", seed=rows * 7 + batch,
                            stride=stride, epochs=epochs, policy=policy,
                        )
                    )  # fmt: skip
                    flat = [w for b in got for w in b]
                    assert len(flat) == epochs * len(expected)
                    assert all(len(b) == batch for b in got[:-1])
                    for e in range(epochs):
                        epoch = flat[e * len(expected) : (e + 1) * len(expected)]
                        assert sorted(epoch) == expected, (rows, batch, epochs, e)

    def test_epochs_are_drawn_anew_and_look_uniform(self) -> None:
        """Over 4,000 epochs of 10 windows, each window lands at each position about as
        often as a uniform shuffle puts it there (chi-square), and epochs differ."""
        rows = np.arange(10 * 4000, dtype=np.uint64)
        windows, _ = shuffling.shuffled_windows(3, rows, 10)
        table = np.zeros((10, 10))
        np.add.at(table, (np.tile(np.arange(10), 4000), windows), 1)
        expected = 400.0
        chi = ((table - expected) ** 2 / expected).sum()
        assert chi < 81 + 4 * np.sqrt(2 * 81)  # 81 degrees of freedom, 4 sigma
        epochs = windows.reshape(4000, 10)
        assert len({tuple(e) for e in epochs.tolist()}) > 3900

    @given(count=st.integers(1, 5000), seed=st.integers(0, 2**64 - 1))
    @settings(max_examples=60, deadline=None)
    def test_the_permutation_is_a_bijection_for_any_size_and_key(
        self, count: int, seed: int
    ) -> None:
        keys = shuffling.epoch_keys(seed, np.asarray([0]))[0]
        drawn = shuffling.permuted(np.arange(count, dtype=np.uint64), keys, count)
        assert sorted(drawn.tolist()) == list(range(count))

    def test_the_state_names_the_epoch_and_resumes_it(self) -> None:
        """`state()` of a shuffled stream says its epoch; resumed from it at any step, the
        stream equals the uninterrupted one element by element."""
        policy = policy_of()
        options: dict[str, Any] = {"order": "shuffled", "seed": 9, "epochs": 3, "stride": 7}
        whole = every(devpolicy.windows(TOKENS[:5000], 50, 16, policy=policy, **options))
        stream = devpolicy.windows(TOKENS[:5000], 50, 16, policy=policy, **options)
        for step in range(len(whole)):
            saved = stream.state()
            assert saved["epoch"] == step * 16 // len(range(0, 5000 - 50 + 1, 7))
            resumed = devpolicy.windows(
                TOKENS[:5000], 50, 16, policy=policy, resume=json.dumps(saved), **options
            )
            for got, want in zip(every(resumed), whole[step:], strict=True):
                np.testing.assert_array_equal(got, want)
            next(stream)

    def test_an_endless_shuffled_stream_starts_at_step_ten_to_the_ninth_at_once(self) -> None:
        policy = policy_of()
        far = devpolicy.windows(TOKENS, 8, 4, order="shuffled", seed=1, start=10**9, policy=policy)
        batch = np.asarray(next(far))
        rows = np.arange(4, dtype=np.uint64) + np.uint64(10**9 * 4)
        windows, epochs = shuffling.shuffled_windows(1, rows, (len(TOKENS) - 8 + 1 + 7) // 8)
        np.testing.assert_array_equal(batch[:, 0], windows * 8)
        assert far.state()["epoch"] == int(epochs[0])

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"order": "random", "epochs": 2}, r"epochs= bounds an order='shuffled' stream"),
            ({"order": "shuffled", "epochs": 0}, r"^windows epochs must be an int >= 1, got 0$"),
            (
                {"order": "shuffled", "epochs": 1, "start": 99},
                r"^windows start=99 is past the end: this stream has 3 batches$",
            ),
        ],
    )
    def test_bad_epoch_arguments_are_refused_naming_them(
        self, options: dict[str, Any], message: str
    ) -> None:
        with pytest.raises(ValueError, match=message):
            devpolicy.windows(np.arange(24), 4, 2, policy=policy_of(), **options)
