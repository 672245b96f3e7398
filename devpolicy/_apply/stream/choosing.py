"""Which read path a stream uses, chosen by timing the paths that can serve it on its own
groups, not by a table of rules alone.

The rules (`cutting.GroupCutter._choose`) give a first guess and say which paths are safe
for the source at all (a cold file is never gathered through its mapping; a file larger
than the page cache can hold is never kept mapped). Where more than one is safe, the
stream times each on real groups, taking turns, and keeps the fastest; it looks again
every `recheck_seconds`, since the host's load, the page cache and memory change during a
run (a polled ring's kernel thread that loses its core loses its lead). Every path gives
the same exact batches, so a trial costs time, never correctness. The figures behind this
are in docs/benchmarks.md#choosing-the-read-path-by-measurement. No JAX here.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Hashable

#: Groups cut before any is timed: the first groups are small (a ramp) and pay one-time
#: costs (a mapping's first faults, a ring's first submission).
WARM_GROUPS = 4
#: A path must beat the current one by this share to be switched to: two paths within
#: it are the same path for a user, and each switch costs a little.
MARGIN = 0.05
#: A challenger whose group cost this share more than the current path's median so far
#: has lost: its turns end at once (a trial of a clearly slower path costs a group or
#: two, not its whole share; a short stream pays a trial at its start).
LOSING = 0.3
#: The last trial's outcome for each source (its files and way of reading), at most this
#: many sources: a new stream of the same files starts on it until its recheck is due,
#: rather than paying a trial again (an evaluation stream, a loop of short runs).
REMEMBERED = 64


class _Outcomes:
    """What the last trial of each source settled on: (path, why, when)."""

    lock = threading.Lock()
    by_source: dict[Hashable, tuple[str, str, float]] = {}  # noqa: RUF012 - one per process

    @classmethod
    def settled(cls, source: Hashable, now: float, recheck: float) -> tuple[str, str] | None:
        with cls.lock:
            found = cls.by_source.get(source)
        if found is None or now - found[2] >= recheck:
            return None
        return found[0], found[1]

    @classmethod
    def keep(cls, source: Hashable, path: str, why: str, now: float) -> None:
        with cls.lock:
            cls.by_source.pop(source, None)
            cls.by_source[source] = (path, why, now)
            while len(cls.by_source) > REMEMBERED:
                del cls.by_source[next(iter(cls.by_source))]


class PathTrials:
    """Times the candidate read paths of one stream and says which one reads the next group.

    `path` is the path that reads the next group. The owner calls `timed(path, batches,
    seconds)` for each group it cut (with the path that read that group, and the seconds
    the caller waited for it), and asks `next_path()` which path reads the group after;
    a group read ahead is timed a group later than its path was chosen, so a trial ends
    once each path was timed on its share of groups, not when its schedule runs out.

    Example:
        >>> trials = PathTrials(["file", "keep"], "file", groups=2, rounds=1, recheck=60.0)
        >>> for _ in range(4):  # warming: timed, not counted
        ...     trials.timed(trials.path, 8, 0.010)
        ...     _ = trials.next_path()
        >>> for _ in range(4):  # file twice (10 ms a group), then keep twice (5 ms)
        ...     trials.timed(trials.path, 8, 0.010 if trials.path == "file" else 0.005)
        ...     _ = trials.next_path()
        >>> trials.path, trials.trying
        ('keep', False)
        >>> trials.why
        'measured: keep 0.62 ms a batch, file 1.25 ms'
    """

    __slots__ = (
        "_clock",
        "_due",
        "_groups",
        "_incumbent",
        "_left",
        "_lost",
        "_rounds",
        "_schedule",
        "_seconds",
        "_source",
        "_warming",
        "candidates",
        "decisions",
        "path",
        "recheck",
        "trying",
        "why",
    )

    def __init__(
        self,
        candidates: list[str],
        first: str,
        *,
        groups: int,
        rounds: int,
        recheck: float,
        clock: object = time.monotonic,
        source: Hashable | None = None,
    ) -> None:
        if first not in candidates:
            raise ValueError(f"the first path {first!r} is not a candidate ({candidates})")
        self.candidates = list(candidates)
        self.path = first
        self._incumbent = first  # the path before a trial: kept unless another beats it
        self.recheck = recheck
        self.decisions = 0  # trials ended
        self.why = ""  # what was measured, once a trial ended
        self._groups = groups  # groups a path reads in a row, a turn
        self._rounds = rounds  # turns of each path, a trial
        self._clock = clock
        self._seconds: dict[str, list[float]] = {}  # seconds a batch, by path, this trial
        self._warming = WARM_GROUPS
        self._schedule: list[str] = []  # the paths of the turns still to come
        self._left = 0  # groups left in this turn
        self._lost: set[str] = set()  # challengers that lost this trial early
        self._due = 0.0  # when to look again, once settled
        self.trying = len(self.candidates) > 1
        self._source = source  # the files read: a trial's outcome is theirs
        now = self._clock()  # type: ignore[operator]
        settled = None if source is None else _Outcomes.settled(source, now, recheck)
        if settled is not None and settled[0] in self.candidates and self.trying:
            # A trial of these files in this process settled this lately: start on it.
            self.path = self._incumbent = settled[0]
            self.why = f"{settled[1]} (by an earlier stream of the same files)"
            self.trying = False
            self._warming = 0
            self._due = now + recheck

    def drop(self, path: str, instead: str) -> None:
        """`path` can no longer serve this stream (memory fell, large folios): never tried
        again; the stream reads by `instead` from now on (a trial in progress ends)."""
        if instead not in self.candidates or instead == path:
            raise ValueError(f"{instead!r} cannot replace {path!r} ({self.candidates})")
        if path in self.candidates:
            self.candidates.remove(path)
        self.path = self._incumbent = instead
        self.trying = False
        self._schedule = []
        self._due = self._clock() + self.recheck  # type: ignore[operator]

    def timed(self, path: str, batches: int, seconds: float) -> None:
        """A group of `batches` read by `path` cost the caller `seconds`."""
        if not self.trying or self._warming or batches < 1:
            return
        each = seconds / batches
        self._seconds.setdefault(path, []).append(each)
        ahead = self._seconds.get(self._incumbent)
        if path != self._incumbent and ahead and each > statistics.median(ahead) * (1 + LOSING):
            self._lost.add(path)
            self._schedule = [p for p in self._schedule if p != path]
            if self.path == path:
                self._left = 0  # its turn ends with this group

    def next_path(self) -> str:
        """The path that reads the next group (`path`, changed where a trial says so)."""
        if self._warming:
            self._warming -= 1
            if self._warming == 0 and self.trying:
                self._start()
            return self.path
        if not self.trying:
            if len(self.candidates) > 1 and self._clock() >= self._due:  # type: ignore[operator]
                self.trying = True
                self._start()
            return self.path
        each = self._groups * self._rounds
        playing = [path for path in self.candidates if path not in self._lost]
        if all(len(self._seconds.get(path, ())) >= each for path in playing):
            self._decide()
            return self.path
        self._left -= 1
        if self._left <= 0:
            if self._schedule:
                self.path = self._schedule.pop(0)
            elif self.path in self._lost:
                self.path = self._incumbent
            self._left = self._groups
        return self.path

    def _start(self) -> None:
        """A trial: each candidate `rounds` turns of `groups` groups, the current first."""
        self._incumbent = self.path
        others = [p for p in self.candidates if p != self.path]
        turns = [self.path, *others] * self._rounds
        self._seconds = {}
        self._lost = set()
        self._schedule = turns[1:]
        self._left = self._groups

    def _decide(self) -> None:
        """End a trial: the fastest path by the median of its groups, kept unless another
        beats it by `MARGIN`."""
        medians = {
            path: statistics.median(seconds) for path, seconds in self._seconds.items() if seconds
        }
        before = self._incumbent
        playing = {path: m for path, m in medians.items() if path not in self._lost}
        best = min(playing, key=playing.__getitem__, default=before)
        keep = medians.get(before)
        if keep is not None and medians[best] >= keep * (1 - MARGIN):
            best = before
        self.path = best
        self.trying = False
        self.decisions += 1
        now = self._clock()  # type: ignore[operator]
        self._due = now + self.recheck
        shown = sorted(medians.items(), key=lambda item: item[1])
        self.why = "measured: " + ", ".join(
            f"{path} {seconds * 1e3:.2f} ms a batch" if i == 0 else f"{path} {seconds * 1e3:.2f} ms"
            for i, (path, seconds) in enumerate(shown)
        )
        if self._source is not None:
            _Outcomes.keep(self._source, best, self.why, now)
