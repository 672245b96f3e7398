"""One process of a 2-process job resuming a `windows` stream (run by tests/apply/stream/test_state.py).

Usage: python tests/resume_worker.py PORT PROCESS_ID

Each process draws its rows of 6 global batches (4 rows, sharded by rows over 2 x 2
devices) from one uninterrupted stream, then from a stream resumed at step 3 (by `start`
and by the saved state), and reports its rows of each. Then, for a shuffled stream and a
mixture, and packed rows, it reports its rows of 6 global batches by global row, and the
state saved before each step: the test resumes each state in one process (2 -> 1) and
compares.
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


def rows_by_index(batch: jax.Array) -> dict[int, list[int]]:
    """This process's rows of a global batch, by their index in the global batch."""
    seen: dict[int, list[int]] = {}
    for shard in batch.addressable_shards:
        start = shard.index[0].start or 0
        for i, row in enumerate(np.asarray(shard.data).tolist()):
            seen[start + i] = row
    return seen


def elastic(tokens: object, policy: devpolicy.Policy, **options: object) -> dict[str, object]:
    """Six global batches of a stream (this process's rows, by global row) and its state
    saved before each step."""
    stream = devpolicy.windows(tokens, 5, 2, seed=11, steps=6, policy=policy, **options)
    batches, states = [], [stream.state()]
    for batch in stream:
        batches.append(rows_by_index(batch))
        states.append(stream.state())
    return {"batches": batches, "states": states}


def packed_corpus() -> np.ndarray:
    """Documents of 1 to 40 tokens, each ended by token 0 (the test builds the same)."""
    lengths = (np.arange(3_000) * 7919) % 40 + 1
    tokens = [np.append((np.arange(n) % 900) + 1, 0) for n in lengths.tolist()]
    return np.concatenate(tokens).astype(np.uint16)


def packed_elastic(policy: devpolicy.Policy) -> dict[str, object]:
    """Six global batches of packed rows (this process's rows of the tokens, by global
    row) and the state saved before each step."""
    stream = devpolicy.windows(
        packed_corpus(), 16, 2, order="shuffled", seed=11, steps=6, pack="first_fit",
        separator=0, pad=999, policy=policy,
    )  # fmt: skip
    batches, states = [], [stream.state()]
    for batch in stream:
        batches.append(rows_by_index(batch["tokens"]))
        states.append(stream.state())
    return {"batches": batches, "states": states}


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
                    "shuffled": elastic(tokens, policy, order="shuffled", stride=3),
                    "packed": packed_elastic(policy),
                    "mixed": elastic(
                        {"low": tokens[:60_000], "high": tokens[60_000:]},
                        policy,
                        order="shuffled",
                        weights={"low": 3, "high": 1},
                    ),
                }
            ),
            flush=True,
        )
    finally:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
