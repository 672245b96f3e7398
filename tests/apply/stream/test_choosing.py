"""`choosing.PathTrials`: the read path a stream keeps is the one its own groups were
fastest on, tried in turns, and tried again as time passes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devpolicy._apply.stream.choosing import MARGIN, WARM_GROUPS, PathTrials


class FakeClock:
    """A clock the test moves: rechecks are due by time, not by groups."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(trials: PathTrials, cost: dict[str, float], groups: int, batches: int = 8) -> list[str]:
    """Cut `groups` groups, each read by the trials' path at `cost[path]` seconds a batch;
    the paths that read them, in order."""
    read = []
    for _ in range(groups):
        path = trials.path
        read.append(path)
        trials.timed(path, batches, cost[path] * batches)
        trials.next_path()
    return read


class TestPathTrials:
    def test_the_fastest_path_is_kept_after_a_trial(self) -> None:
        trials = PathTrials(["file", "keep"], "file", groups=3, rounds=2, recheck=60.0)
        read = run(trials, {"file": 2e-4, "keep": 1e-4}, WARM_GROUPS + 12 + 5)
        assert read[:WARM_GROUPS] == ["file"] * WARM_GROUPS
        trial = read[WARM_GROUPS : WARM_GROUPS + 12]
        assert trial == ["file"] * 3 + ["keep"] * 3 + ["file"] * 3 + ["keep"] * 3
        assert read[WARM_GROUPS + 12 :] == ["keep"] * 5
        assert trials.why == "measured: keep 0.10 ms a batch, file 0.20 ms"

    def test_a_path_within_the_margin_does_not_displace_the_current_one(self) -> None:
        trials = PathTrials(["file", "keep"], "file", groups=2, rounds=1, recheck=60.0)
        run(trials, {"file": 1e-4, "keep": 1e-4 * (1 - MARGIN / 2)}, WARM_GROUPS + 4 + 1)
        assert trials.path == "file"

    def test_a_long_stream_looks_again_when_the_recheck_is_due(self) -> None:
        clock = FakeClock()
        trials = PathTrials(["file", "keep"], "file", groups=1, rounds=1, recheck=30.0, clock=clock)
        run(trials, {"file": 1e-4, "keep": 2e-4}, WARM_GROUPS + 3)
        assert (trials.path, trials.decisions) == ("file", 1)
        run(trials, {"file": 1e-4, "keep": 2e-4}, 100)  # not due: no trial
        assert trials.decisions == 1
        clock.now = 31.0  # the host got busy: keep is now faster
        run(trials, {"file": 3e-4, "keep": 2e-4}, 4)
        assert (trials.path, trials.decisions) == ("keep", 2)

    def test_one_candidate_is_never_tried(self) -> None:
        trials = PathTrials(["file"], "file", groups=1, rounds=1, recheck=0.001)
        assert run(trials, {"file": 1e-4}, 50) == ["file"] * 50
        assert (trials.decisions, trials.trying) == (0, False)

    def test_a_dropped_path_is_never_tried_again(self) -> None:
        trials = PathTrials(["file", "keep"], "file", groups=1, rounds=3, recheck=0.001)
        run(trials, {"file": 1e-4, "keep": 1e-4}, WARM_GROUPS + 1)
        assert trials.path == "keep"  # mid-trial
        trials.drop("keep", "file")
        assert (trials.path, trials.trying) == ("file", False)
        assert set(run(trials, {"file": 1e-4, "keep": 1e-5}, 50)) == {"file"}
        with pytest.raises(ValueError, match=r"^'keep' cannot replace 'file'"):
            trials.drop("file", "keep")

    def test_the_first_path_must_be_a_candidate(self) -> None:
        with pytest.raises(ValueError, match=r"^the first path 'x' is not a candidate"):
            PathTrials(["file"], "x", groups=1, rounds=1, recheck=1.0)

    @settings(max_examples=200, deadline=None)
    @given(
        costs=st.lists(st.floats(1e-6, 1e-2), min_size=2, max_size=4, unique=True),
        groups=st.integers(1, 4),
        rounds=st.integers(1, 3),
    )
    def test_the_path_kept_is_never_slower_than_the_current_beyond_the_margin(
        self, costs: list[float], groups: int, rounds: int
    ) -> None:
        """Whatever the costs, a trial keeps a path at most `1 - MARGIN` times the
        current one's cost, or the current one."""
        names = [f"p{i}" for i in range(len(costs))]
        cost = dict(zip(names, costs, strict=True))
        trials = PathTrials(names, names[0], groups=groups, rounds=rounds, recheck=1e9)
        run(trials, cost, WARM_GROUPS + groups * rounds * len(names) + 1)
        assert trials.decisions == 1
        kept = trials.path
        assert kept == names[0] or cost[kept] < cost[names[0]] * (1 - MARGIN)
        assert cost[kept] == min(cost.values()) or kept == names[0]

    def test_a_new_stream_of_the_same_files_starts_where_the_last_trial_settled(self) -> None:
        """Until the recheck is due, a second stream of the same source pays no trial."""
        clock = FakeClock()
        source = ("test", object())
        first = PathTrials(
            ["file", "keep"], "file", groups=1, rounds=1, recheck=30.0, clock=clock, source=source
        )
        run(first, {"file": 2e-4, "keep": 1e-4}, WARM_GROUPS + 3)
        assert (first.path, first.decisions) == ("keep", 1)
        second = PathTrials(
            ["file", "keep"], "file", groups=1, rounds=1, recheck=30.0, clock=clock, source=source
        )
        assert (second.path, second.trying) == ("keep", False)
        assert second.why.endswith("(by an earlier stream of the same files)")
        assert run(second, {"file": 2e-4, "keep": 1e-4}, 20) == ["keep"] * 20
        clock.now = 31.0  # due: a third stream tries again
        third = PathTrials(
            ["file", "keep"], "file", groups=1, rounds=1, recheck=30.0, clock=clock, source=source
        )
        assert (third.path, third.trying) == ("file", True)

    def test_a_clearly_slower_challenger_loses_after_one_group(self) -> None:
        """A path whose group costs more than `LOSING` over the current one's median is
        read no more this trial: a trial of a slow path costs a group, not its share."""
        trials = PathTrials(["file", "keep"], "file", groups=4, rounds=2, recheck=60.0)
        read = run(trials, {"file": 1e-4, "keep": 3e-4}, WARM_GROUPS + 30)
        trial = read[WARM_GROUPS:]
        assert trial[:4] == ["file"] * 4
        assert trial.count("keep") == 1  # one group, then its turns were dropped
        assert (trials.path, trials.decisions) == ("file", 1)
        assert "keep 0.30 ms" in trials.why
