"""One process of a 2-process job that adopts devpolicy as docs/adopting.md does, on a
hybrid mesh whose `fsdp` axis runs across the two processes (run by
tests/scenarios/test_adoption.py). Each process is a slice of 2 CPU devices.

Usage: python tests/adoption_worker.py PORT PROCESS_ID DIR MODE

DIR holds the policy (`trainer.yaml`) and the checkpoint. MODE:
- `train`: the model and the optimizer state are created where the policy puts them;
  2 steps; `save_file` of both from both processes; 2 more steps. The same values
  gathered to numpy are saved too (`gathered.safetensors`), to compare the file with.
- `resume`: a fresh job restores the checkpoint into the abstract tree (each process reads
  its own slices) and trains the same 2 more steps.

Each process prints one JSON line: the losses, the mesh in device order, what it wrote or
read.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import jax

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_platforms", "cpu")

import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import mesh_utils, multihost_utils  # noqa: E402
from structlog.testing import capture_logs  # noqa: E402

import devpolicy  # noqa: E402

VOCAB, EMBED, MLP, ROWS, LENGTH = 256, 64, 128, 4, 16


class Model(nnx.Module):  # type: ignore[misc]
    """A language model in the lm1b manner, small: embed, an MLP, logits by the embedding."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        init = nnx.initializers.lecun_normal()
        named = nnx.with_partitioning
        self.embed = nnx.Embed(
            VOCAB, EMBED, embedding_init=named(init, ("vocab", "embed")), rngs=rngs
        )
        self.up = nnx.Linear(
            EMBED, MLP, use_bias=False, kernel_init=named(init, ("embed", "mlp")), rngs=rngs
        )
        self.down = nnx.Linear(
            MLP, EMBED, use_bias=False, kernel_init=named(init, ("mlp", "embed")), rngs=rngs
        )

    def __call__(self, tokens: jax.Array) -> jax.Array:
        hidden = self.embed(tokens)
        hidden = hidden + self.down(jax.nn.relu(self.up(hidden)))
        return self.embed.attend(hidden)


def no_eager_sharding() -> Any:
    switch = getattr(nnx, "use_eager_sharding", None)  # flax >= 0.12
    return switch(False) if switch is not None else contextlib.nullcontext()


def batch(step: int) -> np.ndarray[Any, Any]:
    """This process's rows of step `step`'s batch: its own, the same in every job."""
    rng = np.random.default_rng([step, jax.process_index()])
    return rng.integers(0, VOCAB, size=(ROWS, LENGTH), dtype=np.int32)


def main() -> None:
    port, process_id, directory, mode = (
        int(sys.argv[1]),
        int(sys.argv[2]),
        Path(sys.argv[3]),
        sys.argv[4],
    )
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60
    )
    devpolicy.bootstrap(directory / "trainer.yaml", required=True)
    checkpoint = directory / "checkpoint.safetensors"

    with no_eager_sharding():
        graphdef, abstract_params = nnx.split(nnx.eval_shape(lambda: Model(nnx.Rngs(0))))
    param_shardings = devpolicy.shardings("params", abstract_params)
    tx = optax.adamw(1e-2)
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    opt_shardings = devpolicy.shardings("opt_state", abstract_opt)
    batch_sharding = devpolicy.resolve("batch/tokens").sharding

    def loss_fn(params: Any, tokens: jax.Array) -> jax.Array:
        logits = nnx.merge(graphdef, params)(tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()

    def step(params: Any, opt_state: Any, tokens: jax.Array) -> tuple[Any, Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    train_step = jax.jit(
        step,
        in_shardings=(param_shardings, opt_shardings, batch_sharding),
        out_shardings=(param_shardings, opt_shardings, None),
    )

    def train(params: Any, opt_state: Any, steps: range) -> tuple[Any, Any, list[float]]:
        losses = []
        for number in steps:
            tokens = jax.make_array_from_process_local_data(batch_sharding, batch(number))
            params, opt_state, loss = train_step(params, opt_state, tokens)
            losses.append(float(loss))
        return params, opt_state, losses

    mesh = batch_sharding.mesh
    jax_mesh = mesh_utils.create_hybrid_device_mesh(
        (1, 1, 2), (1, 2, 1), jax.devices(), process_is_granule=True
    )
    report: dict[str, Any] = {
        "process_index": jax.process_index(),
        "own": [d.id for d in jax.local_devices()],
        "mesh": dict(mesh.shape),
        "mesh_devices": [d.id for d in mesh.devices.flat],
        "jax_mesh_devices": [d.id for d in jax_mesh.flat],
        "batch_spec": list(batch_sharding.spec),
    }
    if mode == "train":

        def create() -> Any:
            with no_eager_sharding():
                return nnx.state(Model(nnx.Rngs(0)))

        params = jax.jit(create, out_shardings=param_shardings)()
        opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(params)
        params, opt_state, report["first_losses"] = train(params, opt_state, range(2))
        state = {"params": params, "opt_state": opt_state}
        with capture_logs() as logs:
            devpolicy.save_file(state, checkpoint, timeout=60)
        report["saved"] = next(e for e in logs if e["event"] == "save_file")
        # The same values gathered to numpy in every process, saved as such: the file a
        # single process would write.
        gathered = multihost_utils.process_allgather(state, tiled=True)
        devpolicy.save_file(gathered, directory / "gathered.safetensors", timeout=60)
        _, _, report["losses"] = train(params, opt_state, range(2, 4))
    else:
        with capture_logs() as logs:
            restored = devpolicy.load_file(
                checkpoint, into={"params": abstract_params, "opt_state": abstract_opt}, prefix=""
            )
        report["loaded"] = next(e for e in logs if e["event"] == "load_file")
        report["shardings_as_declared"] = all(
            leaf.sharding == sharding
            for leaf, sharding in zip(
                jax.tree_util.tree_leaves((restored["params"], restored["opt_state"])),
                jax.tree_util.tree_leaves((param_shardings, opt_shardings)),
                strict=True,
            )
        )
        _, _, report["losses"] = train(restored["params"], restored["opt_state"], range(2, 4))
    print(json.dumps(report, default=str), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
