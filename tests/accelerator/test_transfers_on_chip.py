"""`transfers:` on the chip: host data sent to an accelerator by JAX on its own, and reads
back by the host (the CPU cases are in tests/apply/test_transfers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._machine.ledger import forget_transfers

pytestmark = pytest.mark.accelerator
HOST = np.ones((256, 256), np.float32)


@pytest.fixture(autouse=True)
def _counts() -> Iterator[None]:
    forget_transfers()
    yield
    forget_transfers()


def chip_policy(**transfers: str) -> devpolicy.Policy:
    return devpolicy.load_policy(
        {"version": 1, "default": "accelerator", "transfers": transfers}, environ={}
    )


def scaled(chip: jax.Device) -> tuple[jax.stages.Wrapped, jax.Array]:
    """A jitted product and a factor committed to the chip: a numpy first argument is sent
    to the chip by JAX itself."""
    return jax.jit(lambda a, b: a * b), jax.device_put(np.float32(2), chip)


def test_numpy_into_a_chip_jit_is_a_warning_crossing_host_and_accelerator(
    chip: jax.Device,
) -> None:
    """host_to_device onto the chip is logged at warning, whatever host_local says."""
    step, factor = scaled(chip)
    with capture_logs() as logs, devpolicy.activate(chip_policy(host_to_device="log")):
        step(HOST, factor)
    (event,) = [e for e in logs if e["event"] == "transfer"]
    assert event["log_level"] == "warning"
    assert event["devices"] == [f"{chip.platform}:0"]
    assert event["nbytes"] == HOST.nbytes


def test_disallow_refuses_numpy_into_a_chip_jit(chip: jax.Device) -> None:
    step, factor = scaled(chip)
    refused = pytest.raises(
        devpolicy.errors.TransferRefusedError, match=r"transfers\.host_to_device"
    )
    with devpolicy.activate(chip_policy(host_to_device="disallow")), refused:
        step(HOST, factor)


def test_device_to_host_is_left_to_jaxs_own_guard(chip: jax.Device) -> None:
    """float(x) of a chip array under device_to_host: disallow is JAX's own refusal."""
    x = jax.device_put(HOST, chip)
    refused = pytest.raises(Exception, match="Disallowed device-to-host")
    with devpolicy.activate(chip_policy(device_to_host="disallow")), refused:
        float(x[0, 0])
    assert float(x[0, 0]) == 1.0


def test_plan_transfers_predicts_numpy_into_a_chip_jit_as_the_call_reports_it(
    chip: jax.Device,
) -> None:
    """The plan's move onto the chip is the event of the real call: devices, bytes, mode."""
    step, factor = scaled(chip)
    policy = chip_policy(host_to_device="log")
    plan = devpolicy.plan_transfers(step, (HOST, factor), policy=policy)
    (moved,) = plan.moved
    with capture_logs() as logs, devpolicy.activate(policy):
        step(HOST, factor)
    (event,) = [e for e in logs if e["event"] == "transfer"]
    assert (moved.argument, moved.direction, moved.mode) == ("args[0]", "host_to_device", "log")
    assert list(moved.devices) == event["devices"]
    assert moved.nbytes == event["nbytes"] == HOST.nbytes
