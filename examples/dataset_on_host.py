"""Keep a token dataset on the host while the model lives on the accelerator.

Writes a synthetic uint16 token dataset as safetensors, loads it with devpolicy keeping the
tokens in host memory, puts the model parameters on the compute device, and runs a few
training-style steps, printing where everything went and why. It runs the same on a
machine without a GPU: the policy falls back to the CPU and says so.

    python examples/dataset_on_host.py --size 64MiB
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.flax import load_file
from safetensors.numpy import save_file

import devpolicy

POLICY = Path(__file__).resolve().parent.parent / "policies" / "dataset-on-host.yaml"
SEQ_LEN = 128
VOCAB = 32_000
WIDTH = 64


def write_dataset(path: Path, nbytes: int, seed: int = 0) -> None:
    """A file holding one `tokens` tensor of uint16 token ids, about `nbytes` large."""
    rows = max(1, nbytes // (SEQ_LEN * 2))
    tokens = np.random.default_rng(seed).integers(0, VOCAB, size=(rows, SEQ_LEN), dtype=np.uint16)
    save_file({"tokens": tokens}, str(path))


@devpolicy.place("dataset/train")
def load_train(path: Path) -> dict[str, jax.Array]:
    """Plain safetensors loading; devpolicy decides which device it runs against."""
    return load_file(str(path))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size", default="32MiB", help="dataset size, e.g. 64MiB or 2GiB (default: 32MiB)"
    )
    parser.add_argument("--steps", type=int, default=5, help="training-style steps to run")
    parser.add_argument("--batch", type=int, default=8, help="sequences per batch")
    parser.add_argument(
        "--policy", type=Path, default=POLICY, help="policy file (default: %(default)s)"
    )
    args = parser.parse_args(argv)

    try:
        nbytes = devpolicy.parse_size(args.size)
    except ValueError as e:
        parser.error(f"--size: {e}")
    policy = devpolicy.load_policy(args.policy)
    print(
        f"policy: {policy.found}; backends: {', '.join(devpolicy.available_backends())}\n",
        file=sys.stderr,
    )

    with tempfile.TemporaryDirectory() as tmp, devpolicy.activate(policy):
        path = Path(tmp) / "train.safetensors"
        write_dataset(path, nbytes)
        dataset = load_train(path)
        tokens = dataset["tokens"]

        rng = np.random.default_rng(1)
        params = devpolicy.put(
            "model",
            {
                "embed": rng.normal(size=(VOCAB, WIDTH)).astype(np.float32) * 0.02,
                "out": rng.normal(size=(WIDTH,)).astype(np.float32),
            },
        )

        @jax.jit
        def step(params: dict[str, jax.Array], batch: jax.Array) -> jax.Array:
            hidden = params["embed"][batch.astype(jnp.int32)]
            return jnp.mean(hidden @ params["out"])

        losses = []
        for i in range(args.steps):
            start = (i * args.batch) % max(1, tokens.shape[0] - args.batch)
            batch = devpolicy.put("batch", tokens[start : start + args.batch])
            losses.append(float(step(params, batch)))

        placed: dict[str, int] = collections.Counter()
        for name, array in [
            ("dataset/train/tokens", tokens),
            *[(f"model/{k}", v) for k, v in params.items()],
        ]:
            (device,) = array.devices()
            placed[devpolicy.inventory().text(device)] += array.nbytes
            print(
                f"{name:24} {devpolicy.inventory().text(device):8} "
                f"{devpolicy.format_size(array.nbytes):>10}"
            )
        print(
            f"batch                    {devpolicy.inventory().text(next(iter(batch.devices()))):8}"
        )
        print(
            "\nper device: "
            + ", ".join(f"{d} {devpolicy.format_size(n)}" for d, n in sorted(placed.items()))
        )
        print(f"losses: {', '.join(f'{x:.4f}' for x in losses)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
