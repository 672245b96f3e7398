"""One process of a 2-process job loading a sharded checkpoint from a URL (run by
test_many_hosts): it plans the URL (the predicted fetch), loads it, and reports what it
fetched and whether its shards hold the local file's values.

Usage: python tests/io/remote/remote_worker.py PORT PROCESS_ID URL LOCAL_FILE
(the environment points at this process's S3 endpoint: AWS_ENDPOINT_URL and the keys).
"""

from __future__ import annotations

import json
import sys

import jax

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_platforms", "cpu")

import numpy as np  # noqa: E402
from structlog.testing import capture_logs  # noqa: E402

import devpolicy  # noqa: E402


def status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def main() -> None:
    port, process_id, url, local = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60
    )
    try:
        policy = devpolicy.load_policy(
            {
                "version": 1,
                "meshes": {"dp": {"axes": {"data": -1}, "devices": "cpu"}},
                "rules": [{"match": "*", "sharding": {"mesh": "dp", "spec": ["data"]}}],
            },
            environ={},
        )
        planned = devpolicy.plan(url, policy=policy)
        before = status("VmHWM")
        with capture_logs() as logs:
            out = devpolicy.load_file(url, policy=policy)
        peak_rise = status("VmHWM") - before
        expected = devpolicy.load_file(local, policy=devpolicy.load_policy(
            {"version": 1, "default": "cpu"}, environ={}), mmap=True)  # fmt: skip
        equal = all(
            np.array_equal(np.asarray(s.data), np.asarray(expected[key])[s.index])
            for key, array in out.items()
            for s in array.addressable_shards
        )
        summary = next(e for e in logs if e["event"] == "load_file")
        (fetch,) = planned.fetches
        print(json.dumps({
            "process_index": jax.process_index(),
            "shards_equal": equal,
            "requests": summary["requests"],
            "bytes_fetched": summary["bytes_fetched"],
            "predicted_requests": fetch.requests,
            "predicted_bytes": fetch.nbytes,
            "share": fetch.share,
            "peak_rise": peak_rise,
        }), flush=True)  # fmt: skip
    finally:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
