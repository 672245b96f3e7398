"""The accelerator lane: the library's claims on whatever accelerator JAX finds here (a TPU,
else a GPU), each test marked `accelerator` and skipped, with the reason, where JAX finds
none. Run it with `python benchmarks/accelerator_lane.py` (docs/development.md)."""

from __future__ import annotations

import jax
import pytest

import devpolicy


def no_accelerator_reason() -> str:
    """Why this process has no accelerator, in the inventory's words."""
    inv = devpolicy.inventory()
    why = "; ".join(f"{p}: {inv.missing[p]}" for p in ("tpu", "gpu") if p in inv.missing)
    return f"no accelerator: JAX finds no TPU or GPU here ({why})"


@pytest.fixture
def chip() -> jax.Device:
    """The device `accelerator` resolves to in this process (skips where there is none)."""
    platform = devpolicy.inventory().accelerator
    if platform is None:
        pytest.skip(no_accelerator_reason())
    return devpolicy.get_device("accelerator")
