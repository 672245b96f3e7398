"""Which backend reads a URL's scheme: S3, GCS, the Hub, or any web server.

The backends' modules import nothing beyond Python at module level (botocore and google-auth
are imported when a backend is made), so naming them all here costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from .backend import Backend
from .gcs import GcsBackend
from .hub import HubBackend
from .s3 import S3Backend
from .urls import RemoteURL
from .web import WebBackend


def backend_for(url: RemoteURL, environ: Mapping[str, str]) -> Backend:
    """The backend of `url`'s scheme, made with the credentials and endpoints `environ`
    holds.

    Raises:
        RemoteExtraMissingError: the scheme needs a package of the `remote` extra.
    """
    if url.scheme == "s3":
        return S3Backend(url, environ)
    if url.scheme == "gs":
        return GcsBackend(url, environ)
    if url.scheme == "hf":
        return HubBackend(url, environ)
    return WebBackend(url, environ)
