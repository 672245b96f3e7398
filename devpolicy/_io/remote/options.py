"""How remote reads are paced and retried: defaults < `DEVPOLICY_REMOTE_*` < keywords.

Defaults, measured against SeaweedFS's S3 gateway on this project's 2-core machine (see
`benchmarks/results/remote.md`): 8 concurrent requests of 8 MiB reached the throughput of
raw concurrent GETs (16 gained nothing, 4 lost 40%); 8 MiB is also the Run:ai streamer's
chunk. The in-flight budget (bytes asked and not yet received) defaults to 128 MiB, so
concurrency x chunk (64 MiB) fits with room; it caps the concurrency actually used when a
caller raises the chunk size. Retries: 8 attempts per range, backoff from 0.1 s doubling up
to 5 s with full jitter (three 503s cost 0.7 s at most), and 120 s in all per range.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path

from ..._base.errors import EnvOverrideError
from ..._base.sizes import SIZE_FORMS, parse_size
from .errors import RemoteOptionError

ENV_PREFIX = "DEVPOLICY_REMOTE_"
_INT = re.compile(r"^[0-9]{1,9}$")
_SECONDS = re.compile(r"^[0-9]{1,9}(\.[0-9]{1,9})?$")


@dataclass(frozen=True)
class RemoteOptions:
    """Options of remote reads.

    Attributes:
        concurrency: Requests in flight at once per object (1-256).
        chunk_bytes: The largest request; longer ranges are split (64 KiB to 1 GiB).
        inflight_bytes: Bytes asked and not yet received, at most (at least `chunk_bytes`,
            at most 4 GiB); concurrency is lowered to fit it.
        attempts: Tries per range before giving up (1-100).
        backoff_seconds: The first retry's backoff; each further one doubles it.
        backoff_cap_seconds: The longest single backoff.
        total_seconds: The longest time one range may take, retries included.
        timeout_seconds: Connecting, and each wait for bytes, at most this long.
        cache_dir: A directory to keep fetched objects in (None: no cache).
    """

    concurrency: int = 8
    chunk_bytes: int = 8 * 2**20
    inflight_bytes: int = 128 * 2**20
    attempts: int = 8
    backoff_seconds: float = 0.1
    backoff_cap_seconds: float = 5.0
    total_seconds: float = 120.0
    timeout_seconds: float = 30.0
    cache_dir: Path | None = None

    @property
    def streams(self) -> int:
        """Requests actually run at once: `concurrency`, lowered to fit `inflight_bytes`."""
        return max(1, min(self.concurrency, self.inflight_bytes // self.chunk_bytes))

    def backoff(self, retry: int) -> float:
        """The most to wait before retry number `retry` (1 for the first); callers jitter it."""
        return float(min(self.backoff_cap_seconds, self.backoff_seconds * 2.0 ** (retry - 1)))


# name -> (environment suffix, kind, low, high); kinds: int, size, seconds, path.
_SPECS: dict[str, tuple[str, str, float, float]] = {
    "concurrency": ("CONCURRENCY", "int", 1, 256),
    "chunk_bytes": ("CHUNK", "size", 64 * 2**10, 2**30),
    "inflight_bytes": ("INFLIGHT", "size", 64 * 2**10, 4 * 2**30),
    "attempts": ("ATTEMPTS", "int", 1, 100),
    "backoff_seconds": ("BACKOFF", "seconds", 0.0, 60.0),
    "backoff_cap_seconds": ("BACKOFF_CAP", "seconds", 0.0, 600.0),
    "total_seconds": ("TOTAL_TIME", "seconds", 0.001, 86400.0),
    "timeout_seconds": ("TIMEOUT", "seconds", 0.001, 3600.0),
    "cache_dir": ("CACHE", "path", 0, 0),
}


def env_name(option: str) -> str:
    """The environment variable of `option` (`DEVPOLICY_REMOTE_CHUNK` for `chunk_bytes`)."""
    return ENV_PREFIX + _SPECS[option][0]


def _accepted(kind: str, low: float, high: float) -> str:
    if kind == "int":
        return f"a whole number from {int(low)} to {int(high)}"
    if kind == "size":
        return f"{SIZE_FORMS}, from {int(low)} to {int(high)} bytes"
    if kind == "seconds":
        return f"a number of seconds from {low:g} to {high:g}"
    return "a directory path"


def _check(option: str, value: object) -> object:
    """`value` as `option` holds it; ValueError(problem) if it cannot be."""
    kind, low, high = _SPECS[option][1:]
    if kind == "path":
        if value is None:
            return None
        if not isinstance(value, str | os.PathLike) or not os.fspath(value):
            raise ValueError("not a directory path")
        return Path(os.fspath(value))
    if kind == "size":
        number: float = parse_size(value)
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    elif kind == "int" and not isinstance(value, int):
        raise ValueError("not a whole number")
    else:
        number = value
    if not math.isfinite(number) or not low <= number <= high:
        raise ValueError("out of range")
    return float(number) if kind == "seconds" else int(number)


def _from_text(option: str, text: str) -> object:
    kind = _SPECS[option][1]
    if kind == "path":
        return text
    if kind == "int":
        if _INT.match(text) is None:
            raise ValueError("not a whole number")
        return int(text)
    if kind == "seconds":
        if _SECONDS.match(text) is None:
            raise ValueError("not a plain number of seconds")
        return float(text)
    return text


def resolve_options(
    environ: Mapping[str, str] | None = None,
    base: RemoteOptions | None = None,
    **keywords: object,
) -> RemoteOptions:
    """The options in force: `base` (default: the defaults), then `DEVPOLICY_REMOTE_*` from
    `environ` (default: `os.environ`), then `keywords`, later winning.

    Raises:
        EnvOverrideError: a variable that cannot be read; the message names it and the
            accepted forms.
        RemoteOptionError: an unknown keyword (listing the known ones) or a bad value.

    Example:
        >>> o = resolve_options({"DEVPOLICY_REMOTE_CHUNK": "16MiB"}, concurrency=4)
        >>> o.chunk_bytes, o.concurrency
        (16777216, 4)
    """
    environ = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for option, (suffix, kind, low, high) in _SPECS.items():
        variable = ENV_PREFIX + suffix
        text = environ.get(variable)
        if text is None:
            continue
        try:
            values[option] = _check(option, _from_text(option, text.strip()))
        except ValueError as e:
            raise EnvOverrideError(variable, text, str(e), _accepted(kind, low, high)) from None
    known = {f.name for f in fields(RemoteOptions)}
    for option, value in keywords.items():
        if option not in known:
            raise RemoteOptionError(option, value, "unknown option", ", ".join(sorted(known)))
        try:
            values[option] = _check(option, value)
        except ValueError as e:
            kind, low, high = _SPECS[option][1:]
            raise RemoteOptionError(option, value, str(e), _accepted(kind, low, high)) from None
    options = replace(base or RemoteOptions(), **values)  # type: ignore[arg-type]
    if options.inflight_bytes < options.chunk_bytes:
        raise RemoteOptionError(
            "inflight_bytes",
            options.inflight_bytes,
            f"smaller than chunk_bytes ({options.chunk_bytes}): no request would fit",
            f"at least chunk_bytes (set by keyword or {env_name('inflight_bytes')})",
        )
    return options
