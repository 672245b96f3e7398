"""Huge host arrays: `host_view` (zero-copy numpy views), `windows` (batches cut from
them, placed by the policy), and the warning for arrays JAX cannot index with x64 off."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._apply import hostview as _hostview
from tests.helpers import policy_of

BATCH_RULES = [
    {"match": "*/tokens", "device": "cpu:0", "mmap": True},
    {"match": "batch", "device": "cpu:1"},
]

# The story's dataset: one uint16 tensor of this many tokens (19.09 GiB).
STORY_TOKENS = 10_248_871_837


def where(x: jax.Array) -> str:
    (device,) = x.devices()
    return devpolicy.inventory().text(device)


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def sparse_tokens(path: Path, count: int, values: dict[int, np.ndarray]) -> None:
    """A safetensors file of `count` uint16 tokens at a 64-byte-aligned offset, written
    sparse: zeros (holes) except `values` at their token offsets."""
    header = json.dumps(
        {"tokens": {"dtype": "U16", "shape": [count], "data_offsets": [0, 2 * count]}}
    ).encode()
    header += b" " * (-(8 + len(header)) % 64)
    start = 8 + len(header)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(start + 2 * count)
        for offset, data in values.items():
            os.pwrite(f.fileno(), data.astype("<u2").tobytes(), start + 2 * offset)


@pytest.fixture
def unwarned(monkeypatch: pytest.MonkeyPatch) -> None:
    """The once-per-process warning not yet given."""
    monkeypatch.setattr(_hostview, "_warned", [])


class TestHostView:
    def test_a_mapped_tensor_is_viewed_without_a_copy(self, tmp_path: Path) -> None:
        """The view of a mapped host tensor is the array's own buffer (the file's pages)."""
        path = tmp_path / "data.safetensors"
        devpolicy.save_file({"tokens": np.arange(5000, dtype=np.uint16)}, path)
        x = devpolicy.load_file(path, policy=policy_of(rules=BATCH_RULES))["tokens"]
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
            devpolicy.HostViewError,
            match=r"^float32\[4\] over 2 devices: sharded over 2 devices, so its memory is "
            r"not one buffer; view each shard",
        ):
            devpolicy.host_view(x)

    def test_a_deleted_array_is_refused(self) -> None:
        """A donated or deleted array has no memory to view."""
        x = jnp.zeros(3)
        x.delete()
        with pytest.raises(devpolicy.HostViewError, match=r"^float32\[3\]: the array is deleted"):
            devpolicy.host_view(x)

    def test_a_traced_value_is_refused(self) -> None:
        """Inside jit there is no host memory to view."""

        @jax.jit
        def f(x: jax.Array) -> jax.Array:
            devpolicy.host_view(x)
            return x

        with pytest.raises(devpolicy.HostViewError, match=r"^traced float32\[2\]: a value inside"):
            f(jnp.zeros(2))

    @pytest.mark.parametrize("value", [[1, 2], "tokens", None])
    def test_a_non_array_is_a_type_error(self, value: object) -> None:
        """Lists and other objects are not arrays with host memory."""
        with pytest.raises(TypeError, match=r"^host_view\(\) takes a jax\.Array on a host"):
            devpolicy.host_view(value)


class TestWindows:
    def test_sequential_windows_in_order_the_last_batch_smaller(self) -> None:
        """Non-overlapping windows from the start, `batch` at a time, one pass."""
        tokens = np.arange(10, dtype=np.uint16)
        out = [b.tolist() for b in devpolicy.windows(tokens, 3, 2, policy=policy_of())]
        assert out == [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8]]]

    def test_stride_and_steps(self) -> None:
        """`stride` spaces the windows; `steps` stops early."""
        tokens = np.arange(20, dtype=np.int32)
        out = devpolicy.windows(tokens, 4, 2, stride=3, steps=2, policy=policy_of())
        assert [b[:, 0].tolist() for b in out] == [[0, 3], [6, 9]]

    def test_windows_of_a_two_dimensional_array_run_along_rows(self) -> None:
        """Rows are the first dimension: each window keeps the rest of the shape."""
        tokens = np.arange(24, dtype=np.float32).reshape(6, 4)
        (first, _) = devpolicy.windows(tokens, 3, 1, policy=policy_of())
        assert first.shape == (1, 3, 4)
        np.testing.assert_array_equal(first[0], tokens[:3])

    def test_random_windows_are_contiguous_reproducible_and_in_range(self) -> None:
        """Each random window is a run of the array; the same seed gives the same batches."""
        tokens = np.arange(1000, dtype=np.int32)

        def draw(seed: int) -> list[list[list[int]]]:
            stream = devpolicy.windows(
                tokens, 16, 8, order="random", seed=seed, steps=5, policy=policy_of()
            )
            return [b.tolist() for b in stream]

        first = draw(7)
        assert len(first) == 5
        for batch in first:
            for window in batch:
                assert window == list(range(window[0], window[0] + 16))
                assert 0 <= window[0] <= 1000 - 16
        assert draw(7) == first
        assert draw(8) != first

    def test_batches_arrive_on_the_device_decided_for_their_name(self) -> None:
        """Each batch is placed by the batch rule (cpu:1), committed, and logged."""
        tokens = np.arange(100, dtype=np.uint16)
        policy = policy_of(rules=BATCH_RULES)
        with capture_logs() as logs:
            out = list(
                devpolicy.windows(tokens, 10, 4, order="random", seed=0, steps=3, policy=policy)
            )
        assert {where(b) for b in out} == {"cpu:1"}
        assert all(b.committed for b in out)
        assert any(e["event"] == "placement" and e["name"] == "batch" for e in logs)

    def test_the_active_policy_decides_by_default(self) -> None:
        """Without policy=, the active policy decides, as for prefetch."""
        with devpolicy.activate(policy_of(rules=BATCH_RULES)):
            (b,) = devpolicy.windows(np.arange(4), 4, 1)
        assert where(b) == "cpu:1"

    def test_close_ends_the_stream(self) -> None:
        """An endless random stream ends when closed."""
        stream = devpolicy.windows(np.arange(50), 5, 2, order="random", policy=policy_of())
        next(stream)
        stream.close()
        assert list(stream) == []

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"length": 0}, r"^windows length must be an int >= 1, got 0$"),
            ({"batch": 2.0}, r"^windows batch must be an int >= 1, got 2\.0$"),
            ({"stride": -1}, r"^windows stride must be an int >= 1, got -1$"),
            ({"steps": True}, r"^windows steps must be an int >= 1, got True$"),
            ({"size": 0}, r"^prefetch size must be an int >= 1, got 0$"),
            (
                {"order": "shuffled"},
                r"^windows order must be one of \('sequential', 'random'\), got 'shuffled'$",
            ),
            (
                {"length": 11},
                r"^windows of length 11 need at least 11 rows along the first dimension; "
                r"the array has 10 \(shape \(10,\)\)$",
            ),
        ],
    )
    def test_bad_arguments_are_refused_at_the_call(
        self, kwargs: dict[str, object], message: str
    ) -> None:
        """Each bad argument is named with its value, before any batch is made."""
        args: dict[str, object] = {"length": 3, "batch": 2, **kwargs}
        with pytest.raises(ValueError, match=message):
            devpolicy.windows(np.arange(10), policy=policy_of(), **args)  # type: ignore[arg-type]

    def test_an_accelerator_array_would_be_copied_and_is_refused(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Tokens not on a host device: the error says where they are and what to do."""
        monkeypatch.setattr(_hostview, "_HOST_PLATFORMS", frozenset({"tpu"}))
        with pytest.raises(
            devpolicy.HostViewError,
            match=r"^uint16\[8\] on cpu:0: not on a host device: a view would first copy "
            r"16 bytes to the host; place it on the host",
        ):
            devpolicy.windows(jnp.zeros(8, jnp.uint16), 2, 2, policy=policy_of())


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
        policy = policy_of(rules=BATCH_RULES)
        before = rss_bytes()
        with capture_logs() as logs:
            tokens = devpolicy.load_file(path, policy=policy)["tokens"]
        assert tokens.shape == (n,)
        warnings = [e for e in logs if e["event"] == "huge_array_x64_off"]
        assert [(e["name"], e["elements"], e["log_level"]) for e in warnings] == [
            ("train/tokens", n, "warning")
        ]
        assert "devpolicy.host_view" in warnings[0]["fix"]
        assert "runtime: {x64: true}" in warnings[0]["fix"]
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

    def test_the_warning_is_given_once_per_process(self, tmp_path: Path, unwarned: None) -> None:
        """A second huge array says nothing more; a small one never warns."""
        path = tmp_path / "big.safetensors"
        sparse_tokens(path, 2**31 + 1, {})
        small = tmp_path / "small.safetensors"
        devpolicy.save_file({"tokens": np.zeros(2**10, np.uint16)}, small)
        policy = policy_of(rules=BATCH_RULES)
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
            x = devpolicy.load_file(path, policy=policy_of(rules=BATCH_RULES))["tokens"]
        assert int(x[-1]) == 9
        assert not [e for e in logs if e["event"] == "huge_array_x64_off"]

    def test_no_warning_with_x64_on(self, tmp_path: Path, unwarned: None) -> None:
        """With x64 enabled JAX indexes in 64 bits: nothing to warn about."""
        path = tmp_path / "big.safetensors"
        sparse_tokens(path, 2**31 + 1, {})
        jax.config.update("jax_enable_x64", True)
        try:
            with capture_logs() as logs:
                x = devpolicy.load_file(path, policy=policy_of(rules=BATCH_RULES))["tokens"]
        finally:
            jax.config.update("jax_enable_x64", False)
        assert not [e for e in logs if e["event"] == "huge_array_x64_off"]
        del x
