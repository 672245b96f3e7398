"""Batches to the compute device, transferred ahead of use."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import TypeVar

from ._policy import Policy

T = TypeVar("T")


def prefetch(
    iterable: Iterable[T], name: str = "batch", size: int = 2, *, policy: Policy | None = None
) -> Iterator[T]:
    """Yield each element placed by the rule for `name`, with up to `size` transfers in flight.

    Each element (an array or pytree) is `put` as `name` (pytree leaves as `name/<path>`).
    JAX transfers are asynchronous, so while you compute on one batch the next `size` are
    already on their way (`size=2` keeps two in flight; memory holds `size + 1` batches).
    An error from the source is raised after the batches placed before it are used. The policy is
    the one active when `prefetch` is called, unless given.

    Raises:
        ValueError: if `size` is less than 1.

    Example:
        >>> import devpolicy, numpy as np
        >>> rules = [{"match": "batch", "device": "cpu:2"}]
        >>> p = devpolicy.load_policy({"version": 1, "rules": rules})
        >>> batches = (np.full(4, i) for i in range(3))
        >>> [str(next(iter(b.devices()))) for b in devpolicy.prefetch(batches, policy=p)]
        ['cpu:2', 'cpu:2', 'cpu:2']
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"prefetch size must be an int >= 1, got {size!r}")
    if not isinstance(name, str):
        raise TypeError(f"prefetch name must be a str, got {type(name).__name__} {name!r}")
    if policy is None:
        from ._active import active_policy

        policy = active_policy()
    return _prefetched(iter(iterable), name, size, policy)


def _prefetched(source: Iterator[T], name: str, size: int, policy: Policy) -> Iterator[T]:
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
            in_flight.append(policy.put(name, item))

    fill()
    while in_flight:
        current = in_flight.popleft()
        fill()
        yield current
    if failure is not None:
        raise failure
