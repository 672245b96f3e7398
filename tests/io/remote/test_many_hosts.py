"""Two processes over one sharded checkpoint at a URL each fetch their half (bytes counted at
a proxy of their own), and each process's plan predicts its fetch exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import devpolicy
from tests.conftest import REPO
from tests.helpers import reports_of, run_job

from . import servers
from .conftest import BUCKET, s3_environ

# Each test talks to real servers (local S3, GCS, Hub and HTTP servers, some of them processes):
# out of the quick subset (`-m "not slow"`), in the full suite.
pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("remote_worker.py")


def _run_two(url: str, local: Path, endpoints: list[str]) -> list[dict[str, Any]]:
    environs = [{**s3_environ(endpoint), "PYTHONPATH": str(REPO)} for endpoint in endpoints]
    return reports_of(run_job(WORKER, [[url, str(local)]] * 2, environs=environs))


@pytest.mark.slow
class TestManyHosts:
    def test_two_processes_each_fetch_their_half(
        self, s3: servers.S3Server, tmp_path: Path
    ) -> None:
        """Two processes under jax.distributed load a checkpoint sharded over both: each
        fetches about its half (counted at its own proxy), its plan predicts its requests
        and bytes exactly, and its shards hold the file's values."""
        rng = np.random.default_rng(7)
        local = tmp_path / "big.safetensors"
        devpolicy.save_file(
            {
                "w": rng.standard_normal((1024, 2048)).astype(np.float32),  # 8 MiB
                "v": rng.standard_normal((512, 512)).astype(np.float32),  # 1 MiB
            },
            local,
        )
        s3.put(BUCKET, "many/big.safetensors", local.read_bytes())
        with (
            servers.running(lambda: servers.FaultProxy(s3.url)) as first,
            servers.running(lambda: servers.FaultProxy(s3.url)) as second,
        ):
            reports = _run_two(
                f"s3://{BUCKET}/many/big.safetensors", local, [first.url, second.url]
            )
            counted = [first.body_bytes(), second.body_bytes()]
        tensors = (1024 * 2048 + 512 * 512) * 4
        for report, at_proxy in zip(reports, counted, strict=True):
            assert report["shards_equal"] is True
            assert report["share"] == tensors // 2
            # The plan's own header read and the load's: 64 KiB each, the rest its half.
            assert at_proxy <= 1.02 * tensors // 2 + 2 * 64 * 2**10
            assert report["bytes_fetched"] <= 1.02 * tensors // 2 + 64 * 2**10
            assert (report["requests"], report["bytes_fetched"]) == (
                report["predicted_requests"],
                report["predicted_bytes"],
            )
        assert sorted(r["process_index"] for r in reports) == [0, 1]
