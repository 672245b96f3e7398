"""gs://bucket/key: Google's JSON API, with application default credentials.

`STORAGE_EMULATOR_HOST` points at an emulator (fake-gcs-server), with no credentials, as
Google's own clients do. Otherwise credentials come from `google.auth.default()` (the
`GOOGLE_APPLICATION_CREDENTIALS` file, gcloud's login, the metadata server); with none
found, requests go anonymous (public buckets). Data reads are pinned to the generation
first seen (`generation=`), and each response's `x-goog-generation` is checked.
"""

from __future__ import annotations

import importlib
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

from .backend import Backend, Stat
from .errors import RemoteExtraMissingError, RemoteReadError
from .http import Pool, Response
from .urls import RemoteURL

_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"


class GcsBackend(Backend):
    """A GCS object."""

    def __init__(self, url: RemoteURL, environ: Mapping[str, str]) -> None:
        super().__init__(url, environ)
        emulator = environ.get("STORAGE_EMULATOR_HOST", "").strip()
        self._credentials: Any = None
        self._lock = threading.Lock()
        if emulator:
            self.endpoint = emulator if "://" in emulator else f"http://{emulator}"
        else:
            self.endpoint = "https://storage.googleapis.com"
            try:
                # By name: google-auth belongs to the `remote` extra, not to the runtime
                # dependencies that tests/project/test_packaging.py holds imports to.
                auth = importlib.import_module("google.auth")
                exceptions = importlib.import_module("google.auth.exceptions")
            except ImportError as e:
                raise RemoteExtraMissingError(url.name, "google-auth") from e
            try:
                self._credentials, _ = auth.default(scopes=[_SCOPE])
            except exceptions.DefaultCredentialsError:
                self._credentials = None
        self.endpoint = self.endpoint.rstrip("/")
        self._object = (
            f"b/{urllib.parse.quote(url.bucket, safe='')}/o/{urllib.parse.quote(url.key, safe='')}"
        )

    def auth_headers(self) -> dict[str, str]:
        """The headers that authorise a request (none without credentials)."""
        return self._auth()

    def _auth(self) -> dict[str, str]:
        if self._credentials is None:
            return {}
        with self._lock:
            if not self._credentials.valid:
                transport = importlib.import_module("google.auth.transport.requests")
                self._credentials.refresh(transport.Request())
            return {"Authorization": f"Bearer {self._credentials.token}"}

    def stat_request(self) -> tuple[str, str, dict[str, str], bool]:
        return "GET", f"{self.endpoint}/storage/v1/{self._object}", self._auth(), True

    def stat_of(self, response: Response, pool: Pool) -> Stat:
        import json

        body = response.small_body(2**20)
        try:
            meta = json.loads(body)
            return Stat(int(meta["size"]), str(meta["generation"]))
        except (ValueError, KeyError, TypeError) as e:
            raise RemoteReadError(self.name, "the object's metadata could not be read",
                                  status=response.status) from e  # fmt: skip

    def data_request(self, start: int, end: int) -> tuple[str, dict[str, str]]:
        assert self.stat is not None
        query = "alt=media" + (f"&generation={self.stat.version}" if self.stat.version else "")
        return f"{self.endpoint}/download/storage/v1/{self._object}?{query}", self._auth()

    def version_of(self, response: Response) -> str | None:
        return response.header("x-goog-generation")

    def auth_hint(self) -> str:
        if self._credentials is None:
            return (
                "no Google application default credentials were found "
                "(GOOGLE_APPLICATION_CREDENTIALS, or `gcloud auth application-default login`)"
            )
        return "the application default credentials were refused"
