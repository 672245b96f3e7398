"""Ctrl-C held back while a resource is opened and recorded, then delivered.

Python raises `KeyboardInterrupt` between two bytecodes, also right after a system call
that opened a descriptor returns and before the descriptor is stored anywhere: nothing
then closes it. A stream opens its readers (a file descriptor, an io_uring and its
mappings) inside `deferred_interrupts()`, where SIGINT only records that it came; it is
raised as soon as the block ends, once what was opened has an owner that closes it (and
a finaliser). Only the main thread receives SIGINT (Python runs its handlers there), so
elsewhere the block does nothing. A handler the application installed is kept: it runs,
late, with the signal it would have had.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """SIGINT recorded, not acted on, inside the block; delivered when it ends.

    Example:
        >>> with deferred_interrupts():
        ...     opened = "a descriptor and the object that closes it"
        >>> opened
        'a descriptor and the object that closes it'
    """
    # Off the main thread no SIGINT handler runs; a handler installed from C cannot be
    # put back once replaced.
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is None
    ):
        yield
        return
    came: list[int] = []

    def record(number: int, frame: FrameType | None) -> None:
        came.append(number)

    try:
        previous = signal.signal(signal.SIGINT, record)
    except ValueError:  # not the main interpreter's main thread after all
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if came:
            signal.raise_signal(signal.SIGINT)
