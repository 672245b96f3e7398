"""Batches to the compute device, transferred ahead of use."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import TypeVar

from ._decider import Decider
from ._narrowing import Narrow, check_mode
from ._placement import put

T = TypeVar("T")


def prefetch(
    iterable: Iterable[T], decider: Decider, name: str, size: int, narrow: Narrow = "exact"
) -> Iterator[T]:
    """Place each element by `decider`, `size` transfers ahead. See `devpolicy.prefetch`."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"prefetch size must be an int >= 1, got {size!r}")
    if not isinstance(name, str):
        raise TypeError(f"prefetch name must be a str, got {type(name).__name__} {name!r}")
    check_mode(narrow)
    return _prefetched(iter(iterable), name, size, decider, narrow)


def _prefetched(
    source: Iterator[T], name: str, size: int, decider: Decider, narrow: Narrow
) -> Iterator[T]:
    in_flight: deque[T] = deque()
    failure: BaseException | None = None

    def fill() -> None:
        nonlocal failure
        while failure is None and len(in_flight) < size:
            try:
                item = next(source)
            except StopIteration:
                return
            except Exception as e:
                # Raised only once the batches already placed have been used, where
                # plain iteration over the source would have raised it.
                failure = e
                return
            in_flight.append(put(decider, name, item, narrow, local=True))

    fill()
    while in_flight:
        current = in_flight.popleft()
        fill()
        yield current
    if failure is not None:
        raise failure
