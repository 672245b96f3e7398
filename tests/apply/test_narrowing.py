"""64-bit data with x64 disabled: every path that makes an array narrows only when exact."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file as reference_save
from structlog.testing import capture_logs

import devpolicy
from tests.helpers import policy_of


def where(x: jax.Array) -> str:
    (device,) = x.devices()
    return devpolicy.inventory().text(device)


@pytest.fixture
def policy() -> devpolicy.Policy:
    return policy_of(rules=[{"match": "*", "device": "cpu:1"}])


class TestPut:
    def test_int64_that_does_not_fit_is_refused_not_zeroed(self, policy: devpolicy.Policy) -> None:
        """`put` of 2**40 in int64 raises NarrowingError instead of returning int32 [0]."""
        with pytest.raises(
            devpolicy.errors.NarrowingError,
            match=r"^tensor 'x': values 1099511627776\.\.1099511627776 do not fit int32 .*"
            r"narrow='lossy'",
        ) as info:
            policy.put("x", np.array([2**40], np.int64))
        assert info.value.file is None
        assert info.value.problems == (
            ("x", "values 1099511627776..1099511627776 do not fit int32 (-2147483648..2147483647)"),
        )

    def test_every_offending_leaf_is_listed(self, policy: devpolicy.Policy) -> None:
        """Two bad leaves of one pytree: both named in one error, nothing placed."""
        tree = {
            "ok": np.arange(4, dtype=np.int64),
            "ids": np.array([2**40]),
            "w": np.array([0.1], np.float64),
        }
        with capture_logs() as logs, pytest.raises(devpolicy.errors.NarrowingError) as info:
            policy.put("params", tree)
        assert [t for t, _ in info.value.problems] == ["params/ids", "params/w"]
        assert str(info.value).startswith("2 tensors would change in 32 bits:\n")
        assert not [e for e in logs if e["event"] == "placement"]

    def test_exact_narrowing_is_done_and_logged(self, policy: devpolicy.Policy) -> None:
        """Values that survive: int32 on the decided device, a `narrowed` info event."""
        with capture_logs() as logs:
            out = policy.put("pos", np.arange(512, dtype=np.int64))
        assert out.dtype == np.int32
        assert where(out) == "cpu:1"
        assert np.asarray(out).tolist() == list(range(512))
        (event,) = [e for e in logs if e["event"] == "narrowed"]
        assert (event["log_level"], event["name"], event["from_dtype"], event["exact"]) == (
            "info",
            "pos",
            "int64",
            True,
        )

    def test_lossy_that_loses_nothing_is_logged_exact(self, policy: devpolicy.Policy) -> None:
        """narrow='lossy' on values that all survive: `exact=True` at info, not a warning."""
        with capture_logs() as logs:
            policy.put("pos", np.arange(4, dtype=np.int64), narrow="lossy")
            policy.put("big", np.array([2**40]), narrow="lossy")
        events = [(e["name"], e["log_level"], e["exact"]) for e in logs if e["event"] == "narrowed"]
        assert events == [("pos", "info", True), ("big", "warning", False)]

    def test_python_int_too_big_for_int32_is_a_narrowing_error(
        self, policy: devpolicy.Policy
    ) -> None:
        """JAX's bare OverflowError becomes a NarrowingError naming the leaf."""
        with pytest.raises(devpolicy.errors.NarrowingError, match=r"^tensor 'n': values"):
            policy.put("n", 2**40)
        assert int(policy.put("n", 7)) == 7

    def test_numpy_scalar_and_complex_are_judged(self, policy: devpolicy.Policy) -> None:
        """np.int64 scalars and complex128 arrays go the same way as arrays."""
        with pytest.raises(devpolicy.errors.NarrowingError):
            policy.put("s", np.int64(2**40))
        out = policy.put("c", np.array([1 + 2j]))
        assert out.dtype == np.complex64

    def test_bad_narrow_option(self, policy: devpolicy.Policy) -> None:
        """Only 'exact' and 'lossy'."""
        with pytest.raises(ValueError, match=r"^narrow must be 'exact' or 'lossy', got 'no'$"):
            policy.put("x", np.zeros(2), narrow="no")  # type: ignore[arg-type]

    def test_module_level_put_narrows_too(self) -> None:
        """devpolicy.put with the active policy refuses the same way."""
        with (
            devpolicy.activate(policy_of()),
            pytest.raises(devpolicy.errors.NarrowingError, match=r"tensor 'x'"),
        ):
            devpolicy.put("x", np.array([2**40]))

    def test_x64_enabled_keeps_64_bits(self, policy: devpolicy.Policy) -> None:
        """With x64 on nothing is narrowed."""
        jax.config.update("jax_enable_x64", True)
        try:
            out = policy.put("x", np.array([2**40]))
            assert out.dtype == np.int64
            assert int(out[0]) == 2**40
        finally:
            jax.config.update("jax_enable_x64", False)


class TestPrefetch:
    def test_prefetch_refuses_a_batch_that_would_change(self, policy: devpolicy.Policy) -> None:
        """A batch of int64 token ids beyond int32 is an error, not zeros."""
        batches = [np.arange(3, dtype=np.int64), np.array([2**40])]
        stream = policy.prefetch(batches)
        with pytest.raises(devpolicy.errors.NarrowingError, match=r"tensor 'batch'"):
            list(stream)
        lossy = list(policy.prefetch(batches, narrow="lossy"))
        assert [b.dtype for b in lossy] == [np.int32, np.int32]


class TestLoadFile:
    def test_every_offending_tensor_is_listed(self, tmp_path: Path) -> None:
        """Three 64-bit tensors, two that change: both named, with the file, in one error."""
        path = tmp_path / "x.safetensors"
        reference_save(
            {
                "a": np.array([2**40], np.int64),
                "b": np.arange(3, dtype=np.int64),
                "c": np.array([0.1], np.float64),
                "d": np.zeros(3, np.float32),
            },
            str(path),
        )
        with pytest.raises(devpolicy.errors.NarrowingError) as info:
            devpolicy.load_file(path, policy=policy_of())
        assert info.value.file == str(path)
        assert [t for t, _ in info.value.problems] == ["a", "c"]
        assert f"  {path}: tensor 'c': 1 values lose precision" in str(info.value)

    def test_lossy_that_loses_nothing_is_logged_exact(self, tmp_path: Path) -> None:
        """narrow='lossy' on a tensor whose values all survive logs `exact=True`."""
        path = tmp_path / "x.safetensors"
        reference_save({"pos": np.arange(8, dtype=np.int64)}, str(path))
        with capture_logs() as logs:
            devpolicy.load_file(path, policy=policy_of(), narrow="lossy")
        (event,) = [e for e in logs if e["event"] == "narrowed"]
        assert (event["exact"], event["log_level"]) == (True, "info")


class TestMmapRefused:
    def test_unaligned_tensors_say_why_and_how_to_fix_once_per_file(self, tmp_path: Path) -> None:
        """mmap asked for, offsets not 64-byte aligned: one warning naming the fix."""
        path = tmp_path / "odd.safetensors"
        reference_save(
            {"a": np.zeros(3, np.uint8), "b": np.zeros(4096, np.uint8), "c": np.zeros(5, np.uint8)},
            str(path),
        )
        policy = policy_of(rules=[{"match": "*", "device": "cpu:1", "mmap": True}])
        with capture_logs() as logs:
            devpolicy.load_file(path, policy=policy)
        refused = [e for e in logs if e["event"] == "mmap_refused"]
        assert len(refused) == 1
        (event,) = refused
        assert event["log_level"] == "warning"
        assert "not 64-byte aligned" in event["reason"]
        assert f"devpolicy align {path} " in event["reason"]
        assert event["tensors"] >= 1

    def test_aligned_file_gives_no_refusal(self, tmp_path: Path) -> None:
        """A file written by save_file maps without complaint."""
        path = tmp_path / "ok.safetensors"
        devpolicy.save_file({"b": np.zeros(4096, np.uint8)}, path)
        with capture_logs() as logs:
            devpolicy.load_file(path, policy=policy_of(default="cpu:1"), mmap=True)
        assert not [e for e in logs if e["event"] == "mmap_refused"]

    def test_no_refusal_without_mmap(self, tmp_path: Path) -> None:
        """Nobody asked for a map: nothing to explain."""
        path = tmp_path / "odd.safetensors"
        reference_save({"a": np.zeros(3, np.uint8), "b": np.zeros(4096, np.uint8)}, str(path))
        with capture_logs() as logs:
            devpolicy.load_file(path, policy=policy_of(default="cpu:1"))
        assert not [e for e in logs if e["event"] == "mmap_refused"]
