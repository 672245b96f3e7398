"""What `remote:` can set: how URLs (`s3://`, `gs://`, `hf://`, `https://`) are read.

The table of options: each one's field (the policy's `remote:` key and `load_file(remote=)`
key), the attribute of `RemoteOptions` it sets, its `DEVPOLICY_REMOTE_*` variable, its kind
and bounds, and its check. Pure: the schema validates the policy's `remote:` with it,
`environment` reads the variables with it, and the I/O wing resolves the options in force
with it (`_io/remote/options.py`, where the defaults are measured and explained).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .._base.errors import EnvOverrideError
from .._base.sizes import SIZE_FORMS, parse_size

ENV_PREFIX = "DEVPOLICY_REMOTE_"
_INT = re.compile(r"^[0-9]{1,9}$")
_SECONDS = re.compile(r"^[0-9]{1,9}(\.[0-9]{1,9})?$")
MIB = 2**20


@dataclass(frozen=True, slots=True)
class RemoteOption:
    """One option of remote reads.

    Attributes:
        field: Its name in the policy's `remote:` and in `load_file(remote=...)`.
        attribute: The `RemoteOptions` attribute it sets.
        suffix: Its variable's name after `DEVPOLICY_REMOTE_`.
        kind: `int`, `size` (bytes, or text like `8MiB`), `seconds` or `path`.
        low: The least value accepted (not for paths).
        high: The greatest value accepted (not for paths).
        default: Its value when nothing sets it.
        description: What it does, for the schema and the docs.
    """

    field: str
    attribute: str
    suffix: str
    kind: str
    low: float
    high: float
    default: int | float | Path | None
    description: str

    @property
    def variable(self) -> str:
        """Its environment variable (`DEVPOLICY_REMOTE_CHUNK`)."""
        return ENV_PREFIX + self.suffix

    @property
    def accepted(self) -> str:
        """The values it accepts, in words."""
        if self.kind == "int":
            return f"a whole number from {int(self.low)} to {int(self.high)}"
        if self.kind == "size":
            return f"{SIZE_FORMS}, from {int(self.low)} to {int(self.high)} bytes"
        if self.kind == "seconds":
            return f"a number of seconds from {self.low:g} to {self.high:g}"
        return "a directory path"

    def check(self, value: object) -> int | float | Path | None:
        """`value` as the option holds it.

        Raises:
            ValueError: the problem, without the accepted forms (see `accepted`).
        """
        if self.kind == "path":
            if value is None:
                return None
            if not isinstance(value, str | os.PathLike) or not os.fspath(value):
                raise ValueError("not a directory path")
            return Path(os.fspath(value)).expanduser()
        if self.kind == "size":
            number: float = parse_size(value)
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {type(value).__name__}")
        elif self.kind == "int" and not isinstance(value, int):
            raise ValueError("not a whole number")
        else:
            number = value
        if not math.isfinite(number) or not self.low <= number <= self.high:
            raise ValueError("out of range")
        return float(number) if self.kind == "seconds" else int(number)

    def from_text(self, text: str) -> int | float | Path | None:
        """The option's value from a variable's text.

        Raises:
            ValueError: the problem (see `check`).
        """
        text = text.strip()
        if self.kind == "int" and _INT.match(text) is None:
            raise ValueError("not a whole number")
        if self.kind == "seconds" and _SECONDS.match(text) is None:
            raise ValueError("not a plain number of seconds")
        value: object = text
        if self.kind == "int":
            value = int(text)
        elif self.kind == "seconds":
            value = float(text)
        return self.check(value)


# Defaults: see `_io/remote/options.py` for the measurements behind them.
OPTIONS: tuple[RemoteOption, ...] = (
    RemoteOption("concurrency", "concurrency", "CONCURRENCY", "int", 1, 256, 8,
                 "Requests in flight at once per file."),
    RemoteOption("chunk", "chunk_bytes", "CHUNK", "size", 64 * 2**10, 2**30, 8 * MIB,
                 "The largest request; longer ranges are split (`8MiB`)."),
    RemoteOption("inflight", "inflight_bytes", "INFLIGHT", "size", 64 * 2**10, 4 * 2**30,
                 128 * MIB, "Bytes asked and not yet received, at most, per file: the host "
                 "memory a fetch holds beyond the arrays it fills; lowers `concurrency` to "
                 "fit (at least `chunk`)."),
    RemoteOption("attempts", "attempts", "ATTEMPTS", "int", 1, 100, 8,
                 "Tries per range before giving up (5xx, 429, timeouts, resets, cut bodies)."),
    RemoteOption("backoff", "backoff_seconds", "BACKOFF", "seconds", 0.0, 60.0, 0.1,
                 "The first retry's backoff in seconds; each further one doubles it "
                 "(full jitter)."),
    RemoteOption("backoff_cap", "backoff_cap_seconds", "BACKOFF_CAP", "seconds", 0.0, 600.0,
                 5.0, "The longest single backoff, in seconds."),
    RemoteOption("total_time", "total_seconds", "TOTAL_TIME", "seconds", 0.001, 86400.0, 120.0,
                 "The longest one range may take, retries included, in seconds."),
    RemoteOption("timeout", "timeout_seconds", "TIMEOUT", "seconds", 0.001, 3600.0, 30.0,
                 "Connecting, and each wait for bytes, at most this many seconds."),
    RemoteOption("cache", "cache_dir", "CACHE", "path", 0, 0, None,
                 "A directory to keep fetched files in, then mapped from it on later "
                 "loads (opt-in; checked against the object's version)."),
)  # fmt: skip
BY_FIELD = {option.field: option for option in OPTIONS}
BY_ATTRIBUTE = {option.attribute: option for option in OPTIONS}
#: The offline switch (a complete cache entry is served with no request; see
#: `_io/remote/options.offline_switch`): read where a URL is opened, not a `remote:` field.
OFFLINE_VARIABLE = ENV_PREFIX + "OFFLINE"
OFFLINE_YES = ("1", "true", "yes", "on")
OFFLINE_NO = ("", "0", "false", "no", "off")
OFFLINE_ACCEPTED = "1 or 0 (also true/false, yes/no, on/off; empty: 0)"


def offline_of(environ: Mapping[str, str]) -> bool:
    """Whether `DEVPOLICY_REMOTE_OFFLINE` is on.

    Raises:
        EnvOverrideError: it is neither yes nor no, naming the accepted values.
    """
    text = environ.get(OFFLINE_VARIABLE, "")
    if text.strip().lower() in OFFLINE_YES:
        return True
    if text.strip().lower() not in OFFLINE_NO:
        raise EnvOverrideError(OFFLINE_VARIABLE, text, "neither yes nor no", OFFLINE_ACCEPTED)
    return False


#: Every `DEVPOLICY_REMOTE_*` variable.
VARIABLES = (*(option.variable for option in OPTIONS), OFFLINE_VARIABLE)


def from_environment(environ: Mapping[str, str]) -> dict[str, object]:
    """`DEVPOLICY_REMOTE_*` of `environ` by `remote:` field, each checked by the option's
    own rule; an empty value counts as unset.

    Raises:
        EnvOverrideError: naming the variable, its value and the accepted forms.
    """
    found: dict[str, object] = {}
    offline_of(environ)  # not a `remote:` field, but checked with the others
    for option in OPTIONS:
        text = environ.get(option.variable)
        if not text:
            continue
        try:
            found[option.field] = option.from_text(text)
        except ValueError as e:
            raise EnvOverrideError(option.variable, text, str(e), option.accepted) from None
    return found
