"""One process of a 2-process job saving a sharded nnx state with `save_file` (run by
tests/scenarios/test_multiprocess_save.py).

Usage: python tests/save_worker.py PORT PROCESS_ID DIR MODE

MODE says what the job does:
- `save`: save the state twice (a new file, then over it); process 0 also writes the
  same values from one process (`reference.safetensors`) to compare with.
- `kill0` / `kill1`: that process is killed (SIGKILL) just after writing its first piece.
- `term0`: process 0 gets SIGTERM there.
- `term0late1`: the same, and process 1 opens the unfinished file only once process 0
  has removed it (the race that once blamed the filesystem).
- `fail1`: process 1's writes fail (ENOSPC).
- `differ`: process 1's tree has one leaf more.

Each process prints one JSON line: what it wrote, or the error it raised.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import jax

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_platforms", "cpu")

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from structlog.testing import capture_logs  # noqa: E402

import devpolicy  # noqa: E402

#: Each leaf's spec over the (data, model) mesh of all 4 devices: rows split over both axes,
#: columns split (a run per row), rows over `data` only (`model` holds replicas), replicated,
#: and F4 values (two a byte in the file) split by rows.
SPECS = {
    "embed": P(("data", "model")),
    "up/kernel": P("data", "model"),
    "up/bias": P(),
    "down/kernel": P(None, ("data", "model")),
    "down/bias": P("model"),
    "norm/scale": P("data"),
    "norm/bias": P("model"),
    "step": P(),
    "codes": P(("data", "model")),
}


class Model(nnx.Module):  # type: ignore[misc]
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Param(jax.random.normal(rngs.params(), (512, 256), jnp.bfloat16))
        self.up = nnx.Linear(256, 1024, rngs=rngs)
        self.down = nnx.Linear(1024, 256, rngs=rngs)
        self.norm = nnx.LayerNorm(256, rngs=rngs)
        self.step = nnx.Variable(jnp.array(7, jnp.int32))
        # F4, two values a byte in the file: each process's rows are whole bytes.
        codes = np.linspace(-6, 6, 128 * 6, dtype=np.float32).reshape(128, 6)
        self.codes = nnx.Variable(jnp.asarray(codes.astype(ml_dtypes.float4_e2m1fn)))


def proc_io(field: str) -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def name_of(path: Any) -> str:
    """A leaf's name as save_file writes it: the dict keys, not the Variable's `.value`."""
    return "/".join(str(k.key) for k in path if hasattr(k, "key"))


def global_state(mesh: jax.sharding.Mesh) -> tuple[Any, dict[str, np.ndarray[Any, Any]]]:
    """The model's state as arrays spanning both processes, and its values as numpy."""
    state = nnx.state(Model(nnx.Rngs(0)))
    flat = {
        name_of(path): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]
    }

    def spread(path: Any, leaf: Any) -> jax.Array:
        name = name_of(path)
        whole = np.asarray(leaf)
        sharding = NamedSharding(mesh, SPECS[name])
        return jax.make_array_from_callback(whole.shape, sharding, lambda index: whole[index])

    return jax.tree_util.tree_map_with_path(spread, state), flat


def break_writes(mode: str, process_id: int, directory: Path) -> None:
    """Fault injection: kill this process after its first data piece, or fail its writes;
    in `term0late1`, process 0 is terminated once process 1 has reached its writes (a
    marker file says so), and process 1 opens the unfinished file only once it is gone."""
    real = os.pwrite
    marker = directory / "process-1-writes"

    def signalled_after_one(fd: int, data: Any, offset: int) -> int:
        done = real(fd, data, offset)
        if offset > 0:  # a piece of data, not process 0's header at offset 0
            if mode == "term0late1":
                waited_for(lambda: marker.exists())
                marker.unlink()
            os.kill(os.getpid(), signal.SIGKILL if mode.startswith("kill") else signal.SIGTERM)
        return done

    def no_space(fd: int, data: Any, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    real_open = os.open

    def once_removed(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_WRONLY and ".devpolicy-" in os.fspath(path):
            marker.touch()
            waited_for(lambda: not os.path.exists(path))
        return real_open(path, flags, *args, **kwargs)

    if mode in (f"kill{process_id}", f"term{process_id}") or (
        mode == "term0late1" and process_id == 0
    ):
        os.pwrite = signalled_after_one
    elif mode == "term0late1" and process_id == 1:
        os.open = once_removed
    elif mode == "fail1" and process_id == 1:
        os.pwrite = no_space


def waited_for(condition: Any, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)


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
    mesh = jax.make_mesh((2, 2), ("data", "model"), devices=jax.devices())
    state, values = global_state(mesh)
    tree: Any = state
    if mode == "differ":  # the same arrays by name; process 1 has one more
        tree = dict(zip(values, jax.tree_util.tree_leaves(state), strict=True))
        if process_id == 1:
            tree["extra"] = np.zeros(3, np.float32)
    path = directory / "model.safetensors"
    policy = devpolicy.load_policy({"version": 1}, environ={})
    report: dict[str, Any] = {"process_index": jax.process_index(), "pid": os.getpid()}
    if mode == "save":
        if process_id == 0:
            devpolicy.save_file(values, directory / "reference.safetensors", policy=policy)
        saves = []
        for _ in range(2):  # a new file, then the same again over it
            wchar = proc_io("wchar")
            with capture_logs() as logs:
                devpolicy.save_file(state, path, policy=policy, timeout=60)
            event = next(e for e in logs if e["event"] == "save_file")
            saves.append({**event, "wchar": proc_io("wchar") - wchar})
        report["saves"] = saves
    else:
        # Both processes start saving together: the short timeout below measures the save.
        multihost_utils.sync_global_devices("save_worker: ready")
        break_writes(mode, process_id, directory)
        try:
            devpolicy.save_file(tree, path, policy=policy, timeout=5)
            report["error"] = None
        except devpolicy.SafetensorsFileError as e:
            report["error"] = str(e)
        report["left"] = sorted(p.name for p in directory.iterdir())
    # Printed before shutting down: a peer that was killed makes the coordination service
    # abort this process a little later (JAX's doing, not catchable).
    print(json.dumps(report, default=str), flush=True)
    if mode.startswith("kill"):
        os._exit(0)  # no shutdown handshake with a peer that is gone
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
