"""One process of a 2-process job saving a sharded state to `s3://` (run by
tests/io/remote/test_upload.py). Each process has 2 CPU devices; the S3 endpoint and
credentials come in the environment.

Usage: python tests/io/remote/upload_worker.py PORT PROCESS_ID URL DIR

Process 0 also saves the same values from numpy to DIR/reference.safetensors. Each
process prints one JSON line: its `save_file` event.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_platforms", "cpu")

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from structlog.testing import capture_logs  # noqa: E402

import devpolicy  # noqa: E402

#: Rows split over all 4 devices (each process one range of 8 MiB), columns split (the
#: processes' bytes interleave), and small ones.
SPECS = {
    "rows": ((2048, 2048), P(("data", "model"))),
    "columns": ((2048, 1024), P(None, ("data", "model"))),
    "bias": ((1024,), P("model")),
    "scale": ((256,), P()),
    "step": ((), P()),
}


def main() -> None:
    port, process_id, url, directory = (
        int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    )  # fmt: skip
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60
    )
    mesh = jax.make_mesh((2, 2), ("data", "model"), devices=jax.devices())
    rng = np.random.default_rng(3)
    values = {
        name: rng.standard_normal(shape).astype(np.float32) for name, (shape, _) in SPECS.items()
    }
    state = {
        name: jax.make_array_from_callback(
            values[name].shape, NamedSharding(mesh, spec), lambda index, n=name: values[n][index]
        )
        for name, (_, spec) in SPECS.items()
    }
    policy = devpolicy.load_policy({"version": 1}, environ={})
    if process_id == 0:
        devpolicy.save_file(values, directory / "reference.safetensors", policy=policy)
    with capture_logs() as events:
        devpolicy.save_file(state, url, policy=policy, timeout=120)
    saved = next(e for e in events if e["event"] == "save_file")
    print(json.dumps({"process_index": process_id, "saved": saved}, default=str), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
