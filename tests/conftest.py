"""Test set-up: four fake CPU devices, and no leaks of environment, cwd or logging between tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax

# Must run before any JAX backend starts: every test then sees cpu:0..cpu:3.
jax.config.update("jax_num_cpu_devices", 4)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import structlog  # noqa: E402
from hypothesis import settings  # noqa: E402

from devpolicy._apply import hostview  # noqa: E402
from devpolicy._policy import active as _active  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# No per-example deadline: speed is measured by benchmarks/, and on a loaded CI machine one
# example can stall for seconds (then hypothesis reports a flaky failure that says nothing).
settings.register_profile("devpolicy", deadline=None)
settings.load_profile("devpolicy")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Each test starts in an empty directory, with no DEVPOLICY_* variables and no active policy."""
    for name in list(os.environ):
        if name.startswith("DEVPOLICY_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    _active.forget_discovered()
    before = jax.config.jax_default_device
    yield
    _active.forget_discovered()
    structlog.reset_defaults()
    assert jax.config.jax_default_device == before, "a test left JAX's default device changed"
    assert not _active._outermost, "a test left a policy activated"


@pytest.fixture
def copying_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU's devices stand in for an accelerator's, which copies host memory: they
    count as copying devices (`hostview.ADOPTING` emptied), so devpolicy takes the
    accelerator's code path to them, and JAX itself copies every host array it is handed
    for device memory (`jax.device_put` and `jax.make_array_from_callback` wrapped for the
    test, as the accelerator copies it). Emptying
    `ADOPTING` alone left the CPU adopting aligned arrays: a tensor "sent" from a file's
    map aliased the file, as on no accelerator. Nothing in devpolicy reads a test hook."""
    monkeypatch.setattr(hostview, "ADOPTING", frozenset())
    real_put, real_from_callback = jax.device_put, jax.make_array_from_callback

    def copied(leaf: Any, destination: Any) -> Any:
        # An accelerator copies a numpy array whatever memory it goes to (its pinned host
        # memory too: numpy's is pageable); and before jaxlib 0.7.1 a CPU sharding's
        # memory kind is `unpinned_host` whatever was asked, so it cannot tell here.
        return leaf.copy() if isinstance(leaf, np.ndarray) else leaf

    def device_put(x: Any, device: Any = None, *args: Any, **kwargs: Any) -> Any:
        if isinstance(x, (list, tuple)) and isinstance(device, (list, tuple)):
            x = type(x)(copied(a, d) for a, d in zip(x, device, strict=True))
        else:
            x = jax.tree.map(lambda leaf: copied(leaf, device), x)
        return real_put(x, device, *args, **kwargs)

    def make_array_from_callback(shape: Any, sharding: Any, callback: Any, *args: Any,
                                 **kwargs: Any) -> Any:  # fmt: skip
        return real_from_callback(
            shape, sharding, lambda index: copied(callback(index), sharding), *args, **kwargs
        )

    monkeypatch.setattr(jax, "device_put", device_put)
    monkeypatch.setattr(jax, "make_array_from_callback", make_array_from_callback)


@pytest.fixture
def cpus() -> list[jax.Device]:
    """The four fake CPU devices."""
    devices = jax.local_devices(backend="cpu")
    assert len(devices) == 4
    return devices
