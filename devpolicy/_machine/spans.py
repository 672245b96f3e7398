"""Spans in the profiler's trace for what devpolicy does on the caller's behalf: a
stream's wait inside `next()`, the reading and placing of its groups, `load_file`'s reads
and transfers, a save. They show beside the step in the trace JAX users already read
(`jax.profiler.trace`, viewed in TensorBoard or Perfetto), so a slow batch or a slow load
is named, not an unexplained gap. With no trace active a span is one check of the
profiler (about 40 ns on this CPU) and nothing else: docs/benchmarks.md ("Watching the
loop"). Their names are listed in docs/report.md ("In the profiler's trace").
"""

from __future__ import annotations

import contextlib
from typing import Any

from jax.profiler import TraceAnnotation

#: The spans' names, one per thing devpolicy does for the caller.
STREAM_NEXT = "devpolicy.stream.next"
STREAM_READ = "devpolicy.stream.read"
STREAM_PLACE = "devpolicy.stream.place"
LOAD_READ = "devpolicy.load_file.read"
LOAD_TRANSFER = "devpolicy.load_file.transfer"
SAVE = "devpolicy.save"
NAMES = (STREAM_NEXT, STREAM_READ, STREAM_PLACE, LOAD_READ, LOAD_TRANSFER, SAVE)

_NOTHING = contextlib.nullcontext()
_tracing = TraceAnnotation.is_enabled


def span(what: str, /, **metadata: Any) -> contextlib.AbstractContextManager[Any]:
    """A span `what` in the profiler's trace (its `metadata` shown with it) while a trace
    is being taken; else a context that does nothing.

    Example:
        >>> with span(STREAM_READ, name="batch", batches=8):
        ...     pass
    """
    if not _tracing():
        return _NOTHING
    return TraceAnnotation(what, **metadata)


def tracing() -> bool:
    """Whether a trace is being taken now (a span would be recorded)."""
    return bool(_tracing())
