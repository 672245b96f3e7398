"""Multi-process runs: `cpu:1` means each process's own second device, arrays stay addressable."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO

WORKER = REPO / "tests" / "multiprocess_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.slow
def test_two_processes_each_use_their_own_devices() -> None:
    """Two jax.distributed processes on 127.0.0.1: targets index process-local devices."""
    port = free_port()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("DEVPOLICY_") and k != "XLA_FLAGS"
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(port), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for i in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-3000:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    first, second = outputs
    assert first["global_ids"] == second["global_ids"]
    assert len(first["global_ids"]) == 4
    for index, report in enumerate(outputs):
        assert report["process_index"] == index
        assert report["decided_text"] == "cpu:1"
        assert report["decided_id"] == report["local_ids"][1]
        assert report["scoped_id"] == report["local_ids"][1]
        assert report["put_addressable"] is True
        assert report["put_value"] == [index, index + 1, index + 2, index + 3]
        assert report["scoped_value"] == [float(index)] * 2
        assert report["event_process_index"] == [index]
    # What devpolicy avoids: in process 1, JAX's "first CPU device" belongs to process 0.
    assert second["jax_devices_cpu_0"] not in second["local_ids"]
