"""One process of a 2-process job building hybrid (multi-slice) meshes (run by
test_multiprocess): each process is a slice of 2 CPU devices.

Usage: python tests/hybrid_worker.py PORT PROCESS_ID
"""

from __future__ import annotations

import json
import sys

import jax

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_platforms", "cpu")

import numpy as np  # noqa: E402
from jax.experimental import mesh_utils  # noqa: E402

import devpolicy  # noqa: E402

#: (name, one slice's axes, slices per axis): data across the slices; then fsdp both
#: across and within them.
MESHES = {
    "across": ({"data": 1, "fsdp": -1}, {"data": -1}),
    "both": ({"fsdp": 2, "tensor": 1}, {"fsdp": 2}),
}


def ids(devices: object) -> list[int]:
    return [d.id for d in np.asarray(devices).flat]


def main() -> None:
    port, process_id = int(sys.argv[1]), int(sys.argv[2])
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60
    )
    try:
        policy = devpolicy.load_policy(
            {
                "version": 1,
                "meshes": {
                    name: {"axes": axes, "dcn": dcn, "devices": "cpu"}
                    for name, (axes, dcn) in MESHES.items()
                },
                "rules": [
                    {"match": f"{name}/*", "sharding": {"mesh": name, "spec": [list(axes)]}}
                    for name, (axes, _) in MESHES.items()
                ],
            },
            environ={},
        )
        report: dict[str, object] = {
            "process_index": jax.process_index(),
            # Process 1's ids depend on the JAX: 2048, 2049 today, 131072, 131073 in 0.6.
            "own": [d.id for d in jax.local_devices()],
        }
        for name, (axes, dcn) in MESHES.items():
            decision = policy.resolve(f"{name}/w", shape=(8, 2))
            assert decision.sharding is not None
            mesh = decision.sharding.mesh
            ici = tuple(2 if size == -1 else size for size in axes.values())
            slices = tuple(2 if dcn.get(axis, 1) == -1 else dcn.get(axis, 1) for axis in axes)
            expected = mesh_utils.create_hybrid_device_mesh(
                ici, slices, jax.devices("cpu"), process_is_granule=True
            )
            value = np.arange(16, dtype=np.float32).reshape(8, 2)
            placed = policy.put(name, {"w": value})["w"]
            report[name] = {
                "shape": dict(mesh.shape),
                "devpolicy": ids(mesh.devices),
                "jax": ids(expected),
                "jax_shape": list(expected.shape),
                "decided": decision.device_text,
                "shards_equal": all(
                    np.array_equal(np.asarray(s.data), value[s.index])
                    for s in placed.addressable_shards
                ),
                "local": [d.id for d in decision.local_devices],
            }
        print(json.dumps(report))
    finally:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
