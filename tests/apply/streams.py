"""What the tests of a stream's promises share: token files whose token i is i (ground truth
costs nothing), sparse ones as large as the story's, the batches a stream must hand out
computed without the stream's own code, the device a batch is on, every read path this
machine offers (each the `ReadOptions` a test passes to `windows`), an interrupt injected
where a signal could land, and a count of what a stream holds open."""

from __future__ import annotations

import inspect
import json
import os
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest

import devpolicy
from devpolicy import ReadOptions
from devpolicy._read import positional
from tests.helpers import policy_of

from .conftest import batched_reads_here

TOKEN_RULES = [
    {"match": "*/tokens", "device": "cpu:0", "mmap": True},
    {"match": "batch", "device": "cpu:1"},
]
_MASK = 2**64 - 1
_GAMMA = 0x9E3779B97F4A7C15


def counting_file(path: Path, count: int) -> None:
    """A safetensors file of `count` uint32 tokens, token i == i, written dense (every
    byte), its data 64-byte aligned so that `load_file` maps it."""
    header = json.dumps(
        {"tokens": {"dtype": "U32", "shape": [count], "data_offsets": [0, 4 * count]}}
    ).encode()
    header += b" " * (-(8 + len(header)) % 64)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.write(np.arange(count, dtype="<u4").tobytes())


def sparse_tokens(path: Path, count: int, values: dict[int, np.ndarray]) -> None:
    """A safetensors file of `count` uint16 tokens at a 64-byte-aligned offset, written
    sparse: zeros (holes) except `values` at their token offsets."""
    header = json.dumps(
        {"tokens": {"dtype": "U16", "shape": [count], "data_offsets": [0, 2 * count]}}
    ).encode()
    header += b" " * (-(8 + len(header)) % 64)
    start = 8 + len(header)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(start + 2 * count)
        for offset, data in values.items():
            os.pwrite(f.fileno(), data.astype("<u2").tobytes(), start + 2 * offset)


def where(x: Any) -> str:
    """The target text of the one device `x` is placed on (`cpu:1`)."""
    (device,) = x.devices()
    return devpolicy.inventory().text(device)


def _mixed(z: int) -> int:
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & _MASK
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def random_step(seed: int, step: int, batch: int, starts: int) -> list[int]:
    """The window starts of step `step` of a random stream, in plain Python ints (SplitMix64
    over the counter step * batch + row, keyed by the seed), not the stream's numpy code."""
    key = _mixed((seed * _GAMMA) & _MASK)
    out = []
    for row in range(batch):
        z = (step * batch * _GAMMA + (row + 1) * _GAMMA + key) & _MASK
        fraction = float(_mixed(z) >> 11) * (starts / 2**53)
        out.append(min(int(fraction), starts - 1))
    return out


def expected_batch(seed: int, step: int, batch: int, length: int, count: int) -> np.ndarray:
    """Step `step`'s batch of a random stream over tokens 0 .. count - 1 (token i == i)."""
    starts = np.array(random_step(seed, step, batch, count - length + 1), dtype=np.int64)
    return starts[:, None] + np.arange(length)


def assert_exact(batch: Any, seed: int, step: int, length: int, count: int) -> None:
    """`batch` holds exactly the windows of step `step`."""
    got = np.asarray(batch)
    want = expected_batch(seed, step, got.shape[0], length, count)
    if got.shape != want.shape or not (got == want).all():
        raise AssertionError(f"the batch handed out as step {step} is not that step's")


def step_of(batch: Any, seed: int, length: int, count: int, steps: int) -> int:
    """Which step `batch` is (it must be exactly one of the first `steps`)."""
    got = np.asarray(batch)
    rows = got[:, :1].ravel().tolist()
    for step in range(steps):
        if random_step(seed, step, got.shape[0], count - length + 1) == rows:
            assert_exact(got, seed, step, length, count)
            return step
    raise AssertionError(f"a batch that is no step of the stream: starts {rows}")


#: A stream that switches its read path nearly every group: where reading by position and
#: keeping the mapping are both safe (a warm file that fits, whose pages are all in the page
#: cache), it times both on its own groups, one group a turn, and looks again at once.
SWITCHING = ReadOptions(trial_groups=1, trial_rounds=1, recheck_seconds=1e-6)
#: Steps of a small batch past a stream's first groups, which are never timed
#: (`choosing.WARM_GROUPS`): a stream this far in has switched path a few times.
SWITCHING_LEAD = 250


@dataclass(frozen=True)
class ReadWay:
    """One way a stream copies its windows: whether its tokens come from a file, the
    `ReadOptions` a test passes as `windows(..., reads=...)`, whether it needs io_uring
    (`ring`) and a polled ring (`polled`), whether the file is made unreadable by position
    (`no_file`: gathered from the mapping, as for a private writable map), and the steps
    a test pulls before it strikes (`lead`: a stream's first groups are never timed, so a
    fault that strikes after them strikes a stream that is switching path)."""

    from_file: bool
    reads: ReadOptions
    ring: bool = False
    polled: bool = False
    no_file: bool = False
    lead: int = 0


#: Every way a stream copies its windows.
READ_PATHS = {
    "memory": ReadWay(False, ReadOptions()),
    # Gathered from the mapping, its pages given back group by group: held to reading by
    # position, the stream finds no file to read.
    "mapping": ReadWay(True, ReadOptions(path="file"), no_file=True),
    "preadv": ReadWay(True, ReadOptions(path="file", io_uring=False)),
    "io_uring": ReadWay(True, ReadOptions(path="file", polled=False), ring=True),
    "io_uring polled": ReadWay(True, ReadOptions(path="file"), ring=True, polled=True),
    "auto, switching paths every group": ReadWay(True, SWITCHING, lead=SWITCHING_LEAD),
}
#: The ways that read the file by position: a file truncated under them is an error naming
#: it, never a SIGBUS.
FILE_PATHS = ("preadv", "io_uring", "io_uring polled")
#: The ways a file is truncated under: those, and the stream switching between reading by
#: position and its kept mapping. A kept mapping looks at its file before each group (a
#: truncation between two groups is an error: tests/apply/stream/test_reads.py), but a
#: page read past the file's end while the worker copies a group is SIGBUS, which kills
#: the process (the test run with it): the test truncates while the next group is being
#: gathered, so across a switch it is marked, not run.
TRUNCATED = [
    *FILE_PATHS,
    pytest.param(
        "auto, switching paths every group",
        marks=pytest.mark.xfail(
            run=False,
            reason="a file truncated while the worker copies from its kept mapping is SIGBUS",
        ),
    ),
]


def no_file_to_read(view: object, length: int, **ring: object) -> None:
    """`mapped_file` where the file a view maps cannot be read by position."""


def unreadable_by_position(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every file mapping look like one that cannot be read by position (as a private
    writable map's): `mapped_file` finds no file, wherever devpolicy's modules took it
    from `positional` (the stream's read paths may move between modules; this finds them)."""
    found = positional.mapped_file
    for name, module in list(sys.modules.items()):
        if name.startswith("devpolicy.") and getattr(module, "mapped_file", None) is found:
            monkeypatch.setattr(module, "mapped_file", no_file_to_read)


def use_read_path(name: str, monkeypatch: pytest.MonkeyPatch) -> ReadWay:
    """`name`'s way of copying windows (skipping where this machine cannot have it): its
    `reads` is what a test passes to `windows`."""
    way = READ_PATHS[name]
    if way.ring and not batched_reads_here(polled=way.polled):
        pytest.skip(f"{name} cannot be had here")
    if way.no_file:
        unreadable_by_position(monkeypatch)
    return way


def tokens_for(from_file: bool, path: Path, count: int) -> Any:
    """`count` tokens (token i == i): in memory, or loaded mapped from `path`."""
    if not from_file:
        return np.arange(count, dtype=np.uint32)
    counting_file(path, count)
    return devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]


def mapping_of(view: np.ndarray) -> list[dict[str, str]]:
    """The entries of /proc/self/smaps for the mappings `view` lies in: each a dict of
    its fields (`Rss`, `VmFlags`, ...), with `range` and `perms`."""
    start, end = view.ctypes.data, view.ctypes.data + view.nbytes
    found: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    with open("/proc/self/smaps", encoding="utf-8", errors="replace") as f:
        for line in f:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):
                low, _, high = first.partition("-")
                inside = int(high, 16) > start and int(low, 16) < end
                current = {"range": first, "perms": line.split()[1]} if inside else None
                if current is not None:
                    found.append(current)
            elif current is not None:
                key, _, value = line.partition(":")
                current[key] = value.strip()
    return found


def resident(view: np.ndarray) -> int:
    """Bytes of the mappings `view` lies in that are resident in this process."""
    return sum(int(m["Rss"].split()[0]) * 1024 for m in mapping_of(view))


def held_open(path: Path | None = None) -> dict[str, int]:
    """What this process holds that a stream may open: descriptors of `path`, io_uring
    rings, and stream worker threads."""
    files = rings = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        files += path is not None and target == str(path)
        rings += target == "anon_inode:[io_uring]"
    workers = sum(t.name.startswith("devpolicy-windows") for t in threading.enumerate())
    return {"files": files, "rings": rings, "workers": workers}


_OURS = str(Path(devpolicy.__file__).parent)


def _in_finaliser(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


@contextmanager
def interrupted_at(event: int) -> Iterator[list[str]]:
    """Ctrl-C at the `event`-th place inside devpolicy where Python would act on a signal:
    a function's entry, or just after a C function returned (the result then lost, as a
    signal after a system call loses it). Where devpolicy holds SIGINT back (a handler of
    its own installed), the signal is sent instead, so it is held back as a real one is.
    Yields a list that holds where it struck, once it has."""
    struck: list[str] = []
    seen = 0

    def profile(frame: FrameType, what: str, arg: object) -> None:
        nonlocal seen
        if struck or what not in ("call", "c_return"):
            return
        code = frame.f_code
        if not code.co_filename.startswith(_OURS):
            return
        if code.co_flags & inspect.CO_GENERATOR or _in_finaliser(frame):
            # A generator may be resumed only to be closed by the collector, and a finaliser
            # (and what it calls) runs where the collector runs: an exception there is only
            # printed (Python's rule for signals too), never raised in `next()`.
            return
        seen += 1
        if seen < event:
            return
        struck.append(f"{what} {frame.f_code.co_name}:{frame.f_lineno}")
        sys.setprofile(None)
        import signal

        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            signal.raise_signal(signal.SIGINT)  # held back, as a real one is
            return
        raise KeyboardInterrupt(struck[0])

    sys.setprofile(profile)
    try:
        yield struck
    finally:
        sys.setprofile(None)


def pull_through_interrupts(
    stream: Any,
    check: Callable[[Any, int], None],
    pulls: int = 120,
    seed: int = 1,
    first: int = 0,
    places: int = 400,
) -> int:
    """Pull `stream` (at step `first`) `pulls` times, each pull struck by Ctrl-C at a random
    place inside devpolicy (`interrupted_at`, one of the first `places`: more for a pull
    that does more) and pulled on after (a notebook cell run again): an interrupted pull
    hands nothing out, `state()` naming the same step; any other hands out the next step,
    `check(batch, step)`. Returns the step it reached."""
    handed = first
    rng = np.random.default_rng(seed)
    for _ in range(pulls):
        with interrupted_at(int(rng.integers(1, places))) as struck:
            try:
                batch = next(stream)
            except KeyboardInterrupt:
                assert struck, "a KeyboardInterrupt nobody injected"
                assert stream.state()["step"] == handed, struck
                continue
        check(batch, handed)
        handed += 1
        assert stream.state()["step"] == handed
    return handed


def pulled_by_threads(stream: Any, step_of_batch: Callable[[Any], int], threads: int = 4) -> None:
    """`threads` threads pull `stream` to its end: no error, each thread's steps in order,
    every step of the stream (0 .. n - 1) to exactly one of them."""
    taken: list[list[int]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def pull(mine: list[int]) -> None:
        try:
            mine.extend(step_of_batch(b) for b in stream)
        except BaseException as e:
            errors.append(e)

    running = [threading.Thread(target=pull, args=(mine,)) for mine in taken]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join(120)
    assert not errors
    for mine in taken:
        assert mine == sorted(mine)
    every = sorted(s for mine in taken for s in mine)
    assert every == list(range(len(every)))


def closed_while_pulled(
    make: Callable[[], Any], check: Callable[[Any, int], None], attempts: int, seed: int = 3
) -> None:
    """`attempts` times: a stream from `make()` pulled on another thread and `close()`d
    from this one at a random moment. `close()` never raises; the puller's batches pass
    `check(batch, step)`, then it stops or gets a devpolicy error, never a raw one; a pull
    after the close raises StopIteration."""
    rng = np.random.default_rng(seed)
    for attempt in range(attempts):
        stream = make()
        outcome: list[object] = []

        def pull(stream: Any = stream, outcome: list[object] = outcome) -> None:
            handed = 0
            try:
                for batch in stream:
                    check(batch, handed)
                    handed += 1
                outcome.append("stopped")
            except devpolicy.DevicePolicyError as e:
                outcome.append(e)
            except BaseException as e:
                outcome.append(("raw", e))

        puller = threading.Thread(target=pull)
        puller.start()
        time.sleep(float(rng.uniform(0, 0.02)))
        stream.close()  # never raises
        puller.join(60)
        assert not puller.is_alive()
        assert outcome, attempt
        assert not isinstance(outcome[0], tuple), (attempt, outcome)
        with pytest.raises(StopIteration):
            next(stream)


def forked_child_refuses(stream: Any, step: int, seconds: float = 20) -> int | None:
    """Fork with `stream` open: in the child, the first pull must raise `StreamEndedError`
    saying it is a forked child's copy (never a batch, never a hang), `state()` still at
    `step` and `close()` working. The child's exit code (0: all so; 2: it got a batch; 3:
    another error), or None where it hung (killed after `seconds`)."""
    from devpolicy.errors import StreamEndedError

    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports by its exit status
        code = 1
        try:
            try:
                next(stream)
                code = 2  # a batch: the promise broken
            except StreamEndedError as e:
                code = 0 if "forked child" in str(e) and stream.state()["step"] == step else 3
            stream.close()
        finally:
            os._exit(code)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    return None
