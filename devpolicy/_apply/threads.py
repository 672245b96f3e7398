"""Carrying the caller's device scope and active policy into other threads.

`jax.default_device` is thread-local: a thread, executor worker or `asyncio.to_thread`
started inside a scope does not see it (google/grain#975 is this bug in a data loader).
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ParamSpec, TypeVar

import jax

from .transfers import current_watch, watching

P = ParamSpec("P")
R = TypeVar("R")


def propagate(fn: Callable[P, R]) -> Callable[P, R]:
    """Wrap `fn` to run with the caller's current default device and devpolicy context.

    What is captured is taken now, when `propagate` is called: JAX's default device in
    this thread (a devpolicy scope, `@place` body or raw `jax.default_device`), the
    context variables, which carry `devpolicy.activate`, and the policy watching implicit
    transfers here (`transfers:`). Wherever the wrapper then runs
    (another thread, an executor, `asyncio.to_thread`), it runs inside both.

    Example:
        >>> import threading, devpolicy, jax.numpy as jnp
        >>> p = devpolicy.load_policy({"version": 1, "default": "cpu:2"})
        >>> out = []
        >>> with devpolicy.activate(p), devpolicy.scope("loader"):
        ...     t = threading.Thread(target=devpolicy.propagate(lambda: out.append(jnp.zeros(1))))
        ...     t.start(); t.join()
        >>> devpolicy.inventory().text(*out[0].devices())
        'cpu:2'
    """
    device = jax.config.jax_default_device  # type: ignore[attr-defined]
    context = contextvars.copy_context()
    watch = current_watch()

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        def call() -> R:
            with jax.default_device(device), watching(watch):
                return fn(*args, **kwargs)

        # A Context can be entered by one thread at a time; a copy per call lets the
        # wrapper run in several workers at once.
        return context.copy().run(call)

    return run


class ThreadPoolExecutor(concurrent.futures.ThreadPoolExecutor):
    """A `concurrent.futures.ThreadPoolExecutor` whose tasks run in the submitter's scope.

    `submit` and `map` capture the submitting thread's default device and devpolicy
    context at the time of the call (see `propagate`), so a data loader's workers put
    arrays where the code that scheduled them would have.

    Example:
        >>> import devpolicy, jax.numpy as jnp
        >>> with devpolicy.activate(devpolicy.load_policy({"version": 1, "default": "cpu:1"})):
        ...     with devpolicy.threads.ThreadPoolExecutor(2) as pool, devpolicy.scope("batches"):
        ...         arrays = list(pool.map(lambda i: jnp.full(2, i), range(3)))
        >>> {devpolicy.inventory().text(*a.devices()) for a in arrays}
        {'cpu:1'}
    """

    def submit(
        self, fn: Callable[..., R], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[R]:
        """Schedule `fn(*args, **kwargs)` to run in the caller's scope."""
        return super().submit(propagate(fn), *args, **kwargs)

    def map(self, fn: Callable[..., R], *iterables: Iterable[Any], **options: Any) -> Iterator[R]:
        """Like `Executor.map` (same options), each call in the caller's scope.

        `Executor.map` schedules through `submit`, which already carries the scope.
        """
        return super().map(fn, *iterables, **options)
