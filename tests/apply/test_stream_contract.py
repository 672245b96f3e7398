"""What a stream promises (docs/host-arrays.md, "What a stream promises"), each promise held
by a test on every read path this machine offers, and across a switch of path (a stream
that times two paths and switches between them nearly every group): every batch handed
out holds exactly its own step's windows, each step at most once, in order, whatever
happens around it."""

from __future__ import annotations

import gc
import json
import os
import signal
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._apply.stream import owner
from devpolicy._read import positional
from devpolicy.errors import HostViewError, StreamEndedError, StreamStateError
from tests.helpers import policy_of

from .streams import (
    READ_PATHS,
    TRUNCATED,
    ReadWay,
    assert_exact,
    closed_while_pulled,
    forked_child_refuses,
    held_open,
    pull_through_interrupts,
    pulled_by_threads,
    step_of,
    tokens_for,
    use_read_path,
)

OWNER = owner.__file__
DEVPOLICY = str(Path(devpolicy.__file__).parent)
COUNT = 1 << 18
LENGTH = 64
BATCH = 4


@pytest.fixture(params=list(READ_PATHS))
def read_way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ReadWay:
    """Each way a stream copies its windows (`streams.READ_PATHS`)."""
    return use_read_path(request.param, monkeypatch)


@pytest.fixture(params=TRUNCATED)
def file_way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ReadWay:
    """Each way a file is truncated under (`streams.TRUNCATED`)."""
    return use_read_path(request.param, monkeypatch)


def open_stream(tokens: Any, seed: int = 5, steps: int | None = 200, **options: Any) -> Any:
    return devpolicy.windows(
        tokens, LENGTH, BATCH, order="random", seed=seed, steps=steps, policy=policy_of(), **options
    )


def led(stream: Any, way: ReadWay, first: int = 0) -> int:
    """Pull `stream` (at step `first`) `way.lead` steps on, each exact, so that a fault
    after strikes a stream past its untimed first groups; the step reached."""
    for step in range(first, first + way.lead):
        assert_exact(next(stream), 5, step, LENGTH, COUNT)
    return first + way.lead


class TestErrorsEndTheStream:
    def test_after_a_truncated_file_every_pull_raises_and_no_batch_comes(
        self, file_way: ReadWay, tmp_path: Path
    ) -> None:
        """The token file truncated mid-stream: the pull that finds it raises the error
        naming the file, and every pull after raises a `StreamEndedError` naming it, never
        a batch (27-58 batches never read came out of a polled ring before)."""
        path = tmp_path / "train.safetensors"
        tokens = tokens_for(True, path, COUNT)
        before = held_open(path)  # the mapping's own descriptor
        stream = open_stream(tokens, steps=None, reads=file_way.reads)
        handed = led(stream, file_way)
        for step in range(handed, handed + 3):
            assert_exact(next(stream), 5, step, LENGTH, COUNT)
        os.truncate(path, 4096)
        handed += 3
        # Batches read before the truncation may still come, exact; then the error.
        with pytest.raises(HostViewError, match="truncated after it was mapped"):  # noqa: PT012
            for batch in stream:
                assert_exact(batch, 5, handed, LENGTH, COUNT)
                handed += 1
        for _ in range(50):
            with pytest.raises(StreamEndedError, match=r"failed at step \d+: HostViewError"):
                next(stream)
        assert stream.state()["step"] == handed
        stream.close()
        assert held_open(path) == before

    def test_the_stream_ended_event_says_it_failed_and_why(
        self, file_way: ReadWay, tmp_path: Path
    ) -> None:
        """`stream_ended` says `how='failed'` and the error, once."""
        path = tmp_path / "train.safetensors"
        tokens = tokens_for(True, path, COUNT)
        with capture_logs() as logs:
            stream = open_stream(tokens, steps=None, narrow="exact", reads=file_way.reads)
            led(stream, file_way)
            next(stream)
            os.truncate(path, 4096)
            with pytest.raises(devpolicy.DevicePolicyError):  # noqa: PT012
                for _ in range(1000):
                    next(stream)
            with pytest.raises(StreamEndedError):
                next(stream)
            stream.close()
        ended = [e for e in logs if e["event"] == "stream_ended"]
        assert len(ended) == 1
        assert ended[0]["how"] == "failed"
        assert ended[0]["error"].startswith("HostViewError: ")


class TestInterrupts:
    def test_ctrl_c_inside_next_skips_nothing_and_state_names_the_next_step(
        self, read_way: ReadWay, tmp_path: Path
    ) -> None:
        """Ctrl-C at each place inside `next()` where Python acts on a signal, then pulling
        on (a notebook cell run again): the interrupted step is the next one handed out,
        `state()` names it, and the batches are the uninterrupted stream's, exactly."""
        tokens = tokens_for(read_way.from_file, tmp_path / "train.safetensors", COUNT)
        stream = open_stream(tokens, steps=None, reads=read_way.reads)
        handed = pull_through_interrupts(
            stream,
            lambda batch, step: assert_exact(batch, 5, step, LENGTH, COUNT),
            first=led(stream, read_way),
        )
        for _ in range(40):
            assert_exact(next(stream), 5, handed, LENGTH, COUNT)
            handed += 1
        stream.close()

    def test_a_real_signal_while_pulling_skips_nothing(
        self, read_way: ReadWay, tmp_path: Path
    ) -> None:
        """A timer's signal every 1-2 ms sends SIGINT wherever it finds `next()` running
        (as Ctrl-C would, held back where devpolicy holds it back), while a loop pulls on
        after each interrupt: what was handed out is the stream's steps in order, none
        missing, none twice."""
        tokens = tokens_for(read_way.from_file, tmp_path / "train.safetensors", COUNT)
        stream = open_stream(tokens, steps=None, reads=read_way.reads)
        interrupts = 0

        def inside_next(number: int, frame: FrameType | None) -> None:
            nonlocal interrupts
            if frame is None or not frame.f_code.co_filename.startswith(DEVPOLICY):
                # Not devpolicy's code (a gc callback of JAX's, say): there Python would
                # only print what it raised.
                return
            while frame is not None:
                if frame.f_code.co_name == "__del__":
                    # A finaliser the collector runs inside `next()` (an earlier stream's),
                    # or what it calls: there Python would only print what it raised.
                    return
                if frame.f_code.co_name == "__next__" and frame.f_code.co_filename == OWNER:
                    interrupts += 1
                    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                        raise KeyboardInterrupt
                    signal.raise_signal(signal.SIGINT)  # held back, as devpolicy holds it
                    return
                frame = frame.f_back

        got: list[Any] = []
        previous = signal.signal(signal.SIGALRM, inside_next)
        signal.setitimer(signal.ITIMER_REAL, 0.001, 0.0013)
        try:
            # Until a few signals landed inside `next()` (a fast read path spends little
            # of its time there).
            while (interrupts < 5 or len(got) < 600) and len(got) < 50_000:
                try:
                    got.append(next(stream))
                except KeyboardInterrupt:
                    continue
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert interrupts
        assert stream.state()["step"] == len(got)
        for step, batch in enumerate(got):
            assert_exact(batch, 5, step, LENGTH, COUNT)

    @pytest.mark.parametrize("where", ["the file opened", "the ring opened"])
    def test_ctrl_c_while_a_stream_opens_its_reader_leaks_nothing(
        self, where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """SIGINT arriving the moment the system call that opened the file (or the ring)
        returns, before anything stores it (the stream opens its reader when it is made):
        the interrupt comes once the reader is owned, `windows` raises it with nothing
        left open, and the next stream starts at step 0."""
        way = "io_uring polled" if where == "the ring opened" else "preadv"
        reads = use_read_path(way, monkeypatch).reads
        path = tmp_path / "train.safetensors"
        tokens = tokens_for(True, path, COUNT)
        before = held_open(path)
        if where == "the file opened":
            real_open = os.open

            def opened_then_interrupted(*args: Any, **kwargs: Any) -> int:
                fd = real_open(*args, **kwargs)
                signal.raise_signal(signal.SIGINT)  # acted on at the next chance
                return fd

            monkeypatch.setattr(positional.os, "open", opened_then_interrupted)
        else:
            real_ring = positional.BatchReads.open.__func__  # type: ignore[attr-defined]

            def ring_then_interrupted(cls: Any, *args: Any, **kwargs: Any) -> Any:
                ring = real_ring(cls, *args, **kwargs)
                signal.raise_signal(signal.SIGINT)
                return ring

            monkeypatch.setattr(positional.BatchReads, "open", classmethod(ring_then_interrupted))
        with pytest.raises(KeyboardInterrupt):
            open_stream(tokens, reads=reads)
        gc.collect()
        assert held_open(path) == before
        monkeypatch.undo()
        stream = open_stream(tokens, reads=reads)
        assert_exact(next(stream), 5, 0, LENGTH, COUNT)
        stream.close()
        del stream
        gc.collect()
        assert held_open(path) == before


class TestThreads:
    def test_four_threads_pulling_one_stream_each_get_other_steps_all_of_them(
        self, read_way: ReadWay, tmp_path: Path
    ) -> None:
        """Four threads pull one stream to its end: every step goes to exactly one thread,
        each thread's steps in order, none twice, none missing, no raw error."""
        tokens = tokens_for(read_way.from_file, tmp_path / "train.safetensors", COUNT)
        steps = 300 + read_way.lead
        stream = open_stream(tokens, steps=steps, reads=read_way.reads)
        pulled_by_threads(stream, lambda batch: step_of(np.asarray(batch), 5, LENGTH, COUNT, steps))
        assert stream.state()["step"] == steps

    def test_close_from_another_thread_never_raises_and_leaves_nothing_open(
        self, read_way: ReadWay, tmp_path: Path
    ) -> None:
        """`close()` from another thread at any moment: it never raises; the puller gets
        exact batches, then `StopIteration` (or a devpolicy error), never a raw error; no
        descriptor, ring or worker thread is left."""
        path = tmp_path / "train.safetensors"
        tokens = tokens_for(read_way.from_file, path, COUNT)
        before = held_open(path)  # the mapping's own descriptor

        def made() -> Any:
            stream = open_stream(tokens, steps=None, reads=read_way.reads)
            led(stream, read_way)
            return stream

        closed_while_pulled(
            made,
            lambda batch, step: assert_exact(batch, 5, read_way.lead + step, LENGTH, COUNT),
            attempts=25,
        )
        gc.collect()
        assert held_open(path) == before


class TestFork:
    # The child only pulls (which must refuse before it touches JAX) and leaves with
    # os._exit: none of JAX's threads are needed there.
    @pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
    @pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
    def test_a_forked_childs_copy_refuses_clearly_never_zeros_never_a_hang(
        self, read_way: ReadWay, tmp_path: Path
    ) -> None:
        """Forked with a group in flight, the child's first pull raises `StreamEndedError`
        saying why (no zeros, no hang: the child is killed after 20 s); `state()` and
        `close()` work there; the parent's stream goes on exactly."""
        tokens = tokens_for(read_way.from_file, tmp_path / "train.safetensors", COUNT)
        stream = open_stream(tokens, steps=None, reads=read_way.reads)
        forked = led(stream, read_way) + 3
        for step in range(forked - 3, forked):
            assert_exact(next(stream), 5, step, LENGTH, COUNT)
        assert forked_child_refuses(stream, forked) == 0
        for step in range(forked, forked + 37):
            assert_exact(next(stream), 5, step, LENGTH, COUNT)
        stream.close()


class TestSavedState:
    def saved(self) -> dict[str, Any]:
        stream = open_stream(np.arange(COUNT, dtype=np.uint32))
        next(stream)
        state: dict[str, Any] = stream.state()
        stream.close()
        return state

    @pytest.mark.parametrize(
        ("change", "fields"),
        [
            ({"seed": None}, "resume['seed']"),
            ({"seed": 1.5}, "resume['seed']"),
            ({"seed": "5"}, "resume['seed']"),
            ({"seed": [5]}, "resume['seed']"),
            ({"seed": -1}, "resume['seed']"),
            ({"seed": 2**64}, "resume['seed']"),
            ({"seed": True}, "resume['seed']"),
            ({"step": -1}, "resume['step']"),
            ({"step": 2**64}, "resume['step']"),
            ({"step": 201}, "resume['step']"),
            ({"steps": 0}, "resume['steps']"),
            ({"length": "64"}, "resume['length']"),
            ({"order": "shuffle"}, "resume['order']"),
            ({"row_shape": [-1]}, "resume['row_shape']"),
            ({"dtype": "not a dtype"}, "resume['dtype']"),
            ({"stride": 3}, "resume['stride']"),
            ({"seed": "x", "batch": 0}, "resume['batch'], resume['seed']"),
        ],
    )
    def test_a_damaged_state_names_every_field_at_fault(
        self, change: dict[str, Any], fields: str
    ) -> None:
        """Each damaged field of a saved state is a `StreamStateError` naming it (all of
        them at once), never a raw `AssertionError`, `TypeError` or `OverflowError`."""
        state = {**self.saved(), **change}
        with pytest.raises(
            StreamStateError, match=rf"^windows resume: {__import__('re').escape(fields)}: "
        ):
            open_stream(np.arange(COUNT, dtype=np.uint32), seed=None, resume=state)

    def test_a_missing_field_is_named(self) -> None:
        """An older or cut state without its seed: the missing field is named."""
        state = self.saved()
        del state["seed"]
        with pytest.raises(StreamStateError, match=r"resume\['seed'\]: seed missing"):
            open_stream(np.arange(COUNT, dtype=np.uint32), seed=None, resume=state)

    @pytest.mark.parametrize("text", ["[" * 100_000, "{" * 50 + "}" * 50, "x" * 100_000])
    def test_deep_or_huge_json_is_a_stream_state_error(self, text: str) -> None:
        """Deep JSON (a `RecursionError` in the parser) or huge text is refused clearly."""
        with pytest.raises(StreamStateError, match=r"^windows resume: resume: not"):
            open_stream(np.arange(COUNT, dtype=np.uint32), resume=text)

    def test_a_deeply_nested_mapping_is_refused_without_recursing(self) -> None:
        nested: dict[str, Any] = {}
        for _ in range(100_000):
            nested = {"a": nested}
        with pytest.raises(StreamStateError, match="not a saved stream state"):
            open_stream(np.arange(COUNT, dtype=np.uint32), resume=nested)

    def test_every_differing_argument_is_named_with_both_values(self) -> None:
        """A state resumed with other arguments names every field that differs (another
        global batch of a random stream is no fault: it goes on from the same row)."""
        state = self.saved()
        with pytest.raises(
            StreamStateError,
            match=r"^windows resume: length, steps: the saved stream had length=64, "
            r"steps=200; this one has length=32, steps=300",
        ):
            devpolicy.windows(
                np.arange(COUNT, dtype=np.uint32),
                32,
                8,
                order="random",
                seed=5,
                steps=300,
                resume=json.dumps(state),
                policy=policy_of(),
            )

    @pytest.mark.parametrize("start", [2**63, 2**64, 2**70])
    def test_a_start_past_what_can_be_drawn_is_a_value_error(self, start: int) -> None:
        with pytest.raises(
            ValueError, match=r"^windows start must be an int from 0 to 2\*\*63 - 1"
        ):
            open_stream(np.arange(COUNT, dtype=np.uint32), steps=None, start=start)

    def test_the_last_step_that_can_be_drawn_is_drawn(self) -> None:
        stream = open_stream(np.arange(COUNT, dtype=np.uint32), steps=None, start=2**63 - 1)
        assert_exact(next(stream), 5, 2**63 - 1, LENGTH, COUNT)
        with pytest.raises(StopIteration):
            next(stream)
