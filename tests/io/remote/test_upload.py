"""`save_file` to `s3://`: one multipart upload, from one process or from every process of
a `jax.distributed` job, against SeaweedFS on 127.0.0.1. The object is byte for byte the
file a local save writes; a failed save leaves no object and no upload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._io.remote.upload import RemoteUpload
from tests.helpers import reports_of, run_job

from . import servers
from .conftest import BUCKET, Proxied, s3_environ

# Each test talks to real servers (local S3, GCS, Hub and HTTP servers, some of them processes):
# out of the quick subset (`-m "not slow"`), in the full suite.
pytestmark = pytest.mark.slow

WORKER = Path(__file__).parent / "upload_worker.py"


def _values() -> dict[str, np.ndarray[Any, Any]]:
    """Two 40 MiB tensors (many 8 MiB parts together), and small ones between."""
    rng = np.random.default_rng(7)
    return {
        "embed": rng.standard_normal((4096, 2560)).astype(np.float32),  # 40 MiB
        "norm": rng.standard_normal(2560).astype(np.float32),
        "out": rng.standard_normal((2560, 4096)).astype(np.float32),  # 40 MiB
        "step": np.array(7, np.int32),
    }


@pytest.fixture(scope="module")
def saved_locally(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, np.ndarray[Any, Any]], bytes]:
    """`_values()` and the file a local `save_file` writes of them."""
    values = _values()
    path = tmp_path_factory.mktemp("local") / "local.safetensors"
    devpolicy.save_file(values, path, policy=_policy())
    return values, path.read_bytes()


def _object(s3: servers.S3Server, key: str) -> bytes:
    return bytes(s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read())


def _uploads_left(s3: servers.S3Server) -> list[str]:
    answer = s3.client().list_multipart_uploads(Bucket=BUCKET)
    return [upload["Key"] for upload in answer.get("Uploads", [])]


@pytest.fixture
def environ(s3: servers.S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = s3_environ(s3.url)
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def _policy() -> devpolicy.Policy:
    return devpolicy.load_policy({"version": 1}, environ={})


class TestOneProcess:
    def test_the_object_is_the_file_a_local_save_writes(
        self,
        s3: servers.S3Server,
        environ: dict[str, str],
        saved_locally: tuple[dict[str, np.ndarray[Any, Any]], bytes],
    ) -> None:
        """An 80 MiB save goes up in parts and reads back, byte for byte the local file;
        `load_file` of the URL gives the values; the event shows the URL and the bytes."""
        values, local = saved_locally
        url = f"s3://{BUCKET}/saved/model.safetensors"
        with capture_logs() as events:
            devpolicy.save_file(values, url, policy=_policy())
        assert _object(s3, "saved/model.safetensors") == local
        (event,) = [e for e in events if e["event"] == "save_file"]
        size = len(local)
        assert (event["file"], event["file_bytes"], event["bytes_written"]) == (url, size, size)
        assert event["processes"] == 1
        assert "gathered_bytes" not in event
        loaded = devpolicy.load_file(url, policy=_policy())
        for name, value in values.items():
            np.testing.assert_array_equal(np.asarray(loaded[name]), value)

    def test_a_small_tree_is_one_part(
        self, s3: servers.S3Server, environ: dict[str, str], tmp_path: Path
    ) -> None:
        """A tree of a few bytes: one part (the last may be any size); saved over again,
        the object is replaced whole."""
        url = f"s3://{BUCKET}/saved/small.safetensors"
        for fill in (1.0, 2.0):
            tree = {"params": {"w": np.full((3, 4), fill, np.float32)}}
            devpolicy.save_file(tree, url, policy=_policy())
            devpolicy.save_file(tree, tmp_path / "small.safetensors", policy=_policy())
            assert (
                _object(s3, "saved/small.safetensors")
                == (tmp_path / "small.safetensors").read_bytes()
            )

    def test_odd_leaves_upload_as_they_save_locally(
        self, s3: servers.S3Server, environ: dict[str, str], tmp_path: Path
    ) -> None:
        """An empty array, a 0-d one, F4 values (two a byte), bfloat16 and a PRNG key:
        the object is the local file, byte for byte; an empty tree too."""
        import jax
        import ml_dtypes

        tree = {
            "empty": np.zeros((0, 3), np.float32),
            "scalar": np.array(3, np.int64),
            "codes": np.linspace(-6, 6, 64).astype(ml_dtypes.float4_e2m1fn).reshape(8, 8),
            "half": np.arange(10).astype(ml_dtypes.bfloat16),
            "key": jax.random.key(0),
        }
        for name, value in (("odd", tree), ("none", {})):
            url = f"s3://{BUCKET}/saved/{name}.safetensors"
            devpolicy.save_file(value, url, policy=_policy())
            devpolicy.save_file(value, tmp_path / f"{name}.safetensors", policy=_policy())
            assert (
                _object(s3, f"saved/{name}.safetensors")
                == (tmp_path / f"{name}.safetensors").read_bytes()
            )

    def test_three_503s_on_a_part_are_retried_and_the_object_is_exact(
        self,
        s3: servers.S3Server,
        s3_proxied: Proxied,
        monkeypatch: pytest.MonkeyPatch,
        saved_locally: tuple[dict[str, np.ndarray[Any, Any]], bytes],
    ) -> None:
        """Through a proxy that answers the first three part uploads with 503: the parts
        are sent again, and the object is byte for byte the local file."""
        s3_proxied.setenv(monkeypatch)
        s3_proxied.proxy.faults.append(
            servers.Fault("status", times=3, applies=lambda method, path, range_: method == "PUT")
        )
        values, local = saved_locally
        url = f"s3://{BUCKET}/saved/retried.safetensors"
        devpolicy.save_file(values, url, policy=_policy())
        refused = [e for e in s3_proxied.proxy.exchanges if e.status == 503]
        assert [e.method for e in refused] == ["PUT"] * 3
        assert _object(s3, "saved/retried.safetensors") == local

    def test_a_failed_part_leaves_no_object_and_no_upload(
        self, s3: servers.S3Server, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A part that cannot be uploaded fails the save naming the URL and the part; the
        upload is aborted: no object, no upload left in the bucket."""
        real = RemoteUpload._upload

        def second_fails(self: RemoteUpload, token: str, number: int, body: bytearray) -> Any:
            if number == 2:
                return self._call("upload part 2", self._client.upload_part, UploadId="no-such")
            return real(self, token, number, body)

        monkeypatch.setattr(RemoteUpload, "_upload", second_fails)
        url = f"s3://{BUCKET}/saved/failed.safetensors"
        with pytest.raises(
            devpolicy.SafetensorsFileError, match=rf"^{url}: cannot upload part 2: "
        ):
            devpolicy.save_file(_values(), url, policy=_policy())
        client = s3.client()
        with pytest.raises(client.exceptions.ClientError):
            client.head_object(Bucket=BUCKET, Key="saved/failed.safetensors")
        assert "saved/failed.safetensors" not in _uploads_left(s3)

    def test_refused_credentials_are_named_with_the_fix(
        self, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A wrong secret key: the error names the URL, what failed and where the
        credentials come from, and never shows the secret."""
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        url = f"s3://{BUCKET}/saved/denied.safetensors"
        with pytest.raises(devpolicy.SafetensorsFileError) as caught:
            devpolicy.save_file({"a": np.zeros(2)}, url, policy=_policy())
        text = str(caught.value)
        assert text.startswith(f"{url}: cannot start the upload: ")
        assert "check AWS_PROFILE / AWS_ACCESS_KEY_ID" in text
        assert "not-the-secret" not in text

    @pytest.mark.parametrize(
        "url",
        ["gs://b/m.safetensors", "https://example.com/m.safetensors", "hf://o/r/m.safetensors"],
    )
    def test_other_schemes_are_refused_before_anything_is_done(self, url: str) -> None:
        """gs://, https:// and hf:// are read, not written: the error says which schemes
        are written and what to do."""
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=r"cannot write to a \w+:// URL: devpolicy writes local files and s3:// "
            r"objects \(S3 and S3-compatible stores\); save to a local path and upload it",
        ):
            devpolicy.save_file({"a": np.zeros(2)}, url, policy=_policy())


@pytest.mark.slow
def test_two_processes_upload_their_own_parts(s3: servers.S3Server, tmp_path: Path) -> None:
    """2 processes x 2 CPU devices save a state to s3:// together: a tensor split on rows
    across the processes goes up as each process's own parts (not gathered); one split on
    columns and the small ones are gathered for process 0; the object is byte for byte
    the single-process file of the same values."""
    environ = s3_environ(s3.url)
    url = f"s3://{BUCKET}/joint/model.safetensors"
    reports = reports_of(
        run_job(WORKER, [(url, str(tmp_path))] * 2, environs=[environ, environ], timeout=300)
    )
    reference = (tmp_path / "reference.safetensors").read_bytes()
    assert _object(s3, "joint/model.safetensors") == reference
    rows = 2048 * 2048 * 4  # `rows`, 16 MiB: half from each process
    columns = 2048 * 1024 * 4
    header = 8 + int.from_bytes(reference[:8], "little")
    for report in reports:
        assert report["saved"]["processes"] == 2
        assert report["saved"]["file_bytes"] == len(reference)
        assert report["saved"]["gathered_bytes"] == len(reference) - header - rows
        assert report["saved"]["gathered_bytes"] >= columns
    written = [report["saved"]["bytes_written"] for report in reports]
    assert sum(written) == len(reference)
    assert written[1] == rows // 2
