"""Many positional reads in one io_uring call (`devpolicy._read.uring`), against the file's bytes."""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from devpolicy._read import positional
from devpolicy._read.uring import ENTRIES, BatchReads
from tests.apply.conftest import batched_reads_here

pytestmark = pytest.mark.skipif(
    not batched_reads_here(), reason="io_uring cannot be had here (kernel, seccomp or sandbox)"
)

SIZE = 1025 * 2  # a window of 1,025 uint16 tokens: not a multiple of any page or block


@pytest.fixture(params=["polled by a kernel thread", "plain"])
def ring(request: pytest.FixtureRequest) -> Iterator[BatchReads]:
    """A ring of each kind this machine can have (a polled one needs Linux 5.11 or
    privileges, x86_64 and two cores)."""
    polled = request.param == "polled by a kernel thread"
    opened = BatchReads.open(polled=polled)
    assert opened is not None
    if opened.polled != polled:
        opened.close()
        pytest.skip("a polled ring cannot be had here")
    yield opened
    opened.close()


def known_file(path: Path, nbytes: int = 8 * 2**20, seed: int = 0) -> bytes:
    """`nbytes` random bytes written to `path`."""
    data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    return data


def read_all(
    ring: BatchReads, fd: int, positions: np.ndarray[Any, Any], size: int = SIZE
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    out = np.zeros((len(positions), size), np.uint8)
    addresses = np.uint64(out.ctypes.data) + np.arange(len(positions), dtype=np.uint64) * np.uint64(
        size
    )
    ring.submit(fd, positions, addresses, size, out)
    return out, ring.wait()


def submit_and_wait(
    ring: BatchReads,
    fd: int,
    positions: np.ndarray[Any, Any],
    addresses: np.ndarray[Any, Any],
    out: np.ndarray[Any, Any],
) -> np.ndarray[Any, Any]:
    ring.submit(fd, positions, addresses, SIZE, out)
    return ring.wait()


def test_random_reads_hold_exactly_the_files_bytes(tmp_path: Path, ring: BatchReads) -> None:
    """300 reads at random, unaligned offsets: each holds the file's bytes there."""
    data = known_file(tmp_path / "f.bin")
    positions = np.random.default_rng(1).integers(0, len(data) - SIZE, 300)
    with open(tmp_path / "f.bin", "rb") as f:
        out, results = read_all(ring, f.fileno(), positions)
    assert results.tolist() == [SIZE] * 300
    for row, at in zip(out, positions.tolist(), strict=True):
        assert row.tobytes() == data[at : at + SIZE]


def test_more_reads_than_the_ring_holds_are_all_done(tmp_path: Path, ring: BatchReads) -> None:
    """A call of more reads than the ring's entries is submitted in parts, all exact."""
    data = known_file(tmp_path / "f.bin")
    count = ENTRIES * 2 + 7
    positions = np.random.default_rng(2).integers(0, len(data) - SIZE, count)
    with open(tmp_path / "f.bin", "rb") as f:
        out, results = read_all(ring, f.fileno(), positions)
    assert (results == SIZE).all()
    assert out[-1].tobytes() == data[positions[-1] : positions[-1] + SIZE]
    assert out[ENTRIES].tobytes() == data[positions[ENTRIES] : positions[ENTRIES] + SIZE]


def test_call_after_call_on_one_ring_every_read_is_done_by_the_ring(
    tmp_path: Path, ring: BatchReads
) -> None:
    """50 calls of 1 to 700 reads on one ring: every result is the whole read (none left
    for the caller to redo), every byte the file's."""
    data = known_file(tmp_path / "f.bin")
    rng = np.random.default_rng(5)
    with open(tmp_path / "f.bin", "rb") as f:
        for count in rng.integers(1, 700, 50).tolist():
            positions = rng.integers(0, len(data) - SIZE, count)
            out, results = read_all(ring, f.fileno(), positions)
            assert (results == SIZE).all()
            at = int(positions[-1])
            assert out[-1].tobytes() == data[at : at + SIZE]


def test_offsets_past_4_gib_are_read_exactly(tmp_path: Path, ring: BatchReads) -> None:
    """A sparse file with bytes planted past 2**32: the 64-bit offsets reach them."""
    path = tmp_path / "sparse.bin"
    planted = np.arange(SIZE, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        f.truncate(6 * 2**30)
        f.seek(5 * 2**30 + 3)
        f.write(planted)
    with open(path, "rb") as f:
        out, results = read_all(ring, f.fileno(), np.array([5 * 2**30 + 3, 0]))
    assert results.tolist() == [SIZE, SIZE]
    assert out[0].tobytes() == planted
    assert not out[1].any()


def test_a_read_past_the_end_comes_back_short_and_a_bad_descriptor_as_an_errno(
    tmp_path: Path, ring: BatchReads
) -> None:
    """Results say what each read got: fewer bytes where the file ends, -EBADF for a
    descriptor that is not open; the caller redoes those."""
    data = known_file(tmp_path / "f.bin", 10_000)
    with open(tmp_path / "f.bin", "rb") as f:
        _, results = read_all(ring, f.fileno(), np.array([0, 10_000 - 100, 20_000]))
    assert results.tolist() == [SIZE, 100, 0]
    assert len(data) == 10_000
    _, results = read_all(ring, 987_654, np.array([0]))
    assert results.tolist() == [-errno.EBADF]


def test_signals_during_the_wait_only_restart_it(tmp_path: Path, ring: BatchReads) -> None:
    """A timer signal every 50 us while 20,000 reads run: every read still exact."""
    data = known_file(tmp_path / "f.bin")
    positions = np.random.default_rng(3).integers(0, len(data) - SIZE, 20_000)
    ticks = []
    previous = signal.signal(signal.SIGALRM, lambda *_: ticks.append(1))
    signal.setitimer(signal.ITIMER_REAL, 50e-6, 50e-6)
    try:
        with open(tmp_path / "f.bin", "rb") as f:
            out, results = read_all(ring, f.fileno(), positions)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert ticks  # the wait was interrupted, and went on
    assert (results == SIZE).all()
    for index in (0, 9_999, 19_999):
        at = int(positions[index])
        assert out[index].tobytes() == data[at : at + SIZE]


@pytest.mark.slow
def test_an_exception_from_a_signal_handler_leaves_no_read_in_flight(
    tmp_path: Path, ring: BatchReads
) -> None:
    """A handler that raises (as Ctrl-C does) mid-call: the exception comes out, only
    after every read in flight finished, and the ring reads exactly afterwards."""
    data = known_file(tmp_path / "f.bin")
    positions = np.random.default_rng(4).integers(0, len(data) - SIZE, 200_000)

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    out = np.zeros((len(positions), SIZE), np.uint8)
    addresses = np.uint64(out.ctypes.data) + np.arange(len(positions), dtype=np.uint64) * (
        np.uint64(SIZE)
    )
    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.005)
    try:
        with open(tmp_path / "f.bin", "rb") as f, pytest.raises(KeyboardInterrupt):
            submit_and_wait(ring, f.fileno(), positions, addresses, out)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not ring.in_flight  # nothing left writing into a buffer
    landed = out.copy()
    time.sleep(0.05)
    np.testing.assert_array_equal(out, landed)  # and nothing landed after
    with open(tmp_path / "f.bin", "rb") as f:
        out, results = read_all(ring, f.fileno(), positions[:10])
    assert (results == SIZE).all()
    assert out[9].tobytes() == data[positions[9] : positions[9] + SIZE]


def test_reads_submitted_go_on_while_the_caller_works_and_wait_returns_them(
    tmp_path: Path, ring: BatchReads
) -> None:
    """`submit` returns before the reads are waited for; `wait` gives every result, the
    bytes all in place; the ring then takes the next submission."""
    data = known_file(tmp_path / "f.bin")
    rng = np.random.default_rng(6)
    with open(tmp_path / "f.bin", "rb") as f:
        for _ in range(3):
            positions = rng.integers(0, len(data) - SIZE, 3000)
            out = np.zeros((3000, SIZE), np.uint8)
            addresses = np.uint64(out.ctypes.data) + np.arange(3000, dtype=np.uint64) * np.uint64(
                SIZE
            )
            ring.submit(f.fileno(), positions, addresses, SIZE, out)
            assert ring.in_flight
            sum(range(10_000))  # the caller's own work meanwhile
            assert (ring.wait() == SIZE).all()
            assert not ring.in_flight
            for index in (0, 1023, 1024, 2999):
                at = int(positions[index])
                assert out[index].tobytes() == data[at : at + SIZE]


def test_a_second_submission_before_the_wait_is_refused(tmp_path: Path, ring: BatchReads) -> None:
    known_file(tmp_path / "f.bin", 100_000)
    out = np.zeros(SIZE, np.uint8)
    at = np.array([out.ctypes.data], np.uint64)
    with open(tmp_path / "f.bin", "rb") as f:
        with pytest.raises(RuntimeError, match="no reads were submitted"):
            ring.wait()
        ring.submit(f.fileno(), np.array([0]), at, SIZE, out)
        with pytest.raises(RuntimeError, match=r"in flight: wait\(\) for them first"):
            ring.submit(f.fileno(), np.array([0]), at, SIZE, out)
        assert ring.wait().tolist() == [SIZE]


def test_closing_a_ring_with_reads_in_flight_waits_for_them(
    tmp_path: Path, ring: BatchReads
) -> None:
    """A ring closed between `submit` and `wait`, the file's pages dropped from the cache
    first (so the reads go to the disk): every read started has landed when close
    returns, and nothing lands after."""
    data = known_file(tmp_path / "f.bin", 64 * 2**20)
    positions = np.random.default_rng(7).integers(0, len(data) - SIZE, 5000)
    out = np.zeros((5000, SIZE), np.uint8)
    addresses = np.uint64(out.ctypes.data) + np.arange(5000, dtype=np.uint64) * np.uint64(SIZE)
    with open(tmp_path / "f.bin", "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        ring.submit(f.fileno(), positions, addresses, SIZE, out)
        ring.close()
    assert not ring.in_flight
    landed = out.copy()
    time.sleep(0.05)
    np.testing.assert_array_equal(out, landed)
    # The reads queued (a ring's worth) have landed; the rest were never started.
    for index in (0, ENTRIES - 1):
        at = int(positions[index])
        assert out[index].tobytes() == data[at : at + SIZE]


def test_a_closed_ring_refuses_to_read_and_closes_once(tmp_path: Path) -> None:
    opened = BatchReads.open()
    assert opened is not None
    opened.close()
    opened.close()
    with pytest.raises(ValueError, match="closed"):
        read_all(opened, 0, np.array([0]))


def test_a_file_reader_reads_batches_in_one_call_where_io_uring_can_be_had(
    tmp_path: Path,
) -> None:
    """`FileWindows` over a mapped file: batched, its descriptor blocking (a read of a page
    not yet cached waits for it, not EAGAIN), its windows exact."""
    values = np.arange(100_000, dtype=np.uint16)
    path = tmp_path / "tokens.bin"
    values.tofile(path)
    mapped = np.memmap(path, np.uint16, mode="r")
    reader = positional.mapped_file(mapped, 50)
    assert reader is not None
    try:
        assert reader.batched
        assert os.get_blocking(int(reader._files.fds[0]))
        batches = [np.empty((3, 50), np.uint16) for _ in range(2)]
        starts = np.array([[0, 99_950, 7], [123, 456, 789]])
        reader.read_batches(starts, batches)
        for batch, row in zip(batches, starts, strict=True):
            np.testing.assert_array_equal(batch, values[row[:, None] + np.arange(50)])
    finally:
        reader.close()


def batched_reader(
    tmp_path: Path, count: int, length: int
) -> tuple[positional.FileWindows, np.ndarray[Any, Any]]:
    """A reader of windows of `length` over a mapped file of `count` known uint16 tokens,
    reading a call's windows in one io_uring call; and the tokens."""
    values = np.arange(count, dtype=np.uint16)
    path = tmp_path / "tokens.bin"
    values.tofile(path)
    reader = positional.mapped_file(np.memmap(path, np.uint16, mode="r"), length)
    assert reader is not None
    assert reader.batched
    return reader, values


def test_reads_the_ring_failed_are_read_again_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ring whose reads come back failed (-EINVAL, as a kernel without the read op
    would say): `FileWindows` reads those windows again with `preadv`, exactly."""
    waited = BatchReads.wait

    def failing(ring: BatchReads) -> np.ndarray[Any, Any]:
        results = waited(ring)
        results[::3] = -errno.EINVAL
        return results

    monkeypatch.setattr(BatchReads, "wait", failing)
    reader, values = batched_reader(tmp_path, 100_000, 40)
    try:
        batches = [np.zeros((5, 40), np.uint16) for _ in range(4)]
        starts = np.random.default_rng(8).integers(0, 100_000 - 40, (4, 5))
        reader.read_batches(starts, batches)
        for batch, row in zip(batches, starts, strict=True):
            np.testing.assert_array_equal(batch, values[row[:, None] + np.arange(40)])
    finally:
        reader.close()


# The child only reads with numpy and os, then leaves with os._exit: none of JAX's threads
# are needed there.
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
def test_a_forked_child_reads_by_itself_and_leaves_the_parents_ring_alone(
    tmp_path: Path,
) -> None:
    """The ring's memory is shared with a forked child (and a polled ring's thread reads in
    the parent's address space): the child's reader reads with `preadv`, exactly, and the
    parent's ring still reads exactly after."""
    reader, values = batched_reader(tmp_path, 100_000, 30)
    starts = np.random.default_rng(9).integers(0, 100_000 - 30, (2, 6))
    expected = [values[row[:, None] + np.arange(30)] for row in starts]
    try:
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports by its exit status
            code = 1
            try:
                batches = [np.zeros((6, 30), np.uint16) for _ in range(2)]
                if not reader.batched:
                    reader.read_batches(starts, batches)
                    same = zip(batches, expected, strict=True)
                    code = 0 if all((b == e).all() for b, e in same) else 2
                reader.close()
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        batches = [np.zeros((6, 30), np.uint16) for _ in range(2)]
        reader.read_batches(starts, batches)
        for batch, want in zip(batches, expected, strict=True):
            np.testing.assert_array_equal(batch, want)
    finally:
        reader.close()


def test_a_batch_that_does_not_fit_its_windows_is_refused_before_any_read(
    tmp_path: Path,
) -> None:
    """The kernel writes where it is told: a batch of the wrong size, or read-only, is
    refused before anything is submitted."""
    reader, values = batched_reader(tmp_path, 10_000, 10)
    try:
        with pytest.raises(ValueError, match="for 3 windows of 20 bytes"):
            reader.submit_batches(np.array([[0, 1, 2]]), [np.zeros((2, 10), np.uint16)])
        frozen = np.zeros((3, 10), np.uint16)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="writeable False"):
            reader.submit_batches(np.array([[0, 1, 2]]), [frozen])
        assert reader.batched  # nothing was left in flight
        batch = np.zeros((3, 10), np.uint16)
        reader.read_batches(np.array([[0, 1, 2]]), [batch])
        np.testing.assert_array_equal(batch, values[np.arange(3)[:, None] + np.arange(10)])
    finally:
        reader.close()
