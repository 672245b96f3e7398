"""s3://bucket/key: endpoints, regions and credentials as botocore (and so boto3) finds them.

`AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` (or a profile's `endpoint_url`) for S3-compatible
stores, `AWS_REGION` / `AWS_DEFAULT_REGION` / the profile's region, and the whole credential
chain (environment, `AWS_PROFILE` and the shared files, SSO, instance roles). Requests are
presigned by botocore (SigV4) one at a time, so refreshed credentials are used as they come;
with no credentials found, requests go unsigned (public buckets). A custom endpoint is
addressed path-style (`endpoint/bucket/key`), as S3-compatible stores expect. Data reads send
`If-Match` with the ETag first seen, and each response's ETag is checked as well.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from .backend import Backend, Stat
from .errors import RemoteExtraMissingError, RemoteReadError
from .http import Pool, Response
from .urls import RemoteURL

_LINK_SECONDS = 3600


class S3Backend(Backend):
    """An S3 object."""

    def __init__(self, url: RemoteURL, environ: Mapping[str, str]) -> None:
        super().__init__(url, environ)
        try:
            # By name: botocore belongs to the `remote` extra, not to the runtime dependencies
            # that tests/project/test_packaging.py holds devpolicy's imports to.
            botocore = importlib.import_module("botocore")
            importlib.import_module("botocore.config")
            importlib.import_module("botocore.session")
        except ImportError as e:
            raise RemoteExtraMissingError(url.name, "botocore") from e
        UNSIGNED = botocore.UNSIGNED  # noqa: N806 - botocore's name
        session = botocore.session.Session()
        profile = environ.get("AWS_PROFILE")
        if profile:
            session.set_config_variable("profile", profile)
        # botocore reads os.environ; an `environ` given by the caller is read here instead.
        key, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
        if key and secret:
            session.set_credentials(key, secret, environ.get("AWS_SESSION_TOKEN"))
        region = environ.get("AWS_REGION") or session.get_config_variable("region") or "us-east-1"
        endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
        self._signed = session.get_credentials() is not None
        probe = session.create_client(
            "s3",
            region_name=region,
            endpoint_url=endpoint or None,
            config=botocore.config.Config(signature_version=UNSIGNED),
        )
        custom = "amazonaws.com" not in probe.meta.endpoint_url

        def client(attempts: int) -> Any:
            config = botocore.config.Config(
                signature_version="s3v4" if self._signed else UNSIGNED,
                s3={"addressing_style": "path" if custom else "auto"},
                retries={"max_attempts": attempts, "mode": "standard"},
            )
            return session.create_client(
                "s3", region_name=region, endpoint_url=endpoint or None, config=config
            )

        self._client: Any = client(1)  # reads: the source retries each range itself
        self._client_of = client

    @property
    def client(self) -> Any:
        """botocore's S3 client (presigns the listing of a folder too)."""
        return self._client

    def writer(self) -> Any:
        """botocore's S3 client for uploads: its standard retries (backoff with jitter on
        throttling, 5xx, resets and timeouts), five attempts a request."""
        return self._client_of(5)

    def _link(self, operation: str) -> str:
        return str(
            self._client.generate_presigned_url(
                operation,
                Params={"Bucket": self.url.bucket, "Key": self.url.key},
                ExpiresIn=_LINK_SECONDS,
            )
        )

    def stat_request(self) -> tuple[str, str, dict[str, str], bool]:
        return "HEAD", self._link("head_object"), {}, True

    def stat_of(self, response: Response, pool: Pool) -> Stat:
        length = response.header("Content-Length")
        if length is None or not length.isdigit():
            raise RemoteReadError(self.name, "the server did not say the object's size",
                                  status=response.status)  # fmt: skip
        return Stat(int(length), response.header("ETag"))

    def data_request(self, start: int, end: int) -> tuple[str, dict[str, str]]:
        assert self.stat is not None
        headers = {"If-Match": self.stat.version} if self.stat.version else {}
        return self._link("get_object"), headers

    def version_of(self, response: Response) -> str | None:
        return response.header("ETag")

    def auth_hint(self) -> str:
        if self._signed:
            return "the credentials found were refused: check AWS_PROFILE / AWS_ACCESS_KEY_ID"
        return (
            "no AWS credentials were found (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "AWS_PROFILE, or the shared credentials file)"
        )
