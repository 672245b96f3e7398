"""Epochs without replacement (`devpolicy._apply.stream.shuffling`): every window once an
epoch, in an order drawn anew each epoch from counters, resumed at any step."""

from __future__ import annotations

import json
import math
from itertools import pairwise, permutations
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import devpolicy
from devpolicy._apply.stream import mixing, shuffling
from devpolicy._apply.stream.sampling import Rows
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


#: The upper 1e-4 point of the standard normal: a chi-square past `chi_square_bound` has a
#: p-value under 1e-4.
Z_1E4 = 3.719
#: Where each check's epochs come from: (seed, first epoch), far epochs and seeds included.
SEEDS = ((0, 0), (7, 0), (2**64 - 1, 10**6), (123_456_789, 2**40))


def chi_square_bound(df: int) -> float:
    """The chi-square with `df` degrees of freedom that a uniform draw passes with
    probability 1e-4: the Wilson-Hilferty approximation (chi-square / df is near a normal's
    cube: df * (1 - 2/(9 df) + z * sqrt(2/(9 df)))**3, z the normal's upper 1e-4 point;
    within 1.2% from 10 degrees of freedom, 7% over the exact 15.14 at one)."""
    a = 2 / (9 * df)
    return df * (1 - a + Z_1E4 * math.sqrt(a)) ** 3


def chi_square(counts: np.ndarray, expected: float) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


def epoch_orders(seed: int, first_epoch: int, count: int, epochs: int) -> np.ndarray:
    """The windows of epochs `first_epoch` .. of a shuffled stream with `seed`, one a row,
    drawn as a stream draws them: blocks of rows, which cross epochs' ends."""
    first = first_epoch * count
    rows = np.arange(first, first + count * epochs, dtype=np.uint64)
    parts = [shuffling.shuffled_windows(seed, part, count)[0] for part in np.array_split(rows, 7)]
    return np.concatenate(parts).reshape(epochs, count)


class TestUniformOrders:
    """Up to `SMALL` windows an epoch, every order is equally likely, whatever the seed."""

    def test_the_chi_square_bound_is_the_tail_it_says(self) -> None:
        """Against the exact upper 1e-4 points (df 1: 15.14, 10: 35.56, 100: 161.32)."""
        for df, exact in ((1, 15.14), (10, 35.56), (100, 161.32)):
            assert exact <= chi_square_bound(df) <= exact * 1.08

    @pytest.mark.parametrize("count", range(2, 8))
    def test_every_order_of_up_to_7_windows_is_equally_likely(self, count: int) -> None:
        """From each seed, over 48,000 epochs (20 * 7! for 7 windows), every one of the
        count! orders comes and their counts pass a chi-square test (p > 1e-4); so do the
        counts of all the seeds together, where a bias the same for every seed adds up (the
        Feistel network's over 4 windows passes each seed's test and fails this one)."""
        epochs = max(48_000, 20 * math.factorial(count))
        every_order = np.asarray(list(permutations(range(count))))
        codes = (every_order * count ** np.arange(count)).sum(axis=1)
        pooled = np.zeros(codes.size)
        for seed, first_epoch in SEEDS:
            orders = epoch_orders(seed, first_epoch, count, epochs)
            drawn = np.bincount(
                (orders * count ** np.arange(count)).sum(axis=1), minlength=count**count
            )
            counts = drawn[codes]
            assert counts.sum() == epochs  # nothing but orders of the windows
            assert counts.min() > 0
            assert chi_square(counts, epochs / codes.size) < chi_square_bound(codes.size - 1), seed
            pooled += counts
        expected = len(SEEDS) * epochs / codes.size
        assert chi_square(pooled, expected) < chi_square_bound(codes.size - 1)

    @pytest.mark.parametrize("count", range(6, 17))
    def test_each_window_at_each_position_and_each_pair_of_positions_is_as_likely(
        self, count: int
    ) -> None:
        """6 to 16 windows, 20 * count * (count - 1) epochs from each seed: the window at
        each position (the count x count table, whose chi-square is count / (count - 1)
        times a chi-square of (count - 1)**2 degrees of freedom: a permutation's cells
        move together), and the windows at positions (0, 1), (count - 2, count - 1) and
        (0, count - 1) (count * (count - 1) pairs, each as likely) pass at p > 1e-4."""
        epochs = 20 * count * (count - 1)
        for seed, first_epoch in SEEDS:
            orders = epoch_orders(seed, first_epoch, count, epochs)
            table = np.zeros((count, count))
            np.add.at(table, (np.tile(np.arange(count), epochs), orders.reshape(-1)), 1)
            scaled = chi_square(table, epochs / count) * (count - 1) / count
            assert scaled < chi_square_bound((count - 1) ** 2), (seed, count)
            for at, then in ((0, 1), (count - 2, count - 1), (0, count - 1)):
                pairs = np.bincount(orders[:, at] * count + orders[:, then], minlength=count**2)
                pairs = np.delete(pairs, np.arange(count) * (count + 1))  # never one twice
                assert pairs.size == count * (count - 1)
                got = chi_square(pairs, 20)
                assert got < chi_square_bound(count * (count - 1) - 1), (seed, count, at, then)

    def test_seeds_give_other_orders_and_each_epoch_its_own(self) -> None:
        """4 windows: the first epochs of 64 seeds hold at least 18 of the 24 orders (a
        uniform draw: 22.4 on average, 19 or more 999 times in 1,000), and one seed's 240
        epochs all 24, seldom one twice running; 6 windows: 200 seeds' first epochs hold
        as many orders as 200 uniform draws of 720 would (174.7 on average, sd 4.2)."""
        firsts = {tuple(epoch_orders(seed, 0, 4, 1)[0]) for seed in range(64)}
        assert len(firsts) >= 18
        epochs = epoch_orders(5, 0, 4, 240)
        assert len({tuple(e) for e in epochs.tolist()}) == 24
        repeats = sum(a == b for a, b in pairwise(map(tuple, epochs.tolist())))
        assert repeats <= 30  # 10 on average
        sixes = {tuple(epoch_orders(seed, 0, 6, 1)[0]) for seed in range(200)}
        assert len(sixes) >= 160

    def test_a_shuffled_mixtures_small_source_draws_every_order_alike(self) -> None:
        """A mixture's source of 4 windows (its own epochs, beside one of 5): over 480 of
        its epochs, the 24 orders pass a chi-square test."""
        sampler = mixing.Mixed(
            [4, 5], np.array([0, 100]), [1.0, 1.0], Rows.every(8), 3, None, shuffled_stride=1
        )
        offsets = sampler.take(0, 480)
        assert offsets is not None
        small = offsets[offsets < 100].reshape(-1, 4)
        assert small.shape == (480, 4)
        assert (np.sort(small, axis=1) == np.arange(4)).all()  # each window once an epoch
        _, counts = np.unique((small * 4 ** np.arange(4)).sum(axis=1), return_counts=True)
        assert counts.size == 24
        assert chi_square(counts, 20) < chi_square_bound(23)


class TestDrawnAnyWay:
    """The small domains' tables change how a window is drawn, not what: any grouping of
    rows, any process's rows, any key per position gives the same windows."""

    @given(
        count=st.integers(2, 40),
        seed=st.integers(0, 2**64 - 1),
        first=st.integers(0, 2**62),
        cuts=st.lists(st.integers(0, 300), max_size=8),
        every=st.integers(1, 50),
    )
    @settings(max_examples=60, deadline=None)
    def test_rows_drawn_in_any_groups_or_sparsely_are_drawn_alike(
        self, count: int, seed: int, first: int, cuts: list[int], every: int
    ) -> None:
        """300 rows drawn at once, in groups cut anywhere, and every `every`-th of them
        alone (one process's rows of a larger batch: epochs with gaps between them)."""
        rows = np.arange(first, first + 300, dtype=np.uint64)
        whole, epochs = shuffling.shuffled_windows(seed, rows, count)
        np.testing.assert_array_equal(epochs, rows // np.uint64(count))
        parts = [
            shuffling.shuffled_windows(seed, p, count)[0] for p in np.split(rows, sorted(cuts))
        ]
        np.testing.assert_array_equal(np.concatenate(parts), whole)
        sparse, _ = shuffling.shuffled_windows(seed, rows[::every], count)
        np.testing.assert_array_equal(sparse, whole[::every])
        keys = shuffling.epoch_keys(seed, epochs)
        np.testing.assert_array_equal(
            shuffling.permuted(rows % np.uint64(count), keys, count), whole
        )

    @pytest.mark.parametrize(
        "count", [shuffling.SMALL - 1, shuffling.SMALL, shuffling.SMALL + 1, 3 * shuffling.SMALL]
    )
    def test_either_side_of_small_each_epoch_is_every_window_once(self, count: int) -> None:
        """Two epochs and a half, drawn in one call and in rows of one step each."""
        rows = np.arange(count // 2, count * 3, dtype=np.uint64)
        windows, epochs = shuffling.shuffled_windows(11, rows, count)
        for epoch in (1, 2):
            assert sorted(windows[epochs == epoch].tolist()) == list(range(count))
        stepwise = [shuffling.shuffled_windows(11, r, count)[0] for r in np.array_split(rows, 100)]
        np.testing.assert_array_equal(np.concatenate(stepwise), windows)

    def test_past_small_no_table_is_kept(self) -> None:
        """Past `SMALL` windows the permutation is the Feistel network's: memory stays flat
        however many windows; up to it, a table of the epoch is kept, and kept tables are
        few."""
        shuffling._table.cache_clear()
        shuffling.shuffled_windows(1, np.arange(10**6, dtype=np.uint64), shuffling.SMALL + 1)
        assert shuffling._table.cache_info().currsize == 0
        shuffling.shuffled_windows(1, np.arange(10, dtype=np.uint64), shuffling.SMALL)
        assert shuffling._table.cache_info().currsize == 1
        for seed in range(100):
            shuffling.shuffled_windows(seed, np.arange(10, dtype=np.uint64), 100)
        assert shuffling._table.cache_info().currsize <= 16
