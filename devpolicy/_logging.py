"""devpolicy's events: structlog, without reconfiguring the application's logging.

If the application has configured structlog, events go through its configuration.
Otherwise devpolicy renders them itself, by its policy's `logging:` settings, without
calling `structlog.configure`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

import structlog

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
LOGGER_NAME = "devpolicy"
# A long-running job resolves an unbounded stream of distinct keys only if it makes names
# up as it goes; past this the "first seen" memory starts over rather than grow.
_SEEN_LIMIT = 65_536


_reported: set[tuple[type[BaseException], str]] = set()


class _StderrLogger:
    """Writes each rendered event as a line to whatever `sys.stderr` is at that moment."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    debug = info = warning = error = critical = exception = fatal = log = msg


def _drop_none(_logger: Any, _method: str, event_dict: Any) -> Any:
    # For people reading a terminal only; json and stdlib keep every field.
    return {k: v for k, v in event_dict.items() if v is not None}


def _own_logger(level: str, fmt: str) -> Any:
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    wrapper = structlog.make_filtering_bound_logger(LEVELS[level])
    if fmt == "stdlib":
        processors: list[Any] = [structlog.processors.LogfmtRenderer(key_order=["event"])]
        target: Any = logging.getLogger(LOGGER_NAME)
    elif fmt == "json":
        processors = [
            structlog.processors.add_log_level,
            timestamper,
            structlog.processors.JSONRenderer(),
        ]
        target = _StderrLogger()
    else:
        colors = sys.stderr.isatty()
        processors = [
            _drop_none,
            structlog.processors.add_log_level,
            timestamper,
            structlog.dev.ConsoleRenderer(colors=colors),
        ]
        target = _StderrLogger()
    return structlog.wrap_logger(target, processors=processors, wrapper_class=wrapper).bind()


class EventLog:
    """Emits a policy's events; the expensive set-up is done once, not per event."""

    def __init__(self, level: str, fmt: str) -> None:
        self.level = level
        self.format = fmt
        self._own: Any = None
        self._app: Any = None
        self._app_key: tuple[int, ...] = ()
        self._seen: set[tuple[object, ...]] = set()
        self._debug_off = LEVELS[level] > logging.DEBUG

    def _logger(self) -> Any:
        if structlog.is_configured():
            config = structlog.get_config()
            key = (
                id(config["processors"]),
                id(config["wrapper_class"]),
                id(config["logger_factory"]),
                id(config["context_class"]),
            )
            if self._app is None or key != self._app_key:
                self._app = structlog.get_logger(LOGGER_NAME).bind()
                self._app_key = key
            return self._app
        if self._own is None:
            self._own = _own_logger(self.level, self.format)
        return self._own

    def first_time(self, key: tuple[object, ...]) -> bool:
        """Whether `key` is new; records it. Cheap enough for the hot path."""
        if key in self._seen:
            return False
        if len(self._seen) >= _SEEN_LIMIT:
            self._seen.clear()
        self._seen.add(key)
        return True

    def wants_debug(self) -> bool:
        """False when a debug event would certainly be dropped (skip building its fields)."""
        return not self._debug_off or structlog.is_configured()

    def emit(self, level: str, event: str, fields: Mapping[str, Any]) -> None:
        """Emit one event with flat fields.

        A logging set-up that cannot take an event (stdlib's `extra` refuses a field called
        `name`, for one) must not break placement: like stdlib's own handlers, the failure
        is reported on stderr, once per kind, and the program goes on.
        """
        try:
            getattr(self._logger(), level)(event, **fields)
        except Exception as e:
            kind = (type(e), event)
            if kind not in _reported:
                _reported.add(kind)
                print(
                    f"devpolicy: the logging configuration could not take a {event!r} event "
                    f"({type(e).__name__}: {e}); placement goes on. Fields: {', '.join(fields)}",
                    file=sys.stderr,
                )
