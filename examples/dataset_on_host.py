"""Keep a token dataset in host memory while the model and batches use the accelerator.

Writes a synthetic uint16 token dataset (and a small model checkpoint) as safetensors,
loads both with `devpolicy.load_file` under `policies/dataset-on-host.yaml`, applied by
`devpolicy.bootstrap` before JAX starts (no GPU preallocation, CPU fallback; tokens stay
on the host, parameters go to the compute device), then runs a few training-style steps
whose batches are sliced from the host-resident tokens and moved to the compute device
ahead of use by `devpolicy.prefetch`. Every decision is logged on stderr; a per-device
summary is printed at the end. On a machine without a GPU the policy falls back to the
CPU and each event says why.

    python examples/dataset_on_host.py --size 64MiB
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import devpolicy

POLICY = Path(__file__).resolve().parent.parent / "policies" / "dataset-on-host.yaml"
SEQ_LEN = 128
VOCAB = 32_000
WIDTH = 64


def write_dataset(path: Path, nbytes: int, seed: int = 0) -> None:
    """One `tokens` tensor of uint16 token ids, about `nbytes` large, laid out for zero-copy."""
    rows = max(2, nbytes // (SEQ_LEN * 2))
    tokens = np.random.default_rng(seed).integers(0, VOCAB, size=(rows, SEQ_LEN), dtype=np.uint16)
    devpolicy.save_file({"tokens": tokens}, path)


def write_model(path: Path, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    devpolicy.save_file(
        {
            "embed": (rng.normal(size=(VOCAB, WIDTH)) * 0.02).astype(np.float32),
            "out": rng.normal(size=(WIDTH,)).astype(np.float32),
        },
        path,
    )


def batches(tokens: jax.Array, batch: int, steps: int) -> Iterator[jax.Array]:
    """Slices of the host-resident tokens; prefetch moves each to the compute device."""
    rows = tokens.shape[0]
    for i in range(steps):
        start = (i * batch) % max(1, rows - batch)
        yield tokens[start : start + batch]


@jax.jit
def step(params: dict[str, jax.Array], batch: jax.Array) -> jax.Array:
    hidden = params["embed"][batch.astype(jnp.int32)]
    return jnp.mean(hidden @ params["out"])


def where(x: jax.Array) -> str:
    (device,) = x.devices()
    return devpolicy.inventory().text(device)


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
        nbytes = devpolicy.parse_size(args.size)
    except ValueError as e:
        parser.error(f"--size: {e}")

    # First, before any JAX computation: the policy's `runtime:` (no preallocation, CPU
    # fallback) takes effect, and the policy becomes the active one.
    activation = devpolicy.bootstrap(args.policy)
    backends = ", ".join(devpolicy.available_backends())
    print(f"policy {activation.policy.found}; backends: {backends}", file=sys.stderr)

    with tempfile.TemporaryDirectory() as tmp, activation:
        data, model = Path(tmp) / "dataset.safetensors", Path(tmp) / "model.safetensors"
        write_dataset(data, nbytes)
        write_model(model)

        tokens = devpolicy.load_file(data)["tokens"]  # named dataset/tokens: stays on the host
        params = devpolicy.load_file(model)  # named model/embed, model/out: compute device

        losses, batch_devices, batch_bytes = [], Counter(), Counter()
        for batch in devpolicy.prefetch(batches(tokens, args.batch, args.steps), name="batch"):
            batch_devices[where(batch)] += 1
            batch_bytes[where(batch)] += batch.nbytes
            losses.append(float(step(params, batch)))

        print(f"\n{'array':22} {'device':8} {'size':>10}")
        per_device: Counter[str] = Counter()
        for name, array in [
            ("dataset/tokens", tokens),
            *[(f"model/{k}", v) for k, v in params.items()],
        ]:
            per_device[where(array)] += array.nbytes
            print(f"{name:22} {where(array):8} {devpolicy.format_size(array.nbytes):>10}")
        for device, count in sorted(batch_devices.items()):
            size = devpolicy.format_size(batch_bytes[device])  # all the batches together
            print(f"{'batch x' + str(count):22} {device:8} {size:>10}")
        summary = ", ".join(
            f"{d} {devpolicy.format_size(n)}" for d, n in sorted(per_device.items())
        )
        print(f"\nper device: {summary}")
        print(f"losses: {', '.join(f'{x:.4f}' for x in losses)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
