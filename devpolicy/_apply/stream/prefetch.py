"""Batches to the compute device, transferred ahead of use."""

from __future__ import annotations

import abc
import numbers
import operator
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Generic, Self, TypeVar

from ..._decide.decider import Decider
from ..narrowing import Narrow, check_mode
from ..put import put

T = TypeVar("T")


def as_int(value: object) -> int | None:
    """`value` as an int if it is an integer (numpy's `np.int64(10)` too) and not a bool."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return operator.index(value)
    return None


#: The most batches a stream places ahead of use. Each is a device array held until used:
#: a deeper queue than this hides no more latency, and `size=10**7` would fill the host
#: with arrays (and their per-array cost) before the first batch came.
SIZE_MOST = 1024


def checked_size(verb: str, size: object) -> int:
    """`size`, the batches placed ahead, checked: an int from 1 to `SIZE_MOST`.

    Example:
        >>> checked_size("prefetch", 4)
        4
        >>> checked_size("windows", 10**7)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ValueError: windows size must be an int from 1 to 1024 ..., got 10000000
    """
    whole = as_int(size)
    if whole is None or not 1 <= whole <= SIZE_MOST:
        raise ValueError(
            f"{verb} size must be an int from 1 to {SIZE_MOST} (the batches placed ahead "
            f"of use), got {size!r}"
        )
    return whole


def prefetch(
    iterable: Iterable[T], decider: Decider, name: str, size: int, narrow: Narrow = "exact"
) -> BatchStream[T]:
    """Place each element by `decider`, `size` transfers ahead. See `devpolicy.prefetch`."""
    size = checked_size("prefetch", size)
    if not isinstance(name, str):
        raise TypeError(f"prefetch name must be a str, got {type(name).__name__} {name!r}")
    check_mode(narrow)
    return Prefetched(iter(iterable), name, size, decider, narrow)


class BatchStream(Iterator[T], Generic[T]):
    """The placed batches of `devpolicy.prefetch` and `devpolicy.windows`: an iterator
    that is closed by `close()` or by leaving a `with` block, dropping the batches in
    flight and whatever feeds them. What each stream does between is its own
    (`Prefetched` here, `WindowStream` for windows).

    Example:
        >>> import devpolicy, numpy as np
        >>> p = devpolicy.load_policy({"version": 1})
        >>> def source():
        ...     try:
        ...         while True:
        ...             yield np.zeros(2)
        ...     finally:
        ...         print("source closed")
        >>> with devpolicy.prefetch(source(), policy=p) as stream:
        ...     first = next(stream)
        source closed
    """

    __slots__ = ()

    @abc.abstractmethod
    def __next__(self) -> T: ...

    @abc.abstractmethod
    def close(self) -> None:
        """Drop the batches in flight and end the stream. Closing again does nothing; the
        stream then yields nothing more."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Prefetched(BatchStream[T]):
    """`devpolicy.prefetch`'s stream: each element of `source` placed, `size` ahead.

    `close()` drops the batches in flight and calls the source's `close()` if it has one,
    so a generator source runs its `finally` (closing its files) at once, not whenever it
    is collected. Nothing is pulled from the source before the first `next`.
    """

    __slots__ = (
        "_decider",
        "_failure",
        "_in_flight",
        "_name",
        "_narrow",
        "_pulling",
        "_size",
        "_source",
    )

    def __init__(
        self, source: Iterator[T], name: str, size: int, decider: Decider, narrow: Narrow
    ) -> None:
        self._source: Iterator[T] | None = source  # until closed
        self._pulling = True  # until the source ends, fails or is closed
        self._name = name
        self._size = size
        self._decider = decider
        self._narrow: Narrow = narrow
        self._in_flight: deque[T] | None = None  # None until the first `next`
        self._failure: Exception | None = None

    def _fill(self, in_flight: deque[T]) -> None:
        source = self._source
        while source is not None and self._pulling and len(in_flight) < self._size:
            try:
                item = next(source)
            except StopIteration:
                self._pulling = False
                return
            except Exception as e:
                # Raised only once the batches already placed have been used, where
                # plain iteration over the source would have raised it.
                self._failure = e
                self._pulling = False
                return
            in_flight.append(put(self._decider, self._name, item, self._narrow, local=True))

    def __next__(self) -> T:
        in_flight = self._in_flight
        if in_flight is None:
            in_flight = self._in_flight = deque()
            self._fill(in_flight)
        if in_flight:
            current = in_flight.popleft()
            self._fill(in_flight)
            return current
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure
        raise StopIteration

    def close(self) -> None:
        """Drop the batches in flight and close the source (its `close()`, if it has one).
        Closing again does nothing; the stream then yields nothing more."""
        source, self._source = self._source, None
        self._pulling = False
        self._in_flight = deque()
        self._failure = None
        close = getattr(source, "close", None)
        if callable(close):
            close()
