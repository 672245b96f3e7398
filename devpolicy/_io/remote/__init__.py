"""Remote byte sources: checkpoint bytes from s3://, gs://, hf:// and https:// URLs.

`open_remote(url)` opens one object (one metadata request) and returns a byte source for the
loader's `ByteSource` seam: a `RemoteObject` whose reads are ranged, checked, concurrent and
retried, or, with a cache directory, a `CachedFile` the loader maps like a local file.
`listing.list_folder` lists a folder (S3, GCS, the Hub) so that a checkpoint folder at a
URL is chosen from as a local one; `schemes.backend_for` picks a scheme's backend; options
are resolved by `options` over the table in `_document/remote.py`. The loader reaches all of
this through `_io/reading/checkpoint_sources.py`.
Needs the `remote` extra for s3:// (botocore) and gs:// off an emulator (google-auth);
hf:// and https:// need nothing beyond Python.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .cache import CachedFile, RemoteCache
from .errors import (
    INSTALL_HINT,
    ObjectChangedError,
    RangeIgnoredError,
    RemoteCacheError,
    RemoteExtraMissingError,
    RemoteOfflineError,
    RemoteOptionError,
    RemoteReadError,
    RemoteURLError,
)
from .options import RemoteOptions, offline_switch, options_of, resolve_options
from .schemes import backend_for
from .source import Counters, Emit, RemoteObject
from .urls import SCHEMES, RemoteURL, is_url, parse_url, shown

__all__ = [
    "INSTALL_HINT",
    "SCHEMES",
    "CachedFile",
    "Counters",
    "ObjectChangedError",
    "RangeIgnoredError",
    "RemoteCache",
    "RemoteCacheError",
    "RemoteExtraMissingError",
    "RemoteObject",
    "RemoteOfflineError",
    "RemoteOptionError",
    "RemoteOptions",
    "RemoteReadError",
    "RemoteURL",
    "RemoteURLError",
    "backend_for",
    "is_url",
    "offline_switch",
    "open_remote",
    "options_of",
    "parse_url",
    "resolve_options",
    "shown",
]


def open_remote(
    url: str | RemoteURL,
    *,
    environ: Mapping[str, str] | None = None,
    options: RemoteOptions | None = None,
    emit: Emit | None = None,
    **keywords: object,
) -> RemoteObject | CachedFile:
    """Open a remote object for reading by ranges.

    Args:
        url: `s3://bucket/key`, `gs://bucket/key`, `hf://[datasets/]org/repo[@rev]/path`,
            `https://host/path` (or `http://` on a loopback host), as text or parsed
            already (`parse_url`: the loader parses a path once, and hands it down).
        environ: Where credentials, endpoints and `DEVPOLICY_REMOTE_*` are read (default:
            `os.environ`).
        options: The options, final (the loader weighed `DEVPOLICY_REMOTE_*` with the
            policy's layers): the environment is then read for credentials and endpoints
            only, and `keywords` (any field of `RemoteOptions`) override them. Without
            them: the defaults, then `DEVPOLICY_REMOTE_*`, then `keywords`.
        emit: Where events go (`emit(level, event, fields)`), as `EventLog.emit` takes them.

    Returns:
        A `RemoteObject`, or with `cache_dir` a `CachedFile` (served from the cache, or
        fetched into it first).

    Raises:
        RemoteURLError: the URL cannot be read (unknown scheme, malformed part).
        RemoteExtraMissingError: the scheme needs a package of the `remote` extra.
        RemoteReadError: the object cannot be opened (no access, no such object, the server
            failing past the retries); `RemoteOfflineError` offline (see `offline_switch`)
            when the cache holds no complete entry of it.
        RemoteCacheError: the cache cannot be used (another account's, writable by others,
            not writable).

    Example:
        >>> try:
        ...     open_remote("ftp://host/model.safetensors")
        ... except RemoteURLError as e:
        ...     print(e)
        ftp://host/model.safetensors: scheme: unknown scheme 'ftp'; accepted: gs://, hf://, \
http://, https://, s3://
    """
    environ = os.environ if environ is None else environ
    parsed = url if isinstance(url, RemoteURL) else parse_url(url)
    if options is None:
        final = resolve_options(environ, None, **keywords)
    else:
        final = resolve_options({}, options, **keywords) if keywords else options
    switch = offline_switch(parsed, environ)
    if switch is not None:
        if final.cache_dir is None:
            raise RemoteOfflineError(
                parsed.name,
                f"offline ({switch}=1) and no cache to serve it from (remote: cache, "
                f"DEVPOLICY_REMOTE_CACHE): nothing was asked of the server; set a cache and "
                f"load it once online, or unset {switch}",
            )
        return RemoteCache(final.cache_dir).offline(parsed.name, switch)
    source = RemoteObject(backend_for(parsed, environ), final, emit)
    if final.cache_dir is None:
        return source
    return RemoteCache(final.cache_dir).open(source)
