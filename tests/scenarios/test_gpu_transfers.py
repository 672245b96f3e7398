"""GPU-only checks of `transfers:`: host data onto an accelerator, and reads back by the host.
Skipped without a GPU (the CPU cases are in tests/apply/test_transfers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._machine.ledger import forget_transfers

HAS_GPU = "gpu" in devpolicy.available_backends()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")]
HOST = np.ones((256, 256), np.float32)


@pytest.fixture(autouse=True)
def _counts() -> Iterator[None]:
    forget_transfers()
    yield
    forget_transfers()


def gpu_policy(**transfers: str) -> devpolicy.Policy:
    return devpolicy.load_policy(
        {"version": 1, "default": "gpu:0", "transfers": transfers}, environ={}
    )


def test_numpy_into_a_gpu_jit_is_a_warning_crossing_host_and_accelerator() -> None:
    """host_to_device onto a GPU is logged at warning, whatever host_local says."""
    step = jax.jit(lambda a: a * 2, device=jax.local_devices(backend="gpu")[0])
    with capture_logs() as logs, devpolicy.activate(gpu_policy(host_to_device="log")):
        step(HOST)
    (event,) = [e for e in logs if e["event"] == "transfer"]
    assert event["log_level"] == "warning"
    assert event["devices"] == ["gpu:0"]
    assert event["nbytes"] == HOST.nbytes


def test_disallow_refuses_numpy_into_a_gpu_jit() -> None:
    step = jax.jit(lambda a: a * 2, device=jax.local_devices(backend="gpu")[0])
    refused = pytest.raises(devpolicy.TransferRefusedError, match=r"transfers\.host_to_device")
    with devpolicy.activate(gpu_policy(host_to_device="disallow")), refused:
        step(HOST)


def test_device_to_host_is_left_to_jaxs_own_guard() -> None:
    """float(x) of a GPU array under device_to_host: disallow is JAX's own refusal."""
    x = jax.device_put(HOST, jax.local_devices(backend="gpu")[0])
    refused = pytest.raises(Exception, match="Disallowed device-to-host")
    with devpolicy.activate(gpu_policy(device_to_host="disallow")), refused:
        float(x[0, 0])
    assert float(x[0, 0]) == 1.0
