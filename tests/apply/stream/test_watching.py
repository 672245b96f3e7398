"""A stream's caller's loop watched (`devpolicy._apply.stream.watching`): the seconds it
waited inside `next()` and between pulls, their share and the rate, in `stream_ended`, in
`report()` while it runs and after, and every `report_every` seconds at info; the tally
owned by the stream from its first batch to its end."""

from __future__ import annotations

import time

import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from tests.apply.streams import TOKEN_RULES
from tests.helpers import policy_of


def _slowed_placing(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Every group the stream places takes `seconds` more: a slow source."""
    from devpolicy._apply.stream import placing

    place = placing.GroupPlacer.place

    def slow(self: placing.GroupPlacer, *args: object, **kwargs: object) -> object:
        time.sleep(seconds)
        return place(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(placing.GroupPlacer, "place", slow)


class TestTheLoopIsWatched:
    """A stream says whether its caller's loop waits on it: the seconds inside `next()`
    and between pulls, their share, the rate; in `stream_ended`, `report()` and, on a
    long stream, a `stream_progress` line now and then."""

    def test_a_loop_whose_step_is_slow_waits_under_5_percent(self) -> None:
        """A 30 ms step: the stream's own work on the caller's thread (a group cut every
        few pulls) is a small share, even on a loaded host."""
        policy = policy_of(rules=TOKEN_RULES)
        tokens = np.arange(100_000, dtype=np.uint16)
        with capture_logs() as logs:
            for _ in devpolicy.windows(
                tokens, 64, 4, order="random", seed=0, steps=24, policy=policy
            ):
                time.sleep(0.03)  # the step
        (ended,) = [e for e in logs if e["event"] == "stream_ended"]
        assert ended["waited_share"] < 0.05
        assert ended["working_s"] >= 23 * 0.03
        assert 0 < ended["batches_per_s"] <= 24 / (23 * 0.03)  # the first pull waits little

    def test_a_loop_over_a_slow_source_waits_over_half_the_time(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        _slowed_placing(monkeypatch, 0.02)
        policy = policy_of(rules=TOKEN_RULES)
        tokens = np.arange(100_000, dtype=np.uint16)
        with capture_logs() as logs:
            for _ in devpolicy.windows(
                tokens, 64, 4, order="random", seed=0, steps=30, policy=policy
            ):
                pass
        (ended,) = [e for e in logs if e["event"] == "stream_ended"]
        assert ended["waited_share"] > 0.5
        assert ended["waited_s"] >= 0.02 * (30 // 8)  # a group placed at most 8 a time

    def test_report_and_stream_ended_say_the_same(self) -> None:
        from devpolicy._machine import streams

        policy = policy_of(rules=TOKEN_RULES)
        tokens = np.arange(10_000, dtype=np.uint16)
        with capture_logs() as logs:
            stream = devpolicy.windows(
                tokens, 8, 2, name="watched", order="random", seed=0, steps=12, policy=policy
            )
            for _ in stream:
                time.sleep(0.001)
        (ended,) = [e for e in logs if e["event"] == "stream_ended"]
        (listed,) = [s for s in streams.streams() if s.name == "watched"][-1:]
        assert (listed.handed, listed.open) == (ended["batches"], False) == (12, False)
        assert round(listed.waited, 6) == ended["waited_s"]
        assert round(listed.working, 6) == ended["working_s"]
        assert listed.waited_share is not None
        assert round(listed.waited_share, 4) == ended["waited_share"]
        assert listed.rate is not None
        assert round(listed.rate, 2) == ended["batches_per_s"]
        assert (listed.reads, listed.reads_why) == (ended["reads"], ended["reads_why"])

    def test_an_open_stream_is_listed_with_its_loop_so_far(self) -> None:
        from devpolicy._machine import streams

        policy = policy_of(rules=TOKEN_RULES)
        with devpolicy.windows(
            np.arange(10_000), 8, 2, name="open_watched", order="random", policy=policy
        ) as stream:
            for _ in range(5):
                next(stream)
            (listed,) = [s for s in streams.streams() if s.name == "open_watched"][-1:]
            assert (listed.open, listed.handed, listed.reads) == (True, 5, "memory")
            assert listed.batches >= 5  # placed: handed out and ahead
            assert listed.waited > 0
            assert listed.rate is not None

    def test_a_long_stream_says_how_its_loop_goes_every_report_every_seconds(self) -> None:
        policy = policy_of(rules=TOKEN_RULES)
        tokens = np.arange(10_000, dtype=np.uint16)
        with capture_logs() as logs:
            for _ in devpolicy.windows(
                tokens, 8, 2, order="random", seed=0, steps=30, report_every=0.05, policy=policy
            ):
                time.sleep(0.01)
        progress = [e for e in logs if e["event"] == "stream_progress"]
        assert 2 <= len(progress) <= 8  # about 0.3 s of loop, one a 0.05 s at most
        assert all(e["log_level"] == "info" and e["name"] == "batch" for e in progress)
        assert [e["batches"] for e in progress] == sorted(e["batches"] for e in progress)
        assert all(e["waited_share"] < 0.5 for e in progress)

    @pytest.mark.parametrize("silent", [None, 0])
    def test_report_every_none_or_zero_is_silent(self, silent: float | None) -> None:
        policy = policy_of(rules=TOKEN_RULES)
        with capture_logs() as logs:
            for _ in devpolicy.windows(
                np.arange(1000), 8, 2, order="random", steps=20, report_every=silent,
                policy=policy,
            ):  # fmt: skip
                time.sleep(0.002)
        assert not [e for e in logs if e["event"] == "stream_progress"]

    @pytest.mark.parametrize("bad", [-1, "60", True, float("nan")])
    def test_a_bad_report_every_is_refused_naming_it(self, bad: object) -> None:
        policy = policy_of(rules=TOKEN_RULES)
        with pytest.raises(ValueError, match=r"^windows report_every must be seconds"):
            devpolicy.windows(np.arange(100), 8, 2, report_every=bad, policy=policy)  # type: ignore[arg-type]

    def test_a_stream_dropped_unclosed_is_not_listed_open(self) -> None:
        import gc

        from devpolicy._machine import streams

        policy = policy_of(rules=TOKEN_RULES)
        stream = devpolicy.windows(
            np.arange(1000), 8, 2, name="dropped_open", order="random", policy=policy
        )
        next(stream)
        del stream
        gc.collect()
        (listed,) = [s for s in streams.streams() if s.name == "dropped_open"][-1:]
        assert listed.open is False
