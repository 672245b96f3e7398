"""The host memory a group of batches is cut into, and how a group is sent
(`devpolicy._apply.stream.groups`)."""

from __future__ import annotations

import numpy as np
import pytest

import devpolicy
from devpolicy._apply import hostview
from devpolicy._apply.stream import cutting, groups
from tests.apply.stream.test_sampling import step_by_step
from tests.apply.streams import TOKEN_RULES
from tests.helpers import policy_of


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
        count = 240 // cutting.GROUP_MAX
        assert len(made) == (count if adopted else 3)
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
        assert len(made) == 3  # the ring, reused
        expected = step_by_step(tokens, 256, 4, 1, 240)
        for a, b in zip(held, expected, strict=True):
            np.testing.assert_array_equal(np.asarray(a), b)

    def test_on_the_cpu_a_batch_is_the_buffer_it_was_cut_into(self) -> None:
        """A CPU device adopts the aligned group buffer: no second copy of a batch."""
        (batch,) = devpolicy.windows(np.arange(64, dtype=np.uint16), 64, 1, policy=policy_of())
        assert batch.unsafe_buffer_pointer() % 64 == 0
        assert batch.is_fully_replicated
