"""The host memory a group of batches is cut into, and how a group is sent
(`devpolicy._apply.stream.groups`)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import jax
import numpy as np
import pytest

import devpolicy
from devpolicy._apply import hostview
from devpolicy._apply.stream import cutting, groups
from tests.apply.stream.test_documents import segments_by_hand
from tests.apply.stream.test_sampling import step_by_step
from tests.apply.streams import TOKEN_RULES
from tests.helpers import needs_cpu_pinned_host, policy_of


class TestHostBuffers:
    """The batches are cut a group at a time into host buffers never changed under their
    user."""

    @pytest.mark.parametrize("adopted", [True, False], ids=["adopted", "copied"])
    def test_batches_never_change_under_their_user(
        self, monkeypatch: pytest.MonkeyPatch, adopted: bool
    ) -> None:
        """With the host-buffer ring in use on the CPU (as on an accelerator): where the
        device adopts the aligned buffers, none is reused (one per group); where it copies
        them (buffers made unaligned here), a few are reused over and over. Either way
        every batch still holds its own windows after 240 more were cut."""
        monkeypatch.setattr(hostview, "ADOPTING", frozenset())
        made: list[int] = []

        def buffer(nbytes: int) -> np.ndarray:
            raw = np.empty(nbytes + 128, np.uint8)
            start = (-raw.ctypes.data) % 64 + (0 if adopted else 16)
            made.append(nbytes)
            return raw[start : start + nbytes]

        monkeypatch.setattr(groups, "aligned", buffer)
        tokens = np.arange(2**16, dtype=np.uint32)
        stream = devpolicy.windows(
            tokens, 256, 4, order="random", seed=1, steps=240, policy=policy_of(rules=TOKEN_RULES)
        )
        held = list(stream)
        # The first group one batch (a fresh stream's first batch waits for no more), then
        # groups of GROUP_MAX, the last one the rest: 1 + 29 x 8 + 7.
        count = 1 + -(-(240 - 1) // cutting.GROUP_MAX)
        assert len(made) == (count if adopted else 3 + 2)  # copied: the ring of 3, reused,
        # and a buffer each for the two other shapes (the first group, the last)
        for batch in held:
            values = np.asarray(batch)
            np.testing.assert_array_equal(values, values[:, :1] + np.arange(256))
        expected = step_by_step(tokens, 256, 4, 1, 240)
        for a, b in zip(held, expected, strict=True):
            np.testing.assert_array_equal(np.asarray(a), b)

    @pytest.mark.usefixtures("copying_device")
    def test_bound_for_a_copying_device_the_ring_is_reused_and_batches_hold(self) -> None:
        """Under the honest copying-device fake (each batch the device's own copy, as on an
        accelerator), the stream reuses its few ring buffers, and every batch still holds
        its own windows after 240 more were cut into the same buffers."""
        made: list[int] = []
        aligned = groups.aligned

        def counted(nbytes: int) -> np.ndarray:
            made.append(nbytes)
            return aligned(nbytes)

        with pytest.MonkeyPatch.context() as patched:
            patched.setattr(groups, "aligned", counted)
            tokens = np.arange(2**16, dtype=np.uint32)
            stream = devpolicy.windows(
                tokens,
                256,
                4,
                order="random",
                seed=1,
                steps=240,
                policy=policy_of(rules=TOKEN_RULES),
            )
            held = list(stream)
        assert len(made) == 3 + 2  # the ring, reused; the first and last groups' shapes
        expected = step_by_step(tokens, 256, 4, 1, 240)
        for a, b in zip(held, expected, strict=True):
            np.testing.assert_array_equal(np.asarray(a), b)

    def test_on_the_cpu_a_batch_is_the_buffer_it_was_cut_into(self) -> None:
        """A CPU device adopts the aligned group buffer: no second copy of a batch."""
        (batch,) = devpolicy.windows(np.arange(64, dtype=np.uint16), 64, 1, policy=policy_of())
        assert batch.unsafe_buffer_pointer() % 64 == 0
        assert batch.is_fully_replicated


ROWS = {"rows": {"axes": {"data": 4}, "devices": "cpu"}}


def rows_rule(**extra: object) -> list[dict[str, object]]:
    return [{"match": "batch", "sharding": {"mesh": "rows", "spec": ["data"]}, **extra}]


def sent_bytes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes of every numpy array handed to JAX to send to a device from now on
    (`jax.device_put`, `jax.make_array_from_callback`'s parts,
    `jax.make_array_from_process_local_data`), counted as a stream runs."""
    sent: list[int] = []

    def counted(real: Any) -> Any:
        def put(x: Any, *args: Any, **kwargs: Any) -> Any:
            sent.extend(a.nbytes for a in jax.tree.leaves(x) if isinstance(a, np.ndarray))
            return real(x, *args, **kwargs)

        return put

    def from_callback(shape: Any, sharding: Any, callback: Any, *args: Any, **kw: Any) -> Any:
        def part(index: Any) -> Any:
            found = callback(index)
            sent.append(found.nbytes)
            return found

        return real_callback(shape, sharding, part, *args, **kw)

    real_callback = jax.make_array_from_callback
    monkeypatch.setattr(jax, "device_put", counted(jax.device_put))
    monkeypatch.setattr(
        jax, "make_array_from_process_local_data", counted(jax.make_array_from_process_local_data)
    )
    monkeypatch.setattr(jax, "make_array_from_callback", from_callback)
    return sent


def assert_segments(batches: list[dict[str, Any]], kind: str = "eos") -> None:
    for b in batches:
        for key in ("segment_ids", "positions"):
            assert b[key].dtype == np.int32
            assert b[key].sharding == b["tokens"].sharding
        for row, ids, positions in zip(
            np.asarray(b["tokens"]).tolist(),
            np.asarray(b["segment_ids"]).tolist(),
            np.asarray(b["positions"]).tolist(),
            strict=True,
        ):
            assert (ids, positions) == segments_by_hand(row, 0, kind)


class TestDocumentsSent:
    """A batch with segments sends only its tokens to the device; its ids and positions
    are worked out there, sharded as the tokens are."""

    @pytest.mark.usefixtures("copying_device")
    @pytest.mark.parametrize("sharded", [False, True], ids=["one-device", "rows-of-4"])
    def test_only_the_tokens_bytes_are_sent(
        self, monkeypatch: pytest.MonkeyPatch, sharded: bool
    ) -> None:
        """Bound for a copying device (an accelerator's path), one device or sharded by
        rows over four: the bytes handed to JAX per batch are the tokens' own (uint16:
        a fifth of tokens, ids and positions), the values those of the separators."""
        policy = policy_of(meshes=ROWS, rules=rows_rule()) if sharded else policy_of()
        tokens = (np.arange(50_000) % 37).astype(np.uint16)
        # A first stream starts the device function's compile (its first groups meanwhile
        # served by the host: `test_a_fresh_stream_waits_for_no_compile`); once compiled,
        # a stream sends its tokens alone.
        list(devpolicy.windows(tokens, 65, 8, order="random", seed=2, steps=20, separator=0,
                               policy=policy))  # fmt: skip
        for compiling in list(groups._COMPILING.values()):
            compiling.result()
        sent = sent_bytes(monkeypatch)
        batches = list(
            devpolicy.windows(
                tokens, 65, 8, order="random", seed=2, steps=20, separator=0, policy=policy
            )
        )
        assert sum(sent) == 20 * 8 * 65 * 2
        assert_segments(batches)

    @pytest.mark.usefixtures("copying_device")
    def test_a_fresh_stream_waits_for_no_compile(self) -> None:
        """A shape never compiled: the first groups' ids and positions come from the host
        (the same values) while the device function compiles on a thread of its own."""
        tokens = (np.arange(50_000) % 41).astype(np.uint16)
        groups._COMPILING.clear()
        stream = devpolicy.windows(
            tokens, 67, 3, order="random", seed=5, steps=40, separator=0, policy=policy_of()
        )
        first = next(stream)
        (compiling,) = groups._COMPILING.values()
        assert_segments([first])
        compiling.result()  # compiled meanwhile; the rest from the device function
        assert_segments(list(stream))

    def test_a_host_memory_destination_is_served_by_the_host(self) -> None:
        """Where a batch is not in the device's own memory, the host's ids and positions
        are placed beside it, as the tokens are, the values the same."""
        cpu = jax.devices("cpu")[0]
        sharding = jax.device_put(np.zeros(1), cpu).sharding
        assert groups.on_the_device(sharding)
        kinds = [m.kind for m in cpu.addressable_memories()]
        for kind in kinds:
            expected = kind == cpu.default_memory().kind
            assert groups.on_the_device(sharding.with_memory_kind(kind)) is expected

    @needs_cpu_pinned_host
    def test_batches_in_pinned_host_memory_carry_their_segments(self) -> None:
        """A rule that keeps the batches in `pinned_host`: ids and positions there too
        (worked out on the host), values exact."""
        policy = policy_of(meshes=ROWS, rules=rows_rule(memory="pinned_host"))
        tokens = (np.arange(20_000) % 23).astype(np.uint16)
        batches = list(devpolicy.windows(tokens, 33, 4, steps=10, separator=0, policy=policy))
        assert {b["segment_ids"].sharding.memory_kind for b in batches} == {"pinned_host"}
        assert_segments(batches)

    def test_under_devpolicy_disable_segments_follow_the_tokens(self) -> None:
        """DEVPOLICY_DISABLE: the tokens a plain `device_put` (uncommitted), and their ids
        and positions too, on the tokens' device."""
        policy = devpolicy.load_policy(
            {"version": 1, "default": "cpu:3"}, environ={"DEVPOLICY_DISABLE": "1"}
        )
        tokens = (np.arange(5_000) % 11).astype(np.uint16)
        batches = list(devpolicy.windows(tokens, 17, 4, steps=6, separator=0, policy=policy))
        for b in batches:
            assert not any(b[key].committed for key in b)
            assert b["segment_ids"].devices() == b["tokens"].devices()
        assert_segments(batches)


def compiled() -> None:
    """Every device function a stream started compiling, compiled."""
    for compiling in list(groups._COMPILING.values()):
        compiling.result()


class TestDocumentsOnTheCpu:
    """On a device that adopts host memory (the CPU's), a group's ids and positions are
    worked out on the host into a few reused buffers, and its tokens, ids and positions
    placed by one jitted call."""

    @pytest.mark.parametrize("sharded", [False, True], ids=["one-device", "rows-of-4"])
    def test_a_group_is_placed_by_one_call_sharded_as_its_tokens_would_be(
        self, monkeypatch: pytest.MonkeyPatch, sharded: bool
    ) -> None:
        """Once compiled, no array goes through `jax.device_put`, and every array is
        sharded exactly as the same stream's tokens are without segments."""
        policy = policy_of(meshes=ROWS, rules=rows_rule()) if sharded else policy_of()
        tokens = (np.arange(50_000) % 37).astype(np.uint16)

        def stream(**options: Any) -> list[Any]:
            return list(devpolicy.windows(tokens, 65, 8, order="random", seed=2, steps=20,
                                          policy=policy, **options))  # fmt: skip

        stream(separator=0)
        compiled()
        plain = stream()
        sent = sent_bytes(monkeypatch)
        batches = stream(separator=0)
        assert sent == []
        for b, alone in zip(batches, plain, strict=True):
            for key in ("tokens", "segment_ids", "positions"):
                assert b[key].sharding == alone.sharding
                assert b[key].committed
            np.testing.assert_array_equal(np.asarray(b["tokens"]), np.asarray(alone))
        assert_segments(batches)

    def test_held_batches_keep_their_segments_while_the_buffers_are_reused(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """240 batches held while 60 groups' ids and positions were worked out into the
        same few host buffers: every batch's are still its own tokens'."""
        tokens = (np.arange(2**16) % 29).astype(np.uint16)
        options: dict[str, Any] = {"order": "random", "separator": 0, "policy": policy_of()}
        list(devpolicy.windows(tokens, 64, 4, seed=1, steps=40, **options))
        compiled()
        made: list[int] = []
        real = groups.aligned

        def counted(nbytes: int) -> np.ndarray:
            made.append(nbytes)
            return real(nbytes)

        monkeypatch.setattr(groups, "aligned", counted)
        held = list(devpolicy.windows(tokens, 64, 4, seed=1, steps=240, **options))
        segments_bytes = 2 * cutting.GROUP_MAX * 4 * 64 * 4  # a group's ids and positions
        assert 1 <= made.count(segments_bytes) <= 3  # the ring's, reused
        assert_segments(held)

    def test_groups_few_and_many_documents_share_the_ring_and_keep_their_segments(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Groups with few starts (their rows patched in a reused buffer, only those that
        differ from one document a row) taking turns with groups with many (every
        segment worked out into it), every batch held: each batch's ids and positions
        are still its own tokens', and the ring's buffers were reused."""
        tokens = (np.arange(2**16) % 29 + 1).astype(np.uint16)
        tokens[: 2**13 : 3] = 0  # an eighth dense: a group with 4 of its windows there or
        tokens[2**13 :: 1500] = 0  # more has many starts, the others a few
        options: dict[str, Any] = {"order": "random", "separator": 0, "policy": policy_of()}
        list(devpolicy.windows(tokens, 64, 4, seed=1, steps=40, **options))
        compiled()
        kernels: list[str] = []
        for name in ("runs", "patched"):
            real = getattr(groups, name)

            def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
                kernels.append(_name)
                return _real(*args)

            monkeypatch.setattr(groups, name, counted)
        made: list[int] = []
        real_aligned = groups.aligned

        def aligned(nbytes: int) -> np.ndarray:
            made.append(nbytes)
            return real_aligned(nbytes)

        monkeypatch.setattr(groups, "aligned", aligned)
        held = list(devpolicy.windows(tokens, 64, 4, seed=3, steps=240, **options))
        assert {"runs", "patched"} <= set(kernels)
        segments_bytes = 2 * cutting.GROUP_MAX * 4 * 64 * 4
        assert 1 <= made.count(segments_bytes) <= 3
        assert_segments(held)

    def test_a_fresh_stream_waits_for_no_compile(self) -> None:
        """A shape never compiled: the first groups are placed by `device_put` while the
        call compiles on a thread of its own, the values the same."""
        tokens = (np.arange(50_000) % 43).astype(np.uint16)
        groups._COMPILING.clear()
        stream = devpolicy.windows(
            tokens, 71, 3, order="random", seed=5, steps=40, separator=0, policy=policy_of()
        )
        first = next(stream)
        assert len(groups._COMPILING) == 1
        assert_segments([first])
        compiled()
        assert_segments(list(stream))


#: A process whose stream's device function is still compiling as it ends.
ENDS_WHILE_COMPILING = r"""
import jax, numpy as np
import devpolicy
from devpolicy._apply import hostview
hostview.ADOPTING = frozenset()  # the CPU's devices stand in for a copying accelerator's
real_put = jax.device_put
def device_put(x, device=None, *args, **kwargs):
    x = jax.tree.map(lambda a: a.copy() if isinstance(a, np.ndarray) else a, x)
    return real_put(x, device, *args, **kwargs)
jax.device_put = device_put
tokens = (np.arange(50_000) % 37).astype(np.uint16)
policy = devpolicy.load_policy({"version": 1, "logging": {"level": "warning"}})
stream = devpolicy.windows(tokens, 65, 8, order="random", seed=2, steps=12, separator=0,
                           policy=policy)
for batch in stream:
    jax.block_until_ready(batch)
print("ended")
"""


def test_a_process_ending_while_the_device_function_compiles_exits_cleanly() -> None:
    """The compile runs on a thread of its own; a process that ends meanwhile waits for
    it and exits 0 (on a daemon thread XLA's compile aborted the process at its end)."""
    done = subprocess.run(
        [sys.executable, "-c", ENDS_WHILE_COMPILING],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ended"), done.stderr[-2000:]
