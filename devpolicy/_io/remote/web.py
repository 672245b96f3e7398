"""https://host/path (and http:// on loopback): any server that honours `Range`.

The size comes from a HEAD (or, where HEAD is refused, from the `Content-Range` of a one-byte
GET), the version from `ETag`, else `Last-Modified`; a server that sends neither is refused
(a replaced file could not be noticed). `Last-Modified` counts whole seconds: a file
replaced by one of the same size within the same second is not noticed; prefer ETag. Data
reads send `If-Match` when the ETag is a strong one, and each response's validator is
checked as well. A URL's user information becomes HTTP Basic authorisation; its query string
(a presigned link's signature) is sent and never shown.
"""

from __future__ import annotations

import re

from .backend import Backend, Stat
from .errors import RemoteReadError
from .http import Pool, Response

_TOTAL = re.compile(r"^bytes [0-9]+-[0-9]+/([0-9]+)$")


class WebBackend(Backend):
    """A file on an HTTP(S) server."""

    _by_etag = True

    def stat_request(self) -> tuple[str, str, dict[str, str], bool]:
        return "HEAD", self.url.text, {}, True

    def fallback_request(self) -> tuple[str, str, dict[str, str], bool]:
        """The stat request for servers that refuse HEAD: a GET of the first byte."""
        return "GET", self.url.text, {"Range": "bytes=0-0"}, True

    def stat_of(self, response: Response, pool: Pool) -> Stat:
        etag = response.header("ETag")
        self._by_etag = etag is not None
        version = etag or response.header("Last-Modified")
        if version is None:
            response.small_body()
            raise RemoteReadError(
                self.name,
                "the server sends neither ETag nor Last-Modified: a file replaced during the "
                "load could not be told from the one opened, and its bytes could mix two "
                "versions; serve it from a server that sends ETag (object storage does)",
                status=response.status,
            )
        if response.status == 206:
            match = _TOTAL.match(response.header("Content-Range") or "")
            response.small_body()
            if match is None:
                raise RemoteReadError(self.name, "the server did not say the file's size",
                                      status=response.status)  # fmt: skip
            return Stat(int(match.group(1)), version)
        length = response.header("Content-Length")
        if length is None or not length.isdigit():
            raise RemoteReadError(self.name, "the server did not say the file's size",
                                  status=response.status)  # fmt: skip
        return Stat(int(length), version)

    def data_request(self, start: int, end: int) -> tuple[str, dict[str, str]]:
        assert self.stat is not None
        version = self.stat.version
        if self._by_etag and version and not version.startswith("W/"):
            return self.url.text, {"If-Match": version}
        return self.url.text, {}

    def version_of(self, response: Response) -> str | None:
        return response.header("ETag" if self._by_etag else "Last-Modified")

    def auth_hint(self) -> str:
        return "the server refused access (credentials go in the URL as https://USER:PASSWORD@HOST/...)"
