"""One process of a 2-process job resuming a `windows` stream (run by test_resume).

Usage: python tests/resume_worker.py PORT PROCESS_ID

Each process draws its rows of 6 global batches (4 rows, sharded by rows over 2 x 2
devices) from one uninterrupted stream, then from a stream resumed at step 3 (by `start`
and by the saved state), and reports its rows of each.
"""

from __future__ import annotations

import json
import sys

import jax

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_platforms", "cpu")

import numpy as np  # noqa: E402

import devpolicy  # noqa: E402


def local_rows(batch: jax.Array) -> list[list[int]]:
    """This process's rows of a global batch, in global row order."""
    shards = sorted(batch.addressable_shards, key=lambda s: s.index[0].start or 0)
    seen: dict[int, list[int]] = {}
    for shard in shards:
        start = shard.index[0].start or 0
        for i, row in enumerate(np.asarray(shard.data).tolist()):
            seen[start + i] = row
    return [seen[k] for k in sorted(seen)]


def main() -> None:
    port, process_id = int(sys.argv[1]), int(sys.argv[2])
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60
    )
    try:
        policy = devpolicy.load_policy(
            {
                "version": 1,
                "meshes": {"dp": {"axes": {"data": -1}, "devices": "cpu"}},
                "rules": [{"match": "batch", "sharding": {"mesh": "dp", "spec": ["data"]}}],
            },
            environ={},
        )
        tokens = np.arange(100_000, dtype=np.int32)
        args: dict[str, object] = {"order": "random", "seed": 11, "steps": 6, "policy": policy}
        whole = devpolicy.windows(tokens, 5, 2, **args)
        uninterrupted = []
        saved = None
        for step, batch in enumerate(whole):
            uninterrupted.append(local_rows(batch))
            if step == 2:
                saved = whole.state()  # three batches handed out: the next is 3
        by_start = [local_rows(b) for b in devpolicy.windows(tokens, 5, 2, start=3, **args)]
        by_state = [
            local_rows(b) for b in devpolicy.windows(tokens, 5, 2, resume=json.dumps(saved), **args)
        ]
        shapes = sorted({tuple(b.shape) for b in devpolicy.windows(tokens, 5, 2, **args)})
        print(
            json.dumps(
                {
                    "process_index": jax.process_index(),
                    "uninterrupted": uninterrupted,
                    "by_start": by_start,
                    "by_state": by_state,
                    "shapes": shapes,
                    "saved_step": saved["step"] if saved else None,
                }
            ),
            flush=True,
        )
    finally:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
