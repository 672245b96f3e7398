"""Threads that carry devpolicy's context: the active policy, the scope's device, `transfers:`.

`ThreadPoolExecutor` is the standard library's, each task run in the submitting thread's
context; `devpolicy.propagate(fn)` (at the top level) wraps one function the same way. Here,
not at the top level, so that `from devpolicy import *` never shadows
`concurrent.futures.ThreadPoolExecutor`. See [Threads, async and
multi-process](concurrency.md).

Example:
    >>> from devpolicy.threads import ThreadPoolExecutor
    >>> with ThreadPoolExecutor(2) as pool:
    ...     sorted(pool.map(abs, [-2, 1]))
    [1, 2]
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_names

if TYPE_CHECKING:
    from ._api import ThreadPoolExecutor as ThreadPoolExecutor

__all__ = ["ThreadPoolExecutor"]

# Hidden from type checkers, so that a misspelt name is an error there rather than `Any`.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_names(__name__, __all__)
