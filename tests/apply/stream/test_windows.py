"""`windows` (`devpolicy._apply.stream.windows`): its arguments, checked at the call before
anything opens, and the batches of windows it hands out, placed by the policy."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._apply import hostview
from tests.apply.streams import TOKEN_RULES, where
from tests.helpers import policy_of


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
        policy = policy_of(rules=TOKEN_RULES)
        with capture_logs() as logs:
            out = list(
                devpolicy.windows(tokens, 10, 4, order="random", seed=0, steps=3, policy=policy)
            )
        assert {where(b) for b in out} == {"cpu:1"}
        assert all(b.committed for b in out)
        assert any(e["event"] == "placement" and e["name"] == "batch" for e in logs)

    def test_the_active_policy_decides_by_default(self) -> None:
        """Without policy=, the active policy decides, as for prefetch."""
        with devpolicy.activate(policy_of(rules=TOKEN_RULES)):
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
            (
                {"size": 0},
                r"^windows size must be an int from 1 to 1024 \(the batches placed "
                r"ahead of use\), got 0$",
            ),
            (
                {"order": "shuffle"},
                r"^windows order must be one of \('sequential', 'random', 'shuffled'\), got "
                r"'shuffle'$",
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

    @pytest.mark.parametrize(
        ("kwargs", "error", "message"),
        [
            (
                {"order": "random", "stride": 3},
                ValueError,
                r"^windows stride applies to order='sequential' or 'shuffled' only; "
                r"order='random' draws "
                r"every start at random, got stride=3$",
            ),
            (
                {"seed": -1, "order": "random"},
                ValueError,
                r"^windows seed must be an int from 0 to 2\*\*64 - 1, got -1$",
            ),
            ({"seed": 1.5}, TypeError, r"^windows seed must be an int or None, got 1\.5$"),
            ({"seed": True}, TypeError, r"^windows seed must be an int or None, got True$"),
            ({"length": np.bool_(True)}, ValueError, r"^windows length must be an int >= 1"),
            (
                {"steps": np.int64(0)},
                ValueError,
                r"^windows steps must be an int >= 1, got (np\.int64\(0\)|0)$",
            ),
        ],
    )
    def test_arguments_that_would_be_ignored_or_misread_are_refused(
        self, kwargs: dict[str, object], error: type[Exception], message: str
    ) -> None:
        """A stride random order would ignore, a negative seed, and bools are refused,
        each naming the argument."""
        args: dict[str, object] = {"length": 3, "batch": 2, **kwargs}
        with pytest.raises(error, match=message):
            devpolicy.windows(np.arange(10), policy=policy_of(), **args)  # type: ignore[arg-type]

    def test_numpy_integers_are_accepted_as_lengths_and_seeds(self) -> None:
        """`np.int64(3)` and friends (what arithmetic on shapes gives) work like ints."""
        tokens = np.arange(10, dtype=np.uint16)
        out = devpolicy.windows(
            tokens,
            np.int64(3),
            np.int32(2),
            stride=np.uint8(3),
            steps=np.int64(1),
            size=np.int16(1),
            policy=policy_of(),
        )  # type: ignore[arg-type]
        assert [b.tolist() for b in out] == [[[0, 1, 2], [3, 4, 5]]]
        draw = devpolicy.windows(
            tokens, 3, 2, order="random", seed=np.int64(7), steps=1, policy=policy_of()
        )  # type: ignore[arg-type]
        again = devpolicy.windows(tokens, 3, 2, order="random", seed=7, steps=1, policy=policy_of())
        assert [b.tolist() for b in draw] == [b.tolist() for b in again]

    @pytest.mark.parametrize(
        ("order", "stride"), [("random", None), ("sequential", 1)], ids=["random", "sequential"]
    )
    def test_a_batch_larger_than_the_host_is_refused_before_allocating(
        self, order: str, stride: int | None
    ) -> None:
        """`batch=2**40` says how large a batch would be and names batch and length,
        instead of numpy's raw MemoryError (nothing of that size is allocated). In order,
        a batch holds at most every window: 2**26 of them here, 128 GiB."""
        tokens = np.zeros(2**26, np.uint16)
        with pytest.raises(
            ValueError,
            match=r"^windows batch=1099511627776 of length=1025 needs [0-9.]+ [GTP]iB per batch "
            r"\(uint16, 2\.0 KiB a window\), and size=2 holds up to 6 batches at once: "
            r"[0-9.]+ [GTP]iB, more than the [0-9.]+ [MGT]iB this host has available: lower "
            r"size, batch or length$",
        ):
            devpolicy.windows(
                tokens,
                1025,
                2**40,
                order=order,  # type: ignore[arg-type]
                stride=stride,
                policy=policy_of(),
            )

    def test_an_accelerator_array_would_be_copied_and_is_refused(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Tokens not on a host device: the error says where they are and what to do."""
        monkeypatch.setattr(hostview, "_HOST_PLATFORMS", frozenset({"tpu"}))
        with pytest.raises(
            devpolicy.errors.HostViewError,
            match=r"^windows tokens, uint16\[8\] on cpu:0: not on a host device: a view would "
            r"first copy "
            r"16 bytes to the host; place it on the host",
        ):
            devpolicy.windows(jnp.zeros(8, jnp.uint16), 2, 2, policy=policy_of())


class TestHardening:
    """Inputs and endings a hostile or hurried user meets."""

    @pytest.mark.parametrize("stride", [10**20, 2**63, 10_000])
    def test_a_stride_past_the_array_gives_one_window_a_pass(self, stride: int) -> None:
        """A stride longer than the array (10**20 included, past int64) is one window a
        pass, the one at 0, never a raw OverflowError."""
        tokens = np.arange(1000, dtype=np.int32)
        batches = [
            np.asarray(b)
            for b in devpolicy.windows(tokens, 10, 4, stride=stride, policy=policy_of())
        ]
        assert len(batches) == 1
        np.testing.assert_array_equal(batches[0], tokens[None, :10])


class TestFieldsAndPlacedBytes:
    def test_a_batch_with_segments_is_decided_on_all_the_bytes_it_places(self) -> None:
        """T1: the decision (and its event) counted the tokens' 4,096 bytes where the batch
        places 20,480 with its segment ids and positions: a `min_bytes: 10000` rule missed
        a 20 KB batch, silently."""
        policy = policy_of(
            rules=[
                {"match": "batch", "device": "cpu:1", "min_bytes": 10000},
                {"match": "batch", "device": "cpu:2"},
            ]
        )
        tokens = np.random.default_rng(0).integers(0, 100, 100_000).astype(np.uint16)
        with capture_logs() as logs:
            stream = devpolicy.windows(
                tokens, 1024, 2, order="random", seed=0, separator=0, policy=policy
            )
            batch = next(stream)
            stream.close()
        assert {where(a) for a in batch.values()} == {"cpu:1"}
        placement = next(e for e in logs if e["event"] == "placement")
        assert placement["nbytes"] == 2 * 1024 * (2 + 4 + 4) == 20480
        ended = next(e for e in logs if e["event"] == "stream_ended")
        assert ended["nbytes"] == 20480

    def test_fields_rename_a_batch_for_the_model(self) -> None:
        """T2: flax's lm1b wants inputs, inputs_segmentation and inputs_position."""
        lm1b = {
            "tokens": "inputs",
            "segment_ids": "inputs_segmentation",
            "positions": "inputs_position",
        }
        tokens = np.array([5, 0, 6, 7, 0, 8, 9, 0], np.uint16)
        plain = next(devpolicy.windows(tokens, 4, 2, separator=0, policy=policy_of()))
        renamed = next(
            devpolicy.windows(tokens, 4, 2, separator=0, fields=lm1b, policy=policy_of())
        )
        assert sorted(renamed) == sorted(lm1b.values())
        for ours, theirs in lm1b.items():
            assert np.array_equal(plain[ours], renamed[theirs])

    def test_fields_without_separator_make_each_batch_a_dict_of_the_tokens(self) -> None:
        stream = devpolicy.windows(
            np.arange(8), 4, 2, fields={"tokens": "inputs"}, policy=policy_of()
        )
        (batch,) = list(stream)
        assert list(batch) == ["inputs"]
        assert batch["inputs"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]

    @pytest.mark.parametrize(
        ("fields", "options", "error", "message"),
        [
            (["inputs"], {}, TypeError, r"^windows fields must be a mapping"),
            (
                {"segment_ids": "seg"},
                {},
                ValueError,
                r"^windows fields names a batch's keys: tokens; got 'segment_ids' "
                r"\(segment_ids and positions come with separator= only\)$",
            ),
            ({"token": "inputs"}, {"separator": 0}, ValueError, r"got 'token'$"),
            ({"tokens": ""}, {}, TypeError, r"^windows fields\['tokens'\] must be a non-empty"),
            (
                {"tokens": "x", "positions": "x"},
                {"separator": 0},
                ValueError,
                r"^windows fields would give two of a batch's arrays one key",
            ),
        ],
    )
    def test_bad_fields_are_refused_naming_them(
        self, fields: object, options: dict[str, object], error: type[Exception], message: str
    ) -> None:
        with pytest.raises(error, match=message):
            devpolicy.windows(
                np.arange(8),
                4,
                2,
                fields=fields,
                policy=policy_of(),
                **options,  # type: ignore[arg-type]
            )


class TestStepsPastTheEnd:
    def test_a_sequential_pass_shorter_than_steps_says_so_once(self) -> None:
        with capture_logs() as logs:
            batches = list(devpolicy.windows(np.arange(100), 10, 2, steps=50, policy=policy_of()))
        assert len(batches) == 5
        (warned,) = [e for e in logs if e["event"] == "stream_steps_past_end"]
        assert warned["log_level"] == "warning"
        assert (warned["steps"], warned["batches"]) == (50, 5)
        assert "one pass" in warned["reason"]

    def test_epochs_shorter_than_steps_says_so(self) -> None:
        with capture_logs() as logs:
            stream = devpolicy.windows(
                np.arange(100), 10, 2, order="shuffled", seed=1, epochs=1, steps=9,
                policy=policy_of(),
            )  # fmt: skip
            assert len(list(stream)) == 5
        (warned,) = [e for e in logs if e["event"] == "stream_steps_past_end"]
        assert "epochs=1" in warned["reason"]

    def test_steps_within_the_stream_say_nothing(self) -> None:
        with capture_logs() as logs:
            list(devpolicy.windows(np.arange(100), 10, 2, steps=3, policy=policy_of()))
        assert not [e for e in logs if e["event"] == "stream_steps_past_end"]
