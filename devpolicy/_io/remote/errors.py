"""Errors of remote byte sources. Each names the URL as shown (never a credential).

They join devpolicy's base error, so `except DevicePolicyError` catches them; a read error is
also an `OSError`, as a failed local read is.
"""

from __future__ import annotations

from ..._base.errors import DevicePolicyError, ValueRefusedError

#: What to run when the remote extra is not installed.
INSTALL_HINT = "pip install 'devpolicy[remote]'"


class RemoteURLError(DevicePolicyError, ValueError):
    """A URL devpolicy cannot read from: an unknown scheme, or a malformed part.

    Raised by `load_file`, `plan`, `read_metadata` and `save_file` for such a URL, before any
    request.

    Attributes:
        url: The URL as shown (credentials removed).
        part: Which part is wrong (`scheme`, `bucket`, `key`, `repository`, `revision`, `host`).
    """

    def __init__(self, url: str, part: str, problem: str) -> None:
        self.url = url
        self.part = part
        super().__init__(f"{url}: {part}: {problem}")


class RemoteOptionError(ValueRefusedError):
    """A remote option given by keyword that cannot be used.

    Raised by `load_file`, `plan` and `read_metadata` for a `remote=` field (or a `remote:`
    value in code) that is unknown or out of range.

    Attributes:
        option: The keyword.
        value: Its value.
        accepted: The forms that would be accepted.
    """

    def __init__(self, option: str, value: object, problem: str, accepted: str) -> None:
        self.option = option
        super().__init__(f"{option}=", value, problem, accepted)


class RemoteExtraMissingError(DevicePolicyError, ImportError):
    """Reading a URL needs a package of the `remote` extra that is not installed.

    Raised by `load_file`, `plan`, `read_metadata` and `save_file` for an s3:// (or gs://) URL
    when botocore (or google-auth) is not installed.
    """

    def __init__(self, url: str, package: str) -> None:
        self.url = url
        self.package = package
        super().__init__(
            f"{url}: reading from a URL needs {package!r}, which is not installed; "
            f"install devpolicy's remote support: {INSTALL_HINT}"
        )


class RemoteReadError(DevicePolicyError, OSError):
    """A read from a remote object failed for good (after any retries).

    Raised by `load_file`, `plan`, `read_metadata` (and `save_file` to s3://) when a request for
    a URL's bytes or listing fails after its retries.

    Attributes:
        url: The object's URL as shown (credentials removed).
        range: The byte range asked, `(start, end)` with `end` exclusive, or None (the
            object's metadata).
        status: The last HTTP status, or None when no response came.
        attempts: The attempts made (0: nothing was asked of the server).
    """

    def __init__(
        self,
        url: str,
        problem: str,
        *,
        byte_range: tuple[int, int] | None = None,
        status: int | None = None,
        attempts: int = 1,
    ) -> None:
        self.url = url
        self.range = byte_range
        self.status = status
        self.attempts = attempts
        where = url if byte_range is None else f"{url} bytes {byte_range[0]}-{byte_range[1] - 1}"
        facts = [f"status {status}" if status is not None else "no response"]
        facts.append(f"{attempts} attempt{'s' if attempts != 1 else ''}")
        # No attempt, no facts: "(no response, 0 attempts)" would suggest a server was asked.
        said = f" ({', '.join(facts)})" if attempts else ""
        super().__init__(f"{where}: {problem}{said}")
        # What a reader that reports `OSError.strerror` (as for a local file) shows.
        self.strerror = str(self)


class RangeIgnoredError(RemoteReadError):
    """The server answered a ranged read with the whole object (status 200): it ignores
    `Range`, and devpolicy never takes a whole body as a range.

    Raised by `load_file` and `plan` reading a URL from such a server.
    """


class ObjectChangedError(RemoteReadError):
    """The object changed (ETag, generation or size) after it was opened: its bytes would mix
    two versions.

    Raised by `load_file` while reading a URL whose object is replaced mid-load.
    """


class RemoteCacheError(DevicePolicyError, OSError):
    """The remote cache directory, or an entry in it, cannot be used: another account
    could have chosen its contents, it cannot be written, or an entry is damaged. The
    load does not go on uncached (a cache was asked for): the message says how to fix it,
    or to load without the cache.

    Raised by `load_file`, `plan` and `read_metadata` of a URL with `remote: cache` (or
    `DEVPOLICY_REMOTE_CACHE`) set.

    Attributes:
        path: The directory or entry concerned.
    """

    def __init__(self, path: str, problem: str, fix: str) -> None:
        self.path = path
        super().__init__(
            f"remote cache (remote: cache, DEVPOLICY_REMOTE_CACHE) {path}: {problem}; {fix}"
        )


class RemoteOfflineError(RemoteReadError):
    """Offline (`DEVPOLICY_REMOTE_OFFLINE=1`, or `HF_HUB_OFFLINE=1` for hf://) and the file
    is not complete in the cache, or its cached copy failed its checksum: nothing was asked
    of the server (`attempts` is 0, `status` None).

    Raised by `load_file`, `plan` and `read_metadata` of a URL while offline.

    Example:
        >>> print(RemoteOfflineError("s3://b/m.bin", "offline and not in the cache"))
        s3://b/m.bin: offline and not in the cache
    """

    def __init__(self, url: str, problem: str) -> None:
        super().__init__(url, problem, attempts=0)
