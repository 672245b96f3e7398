"""The reference program of implicit transfers: each line marked `# implicit: KIND, DIRECTION`
makes one transfer JAX's guard can see (test_transfers.py runs it and checks every marked
line is reported with this file's line, its direction, devices and bytes).

KIND names the case; DIRECTION is the transfer's direction as devpolicy reports it
(`host_to_device` for host data, which on a CPU device is `host_local` by the policy).
Runs on 4 CPU devices; the device-to-host case needs an accelerator (tests/gpu).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from devpolicy._decide.decision import single_device_sharding

#: The bytes each marked line moves in all; None for scalars (an index may be sent as one
#: scalar or two, by JAX version).
EXPECTED_BYTES: dict[str, int | None] = {
    "jit numpy argument": 48,
    "jit numpy argument again": 48,
    "jnp.asarray of numpy": 48,
    "array + numpy": 48,
    "array + Python scalar": None,
    "jnp.ones": None,
    "integer index": None,
    "slice bounds": None,
    "uncommitted + committed": 48,
    "committed into another device's jit": 48,
    "numpy into a 2-device NamedSharding": 48,
    "numpy into 2 replicas": 96,
}


def run(devices: list[jax.Device]) -> dict[str, jax.Array]:
    """Make each implicit transfer once; returns what each made (kept alive for the test)."""
    cpu0, cpu1 = devices[0], devices[1]
    host = np.arange(12, dtype=np.float32).reshape(4, 3)
    twice: Callable[[jax.Array], jax.Array] = jax.jit(lambda a: a * 2)
    on_cpu0 = jax.jit(lambda a: a + 1, in_shardings=single_device_sharding(cpu0))
    mesh = jax.make_mesh((2,), ("data",), devices=[cpu0, cpu1])
    split = jax.jit(lambda a: a + 1, in_shardings=NamedSharding(mesh, PartitionSpec("data")))
    replicated = jax.jit(lambda a: a + 1, in_shardings=NamedSharding(mesh, PartitionSpec()))
    committed = jax.device_put(host, cpu1)  # explicit: never reported
    out: dict[str, jax.Array] = {}
    out["a"] = twice(host)  # implicit: jit numpy argument, host_to_device
    out["b"] = twice(host)  # implicit: jit numpy argument again, host_to_device
    out["c"] = jnp.asarray(host)  # implicit: jnp.asarray of numpy, host_to_device
    out["d"] = committed + host  # implicit: array + numpy, host_to_device
    out["e"] = committed + 1  # implicit: array + Python scalar, host_to_device
    out["f"] = jnp.ones((3,))  # implicit: jnp.ones, host_to_device
    out["g"] = committed[1]  # implicit: integer index, host_to_device
    out["h"] = committed[1:3]  # implicit: slice bounds, host_to_device
    with jax.default_device(cpu0):
        loose = jax.device_put(np.ones((4, 3), np.float32))  # explicit, uncommitted
    out["i"] = loose * committed  # implicit: uncommitted + committed, device_to_device
    out["j"] = on_cpu0(committed)  # implicit: committed into another device's jit, device_to_device
    out["k"] = split(host)  # implicit: numpy into a 2-device NamedSharding, host_to_device
    out["l"] = replicated(host)  # implicit: numpy into 2 replicas, host_to_device
    out["m"] = jax.device_get(committed)  # explicit: never reported
    return out
