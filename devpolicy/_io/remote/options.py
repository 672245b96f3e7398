"""How remote reads are paced and retried: defaults < the policy's `remote:` <
`DEVPOLICY_REMOTE_*` < a call's `remote=` (or `open_remote`'s keywords).

The table of options (names, variables, bounds, checks) is `_document/remote.py`, which the
schema and the environment read too; the policy's layers are weighed in `_document/layers.py`.

Defaults, measured against SeaweedFS's S3 gateway on this project's 2-core machine (see
`benchmarks/results/remote.md`): 8 concurrent requests of 8 MiB reached the throughput of
raw concurrent GETs (16 gained nothing, 4 lost 40%); 8 MiB is also the Run:ai streamer's
chunk. The in-flight budget (bytes asked and not yet received) defaults to 128 MiB, so
concurrency x chunk (64 MiB) fits with room; it caps the concurrency actually used when a
caller raises the chunk size. Retries: 8 attempts per range, backoff from 0.1 s doubling up
to 5 s with full jitter (three 503s cost 0.7 s at most), and 120 s in all per range.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..._document.remote import (
    BY_ATTRIBUTE,
    BY_FIELD,
    ENV_PREFIX,
    OFFLINE_VARIABLE,
    from_environment,
    offline_of,
)
from .errors import RemoteOptionError
from .urls import RemoteURL

__all__ = [
    "ENV_PREFIX",
    "OFFLINE",
    "RemoteOptions",
    "env_name",
    "offline_switch",
    "options_of",
    "resolve_options",
]

#: Our offline switch, for every scheme: a complete cache entry is served with no request.
OFFLINE = OFFLINE_VARIABLE


def offline_switch(url: RemoteURL, environ: Mapping[str, str]) -> str | None:
    """The variable that makes reading `url` offline, or None: `DEVPOLICY_REMOTE_OFFLINE`
    for every scheme, and the Hub's own `HF_HUB_OFFLINE` for hf:// (read as
    `huggingface_hub` reads it: 1, ON, YES or TRUE).

    Raises:
        EnvOverrideError: `DEVPOLICY_REMOTE_OFFLINE` is neither yes nor no.

    Example:
        >>> from devpolicy._io.remote.urls import parse_url
        >>> offline_switch(parse_url("hf://org/repo/m.safetensors"), {"HF_HUB_OFFLINE": "1"})
        'HF_HUB_OFFLINE'
    """
    if offline_of(environ):
        return OFFLINE
    hub = environ.get("HF_HUB_OFFLINE", "").strip().upper()
    if url.scheme == "hf" and hub in ("1", "ON", "YES", "TRUE"):
        return "HF_HUB_OFFLINE"
    return None


def _default(attribute: str) -> Any:
    return BY_ATTRIBUTE[attribute].default


@dataclass(frozen=True)
class RemoteOptions:
    """Options of remote reads (the policy's `remote:` fields, by their attribute names).

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

    concurrency: int = _default("concurrency")
    chunk_bytes: int = _default("chunk_bytes")
    inflight_bytes: int = _default("inflight_bytes")
    attempts: int = _default("attempts")
    backoff_seconds: float = _default("backoff_seconds")
    backoff_cap_seconds: float = _default("backoff_cap_seconds")
    total_seconds: float = _default("total_seconds")
    timeout_seconds: float = _default("timeout_seconds")
    cache_dir: Path | None = None

    @property
    def streams(self) -> int:
        """Requests actually run at once: `concurrency`, lowered to fit `inflight_bytes`."""
        return max(1, min(self.concurrency, self.inflight_bytes // self.chunk_bytes))

    def backoff(self, retry: int) -> float:
        """The most to wait before retry number `retry` (1 for the first); callers jitter it."""
        return float(min(self.backoff_cap_seconds, self.backoff_seconds * 2.0 ** (retry - 1)))


def env_name(option: str) -> str:
    """The environment variable of `option` (`DEVPOLICY_REMOTE_CHUNK` for `chunk_bytes`)."""
    return BY_ATTRIBUTE[option].variable


def _fits(options: RemoteOptions, where: str) -> RemoteOptions:
    if options.inflight_bytes < options.chunk_bytes:
        raise RemoteOptionError(
            "inflight_bytes",
            options.inflight_bytes,
            f"smaller than chunk_bytes ({options.chunk_bytes}): no request would fit",
            f"at least chunk_bytes (set {where})",
        )
    return options


def resolve_options(
    environ: Mapping[str, str] | None = None,
    base: RemoteOptions | None = None,
    **keywords: object,
) -> RemoteOptions:
    """The options in force: `base` (default: the defaults), then `DEVPOLICY_REMOTE_*` from
    `environ` (default: `os.environ`), then `keywords` (attribute names), later winning.

    Raises:
        EnvOverrideError: a variable that cannot be read; the message names it and the
            accepted forms.
        RemoteOptionError: an unknown keyword (listing the known ones) or a bad value.

    Example:
        >>> o = resolve_options({"DEVPOLICY_REMOTE_CHUNK": "16MiB"}, concurrency=4)
        >>> o.chunk_bytes, o.concurrency
        (16777216, 4)
    """
    import os

    environ = os.environ if environ is None else environ
    values: dict[str, object] = {
        BY_FIELD[field].attribute: value for field, value in from_environment(environ).items()
    }
    for attribute, value in keywords.items():
        found = BY_ATTRIBUTE.get(attribute)
        if found is None:
            known = ", ".join(sorted(BY_ATTRIBUTE))
            raise RemoteOptionError(attribute, value, "unknown option", known)
        try:
            values[attribute] = found.check(value)
        except ValueError as e:
            raise RemoteOptionError(attribute, value, str(e), found.accepted) from None
    options = replace(base or RemoteOptions(), **values)  # type: ignore[arg-type]
    return _fits(options, f"by keyword or {env_name('inflight_bytes')}")


def options_of(
    settled: Mapping[str, object],
    call: Mapping[str, object] | None = None,
    *,
    base: RemoteOptions | None = None,
    environ: Mapping[str, str] | None = None,
) -> RemoteOptions:
    """The options in force for one call: `base` (default: the defaults), then
    `DEVPOLICY_REMOTE_*` of `environ` (default: `os.environ`), then `settled` (the policy's
    layers: file < `DEVPOLICY_REMOTE_*` < `load_policy(overrides=)`, by field), then `call`
    (a call's `remote=`, by field: `{"concurrency": 16, "cache": "/var/cache/models"}`),
    later winning. The variables are read and checked here too, so that they count (and a
    bad one is refused) the same with a policy or without one (an empty `settled`).

    Raises:
        EnvOverrideError: a `DEVPOLICY_REMOTE_*` variable that cannot be read, naming it
            and the accepted values.
        RemoteOptionError: `call` is not a mapping, or holds an unknown field (listing the
            known ones) or a bad value; or the in-flight budget is below the chunk size.

    Example:
        >>> options_of({"chunk": 16 * 2**20}, {"concurrency": 4}, environ={}).chunk_bytes
        16777216
    """
    import os

    environ = os.environ if environ is None else environ
    values: dict[str, object] = {
        BY_FIELD[field].attribute: value for field, value in from_environment(environ).items()
    }
    for field, value in settled.items():
        values[BY_FIELD[field].attribute] = value
    if call is not None and not isinstance(call, Mapping):
        raise RemoteOptionError("remote", call, "not a mapping", "a dict of " + ", ".join(BY_FIELD))
    for field, value in (call or {}).items():
        known = BY_FIELD.get(field) if isinstance(field, str) else None
        if known is None:
            raise RemoteOptionError(
                f"remote[{field!r}]", value, "unknown option", ", ".join(BY_FIELD)
            )
        try:
            values[known.attribute] = known.check(value)
        except ValueError as e:
            raise RemoteOptionError(f"remote[{field!r}]", value, str(e), known.accepted) from None
    options = replace(base or RemoteOptions(), **values)  # type: ignore[arg-type]
    return _fits(options, "in the policy's remote:, DEVPOLICY_REMOTE_INFLIGHT or remote=")
