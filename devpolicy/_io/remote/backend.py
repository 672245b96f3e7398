"""What each scheme supplies to a remote source: a stat request, data requests, versions.

A backend knows how to ask for an object's size and version and how to sign a ranged GET;
the source (`source.py`) does the sending, checking, retrying and counting, the same for all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ObjectChangedError
from .http import Pool, Response
from .urls import RemoteURL


@dataclass(frozen=True)
class Stat:
    """An object's size and version (ETag, generation, commit), as first seen."""

    size: int
    version: str | None


class Backend:
    """One scheme's requests. Subclasses override `stat_request`, `data_request`, `stat_of`
    and, where their responses say more, `version_of`."""

    def __init__(self, url: RemoteURL, environ: Mapping[str, str]) -> None:
        self.url = url
        self.environ = environ
        self.stat: Stat | None = None

    @property
    def name(self) -> str:
        """The URL as shown."""
        return self.url.name

    def identity(self) -> str:
        """What names this object's bytes for a cache: the URL shown and its version."""
        assert self.stat is not None
        return f"{self.name}\0{self.stat.version}\0{self.stat.size}"

    def stat_request(self) -> tuple[str, str, dict[str, str], bool]:
        """(method, url, headers, follow redirects) of the metadata request."""
        raise NotImplementedError

    def stat_of(self, response: Response, pool: Pool) -> Stat:
        """Size and version from the metadata response (status 2xx/3xx), or raise."""
        raise NotImplementedError

    def data_request(self, start: int, end: int) -> tuple[str, dict[str, str]]:
        """(url, headers) of a GET of bytes `start` to `end` (exclusive); `Range` is added."""
        raise NotImplementedError

    def version_of(self, response: Response) -> str | None:
        """The version a data response reports, or None when it reports none."""
        return None

    def expired(self, status: int) -> bool:
        """Whether `status` means a cached link expired (the backend forgot it: retry)."""
        return False

    def check_version(self, response: Response, start: int, end: int, attempts: int) -> None:
        """Raise `ObjectChangedError` when a data response reports another version."""
        assert self.stat is not None
        seen = self.version_of(response)
        if seen is not None and self.stat.version is not None and seen != self.stat.version:
            raise ObjectChangedError(
                self.name,
                f"the object changed since it was opened (version {self.stat.version} "
                f"then {seen}); its bytes would mix two versions",
                byte_range=(start, end),
                status=response.status,
                attempts=attempts,
            )

    def auth_hint(self) -> str:
        """What to set when the server refuses access (401/403)."""
        return ""

    def close(self) -> None:
        """Release what the backend holds."""
