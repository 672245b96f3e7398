"""Ctrl-C held back while a stream opens its readers (`devpolicy._apply.stream.interrupts`):
recorded inside the block, delivered at its end, the application's own handler kept."""

from __future__ import annotations

import signal
import threading

import pytest

from devpolicy._apply.stream.interrupts import deferred_interrupts


class TestDeferredInterrupts:
    def test_ctrl_c_inside_the_block_is_raised_when_it_ends_not_within(self) -> None:
        reached = []

        def opened_and_recorded() -> None:
            with deferred_interrupts():
                signal.raise_signal(signal.SIGINT)
                reached.append("after the signal")  # the open and its record, never split

        with pytest.raises(KeyboardInterrupt):
            opened_and_recorded()
        assert reached == ["after the signal"]

    def test_the_applications_handler_is_kept_and_runs_late(self) -> None:
        came: list[int] = []
        previous = signal.signal(signal.SIGINT, lambda number, frame: came.append(number))
        try:
            with deferred_interrupts():
                signal.raise_signal(signal.SIGINT)
                assert came == []
            assert came == [signal.SIGINT]
            assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        finally:
            signal.signal(signal.SIGINT, previous)

    def test_off_the_main_thread_the_block_changes_no_handler(self) -> None:
        seen = []

        def opened_in_a_thread() -> None:
            before = signal.getsignal(signal.SIGINT)
            with deferred_interrupts():
                seen.append(signal.getsignal(signal.SIGINT) is before)

        thread = threading.Thread(target=opened_in_a_thread)
        thread.start()
        thread.join()
        assert seen == [True]
