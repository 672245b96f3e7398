"""Keep a token dataset in host memory while the model and batches use the accelerator.

Writes a synthetic stream of uint16 tokens (and a small model checkpoint) as safetensors,
loads both with `devpolicy.load_file` under `policies/dataset-on-host.yaml`, applied by
`devpolicy.bootstrap` before JAX starts (JAX starts the accelerator installed here and the
CPU; the tokens stay on the host, mapped from their file, and the parameters go to
`accelerator`: the TPU on a TPU VM, the GPU on a GPU box),
then runs a few training-style steps on batches of random windows that
`devpolicy.windows` cuts from the host tokens (a zero-copy view: any offset works, past
2**31 included) and sends to the compute device ahead of use. Every decision is logged
on stderr; `devpolicy.report()` prints where the live bytes are at the end, by device and
by rule. On a machine without a TPU or GPU the policy's rules go to the CPU, as they
declare, and each event says why (at info: no warning).

    python examples/dataset_on_host.py --size 64MiB
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import devpolicy

POLICY = Path(__file__).resolve().parent.parent / "policies" / "dataset-on-host.yaml"
SEQ_LEN = 128
VOCAB = 32_000
WIDTH = 64
CHUNK = 8 * 2**20  # tokens written at a time (16 MiB)


def write_dataset(path: Path, nbytes: int, seed: int = 0) -> None:
    """One `tokens` tensor: a stream of uint16 token ids, about `nbytes` large, written
    chunk by chunk as a tokenizer makes them (`save_chunks` holds one chunk at a time, so
    `--size 40GiB` needs no 40 GiB of memory) at a 64-byte-aligned offset, so that it maps
    zero-copy."""
    count = max(2 * SEQ_LEN, nbytes // 2)
    rng = np.random.default_rng(seed)
    chunks = (
        rng.integers(0, VOCAB, size=min(CHUNK, count - start), dtype=np.uint16)
        for start in range(0, count, CHUNK)
    )
    devpolicy.save_chunks(chunks, path)


def write_model(path: Path, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    devpolicy.save_file(
        {
            "embed": (rng.normal(size=(VOCAB, WIDTH)) * 0.02).astype(np.float32),
            "out": rng.normal(size=(WIDTH,)).astype(np.float32),
        },
        path,
    )


@jax.jit
def step(params: dict[str, jax.Array], batch: jax.Array) -> jax.Array:
    hidden = params["embed"][batch.astype(jnp.int32)]
    return jnp.mean(hidden @ params["out"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="32MiB", help="dataset size: 64MiB, 2GiB (default 32MiB)")
    parser.add_argument("--steps", type=int, default=5, help="training-style steps to run")
    parser.add_argument("--batch", type=int, default=8, help="sequences per batch")
    parser.add_argument("--policy", type=Path, default=POLICY, help="policy file")
    args = parser.parse_args(argv)
    try:
        nbytes = devpolicy.sizes.parse_size(args.size)
    except ValueError as e:
        parser.error(f"--size: {e}")

    # First, before any JAX computation: the policy's `runtime:` (the accelerator installed,
    # then the CPU) takes effect, and the policy becomes the active one.
    activation = devpolicy.bootstrap(args.policy)
    backends = ", ".join(devpolicy.inventory().devices)
    print(f"policy {activation.policy.found}; backends: {backends}", file=sys.stderr)

    with tempfile.TemporaryDirectory() as tmp, activation:
        data, model = Path(tmp) / "dataset.safetensors", Path(tmp) / "model.safetensors"
        write_dataset(data, nbytes)
        write_model(model)

        tokens = devpolicy.load_file(data)["tokens"]  # named dataset/tokens: stays on the host
        params = devpolicy.load_file(model)  # named model/embed, model/out: compute device

        # Random windows of the host tokens, each batch placed as "batch" (the compute
        # device), two transfers in flight ahead of the step that uses them.
        losses = []
        stream = devpolicy.windows(
            tokens, SEQ_LEN, args.batch, order="random", seed=0, steps=args.steps
        )
        for batch in stream:
            losses.append(float(step(params, batch)))

        # Where the live bytes are now (the last batch is still held), by device and rule;
        # then the same as bars against each device's memory, with the stream's loop.
        ledger = devpolicy.report()
        print(ledger)
        print(ledger.bars())
        print(f"losses: {', '.join(f'{x:.4f}' for x in losses)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
