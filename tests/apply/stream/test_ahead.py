"""`windows` over a file mapping gathers the next group of batches on a worker thread
while the current group is placed and used: the batches are exactly those of the stream
gathering on its own thread, the thread lives as long as the stream, and nothing it
touches (the paging advice, the mapping) outlives the stream's end."""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import numpy as np
import pytest

import devpolicy
from devpolicy._apply.stream import cutting
from devpolicy._read import pages
from tests.apply.streams import mapping_of
from tests.helpers import policy_of

LENGTH = 257


#: Every stream here gathers from the mapping (the path with a worker thread), whatever
#: `windows` would choose for these files on this machine.
GATHERED = devpolicy.ReadOptions(path="budget")
#: The same, each group gathered on the stream's own thread (nothing read ahead).
ALONE = devpolicy.ReadOptions(path="budget", ahead=False)


def workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("devpolicy-windows")]


def ended(threads: list[threading.Thread]) -> bool:
    """Whether every one of `threads` has ended (given a few seconds to see its end)."""
    for thread in threads:
        thread.join(timeout=10)
    return not any(t.is_alive() for t in threads)


def started(
    tokens: np.ndarray, **options: object
) -> tuple[devpolicy.WindowStream, threading.Thread]:
    """A stream over `tokens` that has handed out its first batch, and the one worker
    thread it started for that."""
    before = workers()
    stream = stream_of(tokens, **options)
    next(stream)
    running = [t for t in workers() if t not in before]
    assert len(running) == 1
    return stream, running[0]


def counting_file(tmp_path: Path, count: int, dtype: str = "uint32") -> np.memmap:
    """A read-only mapping of `count` tokens 0, 1, 2, ...: a window says where it starts."""
    path = tmp_path / f"tokens-{dtype}.bin"
    np.arange(count, dtype=dtype).tofile(path)
    return np.memmap(path, dtype, mode="r")


def exact(batch: object) -> bool:
    """Whether every window of `batch` holds the tokens from its start on."""
    values = np.asarray(batch).astype(np.int64)
    return bool((values == values[:, :1] + np.arange(values.shape[1])).all())


def stream_of(tokens: np.ndarray, **options: object) -> devpolicy.WindowStream:
    defaults: dict[str, object] = {
        "order": "random",
        "seed": 5,
        "policy": policy_of(),
        "reads": GATHERED,
    }
    return devpolicy.windows(tokens, LENGTH, 8, **(defaults | options))  # type: ignore[arg-type]


def alone(tokens: np.ndarray, **options: object) -> list[np.ndarray]:
    """The batches of the same stream gathered on its own thread."""
    with stream_of(tokens, reads=ALONE, **options) as stream:
        batches = []
        for batch in stream:
            assert stream._cutter._gatherer is None
            batches.append(np.asarray(batch))
        return batches


class TestSameBatches:
    @pytest.mark.parametrize(
        "options",
        [
            {"steps": 21},
            {"order": "sequential", "stride": 100},
            {"order": "sequential", "steps": 13},
        ],
        ids=["random", "sequential", "sequential-steps"],
    )
    def test_gathered_ahead_a_stream_yields_what_it_yields_alone(
        self, tmp_path: Path, options: dict[str, object]
    ) -> None:
        """Random and in order, a number of steps no multiple of a group: the same
        batches, element by element, with the worker thread as without it."""
        tokens = counting_file(tmp_path, 2**16)
        with stream_of(tokens, **options) as stream:
            ahead = [np.asarray(b) for b in stream]
        expected = alone(tokens, **options)
        assert len(ahead) == len(expected) > cutting.GROUP_MAX
        for got, want in zip(ahead, expected, strict=True):
            np.testing.assert_array_equal(got, want)
            assert exact(got)

    def test_64_bit_tokens_gathered_ahead_are_narrowed_and_checked(self, tmp_path: Path) -> None:
        """uint64 tokens with x64 off: narrowed to uint32 on the stream's thread, values
        exact; a value that would change is still refused, naming the stream."""
        tokens = counting_file(tmp_path, 2**14, "uint64")
        with stream_of(tokens, steps=20) as stream:
            got = [np.asarray(b) for b in stream]
        assert {b.dtype for b in got} == {np.dtype(np.uint32)}
        for a, b in zip(got, alone(tokens, steps=20), strict=True):
            np.testing.assert_array_equal(a, b)
        path = tmp_path / "wide.bin"
        np.full(2**14, 2**40, np.uint64).tofile(path)
        wide = np.memmap(path, np.uint64, mode="r")
        with pytest.raises(devpolicy.errors.NarrowingError, match="batch"):
            next(stream_of(wide, name="batch"))

    def test_held_batches_never_change_while_later_groups_are_gathered(
        self, tmp_path: Path
    ) -> None:
        """Every batch of 300, kept to the end while the thread gathered the groups after
        it, still holds its own windows."""
        tokens = counting_file(tmp_path, 2**18)
        with stream_of(tokens, steps=300) as stream:
            held = list(stream)
        assert len(held) == 300
        assert all(exact(b) for b in held)

    def test_a_stream_resumed_from_its_state_goes_on_exactly(self, tmp_path: Path) -> None:
        """The state taken while the next group is being gathered counts only the
        batches handed out: the resumed stream yields the rest, none skipped."""
        tokens = counting_file(tmp_path, 2**16)
        whole = alone(tokens, steps=30)
        with stream_of(tokens, steps=30) as first:
            head = [np.asarray(next(first)) for _ in range(11)]
            saved = first.state()
        assert saved["step"] == 11
        with stream_of(tokens, steps=30, resume=saved) as resumed:
            tail = [np.asarray(b) for b in resumed]
        for a, b in zip(head + tail, whole, strict=True):
            np.testing.assert_array_equal(a, b)

    def test_two_streams_over_one_mapping_each_get_their_own_windows(self, tmp_path: Path) -> None:
        """Two streams read one mapping in turns, each on its own worker thread: each
        yields exactly what it yields alone."""
        tokens = counting_file(tmp_path, 2**16)
        one, two = stream_of(tokens, seed=1, steps=40), stream_of(tokens, seed=2, steps=40)
        got_one, got_two = [], []
        for a, b in zip(one, two, strict=True):
            got_one.append(np.asarray(a))
            got_two.append(np.asarray(b))
        for seed, got in ((1, got_one), (2, got_two)):
            for a, b in zip(got, alone(tokens, seed=seed, steps=40), strict=True):
                np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(pages._MADVISE is None, reason="file mappings are found in Linux's /proc")
class TestThread:
    def test_a_mapped_stream_has_one_worker_until_it_ends(self, tmp_path: Path) -> None:
        """One thread while the stream runs, none once it has ended by itself."""
        stream, worker = started(counting_file(tmp_path, 2**16), steps=30)
        assert sum(1 for _ in stream) == 29
        assert ended([worker])

    def test_tokens_in_memory_start_no_thread(self) -> None:
        """In memory a gather costs less than a hand-off: no thread is started."""
        with stream_of(np.arange(2**16, dtype=np.uint32), steps=30) as stream:
            for batch in stream:
                assert exact(batch)
                assert stream._cutter._gatherer is None

    def test_closed_mid_way_the_thread_and_the_advice_end(self, tmp_path: Path) -> None:
        """`close()` while a group is being gathered: the gather is finished or
        cancelled, the random-access advice ends, the thread ends, nothing more comes."""
        tokens = counting_file(tmp_path, 2**18)
        stream, worker = started(tokens)
        assert stream._cutter._ahead is not None  # the next group is being gathered
        stream.close()
        assert ended([worker])
        flags = {f for m in mapping_of(tokens) for f in m.get("VmFlags", "").split()}
        assert "rr" not in flags
        assert list(stream) == []

    def test_a_stream_dropped_unclosed_ends_its_thread(self, tmp_path: Path) -> None:
        """A stream read and then dropped without `close()`: its thread ends once it is
        collected."""
        stream, worker = started(counting_file(tmp_path, 2**16))
        del stream
        gc.collect()
        assert ended([worker])

    def test_streams_one_after_another_leave_no_thread_behind(self, tmp_path: Path) -> None:
        """200 streams, each read a little then closed, dropped or run out: the threads
        alive afterwards are the ones alive before."""
        tokens = counting_file(tmp_path, 2**16)
        before = set(threading.enumerate())
        for i in range(200):
            stream = stream_of(tokens, seed=i, steps=12)
            next(stream)
            assert stream._cutter._gatherer is not None
            if i % 3 == 0:
                stream.close()
            elif i % 3 == 1:
                sum(1 for _ in stream)
            del stream
        gc.collect()
        assert ended([t for t in threading.enumerate() if t not in before])
