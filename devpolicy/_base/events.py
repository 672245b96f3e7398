"""devpolicy's events: structlog, without reconfiguring the application's logging.

If the application has configured structlog, events go through its configuration.
Otherwise, by the policy's `logging.format`: `auto` (the default) sends them to stdlib
logging when the application has set up handlers (`logging.basicConfig(...)`), else
renders them on stderr; `console`/`json` render on stderr; `stdlib` uses the `devpolicy`
logger. Nothing global is configured.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .limits import SEEN_LIMIT
from .visible import visible

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
LOGGER_NAME = "devpolicy"


_reported: set[tuple[type[BaseException], str]] = set()
# This process's index in a multi-process run, once a backend has started (it cannot
# change after that); None until then.
_started_index: int | None = None


def process_index() -> int:
    """This process's index (0 unless `jax.distributed` says otherwise); never starts JAX.

    An event can come before any backend has started (`bootstrap`'s `runtime` event must:
    the knobs it reports take effect at start), so the index is read without starting
    one: from `jax.distributed`'s state until a backend runs, then from the backend once
    and kept.

    Example:
        >>> process_index()
        0
    """
    global _started_index
    if _started_index is not None:
        return _started_index
    jax = sys.modules.get("jax")
    if jax is None:  # no process of a multi-process job gets here: it imported JAX
        return 0
    from jax._src import distributed, xla_bridge

    if xla_bridge.backends_are_initialized():
        _started_index = int(jax.process_index())
        return _started_index
    return int(distributed.global_state.process_id or 0)


class _StderrLogger:
    """Writes each rendered event as a line to whatever `sys.stderr` is at that moment."""

    def msg(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    debug = info = warning = error = critical = exception = fatal = log = msg


def _drop_none(_logger: Any, _method: str, event_dict: Any) -> Any:
    # For people reading a terminal only; json and stdlib keep every field.
    return {k: v for k, v in event_dict.items() if v is not None}


def _visible_fields(_logger: Any, _method: str, event_dict: Any) -> Any:
    # Names, files and metadata come from files anyone may have written: an escape
    # sequence, `\r` or newline in one must not rewrite the terminal or forge a log line.
    # JSON needs none of this: its encoder writes every control character as `\u001b`.
    # Other values are rendered by `repr`, which escapes them already.
    return {k: visible(v) if isinstance(v, str) else v for k, v in event_dict.items()}


def _structlog() -> Any:
    # Imported when the first event is emitted, not with devpolicy: structlog brings rich
    # and pygments (about 0.1 s), which a program that logs nothing never needs.
    import structlog

    return structlog


def _own_logger(level: str, fmt: str) -> Any:
    structlog = _structlog()
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    wrapper = structlog.make_filtering_bound_logger(LEVELS[level])
    if fmt == "stdlib":
        processors: list[Any] = [
            _visible_fields,
            structlog.processors.LogfmtRenderer(key_order=["event"]),
        ]
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
            _visible_fields,
            structlog.processors.add_log_level,
            timestamper,
            structlog.dev.ConsoleRenderer(colors=colors),
        ]
        target = _StderrLogger()
    return structlog.wrap_logger(target, processors=processors, wrapper_class=wrapper).bind()


_NO_HANDLER_NOTE = (
    "devpolicy: logging.format is 'stdlib' but stdlib logging has no handler for the "
    "'devpolicy' logger (nothing would be written); devpolicy's events go to stderr instead. "
    "Configure logging (logging.basicConfig(...)) or use format 'auto'."
)
_noted: set[str] = set()


def _level_chosen(logger: logging.Logger) -> bool:
    """Whether the `devpolicy` logger or an ancestor below the root has a level set."""
    current: logging.Logger | None = logger
    while current is not None and current.parent is not None:
        if current.level != logging.NOTSET:
            return True
        current = current.parent
    return False


def _inherited_fields(logger: logging.Logger, level: str) -> dict[str, str]:
    """The `logging_rerouted` event: stdlib would drop `level` events only by the root's
    inherited level, so devpolicy's own output shows them on stderr instead."""
    root = logging.getLevelName(logger.getEffectiveLevel())
    return {
        "root_level": root,
        "reason": f"stdlib logging has handlers, but the root logger's level ({root}) would "
        f"drop devpolicy's {level} events (a bare logging.basicConfig(), as absl makes): "
        "they go to stderr instead",
        "fix": "to keep them in stdlib logging: logging.getLogger('devpolicy')"
        ".setLevel(logging.INFO); to drop them: set that logger's level yourself, or "
        "devpolicy's `logging.level`",
    }


def _dropped_note(logger: logging.Logger, level: str) -> str:
    root = logging.getLevelName(logger.getEffectiveLevel())
    return (
        f"devpolicy: logging.format is 'stdlib', and the root logger's level ({root}) drops "
        f"devpolicy's {level} events (nobody set a level for the 'devpolicy' logger). To "
        "keep them: logging.getLogger('devpolicy').setLevel(logging.INFO); to drop them "
        "without this note: set that logger's level yourself, or devpolicy's `logging.level`."
    )


class EventLog:
    """Emits a policy's events at or above its level; set-up is done once, not per event.

    devpolicy's own level is applied before anything renders, whoever renders (its own
    output, the application's structlog, stdlib logging): an event below it costs nothing.
    Where events go is looked up at each emit (cheap), so an application that configures
    logging after loading a policy is followed.
    """

    def __init__(self, level: str, fmt: str) -> None:
        self.level = level
        self.format = fmt
        self._threshold = LEVELS[level]
        self._own: dict[str, Any] = {}
        self._app: Any = None
        self._app_key: tuple[int, ...] = ()
        # Hashes, not keys: a long job may see a great many names.
        self._seen: set[int] = set()

    def _logger(self, level: str) -> Any:
        """The logger to emit through, or None when stdlib would drop the event anyway."""
        structlog = _structlog()
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
        fmt = self.format
        if fmt in ("auto", "stdlib"):
            stdlib = logging.getLogger(LOGGER_NAME)
            if stdlib.hasHandlers():
                if stdlib.isEnabledFor(LEVELS[level]):
                    return self._own_for("stdlib")
                if _level_chosen(stdlib):
                    # The application chose this level for devpolicy's logger: its choice.
                    # Rendering what stdlib drops costs for nothing.
                    return None
                if fmt == "stdlib":
                    # Asked for stdlib, whose inherited root level drops the event: it
                    # really is lost, so say so once, whatever devpolicy's level.
                    if "dropped" not in _noted:
                        _noted.add("dropped")
                        print(_dropped_note(stdlib, level), file=sys.stderr)
                    return None
                # Only an inherited level (the root's WARNING, left by a bare
                # `logging.basicConfig()` such as absl's) would drop it: to stderr instead.
                # Nothing is lost, so why is told once at debug, not on every run.
                if "inherited" not in _noted:
                    _noted.add("inherited")
                    self._own_for("console").debug(
                        "logging_rerouted",
                        **_inherited_fields(stdlib, level),
                        process_index=process_index(),
                    )
            if fmt == "stdlib" and "stdlib" not in _noted:
                _noted.add("stdlib")
                print(_NO_HANDLER_NOTE, file=sys.stderr)
            fmt = "console"
        return self._own_for(fmt)

    def _own_for(self, fmt: str) -> Any:
        logger = self._own.get(fmt)
        if logger is None:
            logger = self._own[fmt] = _own_logger(self.level, fmt)
        return logger

    def enabled(self, level: str) -> bool:
        """Whether an event at `level` would be emitted."""
        return LEVELS[level] >= self._threshold

    def first_time(self, key: tuple[object, ...]) -> bool:
        """Whether `key` is new; records it. Cheap enough for the hot path."""
        digest = hash(key)
        if digest in self._seen:
            return False
        if len(self._seen) >= SEEN_LIMIT:
            # Only a job that makes names up without end gets here; it starts over
            # rather than grow without bound.
            self._seen.clear()
        self._seen.add(digest)
        return True

    def decided(
        self,
        key: tuple[object, ...],
        event: str,
        fields: Callable[[], Mapping[str, Any]],
        first_level: str = "info",
    ) -> None:
        """A fresh decision: `first_level` the first time `key` is seen, debug after."""
        if self.first_time(key):
            if self.enabled(first_level):
                self.emit(first_level, event, fields())
        else:
            self.repeat(event, fields)

    def repeat(self, event: str, fields: Callable[[], Mapping[str, Any]]) -> None:
        """A repeated decision: debug, its fields built only if someone will see it."""
        if self._threshold <= logging.DEBUG:
            self.emit("debug", event, fields())

    def emit(self, level: str, event: str, fields: Mapping[str, Any]) -> None:
        """Emit one event with flat fields, if `level` is at or above devpolicy's level.

        Every event carries `process_index` (added here unless the fields have it).

        A logging set-up that cannot take an event (stdlib's `extra` refuses a field called
        `name`, for one) must not break placement: like stdlib's own handlers, the failure
        is reported on stderr, once per kind, and the program goes on.
        """
        if LEVELS[level] < self._threshold:
            return
        try:
            logger = self._logger(level)
            if logger is None:
                return
            if "process_index" not in fields:
                fields = {**fields, "process_index": process_index()}
            getattr(logger, level)(event, **fields)
        except Exception as e:
            kind = (type(e), event)
            if kind not in _reported:
                _reported.add(kind)
                print(
                    f"devpolicy: the logging configuration could not take a {event!r} event "
                    f"({type(e).__name__}: {e}); placement goes on. Fields: {', '.join(fields)}",
                    file=sys.stderr,
                )
