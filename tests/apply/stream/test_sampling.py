"""Which windows each batch holds (`devpolicy._apply.stream.sampling`): random starts drawn
from counters, the same however steps are grouped, resumed far at once, and uniform."""

from __future__ import annotations

import numpy as np
import pytest

import devpolicy
from devpolicy._apply.stream import sampling
from tests.helpers import policy_of

TOKENS = np.arange(200_000, dtype=np.int32)


def step_by_step(tokens: np.ndarray, length: int, batch: int, seed: int, steps: int) -> list:
    """Random windows drawn one step at a time (`random_starts` of one step each), each
    window sliced and stacked: what a stream must give however it groups its steps."""
    rows = np.arange(batch, dtype=np.uint64)
    out = []
    for step in range(steps):
        (starts,) = sampling.random_starts(seed, step, 1, rows, batch, len(tokens) - length + 1)
        out.append(np.stack([tokens[s : s + length] for s in starts.tolist()]))
    return out


class TestRandomStarts:
    def test_a_seed_gives_the_same_batches_as_one_draw_a_step(self) -> None:
        """Grouping draws several steps' starts at once, and they are the same numbers as
        one draw a step (odd batch sizes too): a step's windows depend on the seed and
        the step alone."""
        tokens = np.arange(5000, dtype=np.int32)
        for batch in (1, 7, 32):
            stream = devpolicy.windows(
                tokens, 33, batch, order="random", seed=3, steps=21, policy=policy_of()
            )
            got = [np.asarray(b) for b in stream]
            expected = step_by_step(tokens, 33, batch, 3, 21)
            assert len(got) == 21
            for a, b in zip(got, expected, strict=True):
                np.testing.assert_array_equal(a, b)

    def test_resuming_far_draws_nothing_before_the_step(self) -> None:
        """Step 10**12's windows are computed from its counter alone: the same starts as
        a draw of just that step, and the first batch comes without drawing the others."""
        rows = np.arange(4, dtype=np.uint64)
        far = sampling.random_starts(9, 10**12, 2, rows, 4, 10**9)
        one = sampling.random_starts(9, 10**12 + 1, 1, rows, 4, 10**9)
        np.testing.assert_array_equal(far[1], one[0])
        stream = devpolicy.windows(
            TOKENS, 10, 4, order="random", seed=9, start=10**12, policy=policy_of()
        )
        assert next(stream).shape == (4, 10)
        assert stream.state()["step"] == 10**12 + 1

    def test_different_seeds_and_steps_draw_different_uniform_starts(self) -> None:
        """The counter-based draws cover [0, starts) evenly (a chi-square bound over 100
        buckets) and differ between seeds."""
        rows = np.arange(1000, dtype=np.uint64)
        starts = sampling.random_starts(1, 0, 100, rows, 1000, 10_000)
        assert starts.min() >= 0
        assert starts.max() < 10_000
        counts = np.bincount(starts.reshape(-1) // 100, minlength=100)
        expected = starts.size / 100
        assert ((counts - expected) ** 2 / expected).sum() < 200  # 99 dof: mean 99
        other = sampling.random_starts(2, 0, 100, rows, 1000, 10_000)
        assert (starts != other).mean() > 0.99


class TestASamplerIsMadeWhole:
    """A sampler is made with the rows its process draws and never changed after: each
    process's rows of a global batch are the same columns of the one global draw."""

    def test_a_random_sampler_made_with_a_process_rows_draws_those_columns(self) -> None:
        whole = sampling.Random(10_000, sampling.Rows.every(4), 7, None)
        mine = sampling.Random(10_000, sampling.Rows(np.array([1, 3]), 4), 7, None)
        every, own = whole.take(5, 3), mine.take(5, 3)
        assert every is not None
        assert own is not None
        np.testing.assert_array_equal(own, every[:, [1, 3]])

    def test_a_shuffled_sampler_made_with_a_process_rows_draws_those_columns(self) -> None:
        from devpolicy._apply.stream.shuffling import Shuffled

        whole = Shuffled(1000, sampling.Rows.every(4), 1, 7, None, None)
        mine = Shuffled(1000, sampling.Rows(np.array([0, 2]), 4), 1, 7, None, None)
        every, own = whole.take(100, 3), mine.take(100, 3)
        assert every is not None
        assert own is not None
        np.testing.assert_array_equal(own, every[:, [0, 2]])

    def test_no_sampler_can_be_given_other_rows_after_it_is_made(self) -> None:
        from devpolicy._apply.stream.mixing import Mixed
        from devpolicy._apply.stream.shuffling import Shuffled

        rows = sampling.Rows.every(2)
        made = [
            sampling.Random(100, rows, 1, None),
            sampling.Sequential(100, 2, 1, None),
            Shuffled(100, rows, 1, 1, None, None),
            Mixed([50, 50], np.array([0, 60]), [1.0, 1.0], rows, 1, None, None),
        ]
        for sampler in made:
            assert not hasattr(sampler, "own_rows")
            with pytest.raises(AttributeError):
                sampler.rows = rows  # type: ignore[union-attr]  # slots: nothing new
