"""One process of a 2-process jax.distributed job on the CPU backend (run by test_multiprocess).

Usage: python tests/multiprocess_worker.py PORT PROCESS_ID
"""

from __future__ import annotations

import json
import sys

import jax

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_platforms", "cpu")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from structlog.testing import capture_logs  # noqa: E402

import devpolicy  # noqa: E402


def main() -> None:
    port, process_id = int(sys.argv[1]), int(sys.argv[2])
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60
    )
    try:
        local = jax.local_devices(backend="cpu")
        policy = devpolicy.load_policy(
            {"version": 1, "rules": [{"match": "shard/*", "device": "cpu:1"}]}, environ={}
        )
        with capture_logs() as logs:
            decision = policy.resolve("shard/w")
            array = policy.put("shard/w", np.arange(4) + process_id)
            with policy.scope("shard/tmp"):
                made = jnp.ones(2) * process_id
        report = {
            "process_index": jax.process_index(),
            "global_ids": sorted(d.id for d in jax.devices()),
            "local_ids": [d.id for d in local],
            "decided_id": decision.device.id,
            "decided_text": decision.device_text,
            "put_addressable": array.is_fully_addressable,
            "put_value": np.asarray(array).tolist(),
            "scoped_id": next(iter(made.devices())).id,
            "scoped_value": np.asarray(made).tolist(),
            "event_process_index": sorted(
                {e["process_index"] for e in logs if e["event"] == "placement"}
            ),
            "jax_devices_cpu_0": jax.devices("cpu")[0].id,
        }
        print(json.dumps(report), flush=True)
    finally:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
