"""Where a file is: a local path, or an object at a URL (`s3://`, `gs://`, `hf://`, `https://`).

A URL is written `scheme://...`; `URLPath` holds one as the loader's other modules hold a
`Path` (its `name`, `stem`, `parent`, a sibling `parent / name`), so a checkpoint at a URL
is chosen, named and matched by `file:` rules as a local one is. A URL is shown (`str`,
events, errors, plans) without user information, query string or fragment: the places
where credentials travel in a URL. Pure text: no I/O, no JAX.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path
from typing import Any

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# hf:// paths start with the repository: `[datasets/|models/|spaces/]ORG/REPO[@REVISION]`.
_HF_KINDS = ("datasets", "models", "spaces")


def is_url(text: object) -> bool:
    """Whether `text` is written as a URL (`scheme://...`) rather than a local path.

    Example:
        >>> is_url("s3://bucket/model.safetensors"), is_url("model.safetensors")
        (True, False)
    """
    return isinstance(text, str | URLPath) and _SCHEME.match(str(text)) is not None


def shown_url(url: str) -> str:
    """`url` as it may be shown: no user information, no query string, no fragment.

    Example:
        >>> shown_url("https://user:secret@example.org/m.safetensors?X-Amz-Signature=abc")
        'https://example.org/m.safetensors'
    """
    bare = url.split("#", 1)[0].split("?", 1)[0]
    if not bare.lower().startswith(("http://", "https://")):
        # s3, gs, hf: no bucket, organisation or kind holds `@` (a Hub revision follows
        # the repository, the second name): what comes before one in the first is
        # credentials put where they do not go, never shown.
        scheme, _, rest = bare.partition("://")
        first, slash, path = rest.partition("/")
        if scheme.lower() == "hf":
            # The repository may carry `@revision`, but never `NAME:TOKEN@` before it.
            second, slash2, tail = path.partition("/")
            user, at, repository = second.partition("@")
            if at and ":" in user:
                path = f"{repository}{slash2}{tail}"
        return f"{scheme}://{first.rpartition('@')[2]}{slash}{path}"
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return bare
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = host + (f":{port}" if port is not None else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class URLPath:
    """A file or folder at a URL, held as a path is: `str()` is the URL as shown.

    `url` is the URL as given (it may hold credentials: it is never shown); `object_path`
    is the object's own path within its bucket, repository or host, as `file:` rules
    anchored with `/` see it.

    Example:
        >>> p = URLPath("s3://bucket/ckpt/model.safetensors.index.json")
        >>> str(p.parent / "model-00001-of-00002.safetensors"), p.name, p.object_path
        ('s3://bucket/ckpt/model-00001-of-00002.safetensors', \
'model.safetensors.index.json', '/ckpt/model.safetensors.index.json')
        >>> URLPath("hf://datasets/org/tokens@v1/train.safetensors").object_path
        '/train.safetensors'
    """

    __slots__ = ("_rest", "_root", "_shown", "url")

    def __init__(self, url: str) -> None:
        if not is_url(url):
            raise ValueError(f"not a URL (scheme://...): {url!r}")
        stripped = url.rstrip("/")
        self.url = stripped if not stripped.endswith(":") else url  # a folder: no final /
        self._shown = shown_url(self.url)
        self._root, self._rest = _split(self.url)

    @property
    def scheme(self) -> str:
        """The scheme, lower case (`s3`)."""
        return self.url.split("://", 1)[0].lower()

    @property
    def object_path(self) -> str:
        """The object's path after its bucket, host or repository (`/ckpt/model.safetensors`)."""
        path = self._rest.split("?", 1)[0].split("#", 1)[0]
        return "/" + path.lstrip("/")

    @property
    def name(self) -> str:
        """The last part of the path (`model.safetensors`)."""
        return self.object_path.rsplit("/", 1)[-1] or self._shown.rstrip("/").rsplit("/", 1)[-1]

    @property
    def stem(self) -> str:
        """`name` without its last suffix, as `Path.stem`."""
        name = self.name
        dot = name.rfind(".")
        return name[:dot] if dot > 0 else name

    @property
    def parent(self) -> URLPath:
        """The folder the object is in (its bucket, host or repository at the top)."""
        path = self.object_path.rstrip("/")
        if "/" not in path.strip("/"):
            return URLPath(self._root)
        return URLPath(self._root + path.rsplit("/", 1)[0])

    def __truediv__(self, name: str) -> URLPath:
        base = self.url.split("?", 1)[0].split("#", 1)[0].rstrip("/")
        return URLPath(f"{base}/{name}")

    def with_name(self, name: str) -> URLPath:
        """The object `name` beside this one."""
        return self.parent / name

    def __str__(self) -> str:
        return self._shown

    def __repr__(self) -> str:
        return f"URLPath({self._shown!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, URLPath) and other.url == self.url

    def __lt__(self, other: URLPath) -> bool:
        return self.url < other.url

    def __hash__(self) -> int:
        return hash(self.url)


def _split(url: str) -> tuple[str, str]:
    """(root, rest): the URL up to its bucket, host or repository, and the path after it."""
    scheme, _, after = url.partition("://")
    parts = after.split("/")
    count = 1
    if scheme.lower() == "hf":
        count = 3 if parts[0] in _HF_KINDS else 2
    root = "/".join(parts[:count])
    rest = "/".join(parts[count:])
    return f"{scheme}://{root}", ("/" + rest if rest else "")


#: A file's place: a local path or a URL.
FilePath = Path | URLPath


def location(path: Any) -> FilePath:
    """`path` as a `Path`, or a `URLPath` when written as a URL.

    Raises:
        TypeError: `path` is neither text, a path nor a `URLPath`.
    """
    if isinstance(path, URLPath | Path):
        return path
    if isinstance(path, str) and is_url(path):
        return URLPath(path)
    if isinstance(path, str | os.PathLike):
        return Path(path)
    raise TypeError(f"expected a path or a URL, got {type(path).__name__} {path!r}")
