"""`RemoteObject`: the byte source of one remote file, read in checked, retried ranges.

It implements the loader's `ByteSource` seam (`name`, `size`, `fileno() -> None`,
`read_into`, `read_many`, `close`). `read_many` sorts the requests, joins neighbours whose
gap is small (`COALESCE_GAP`), cuts the joined spans into requests of at most `chunk_bytes`,
and runs them on `streams` threads; each response's body is received straight into the
caller's buffers (a gap between two of them into a scratch buffer), so a read holds no copy
of the data.

Every response is checked before a byte is kept: the status (206, or 200 only when the whole
object was asked), `Content-Range` (the range asked, the size first seen), `Content-Length`
and the version (ETag or generation). A status of 408, 429 or 5xx, a reset, a timeout or a
body cut short is retried for that range alone (from the first byte not yet received), after
a capped exponential backoff with full jitter, within `attempts` and `total_seconds`; what
fails for good raises `RemoteReadError` naming the URL, the range, the status and the
attempts. Nothing partial is returned.
"""

from __future__ import annotations

import random
import re
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from .backend import Backend, Stat
from .errors import (
    ObjectChangedError,
    RangeIgnoredError,
    RemoteReadError,
)
from .http import Dropped, Pool, Response
from .options import RemoteOptions

#: Requests whose gap is at most this many bytes are joined into one (object_store's figure:
#: a request costs more than reading a mebibyte on any link worth using).
COALESCE_GAP = 2**20
#: Bytes fetched with the first small read and kept, so the header's two reads (its length,
#: then the header) cost one request together.
HEAD_BYTES = 64 * 2**10
RETRIED = frozenset({408, 429, 500, 502, 503, 504})


def paused_to_retry(options: RemoteOptions, attempts: int, began: float) -> bool:
    """After failed attempt `attempts` of a request first sent at `began` (monotonic):
    False when the attempts or the time are spent; else True, once a jittered backoff
    (never past the time left) has passed."""
    waited = time.monotonic() - began
    if attempts == options.attempts or waited >= options.total_seconds:
        return False
    time.sleep(min(random.uniform(0, options.backoff(attempts)),
                   max(0.0, options.total_seconds - waited)))  # fmt: skip
    return True


_CONTENT_RANGE = re.compile(r"^bytes ([0-9]+)-([0-9]+)/([0-9]+|\*)$")

Emit = Callable[[str, str, Mapping[str, Any]], None]


def _default_emit(level: str, event: str, fields: Mapping[str, Any]) -> None:
    """Events through structlog when the application configured it (else nowhere): the
    loader passes its own `EventLog.emit` instead."""
    import structlog

    if structlog.is_configured():
        getattr(structlog.get_logger("devpolicy"), level)(event, **fields)


@dataclass
class Counters:
    """What a source's reads cost: requests sent, retries among them, body bytes received,
    and seconds spent in `read_into`/`read_many` (wall time, not summed over threads)."""

    requests: int = 0
    retries: int = 0
    bytes: int = 0
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, *, requests: int = 0, retries: int = 0, nbytes: int = 0) -> None:
        """Count one request's worth."""
        with self._lock:
            self.requests += requests
            self.retries += retries
            self.bytes += nbytes

    def as_fields(self) -> dict[str, Any]:
        """The counters as event fields."""
        with self._lock:
            return {
                "requests": self.requests,
                "retries": self.retries,
                "bytes_fetched": self.bytes,
                "fetch_seconds": round(self.seconds, 3),
            }


@dataclass
class _Piece:
    offset: int
    view: memoryview | range  # a range: a piece counted by `planned_requests`, not read


@dataclass
class _Span:
    start: int
    end: int
    pieces: list[_Piece]


class RemoteObject:
    """One remote file, opened: its size and version known, read by ranges.

    Thread-safe: several threads may call `read_into`/`read_many` at once. Not a context
    manager of its own making: call `close()` (or use `contextlib.closing`).
    """

    def __init__(self, backend: Backend, options: RemoteOptions, emit: Emit | None = None) -> None:
        self._backend = backend
        self.options = options
        self.counters = Counters()
        self._emit = emit or _default_emit
        self._pool = Pool(options.timeout_seconds)
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._head: bytes | None = None
        self._failed: RemoteReadError | None = None
        try:
            self.stat = self._stat()
        except BaseException:
            self.close()
            raise
        backend.stat = self.stat

    # -- the ByteSource seam ------------------------------------------------------------

    @property
    def name(self) -> str:
        """The URL as shown: no credentials, no query string."""
        return self._backend.name

    @property
    def size(self) -> int:
        """The object's size in bytes, as first seen."""
        return self.stat.size

    @property
    def version(self) -> str | None:
        """The object's version (ETag, generation) as first seen; None if it has none."""
        return self.stat.version

    def identity(self) -> str:
        """What names these bytes for a cache (the URL shown, the version, the size)."""
        return self._backend.identity()

    def fileno(self) -> int | None:
        """None: there is no local file to map."""
        return None

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill `buffer` with the bytes from `offset`, or raise (never short).

        The first small read near the start fetches `HEAD_BYTES` and keeps them, so a
        header's two reads cost one request.
        """
        view = _bytes_view(buffer)
        self._check_range(offset, len(view))
        end = offset + len(view)
        if end <= HEAD_BYTES and len(view) < HEAD_BYTES:
            head = self._head_bytes()
            if end <= len(head):
                view[:] = head[offset:end]
                return
        self.read_many([(offset, view)])

    def read_many(self, requests: Sequence[tuple[int, memoryview]]) -> None:
        """Fill each `(offset, buffer)`; requests run concurrently; all are filled or it raises."""
        pieces = []
        for offset, buffer in requests:
            view = _bytes_view(buffer)
            self._check_range(offset, len(view))
            if len(view):
                pieces.append(_Piece(offset, view))
        if not pieces:
            return
        spans = self._plan(pieces)
        if self._failed is not None:
            raise RemoteReadError(
                self.name,
                f"the server was found unreachable by an earlier read ({self._failed}); "
                "nothing more is asked of it",
                byte_range=(spans[0].start, spans[-1].end), attempts=0,
            )  # fmt: skip
        began = time.monotonic()
        cancel = threading.Event()
        try:
            if len(spans) == 1:
                self._fetch(spans[0], cancel)
            else:
                executor = self._threads()
                futures = [executor.submit(self._fetch, span, cancel) for span in spans]
                done, pending = wait(futures, return_when=FIRST_EXCEPTION)
                if pending:  # one failed for good: the others stop, those not begun at once
                    cancel.set()
                    for future in pending:
                        future.cancel()
                    wait(pending)
                failures = [
                    e for f in futures if not f.cancelled()
                    for e in [f.exception()] if e is not None and not isinstance(e, _Cancelled)
                ]  # fmt: skip
                del futures, done, pending
                if failures:
                    # The others' frames hold views of the caller's buffers (a cache's map
                    # among them) in reference cycles: let them go now, not at a collection.
                    for other in failures[1:]:
                        forget_frames(other)
                    raise failures[0]
        finally:
            with self.counters._lock:
                self.counters.seconds += time.monotonic() - began

    def release(self) -> None:
        """Let go of the reading threads and idle connections while the source waits (the
        loader reads every file's header first): the next read makes them anew, of the
        same version."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        self._pool.close()

    def close(self) -> None:
        """Stop the reading threads and close the connections, the backend's too."""
        self.release()
        self._backend.close()

    def __repr__(self) -> str:
        return f"RemoteObject({self.name!r}, size={self.size})"

    # -- planning -----------------------------------------------------------------------

    def _check_range(self, offset: int, length: int) -> None:
        if offset < 0 or offset + length > self.size:
            raise ValueError(
                f"{self.name}: bytes {offset}-{offset + length - 1} are outside the object "
                f"({self.size} bytes)"
            )

    def _plan(self, pieces: list[_Piece]) -> list[_Span]:
        return _spans(pieces, self.options.chunk_bytes)

    def _threads(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    self.options.streams, thread_name_prefix="devpolicy-remote"
                )
            return self._executor

    def _head_bytes(self) -> bytes:
        with self._lock:
            head = self._head
        if head is None:
            fetched = bytearray(min(HEAD_BYTES, self.size))
            self.read_many([(0, memoryview(fetched))])
            head = bytes(fetched)
            with self._lock:
                self._head = head
        return head

    # -- one range, retried ---------------------------------------------------------------

    def _fetch(self, span: _Span, cancel: threading.Event | None = None) -> None:
        """Receive `span` into its pieces, retrying what is left after each failure, within
        `attempts` and `total_seconds` (a deadline every wait honours). When another range
        of the same read failed for good (`cancel` set), stop at once.

        Raises:
            RemoteReadError: failed for good (and `cancel` set); `_Cancelled` when stopped.
        """
        options = self.options
        began = time.monotonic()
        deadline = began + options.total_seconds
        attempts = 0
        status: int | None = None
        start = span.start
        pieces = list(span.pieces)
        while True:
            if cancel is not None and cancel.is_set():
                raise _Cancelled
            attempts += 1
            try:
                received = self._attempt(start, span.end, pieces, attempts, deadline)
            except _Retry as failed:
                # Its fields, not the exception: its frames hold views of the buffers.
                problem, status, received = failed.problem, failed.status, failed.received
                at_once = failed.at_once
                forget_frames(failed)
            else:
                return
            start, pieces = _advance(start, pieces, received)
            waited = time.monotonic() - began
            if attempts >= options.attempts or waited >= options.total_seconds:
                limit = (f"{options.attempts} attempts" if attempts >= options.attempts
                         else f"{options.total_seconds:g} s (total_time)")  # fmt: skip
                failure = RemoteReadError(
                    self.name,
                    f"{problem}; gave up after {limit}",
                    byte_range=(span.start, span.end),
                    status=status,
                    attempts=attempts,
                )
                if cancel is not None:
                    cancel.set()
                if status is None:  # no answer at all: the server is unreachable
                    self._failed = failure
                raise failure
            delay = 0.0 if at_once else random.uniform(0, options.backoff(attempts))
            delay = min(delay, max(0.0, options.total_seconds - waited))
            self.counters.add(retries=1)
            self._emit("info", "remote_retry", {
                "url": self.name, "range": f"{span.start}-{span.end - 1}", "status": status,
                "problem": problem, "attempt": attempts, "delay_s": round(delay, 3),
            })  # fmt: skip
            if cancel is not None and cancel.wait(delay):
                raise _Cancelled
            if cancel is None:
                time.sleep(delay)

    def _attempt(
        self, start: int, end: int, pieces: list[_Piece], attempts: int, deadline: float
    ) -> int:
        """One request for bytes `start`..`end`; returns the bytes received, or raises `_Retry`
        (with what was received before the failure) or a final error."""
        url, headers = self._backend.data_request(start, end)
        whole = start == 0 and end == self.size
        headers["Range"] = f"bytes={start}-{end - 1}"
        headers["Accept-Encoding"] = "identity"  # the bytes as stored, never compressed
        self.counters.add(requests=1)
        try:
            response = self._pool.request("GET", url, headers, deadline=deadline)
        except Dropped as e:
            raise _Retry(e.problem, None, 0) from e
        status = response.status
        if status == 200 and not whole:
            response.close()
            raise RangeIgnoredError(
                self.name,
                "the server ignored Range and sent the whole object (status 200); "
                "devpolicy reads only servers that honour Range",
                byte_range=(start, end), status=status, attempts=attempts,
            )  # fmt: skip
        if status not in (200, 206):
            self._refuse(response, start, end, attempts)
        self._check_response(response, start, end, attempts)
        received = 0
        position = start
        try:
            for piece in pieces:
                if piece.offset > position:
                    response.discard(piece.offset - position)
                    received += piece.offset - position
                assert isinstance(piece.view, memoryview)  # a range only in `planned_requests`
                response.read_into(piece.view)
                received += len(piece.view)
                position = piece.offset + len(piece.view)
            if position < end:
                response.discard(end - position)
                received += end - position
        except Dropped as e:
            self.counters.add(nbytes=received + e.received)
            raise _Retry(e.problem, status, received + e.received) from e
        self.counters.add(nbytes=received)
        response.finish()
        return received

    def _check_response(self, response: Response, start: int, end: int, attempts: int) -> None:
        """The response is the range asked of the version first seen, as stored, or raise."""
        encoding = (response.header("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":
            response.close()
            raise RemoteReadError(
                self.name,
                f"the server sent the bytes encoded (Content-Encoding {encoding[:40]!r}) though "
                "only the bytes as stored (identity) were asked; they are not the file's bytes",
                byte_range=(start, end), status=response.status, attempts=attempts,
            )  # fmt: skip
        length = response.header("Content-Length")
        if response.status == 206:
            match = _CONTENT_RANGE.match(response.header("Content-Range") or "")
            if match is None or (int(match.group(1)), int(match.group(2))) != (start, end - 1):
                response.close()
                raise RemoteReadError(
                    self.name,
                    f"the server sent Content-Range {response.header('Content-Range')!r} "
                    f"for bytes {start}-{end - 1}",
                    byte_range=(start, end), status=response.status, attempts=attempts,
                )  # fmt: skip
            total = match.group(3)
            if total != "*" and int(total) != self.size:
                response.close()
                raise ObjectChangedError(
                    self.name,
                    f"the object's size changed since it was opened ({self.size} then {total} "
                    "bytes); its bytes would mix two versions",
                    byte_range=(start, end), status=response.status, attempts=attempts,
                )  # fmt: skip
        if length is not None and length.isdigit() and int(length) != end - start:
            response.close()
            raise RemoteReadError(
                self.name,
                f"the server sent Content-Length {length} for {end - start} bytes",
                byte_range=(start, end), status=response.status, attempts=attempts,
            )  # fmt: skip
        try:
            self._backend.check_version(response, start, end, attempts)
        except ObjectChangedError:
            response.close()
            raise

    def _refuse(self, response: Response, start: int, end: int, attempts: int) -> None:
        """A status other than 200/206: retry (raise `_Retry`) or fail for good."""
        status = response.status
        response.close()
        if status in RETRIED:
            raise _Retry(f"status {status}", status, 0)
        if self._backend.expired(status):
            raise _Retry(f"status {status}: the link expired", status, 0, at_once=True)
        if status in (404, 412, 416):
            # The object was there at open: now its version (or it) is gone.
            raise ObjectChangedError(
                self.name,
                "the object changed since it was opened (the server no longer has that "
                "version or size); its bytes would mix two versions",
                byte_range=(start, end), status=status, attempts=attempts,
            )  # fmt: skip
        raise RemoteReadError(
            self.name,
            _refusal(status, self._backend),
            byte_range=(start, end), status=status, attempts=attempts,
        )  # fmt: skip

    def _stat(self) -> Stat:
        """The object's size and version, with the same retries as a data read."""
        options = self.options
        began = time.monotonic()
        backend = self._backend
        request = backend.stat_request()
        for attempts in range(1, options.attempts + 1):
            method, url, headers, follow = request
            self.counters.add(requests=1)
            status: int | None = None
            try:
                response = self._pool.request(
                    method, url, headers, follow=follow, deadline=began + options.total_seconds
                )
                status = response.status
                if status < 400:
                    try:
                        return backend.stat_of(response, self._pool)
                    finally:
                        response.close()
                fallback = getattr(backend, "fallback_request", None)
                if status in (403, 405, 501) and fallback is not None and request[0] == "HEAD":
                    response.small_body(0)
                    request = fallback()
                    continue
                response.close()
                if status not in RETRIED:
                    raise RemoteReadError(self.name, _refusal(status, backend),
                                          status=status, attempts=attempts)  # fmt: skip
                problem = f"status {status}"
            except Dropped as e:
                problem = e.problem
            if not paused_to_retry(options, attempts, began):
                raise RemoteReadError(self.name, f"{problem}; gave up opening it",
                                      status=status, attempts=attempts)  # fmt: skip
            self.counters.add(retries=1)
        raise AssertionError("unreachable")  # pragma: no cover


def forget_frames(error: BaseException) -> None:
    """Clear the finished frames of `error`'s tracebacks (its cause's and context's too), so
    that the views of the buffers they hold are let go now: a map (the cache's) can then be
    closed, where else closing it raises `BufferError` over the real error."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        todo += [e.__cause__, e.__context__]


def _spans(pieces: list[_Piece], chunk: int) -> list[_Span]:
    """Join neighbouring pieces (gap <= COALESCE_GAP, no overlap) and cut into chunks."""
    pieces.sort(key=lambda p: p.offset)
    joined: list[_Span] = []
    for piece in pieces:
        end = piece.offset + len(piece.view)
        last = joined[-1] if joined else None
        if last is not None and last.end <= piece.offset <= last.end + COALESCE_GAP:
            last.pieces.append(piece)
            last.end = end
        else:
            joined.append(_Span(piece.offset, end, [piece]))
    spans: list[_Span] = []
    for span in joined:
        if span.end - span.start <= chunk:
            spans.append(span)
            continue
        cut = _Span(span.start, span.start, [])
        for piece in span.pieces:
            offset, view = piece.offset, piece.view
            if cut.pieces and offset - cut.start >= chunk:
                spans.append(cut)
                cut = _Span(offset, offset, [])
            while view:
                room = cut.start + chunk - offset
                if room <= 0:
                    spans.append(cut)
                    cut = _Span(offset, offset, [])
                    room = chunk
                take = min(room, len(view))
                cut.pieces.append(_Piece(offset, view[:take]))
                cut.end = offset + take
                offset += take
                view = view[take:]
        if cut.pieces:
            spans.append(cut)
    return spans


def planned_requests(ranges: Sequence[tuple[int, int]], chunk_bytes: int) -> tuple[int, int]:
    """(requests, bytes fetched) of one `read_many` of `ranges` ((offset, length) each), as a
    `RemoteObject` with `chunk_bytes` sends it: neighbours joined (`COALESCE_GAP`), then cut
    into chunks; the bytes count the small gaps fetched between joined neighbours.

    Example:
        >>> planned_requests([(0, 100), (200, 100), (10 * 2**20, 5)], 2**20)
        (2, 305)
    """
    pieces = [_Piece(offset, range(length)) for offset, length in ranges if length]
    spans = _spans(pieces, chunk_bytes)
    return len(spans), sum(span.end - span.start for span in spans)


class _Cancelled(Exception):  # noqa: N818 - internal: another range of the read failed for good
    pass


class _Retry(Exception):  # noqa: N818 - internal control flow of `_fetch`
    def __init__(self, problem: str, status: int | None, received: int, *, at_once: bool = False):
        self.problem = problem
        self.status = status
        self.received = received
        self.at_once = at_once
        super().__init__(problem)


def _advance(start: int, pieces: list[_Piece], received: int) -> tuple[int, list[_Piece]]:
    """What is left of a span after `received` bytes from `start` came."""
    position = start + received
    left = []
    for piece in pieces:
        end = piece.offset + len(piece.view)
        if end <= position:
            continue
        if piece.offset < position:
            left.append(_Piece(position, piece.view[position - piece.offset :]))
        else:
            left.append(piece)
    return position, left


def _bytes_view(buffer: memoryview | bytearray) -> memoryview:
    view = memoryview(buffer)
    if view.readonly:
        raise TypeError("the buffer to read into is read-only")
    if not view.c_contiguous:
        raise TypeError("the buffer to read into is not contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _refusal(status: int, backend: Backend) -> str:
    """Why a status means the object cannot be read, in words. Never the response's body: an
    S3 error body can quote the request's credential scope."""
    if status in (401, 403):
        return f"access refused; {backend.auth_hint()}"
    if status == 404:
        return "no such object (or no access to it)"
    return "the server refused the read"
