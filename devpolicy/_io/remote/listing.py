"""A folder at a URL listed: the names of the files directly in it, so that a checkpoint
folder at a URL is chosen from as a local one is.

S3 (`ListObjectsV2` with a `/` delimiter, signed by botocore as every S3 request is), GCS
(the JSON API's object list with a `/` delimiter) and the Hub (the `tree` route of the
revision, pinned to its commit) list; a plain web server cannot (`list_folder` returns None
and the caller asks for the index and `model.safetensors` by name). Pages are followed to
the end; a transient failure is retried as a read is; no credential is ever shown.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from typing import Any

from .backend import Backend
from .errors import RemoteReadError
from .http import Dropped, Pool
from .options import RemoteOptions
from .schemes import backend_for
from .source import RETRIED, paused_to_retry
from .urls import RemoteURL, parse_url

_S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
#: Pages followed at most (a folder of a million objects at 1,000 a page).
_MAX_PAGES = 1000


def list_folder(
    url: str | RemoteURL, environ: Mapping[str, str], options: RemoteOptions
) -> list[str] | None:
    """The names of the files directly in the folder `url` (not in its subfolders), sorted;
    None for a scheme that cannot list (https://, http://). `url` as text, or parsed
    already as a folder's (`parse_url(..., folder=True)`).

    Raises:
        RemoteURLError: the URL is not a folder's (a malformed bucket or repository).
        RemoteExtraMissingError: the scheme needs a package of the `remote` extra.
        RemoteReadError: the folder cannot be listed (no access, no such bucket or
            repository, the server failing past the retries), naming the URL.
    """
    parsed = url if isinstance(url, RemoteURL) else parse_url(url, folder=True)
    if parsed.scheme in ("http", "https"):
        return None
    backend = backend_for(parsed, environ)
    pool = Pool(options.timeout_seconds)
    try:
        if parsed.scheme == "s3":
            return sorted(_s3(parsed, backend, pool, options))
        if parsed.scheme == "gs":
            return sorted(_gcs(parsed, backend, pool, options))
        return sorted(_hub(parsed, backend, pool, options))
    finally:
        pool.close()
        backend.close()


def _get(
    name: str, pool: Pool, url: str, headers: dict[str, str], options: RemoteOptions,
    backend: Backend,
) -> tuple[bytes, Any]:  # fmt: skip
    """The body and headers of a GET of a listing page, retried as a read is."""
    began = time.monotonic()
    for attempts in range(1, options.attempts + 1):
        status: int | None = None
        try:
            response = pool.request("GET", url, headers)
            status = response.status
            if status == 200:
                body = response.small_body(64 * 2**20)
                return body, response.headers
            response.small_body(0)
            if status not in RETRIED:
                if status in (401, 403):
                    problem = f"access refused; {backend.auth_hint()}"
                elif status == 404:
                    problem = "no such folder, bucket or repository (or no access to it)"
                else:
                    problem = "the server refused to list it"
                raise RemoteReadError(name, f"cannot list the folder: {problem}",
                                      status=status, attempts=attempts)  # fmt: skip
            problem = f"status {status}"
        except Dropped as e:
            problem = e.problem
        if not paused_to_retry(options, attempts, began):
            raise RemoteReadError(name, f"cannot list the folder: {problem}; gave up",
                                  status=status, attempts=attempts)  # fmt: skip
    raise AssertionError("unreachable")  # pragma: no cover


def _s3(url: RemoteURL, backend: Any, pool: Pool, options: RemoteOptions) -> list[str]:
    prefix = f"{url.key}/" if url.key else ""
    names: list[str] = []
    token: str | None = None
    for _ in range(_MAX_PAGES):
        params: dict[str, str] = {"Bucket": url.bucket, "Prefix": prefix, "Delimiter": "/"}
        if token:
            params["ContinuationToken"] = token
        link = backend.client.generate_presigned_url(
            "list_objects_v2", Params=params, ExpiresIn=3600
        )
        body, _ = _get(url.name, pool, link, {}, options, backend)
        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError as e:
            raise RemoteReadError(url.name, f"the folder's listing is not XML: {e}") from None
        for item in root.iter(f"{_S3_NS}Contents"):
            key = item.findtext(f"{_S3_NS}Key") or ""
            if key.startswith(prefix) and "/" not in key[len(prefix) :] and key != prefix:
                names.append(key[len(prefix) :])
        token = root.findtext(f"{_S3_NS}NextContinuationToken")
        if root.findtext(f"{_S3_NS}IsTruncated") != "true" or not token:
            return names
    raise RemoteReadError(url.name, f"the folder's listing runs past {_MAX_PAGES} pages")


def _gcs(url: RemoteURL, backend: Any, pool: Pool, options: RemoteOptions) -> list[str]:
    prefix = f"{url.key}/" if url.key else ""
    names: list[str] = []
    token: str | None = None
    bucket = urllib.parse.quote(url.bucket, safe="")
    for _ in range(_MAX_PAGES):
        query = {"prefix": prefix, "delimiter": "/", "fields": "items(name),nextPageToken"}
        if token:
            query["pageToken"] = token
        link = f"{backend.endpoint}/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}"
        body, _ = _get(url.name, pool, link, backend.auth_headers(), options, backend)
        try:
            page = json.loads(body)
            items = [str(item["name"]) for item in page.get("items", [])]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise RemoteReadError(url.name, f"the folder's listing is not JSON: {e}") from None
        names += [n[len(prefix) :] for n in items if n.startswith(prefix) and n != prefix]
        token = page.get("nextPageToken")
        if not token:
            return names
    raise RemoteReadError(url.name, f"the folder's listing runs past {_MAX_PAGES} pages")


def _hub(url: RemoteURL, backend: Any, pool: Pool, options: RemoteOptions) -> list[str]:
    kind = {"model": "models", "dataset": "datasets", "space": "spaces"}[url.repo_type]
    revision = urllib.parse.quote(url.revision, safe="")
    path = "/" + urllib.parse.quote(url.key) if url.key else ""
    link: str | None = f"{backend.endpoint}/api/{kind}/{url.bucket}/tree/{revision}{path}"
    names: list[str] = []
    for _ in range(_MAX_PAGES):
        if link is None:
            return names
        body, headers = _get(url.name, pool, link, backend.auth_headers(), options, backend)
        try:
            entries = json.loads(body)
            files = [str(e["path"]) for e in entries if e.get("type") == "file"]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise RemoteReadError(url.name, f"the folder's listing is not JSON: {e}") from None
        prefix = f"{url.key}/" if url.key else ""
        names += [f[len(prefix) :] for f in files if f.startswith(prefix)]
        link = _next_link(headers.get("Link"), link)
    raise RemoteReadError(url.name, f"the folder's listing runs past {_MAX_PAGES} pages")


def _next_link(header: str | None, base: str) -> str | None:
    """The `rel="next"` URL of a `Link` header (the Hub's pagination), or None."""
    for part in (header or "").split(","):
        target, _, params = part.partition(";")
        if 'rel="next"' in params.replace(" ", ""):
            return urllib.parse.urljoin(base, target.strip().strip("<>"))
    return None
