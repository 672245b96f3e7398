"""`host_view` (a host array as a zero-copy numpy view), and the warning for arrays JAX
cannot index with x64 off (`devpolicy._apply.hostview`)."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._apply import hostview
from tests.apply.streams import TOKEN_RULES, sparse_tokens, where
from tests.helpers import policy_of

# The story's dataset: one uint16 tensor of this many tokens (19.09 GiB).
STORY_TOKENS = 10_248_871_837


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def unwarned(monkeypatch: pytest.MonkeyPatch) -> None:
    """The once-per-process warning not yet given."""
    monkeypatch.setattr(hostview, "_warned", [])


class TestHostView:
    def test_a_mapped_tensor_is_viewed_without_a_copy(self, tmp_path: Path) -> None:
        """The view of a mapped host tensor is the array's own buffer (the file's pages)."""
        path = tmp_path / "data.safetensors"
        devpolicy.save_file({"tokens": np.arange(5000, dtype=np.uint16)}, path)
        x = devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]
        view = devpolicy.host_view(x)
        assert view.ctypes.data == x.unsafe_buffer_pointer()
        assert view[-3:].tolist() == [4997, 4998, 4999]
        assert not view.flags.writeable
        entry = next(
            e for e in devpolicy.report().by_device["cpu:0"].entries if "data/tokens" in e.names
        )
        assert entry.file_backed == entry.nbytes == 10000

    def test_a_numpy_array_is_returned_as_it_is(self) -> None:
        """Host data already in numpy needs no view."""
        a = np.arange(3)
        assert devpolicy.host_view(a) is a

    def test_a_sharded_array_is_refused(self) -> None:
        """An array over several devices is not one buffer: a HostViewError says so."""
        mesh = jax.make_mesh((2,), ("d",), devices=jax.local_devices(backend="cpu")[:2])
        x = jax.device_put(
            np.zeros(4), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
        )
        with pytest.raises(
            devpolicy.errors.HostViewError,
            match=r"^float32\[4\] over 2 devices: sharded over 2 devices, so its memory is "
            r"not one buffer; view each shard",
        ):
            devpolicy.host_view(x)

    def test_a_deleted_array_is_refused(self) -> None:
        """A donated or deleted array has no memory to view."""
        x = jnp.zeros(3)
        x.delete()
        with pytest.raises(
            devpolicy.errors.HostViewError, match=r"^float32\[3\]: the array is deleted"
        ):
            devpolicy.host_view(x)

    def test_a_traced_value_is_refused(self) -> None:
        """Inside jit there is no host memory to view."""

        @jax.jit
        def f(x: jax.Array) -> jax.Array:
            devpolicy.host_view(x)
            return x

        with pytest.raises(
            devpolicy.errors.HostViewError, match=r"^traced float32\[2\]: a value inside"
        ):
            f(jnp.zeros(2))

    @pytest.mark.parametrize("dtype", [jnp.int4, jnp.uint4, jnp.int2, jnp.float4_e2m1fn])
    def test_a_sub_byte_array_is_refused_saying_why(self, dtype: object) -> None:
        """int4 and other sub-byte types: JAX gives numpy only a copy of those, so there is
        no view; the error says so and how to get the copy, and does not make it."""
        x = jnp.zeros(64, dtype)
        with pytest.raises(
            devpolicy.errors.HostViewError,
            match=rf"^{x.dtype}\[64\] on cpu:0: host_view does not support [24]-bit types: "
            r"JAX gives numpy a sub-byte array only as a copy, never its own buffer, so no "
            r"view of it is zero-copy; np\.asarray\(array\) makes that copy \(64 B, a byte a "
            r"value\); data to be viewed in place is best kept as int8/uint8$",
        ):
            devpolicy.host_view(x)

    def test_one_byte_and_wider_ml_dtypes_are_viewed(self) -> None:
        """float8 and bfloat16 are whole bytes: viewed without a copy."""
        for dtype in (jnp.float8_e4m3fn, jnp.bfloat16):
            x = jax.device_put(np.zeros(64, dtype), jax.local_devices(backend="cpu")[0])
            assert devpolicy.host_view(x).ctypes.data == x.unsafe_buffer_pointer()

    @pytest.mark.parametrize("value", [[1, 2], "tokens", None])
    def test_a_non_array_is_a_type_error(self, value: object) -> None:
        """Lists and other objects are not arrays with host memory."""
        with pytest.raises(TypeError, match=r"^host_view\(\) takes a jax\.Array on a host"):
            devpolicy.host_view(value)


class TestHugeArrays:
    def test_the_story_dataset_is_mapped_viewed_and_sampled_past_2_31(
        self, tmp_path: Path, unwarned: None
    ) -> None:
        """10,248,871,837 uint16 tokens (19.09 GiB, sparse): loaded mapped with RSS
        under 1 GiB, viewed past 2**31 and at the end, windows sampled from there arrive
        on the batch device with the values written, and the ledger shows the tokens as
        file-backed on the host."""
        n = STORY_TOKENS
        length = 9
        stride = (n - length) // 4  # windows at 0, 2.56e9, 5.12e9, 7.69e9 and n - 9
        assert (n - length) % 4 == 0
        assert stride > 2**31
        known = {k * stride: np.arange(k * 10, k * 10 + length) for k in range(5)}
        known[2**31 + 5] = np.array([4242])
        path = tmp_path / "train.safetensors"
        sparse_tokens(path, n, known)
        policy = policy_of(rules=TOKEN_RULES)
        before = rss_bytes()
        with capture_logs() as logs:
            tokens = devpolicy.load_file(path, policy=policy)["tokens"]
        assert tokens.shape == (n,)
        notes = [e for e in logs if e["event"] == "huge_array_x64_off"]
        # On the host, host_view and windows index it: information, not a warning.
        assert [(e["name"], e["elements"], e["log_level"]) for e in notes] == [
            ("train/tokens", n, "info")
        ]
        assert "devpolicy.host_view" in notes[0]["fix"]
        assert "devpolicy.windows" in notes[0]["fix"]
        assert "runtime: {x64: true}" in notes[0]["fix"]
        assert not [e for e in logs if e["log_level"] == "warning"]
        with pytest.raises(OverflowError):
            tokens[-3:]  # what the view is for: JAX cannot index this with x64 off

        view = devpolicy.host_view(tokens)
        assert view[2**31 + 5] == 4242
        assert view[-length:].tolist() == list(range(40, 40 + length))

        batches = list(devpolicy.windows(tokens, length, 5, stride=stride, policy=policy))
        assert len(batches) == 1
        (batch,) = batches
        assert where(batch) == "cpu:1"
        assert batch.tolist() == [list(range(k * 10, k * 10 + length)) for k in range(5)]
        random = next(iter(devpolicy.windows(tokens, 4, 64, order="random", seed=1, policy=policy)))
        assert random.shape == (64, 4)
        assert where(random) == "cpu:1"

        entry = next(
            e for e in devpolicy.report().by_device["cpu:0"].entries if "train/tokens" in e.names
        )
        assert entry.nbytes == entry.file_backed == 2 * n
        assert rss_bytes() - before < 2**30

    def test_a_huge_array_no_view_can_reach_is_a_warning(
        self, tmp_path: Path, unwarned: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Off the host (an accelerator: here the CPU counted as one) neither host_view nor
        windows can index it, so the load warns, saying to place it on the host."""
        monkeypatch.setattr(hostview, "_HOST_PLATFORMS", frozenset({"tpu"}))
        path = tmp_path / "big.safetensors"
        sparse_tokens(path, 2**31 + 1, {})
        with capture_logs() as logs:
            x = devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]
        (warning,) = [e for e in logs if e["event"] == "huge_array_x64_off"]
        assert warning["log_level"] == "warning"
        assert warning["fix"].startswith("place it on a host device (a rule with `device: cpu`")
        del x

    def test_the_event_is_given_once_per_process(self, tmp_path: Path, unwarned: None) -> None:
        """A second huge array says nothing more; a small one never says anything."""
        path = tmp_path / "big.safetensors"
        sparse_tokens(path, 2**31 + 1, {})
        small = tmp_path / "small.safetensors"
        devpolicy.save_file({"tokens": np.zeros(2**10, np.uint16)}, small)
        policy = policy_of(rules=TOKEN_RULES)
        with capture_logs() as logs:
            kept = [
                policy.load_file(small)["tokens"],
                policy.load_file(path)["tokens"],
                policy.load_file(path, prefix="again")["tokens"],
            ]
        assert [e["name"] for e in logs if e["event"] == "huge_array_x64_off"] == ["big/tokens"]
        assert len(kept) == 3

    def test_no_warning_at_exactly_2_31_elements(self, tmp_path: Path, unwarned: None) -> None:
        """2**31 elements are still indexable (the last index is 2**31 - 1)."""
        path = tmp_path / "edge.safetensors"
        sparse_tokens(path, 2**31, {2**31 - 1: np.array([9])})
        with capture_logs() as logs:
            x = devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]
        assert int(x[-1]) == 9
        assert not [e for e in logs if e["event"] == "huge_array_x64_off"]

    def test_no_warning_with_x64_on(self, tmp_path: Path, unwarned: None) -> None:
        """With x64 enabled JAX indexes in 64 bits: nothing to warn about."""
        path = tmp_path / "big.safetensors"
        sparse_tokens(path, 2**31 + 1, {})
        jax.config.update("jax_enable_x64", True)
        try:
            with capture_logs() as logs:
                x = devpolicy.load_file(path, policy=policy_of(rules=TOKEN_RULES))["tokens"]
        finally:
            jax.config.update("jax_enable_x64", False)
        assert not [e for e in logs if e["event"] == "huge_array_x64_off"]
        del x
