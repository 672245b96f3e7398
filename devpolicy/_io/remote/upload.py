"""Writing a safetensors file to object storage as one multipart upload (`s3://` and
S3-compatible stores): what `joint.JointTarget` asks of a place a save writes to, so a
save from one process and one from every process of a job are the same steps.

Process 0 `create`s the upload (its id is the token); every process `write`s its parts
(`parts.plan_parts` says which), each assembled from the process's pieces in memory and
uploaded once whole, a few at a time; process 0 `publish`es by completing the upload with
every process's part tags, or `discard`s it by aborting. The object appears only when the
upload completes: a reader never sees half a file, and an aborted save leaves nothing.
"""

from __future__ import annotations

import bisect
import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Protocol

from ..._base.errors import SafetensorsFileError
from ..._base.locations import shown_url
from .s3 import S3Backend
from .urls import RemoteURL, parse_url

#: Parts uploading at once, per process: with the part being filled, what bounds the
#: upload's memory (about this many parts more than the pieces themselves; 8 MiB parts).
UPLOADS_AT_ONCE = 8


class Part(Protocol):
    """A part of the upload (`parts.Part`): bytes `[start, end)` of the file."""

    @property
    def number(self) -> int: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...


def upload_target(url: str, environ: Mapping[str, str]) -> RemoteUpload:
    """The place a save of `url` writes to.

    Raises:
        SafetensorsFileError: the scheme is not one devpolicy writes (only `s3://`).
        RemoteExtraMissingError: botocore (the `remote` extra) is not installed.
    """
    scheme = url.partition("://")[0].lower()
    if scheme != "s3":
        raise SafetensorsFileError(
            shown_url(url),
            f"cannot write to a {scheme}:// URL: devpolicy writes local files and "
            "s3:// objects (S3 and S3-compatible stores); save to a local path and upload "
            "it with the storage's own tool",
        )
    return RemoteUpload(parse_url(url), environ)


class RemoteUpload:
    """One object written as a multipart upload; see the module's docstring."""

    #: Its parts are planned before anything is written (`parts.plan_parts`).
    parted = True

    def __init__(self, url: RemoteURL, environ: Mapping[str, str]) -> None:
        self.url = url
        self._backend = S3Backend(url, environ)
        self._client: Any = self._backend.writer()
        self._header = b""
        self._where = {"Bucket": url.bucket, "Key": url.key}

    @property
    def name(self) -> str:
        """The URL as shown (no credentials)."""
        return self.url.name

    def create(self, header: bytes, size: int) -> str:
        """Process 0: begin the upload; the header goes out with process 0's first part."""
        self._header = len(header).to_bytes(8, "little") + header
        answer = self._call("start the upload", self._client.create_multipart_upload)
        return str(answer["UploadId"])

    def write(
        self,
        token: str,
        pieces: Iterable[tuple[int, memoryview]],
        parts: Sequence[Part] | None = None,
    ) -> tuple[int, str]:
        """Upload this process's `parts`, filled from `pieces` (file offset, bytes);
        return (bytes uploaded, the parts' numbers and tags as JSON)."""
        mine = sorted(parts or (), key=lambda part: part.start)
        starts = [part.start for part in mine]
        filling: dict[int, tuple[bytearray, list[int]]] = {}
        tags: list[tuple[int, str]] = []
        uploaded = 0
        pending: list[Future[tuple[int, str]]] = []
        with ThreadPoolExecutor(UPLOADS_AT_ONCE, thread_name_prefix="devpolicy-upload") as pool:

            def sent(future: Future[tuple[int, str]]) -> None:
                tags.append(future.result())

            def place(offset: int, data: memoryview) -> None:
                nonlocal pending, uploaded
                while len(data):
                    k = bisect.bisect_right(starts, offset) - 1
                    if k < 0 or offset >= mine[k].end:
                        raise SafetensorsFileError(
                            self.name,
                            f"bytes at {offset} belong to no part of this process "
                            "(a bug: the processes disagree on who uploads what)",
                        )
                    part = mine[k]
                    length = min(len(data), part.end - offset)
                    if part.number not in filling:  # a new part's buffer, made once
                        filling[part.number] = (bytearray(part.end - part.start), [0])
                    buffer, filled = filling[part.number]
                    buffer[offset - part.start : offset - part.start + length] = data[:length]
                    filled[0] += length
                    if filled[0] == len(buffer):
                        del filling[part.number]
                        while len(pending) >= UPLOADS_AT_ONCE:
                            done, _ = wait(pending, return_when="FIRST_COMPLETED")
                            for future in done:
                                sent(future)
                            pending = [f for f in pending if f not in done]
                        pending.append(pool.submit(self._upload, token, part.number, buffer))
                        uploaded += len(buffer)
                    offset += length
                    data = data[length:]

            if self._header:
                place(0, memoryview(self._header))
            for offset, data in pieces:
                place(offset, memoryview(data).cast("B"))
            for future in pending:
                sent(future)
        if filling:
            number, (buffer, filled) = next(iter(filling.items()))
            raise SafetensorsFileError(
                self.name,
                f"part {number} got {filled[0]} of its {len(buffer)} bytes (a bug: the "
                "processes disagree on who uploads what)",
            )
        return uploaded, json.dumps(sorted(tags))

    def publish(self, token: str, receipts: Sequence[str]) -> None:
        """Process 0: complete the upload with every process's parts, in order."""
        tags = sorted(tag for receipt in receipts for tag in json.loads(receipt or "[]"))
        numbers = [number for number, _ in tags]
        if numbers != list(range(1, len(numbers) + 1)):
            raise SafetensorsFileError(
                self.name, f"the parts uploaded are not 1 to {len(numbers)}: {numbers[:20]}"
            )
        listing = {"Parts": [{"PartNumber": n, "ETag": tag} for n, tag in tags]}
        self._call(
            "complete the upload",
            self._client.complete_multipart_upload,
            UploadId=token,
            MultipartUpload=listing,
        )

    def discard(self, token: str) -> None:
        """Process 0, when the save failed: abort the upload (its parts are deleted)."""
        with contextlib.suppress(Exception):
            self._client.abort_multipart_upload(UploadId=token, **self._where)

    def _upload(self, token: str, number: int, body: bytearray) -> tuple[int, str]:
        answer = self._call(
            f"upload part {number}",
            self._client.upload_part,
            UploadId=token,
            PartNumber=number,
            Body=body,
        )
        return number, str(answer["ETag"])

    def _call(self, what: str, method: Any, **arguments: Any) -> Any:
        """A request (botocore retries it); its failure as an error naming the URL."""
        try:
            return method(**self._where, **arguments)
        except Exception as e:  # botocore's ClientError, EndpointConnectionError, ...
            answer = getattr(e, "response", None) or {}
            status = answer.get("ResponseMetadata", {}).get("HTTPStatusCode")
            hint = f"; {self._backend.auth_hint()}" if status in (401, 403) else ""
            raise SafetensorsFileError(self.name, f"cannot {what}: {_said(e)}{hint}") from None


def _said(error: BaseException) -> str:
    """botocore's error as one line (its messages never hold the credentials)."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
