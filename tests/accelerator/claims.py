"""The lane's claims as functions of a device: run on the chip by `test_on_chip.py` and,
where the same code answers for a CPU device (the backend name is data), on `cpu:1` by
`test_claims_on_cpu.py`, so that CI checks them too."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

import devpolicy
from devpolicy._io.format.header import DTYPES
from tests.apply.streams import sparse_tokens


def text(device: jax.Device) -> str:
    """The device's target text (`tpu:0`)."""
    return devpolicy.inventory().text(device)


def placed_on(x: jax.Array) -> jax.Device:
    (device,) = x.devices()
    return device


def rule_places_onto(device: jax.Device) -> None:
    """A rule naming the device's target text puts a new array there, no fallback."""
    policy = devpolicy.load_policy(
        {"version": 1, "rules": [{"match": "model/*", "device": text(device)}]}, environ={}
    )
    decision = policy.resolve("model/w")
    assert decision.device == device
    assert decision.fallback_reason is None
    out = policy.put("model", {"w": np.arange(6, dtype=np.float32)})["w"]
    assert placed_on(out) == device
    np.testing.assert_array_equal(np.asarray(out), np.arange(6, dtype=np.float32))


def sample(dtype_name: str) -> np.ndarray:
    """Sixteen values every dtype holds exactly (0..5 and their negatives where signed)."""
    dtype = DTYPES[dtype_name]
    if dtype == np.bool_:
        return np.arange(16) % 3 == 0
    values = np.arange(16) % 6
    if dtype.kind in "ifc" and dtype.kind != "u" and not dtype_name.startswith("F8_E8M0"):
        values = np.where(np.arange(16) % 2 == 0, values, -values)
    return values.astype(dtype)


def load_file_is_exact_for_every_dtype(device: jax.Device, tmp_path: Path) -> list[str]:
    """Every dtype devpolicy reads, loaded onto `device`: the same values (64-bit types
    narrowed exactly with x64 off). Returns the dtypes checked."""
    tensors = {name.lower(): sample(name) for name in DTYPES}
    path = tmp_path / "dtypes.safetensors"
    policy = devpolicy.load_policy(
        {"version": 1, "rules": [{"match": "dtypes/*", "device": text(device)}]}, environ={}
    )
    devpolicy.save_file(tensors, path, policy=policy)
    out = devpolicy.load_file(path, policy=policy)
    for key, values in tensors.items():
        got = out[key]
        assert placed_on(got) == device, key
        wide = np.complex128 if values.dtype.kind == "c" else np.float64
        np.testing.assert_array_equal(
            np.asarray(got).astype(wide), values.astype(wide), err_msg=key
        )
    return sorted(DTYPES)


def windows_exact_past_2_31(device: jax.Device, tmp_path: Path) -> None:
    """Windows cut from a mapped file of 2**31 + 64 uint16 tokens (sparse: 4 GiB of holes)
    at 0 and past 2**31 arrive on `device` with the values written."""
    n = 2**31 + 64
    known = {0: np.arange(1, 9), 2**31: np.arange(101, 109), n - 8: np.arange(201, 209)}
    path = tmp_path / "train.safetensors"
    sparse_tokens(path, n, {start: values.astype(np.uint16) for start, values in known.items()})
    policy = devpolicy.load_policy(
        {
            "version": 1,
            "rules": [
                {"match": "train/*", "device": "cpu", "mmap": True},
                {"match": "batch", "device": text(device)},
            ],
        },
        environ={},
    )
    tokens = devpolicy.load_file(path, policy=policy)["tokens"]
    assert devpolicy.host_view(tokens)[2**31 + 3] == 104
    (past,) = devpolicy.windows(tokens, 8, 2, stride=2**31, policy=policy)
    assert placed_on(past) == device
    assert np.asarray(past).tolist() == [list(range(1, 9)), list(range(101, 109))]
    (end,) = devpolicy.windows(tokens, 8, 2, stride=n - 8, policy=policy)
    assert np.asarray(end).tolist() == [list(range(1, 9)), list(range(201, 209))]
