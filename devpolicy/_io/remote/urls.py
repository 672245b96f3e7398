"""Remote URLs: which ones devpolicy reads, their parts, and how they are shown.

`s3://bucket/key`, `gs://bucket/key`, `hf://org/repo[@revision]/path` (models; also
`hf://models/...`, `hf://datasets/...`, `hf://spaces/...`), `https://host/path`, and
`http://` on a loopback host only. A URL is shown (in events, errors, plans) without user
information or query string, the places where credentials travel in a URL. No I/O here.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from dataclasses import dataclass

from ..._base.locations import is_url, shown_url
from .errors import RemoteURLError

#: A URL as it may be shown (see `shown_url`).
shown = shown_url
__all__ = ["SCHEMES", "RemoteURL", "is_loopback", "is_url", "parse_url", "shown"]

#: The schemes a URL may have, as errors list them.
SCHEMES = ("gs", "hf", "http", "https", "s3")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# S3 bucket names: 3-63 of lowercase letters, digits, dots and hyphens (dots allowed for old
# buckets); GCS allows underscores too, and up to 222 characters with dots.
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_GS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_HF_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_HF_KINDS = {"models": "model", "datasets": "dataset", "spaces": "space"}


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine (`localhost`, 127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class RemoteURL:
    """A parsed remote URL.

    Attributes:
        scheme: One of `SCHEMES`.
        text: The URL as given (may hold credentials: never shown).
        name: The URL as shown.
        bucket: The bucket (s3, gs) or `org/repo` (hf); the host for http(s).
        key: The object's key (s3, gs), path in the repository (hf), or URL path (http).
        revision: hf's revision (`main` when not given).
        repo_type: hf's repository type: `model`, `dataset` or `space`.
    """

    scheme: str
    text: str
    name: str
    bucket: str
    key: str
    revision: str = ""
    repo_type: str = ""


def parse_url(url: str, *, folder: bool = False) -> RemoteURL:
    """Parse a remote URL, or raise naming the part that is wrong.

    With `folder`, the URL names a folder: its key (path in the repository, URL path) may
    be empty (a bucket's or repository's top) and is given without a final `/`.

    Raises:
        RemoteURLError: an unknown scheme (the message lists the valid ones), a missing or
            malformed bucket, key, repository or revision, or plain `http://` off loopback.

    Example:
        >>> u = parse_url("hf://datasets/org/tokens@v1/train/part-0.safetensors")
        >>> u.bucket, u.repo_type, u.revision, u.key
        ('org/tokens', 'dataset', 'v1', 'train/part-0.safetensors')
    """
    match = _SCHEME.match(url) if isinstance(url, str) else None
    if match is None:
        raise RemoteURLError(str(url), "scheme", f"not a URL; accepted schemes: {_schemes()}")
    name = shown(url)
    if any(c <= " " or c == "\x7f" for c in url):
        # Never quoted: the query (a signature) or the user information may hold it.
        raise RemoteURLError(
            name, "characters", "a space, line break or other control character; "
            "percent-encode it (a space is %20)",
        )  # fmt: skip
    scheme = match.group(1).lower()
    if scheme not in SCHEMES:
        raise RemoteURLError(name, "scheme", f"unknown scheme {scheme!r}; accepted: {_schemes()}")
    rest = url[match.end() :]
    if folder:
        rest = rest.rstrip("/")
    if scheme in ("s3", "gs"):
        return _bucket_url(scheme, url, name, rest, folder)
    if scheme == "hf":
        return _hf_url(url, name, rest, folder)
    return _http_url(scheme, url, name, folder)


def _schemes() -> str:
    return ", ".join(f"{s}://" for s in SCHEMES)


def _bucket_url(scheme: str, url: str, name: str, rest: str, folder: bool) -> RemoteURL:
    if "?" in rest or "#" in rest:
        raise RemoteURLError(name, "key", "a query string or fragment is not part of an object key")
    bucket, _, key = rest.partition("/")
    form = _S3_BUCKET if scheme == "s3" else _GS_BUCKET
    if not bucket:
        raise RemoteURLError(name, "bucket", f"missing; write {scheme}://BUCKET/KEY")
    if "@" in bucket:
        where = (
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the shared files"
            if scheme == "s3"
            else "Google's application default credentials"
        )
        raise RemoteURLError(
            name, "bucket",
            f"user information (NAME:PASSWORD@) is not part of a {scheme}:// URL; "
            f"credentials come from {where}",
        )  # fmt: skip
    if form.match(bucket) is None or ".." in bucket:
        allowed = "lowercase letters, digits, '.', '-'" + (", '_'" if scheme == "gs" else "")
        raise RemoteURLError(
            name, "bucket", f"{bucket!r} is not a bucket name (3-63 characters of {allowed})"
        )
    if not key and not folder:
        raise RemoteURLError(name, "key", f"missing; write {scheme}://{bucket}/KEY")
    return RemoteURL(scheme, url, name, bucket, key)


def _hf_url(url: str, name: str, rest: str, folder: bool) -> RemoteURL:
    if "?" in rest or "#" in rest:
        raise RemoteURLError(name, "path", "a query string or fragment is not part of a Hub path")
    parts = rest.split("/")
    if "@" in parts[0]:
        raise RemoteURLError(
            name, "repository",
            "user information (NAME:TOKEN@) is not part of an hf:// URL; the token comes "
            "from HF_TOKEN or the one `hf auth login` saved",
        )  # fmt: skip
    repo_type = "model"
    if parts[0] in _HF_KINDS:
        repo_type = _HF_KINDS[parts.pop(0)]
    if len(parts) < (2 if folder else 3):
        raise RemoteURLError(
            name,
            "repository",
            "write hf://ORG/REPO[@REVISION]/PATH (or hf://datasets/ORG/REPO[@REVISION]/PATH)",
        )
    org, repo, path = parts[0], parts[1], "/".join(parts[2:])
    if ":" in org or ":" in repo.partition("@")[0]:
        raise RemoteURLError(
            f"hf://{'...' if ':' in org else org}/.../{path}",  # never the secret
            "repository",
            "user information (NAME:TOKEN@) is not part of an hf:// URL (not shown here); "
            "the token comes from HF_TOKEN or the one `hf auth login` saved",
        )  # fmt: skip
    repo, at, revision = repo.partition("@")
    revision = urllib.parse.unquote(revision) if at else "main"
    for label, value in (("organisation", org), ("repository", repo)):
        if _HF_NAME.match(value) is None or ".." in value:
            allowed = "letters, digits, '.', '_', '-'"
            raise RemoteURLError(
                name, "repository", f"{label} {value!r} is not a Hub name ({allowed})"
            )
    if at and not revision:
        raise RemoteURLError(name, "revision", "empty after '@'; write @BRANCH, @TAG or @COMMIT")
    if folder and not path:
        pass  # the repository's top
    elif not path or path.endswith("/") or any(p in ("", ".", "..") for p in path.split("/")):
        raise RemoteURLError(name, "path", f"{path!r} is not a file path in the repository")
    return RemoteURL("hf", url, name, f"{org}/{repo}", path, revision, repo_type)


def _check_host(name: str, host: str) -> None:
    """Refuse a host name no resolver takes (over 253 characters, a label over 63, one
    IDNA cannot encode), as a URL error rather than the codec's."""
    if host.startswith("[") or ":" in host:
        return  # an IPv6 address, checked by `urlsplit`
    try:
        encoded = host.encode("idna")
    except UnicodeError:
        encoded = b""
    if not encoded or len(encoded) > 253 or any(len(label) > 63 for label in encoded.split(b".")):
        raise RemoteURLError(
            name[:200], "host", f"not a host name ({len(host)} characters; at most 253, "
            "63 between dots)",
        )  # fmt: skip


def _http_url(scheme: str, url: str, name: str, folder: bool) -> RemoteURL:
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as e:
        raise RemoteURLError(name, "host", f"malformed: {e}") from e
    host = parts.hostname or ""
    if not host:
        raise RemoteURLError(name, "host", f"missing; write {scheme}://HOST/PATH")
    _check_host(name, host)
    if not folder and (not parts.path or parts.path.endswith("/")):
        raise RemoteURLError(name, "path", "missing a file name")
    if scheme == "http" and not is_loopback(host):
        raise RemoteURLError(
            name,
            "scheme",
            "plain http:// is read only from a loopback host (localhost, 127.0.0.0/8, ::1); "
            "use https://",
        )
    return RemoteURL(scheme, url, name, host, parts.path.rstrip("/") if folder else parts.path)
