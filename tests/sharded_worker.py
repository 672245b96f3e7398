"""One process of a 2-process job loading a sharded tensor (run by test_multiprocess).

Usage: python tests/sharded_worker.py PORT PROCESS_ID FILE
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
    port, process_id, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60
    )
    try:
        policy = devpolicy.load_policy(
            {
                "version": 1,
                "meshes": {"dp": {"axes": {"data": -1}, "devices": "cpu"}},
                "rules": [
                    {"match": "big/*", "sharding": {"mesh": "dp", "spec": ["data"]}},
                    {"match": "batch", "sharding": {"mesh": "dp", "spec": ["data"]}},
                ],
            },
            environ={},
        )
        before = status("VmHWM")
        with capture_logs() as logs:
            out = devpolicy.load_file(path, policy=policy)
        peak_rise = status("VmHWM") - before
        tokens = out["tokens"]
        whole = np.memmap(path, dtype=np.uint8, mode="r")  # for checking values only
        header = devpolicy.plan(path, policy=policy).tensors[0]
        expected = np.frombuffer(
            whole, np.int32, count=int(np.prod(header.shape)), offset=header.offset
        ).reshape(header.shape)
        shards_equal = all(
            np.array_equal(np.asarray(s.data), expected[s.index]) for s in tokens.addressable_shards
        )
        local_batches = [np.full((2, 3), 10 * step + process_id, np.float32) for step in range(2)]
        batches = list(policy.prefetch(local_batches))
        summary = next(e for e in logs if e["event"] == "load_file")
        report = {
            "process_index": jax.process_index(),
            "global_shape": list(tokens.shape),
            "spec": [str(e) for e in tokens.sharding.spec],
            "addressable": len(tokens.addressable_shards),
            "shards_equal": shards_equal,
            "bytes_read": summary["bytes_read"],
            "peak_rise": peak_rise,
            "batch_shapes": [list(b.shape) for b in batches],
            "batch_local": [
                sorted({float(v) for s in b.addressable_shards for v in np.asarray(s.data).ravel()})
                for b in batches
            ],
        }
        print(json.dumps(report), flush=True)
    finally:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
