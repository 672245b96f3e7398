"""hf://[datasets/]org/repo[@revision]/path: the Hugging Face Hub's `resolve` route.

`HF_ENDPOINT` (default `https://huggingface.co`) and `HF_TOKEN` (else the token file that
`hf auth login` writes: `HF_TOKEN_PATH`, or `token` under `HF_HOME`, default
`~/.cache/huggingface`), as `huggingface_hub` reads them. The first request resolves the
revision to its commit (`X-Repo-Commit`) and size (`X-Linked-Size`), and every later read
is of that commit, so a branch that moves during a load cannot mix two versions. A large
file is served from a content URL on another host: the token is never sent there, the URL
is reused, and asked again when it expires (403 or 410).
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from .backend import Backend, Stat
from .errors import RemoteReadError
from .http import Pool, Response
from .urls import RemoteURL

_KIND_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}


def hub_token(environ: Mapping[str, str]) -> str | None:
    """The Hub token as `huggingface_hub` finds it, or None.

    Raises:
        RemoteReadError: the token holds a line break or another control character (a
            token file of two lines, a pasted CRLF): it would break the request's header.
            The message says where the token came from, never the token.
    """
    for variable in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        token = environ.get(variable)
        if token:
            return _checked(token.strip(), variable)
    path = environ.get("HF_TOKEN_PATH")
    if not path:
        home = environ.get("HF_HOME") or os.path.join(
            environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
        )
        path = os.path.join(home, "token")
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeError):
        return None
    return _checked(text, f"the token file {path} (HF_TOKEN_PATH, HF_HOME)") or None


def _checked(token: str, where: str) -> str:
    if any(c < " " or c == "\x7f" for c in token):
        raise RemoteReadError(
            "hf://",
            f"the Hub token from {where} holds a line break or another control character "
            "(not shown); set HF_TOKEN to the token alone, on one line",
        )
    return token


class HubBackend(Backend):
    """A file in a Hub repository."""

    def __init__(self, url: RemoteURL, environ: Mapping[str, str]) -> None:
        super().__init__(url, environ)
        self.endpoint = (environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        self._token = hub_token(environ)
        self.commit: str | None = None
        self._location: str | None = None
        self._lock = threading.Lock()

    def _resolve(self, revision: str) -> str:
        repo = _KIND_PREFIX[self.url.repo_type] + self.url.bucket
        return (
            f"{self.endpoint}/{repo}/resolve/{urllib.parse.quote(revision, safe='')}/"
            f"{urllib.parse.quote(self.url.key)}"
        )

    def auth_headers(self) -> dict[str, str]:
        """The headers that authorise a request (none without credentials)."""
        return self._auth()

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def identity(self) -> str:
        assert self.stat is not None
        return f"{self.name}\0{self.commit}\0{self.stat.version}\0{self.stat.size}"

    def stat_request(self) -> tuple[str, str, dict[str, str], bool]:
        return "HEAD", self._resolve(self.commit or self.url.revision), self._auth(), False

    def stat_of(self, response: Response, pool: Pool) -> Stat:
        self.commit = response.header("X-Repo-Commit") or self.commit
        if response.status in (301, 302, 303, 307, 308):
            location = response.header("Location") or ""
            size = response.header("X-Linked-Size")
            version = response.header("X-Linked-Etag") or response.header("ETag")
            base = self._resolve(self.commit or self.url.revision)
            with self._lock:
                self._location = urllib.parse.urljoin(base, location) if location else None
        else:
            size = response.header("Content-Length")
            version = response.header("ETag")
        if size is None or not size.isdigit():
            raise RemoteReadError(self.name, "the Hub did not say the file's size",
                                  status=response.status)  # fmt: skip
        return Stat(int(size), version)

    def data_request(self, start: int, end: int) -> tuple[str, dict[str, str]]:
        with self._lock:
            location = self._location
        if location is None:
            return self._resolve(self.commit or self.url.revision), self._auth()
        host = urllib.parse.urlsplit(location).netloc
        return location, self._auth() if host == urllib.parse.urlsplit(self.endpoint).netloc else {}

    def expired(self, status: int) -> bool:
        with self._lock:
            if status in (403, 410) and self._location is not None:
                self._location = None  # the next read resolves again, at the same commit
                return True
        return False

    def auth_hint(self) -> str:
        if self._token:
            return "the token was refused: check HF_TOKEN, and access to the repository"
        return "a private or gated repository needs a token: set HF_TOKEN"
