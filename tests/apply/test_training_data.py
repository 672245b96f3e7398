"""Training data from `windows`: shuffled epochs without replacement, weighted mixtures of
several token arrays, documents' segment ids and positions, and a state resumed by a job
of another size (2 processes -> 1)."""

from __future__ import annotations

import gc
import json
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

import devpolicy
from devpolicy._apply.stream import mixing, shuffling
from devpolicy._apply.stream import state as streamstate
from devpolicy.errors import StreamStateError
from tests.conftest import REPO
from tests.helpers import policy_of, reports_of, run_job

from .conftest import batched_reads_here
from .streams import (
    SWITCHING,
    closed_while_pulled,
    forked_child_refuses,
    held_open,
    pull_through_interrupts,
    pulled_by_threads,
)

TOKENS = np.arange(100_000, dtype=np.int32)


def firsts(stream: Any) -> list[list[int]]:
    """Each batch's windows by their first token (windows of an arange: their start)."""
    return [np.asarray(b)[:, 0].tolist() for b in stream]


def every(stream: Any) -> list[np.ndarray]:
    return [np.asarray(b) for b in stream]


def source_of(value: int, bounds: dict[str, tuple[int, int]]) -> str:
    return next(name for name, (low, high) in bounds.items() if low <= value < high)


class TestShuffledEpochs:
    @pytest.mark.parametrize("stride", [1, 2, 3])
    def test_each_epoch_hands_out_every_window_exactly_once_exhaustively(self, stride: int) -> None:
        """Every small array (4 to 30 rows), batch (1 to 5) and 1 to 3 epochs: each epoch
        is the windows at 0, stride, 2*stride, ... each exactly once, in an order drawn anew
        each epoch; batches run on across an epoch's end, the last holding what is left."""
        policy = policy_of()
        length = 4
        for rows in range(length, 31):
            tokens = np.arange(rows, dtype=np.int32)
            expected = list(range(0, rows - length + 1, stride))
            for batch in range(1, 6):
                for epochs in (1, 2, 3):
                    got = firsts(
                        devpolicy.windows(
                            tokens, length, batch, order="shuffled", seed=rows * 7 + batch,
                            stride=stride, epochs=epochs, policy=policy,
                        )
                    )  # fmt: skip
                    flat = [w for b in got for w in b]
                    assert len(flat) == epochs * len(expected)
                    assert all(len(b) == batch for b in got[:-1])
                    for e in range(epochs):
                        epoch = flat[e * len(expected) : (e + 1) * len(expected)]
                        assert sorted(epoch) == expected, (rows, batch, epochs, e)

    def test_epochs_are_drawn_anew_and_look_uniform(self) -> None:
        """Over 4,000 epochs of 10 windows, each window lands at each position about as
        often as a uniform shuffle puts it there (chi-square), and epochs differ."""
        rows = np.arange(10 * 4000, dtype=np.uint64)
        windows, _ = shuffling.shuffled_windows(3, rows, 10)
        table = np.zeros((10, 10))
        np.add.at(table, (np.tile(np.arange(10), 4000), windows), 1)
        expected = 400.0
        chi = ((table - expected) ** 2 / expected).sum()
        assert chi < 81 + 4 * np.sqrt(2 * 81)  # 81 degrees of freedom, 4 sigma
        epochs = windows.reshape(4000, 10)
        assert len({tuple(e) for e in epochs.tolist()}) > 3900

    @given(count=st.integers(1, 5000), seed=st.integers(0, 2**64 - 1))
    @settings(max_examples=60, deadline=None)
    def test_the_permutation_is_a_bijection_for_any_size_and_key(
        self, count: int, seed: int
    ) -> None:
        keys = shuffling.epoch_keys(seed, np.asarray([0]))[0]
        drawn = shuffling.permuted(np.arange(count, dtype=np.uint64), keys, count)
        assert sorted(drawn.tolist()) == list(range(count))

    def test_the_state_names_the_epoch_and_resumes_it(self) -> None:
        """`state()` of a shuffled stream says its epoch; resumed from it at any step, the
        stream equals the uninterrupted one element by element."""
        policy = policy_of()
        options: dict[str, Any] = {"order": "shuffled", "seed": 9, "epochs": 3, "stride": 7}
        whole = every(devpolicy.windows(TOKENS[:5000], 50, 16, policy=policy, **options))
        stream = devpolicy.windows(TOKENS[:5000], 50, 16, policy=policy, **options)
        for step in range(len(whole)):
            saved = stream.state()
            assert saved["epoch"] == step * 16 // len(range(0, 5000 - 50 + 1, 7))
            resumed = devpolicy.windows(
                TOKENS[:5000], 50, 16, policy=policy, resume=json.dumps(saved), **options
            )
            for got, want in zip(every(resumed), whole[step:], strict=True):
                np.testing.assert_array_equal(got, want)
            next(stream)

    def test_an_endless_shuffled_stream_starts_at_step_ten_to_the_ninth_at_once(self) -> None:
        policy = policy_of()
        far = devpolicy.windows(TOKENS, 8, 4, order="shuffled", seed=1, start=10**9, policy=policy)
        batch = np.asarray(next(far))
        rows = np.arange(4, dtype=np.uint64) + np.uint64(10**9 * 4)
        windows, epochs = shuffling.shuffled_windows(1, rows, (len(TOKENS) - 8 + 1 + 7) // 8)
        np.testing.assert_array_equal(batch[:, 0], windows * 8)
        assert far.state()["epoch"] == int(epochs[0])

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"order": "random", "epochs": 2}, r"epochs= bounds an order='shuffled' stream"),
            ({"order": "shuffled", "epochs": 0}, r"^windows epochs must be an int >= 1, got 0$"),
            (
                {"order": "shuffled", "epochs": 1, "start": 99},
                r"^windows start=99 is past the end: this stream has 3 batches$",
            ),
        ],
    )
    def test_bad_epoch_arguments_are_refused_naming_them(
        self, options: dict[str, Any], message: str
    ) -> None:
        with pytest.raises(ValueError, match=message):
            devpolicy.windows(np.arange(24), 4, 2, policy=policy_of(), **options)


BOUNDS = {"web": (0, 10_000), "code": (10_000, 14_000), "math": (14_000, 15_000)}
SOURCES = {name: np.arange(low, high, dtype=np.int32) for name, (low, high) in BOUNDS.items()}
WEIGHTS = {"web": 0.6, "code": 0.3, "math": 0.1}


class TestMixtures:
    def test_proportions_over_ten_thousand_batches_are_within_three_sigma(self) -> None:
        """10,000 batches of 8: each source's share of the windows is within 3 standard
        deviations of its weight (and each batch's within two rows of it, the allotment
        being exact over every 10 rows)."""
        stream = devpolicy.windows(
            SOURCES, 2, 8, order="random", seed=4, weights=WEIGHTS, steps=10_000,
            policy=policy_of(),
        )  # fmt: skip
        counts: Counter[str] = Counter()
        for batch in stream:
            here = Counter(source_of(v, BOUNDS) for v in np.asarray(batch)[:, 0].tolist())
            for name, weight in WEIGHTS.items():
                assert abs(here[name] - 8 * weight) < 2
            counts.update(here)
        total = 80_000
        for name, weight in WEIGHTS.items():
            sigma = np.sqrt(total * weight * (1 - weight))
            assert abs(counts[name] - total * weight) <= 3 * sigma

    def test_random_windows_of_each_source_are_spread_over_that_source(self) -> None:
        stream = devpolicy.windows(
            SOURCES, 2, 50, order="random", seed=1, weights=WEIGHTS, steps=400,
            policy=policy_of(),
        )  # fmt: skip
        seen: dict[str, list[int]] = {name: [] for name in BOUNDS}
        for batch in stream:
            for value in np.asarray(batch)[:, 0].tolist():
                seen[source_of(value, BOUNDS)].append(value)
        for name, (low, high) in BOUNDS.items():
            values = np.asarray(seen[name])
            assert values.min() >= low
            assert values.max() <= high - 2
            assert abs(values.mean() - (low + high - 2) / 2) < 0.05 * (high - low)

    def test_a_shuffled_mixture_gives_each_source_its_own_epochs(self) -> None:
        """Each source's windows come each once an epoch of that source, the small source
        going round more often."""
        stream = devpolicy.windows(
            {"web": SOURCES["web"][:400], "math": SOURCES["math"][:100]}, 10, 20,
            order="shuffled", seed=2, weights={"web": 1, "math": 1}, steps=60,
            policy=policy_of(),
        )  # fmt: skip
        order: dict[str, list[int]] = {"web": [], "math": []}
        for batch in stream:
            for value in np.asarray(batch)[:, 0].tolist():
                order["web" if value < 10_000 else "math"].append(value)
        for name, count in (("web", 40), ("math", 10)):
            drawn = order[name]
            low = BOUNDS[name][0]
            for e in range(len(drawn) // count):
                epoch = drawn[e * count : (e + 1) * count]
                assert sorted(epoch) == [low + 10 * i for i in range(count)]
        assert stream.state()["epoch"] == {"web": 600 // 40, "math": 600 // 10}

    @pytest.mark.parametrize("order", ["random", "shuffled"])
    def test_resume_at_any_step_equals_the_uninterrupted_mixture(self, order: str) -> None:
        policy = policy_of()
        options: dict[str, Any] = {"order": order, "seed": 8, "weights": WEIGHTS, "steps": 30}
        whole = every(devpolicy.windows(SOURCES, 16, 8, policy=policy, **options))
        stream = devpolicy.windows(SOURCES, 16, 8, policy=policy, **options)
        for step in range(30):
            saved = json.dumps(stream.state())
            resumed = every(
                devpolicy.windows(SOURCES, 16, 8, policy=policy, resume=saved, **options)
            )
            assert len(resumed) == 30 - step
            for got, want in zip(resumed, whole[step:], strict=True):
                np.testing.assert_array_equal(got, want)
            next(stream)

    def test_stream_ended_and_streams_count_the_windows_of_each_source(self) -> None:
        policy = devpolicy.load_policy({"version": 1, "logging": {"level": "info"}}, environ={})
        with structlog.testing.capture_logs() as events:
            stream = devpolicy.windows(
                SOURCES, 4, 10, order="random", seed=3, weights=WEIGHTS, steps=5,
                name="mixture/tally", policy=policy,
            )  # fmt: skip
            list(stream)
        (ended,) = [e for e in events if e["event"] == "stream_ended"]
        assert ended["sources"] == {"web": 30, "code": 15, "math": 5}
        report = devpolicy.report()
        (listed,) = [s for s in report.streams if s.name == "mixture/tally"]
        assert listed.sources == {"web": 30, "code": 15, "math": 5}
        assert (
            "stream mixture/tally (ended, 5 batches): windows by source: web 30 (60.0%), "
            "code 15 (30.0%), math 5 (10.0%)"
        ) in str(report).splitlines()

    @pytest.mark.parametrize("uring", [True, False], ids=["io_uring", "no io_uring"])
    def test_a_mixture_of_mapped_files_reads_by_position_the_same_windows(
        self, tmp_path: Path, uring: bool
    ) -> None:
        """Sources mapped from files give exactly the batches the same arrays in memory
        give, the read path chosen as one file's is (the rules' first guess, held to): by
        position (one reader over all the files) where a group is one io_uring call, else
        from the mappings, kept (warm files that fit)."""
        if uring and not batched_reads_here():
            pytest.skip("no io_uring here")
        reads = devpolicy.ReadOptions(io_uring=uring, measure=False)
        mapped = {}
        for name, values in SOURCES.items():
            path = tmp_path / f"{name}.bin"
            values.tofile(path)
            mapped[name] = np.memmap(path, dtype=np.int32, mode="r")
        policy = devpolicy.load_policy({"version": 1, "logging": {"level": "info"}}, environ={})
        options: dict[str, Any] = {"order": "shuffled", "seed": 6, "weights": WEIGHTS, "steps": 40}
        with structlog.testing.capture_logs() as events:
            from_files = every(
                devpolicy.windows(mapped, 32, 8, policy=policy, reads=reads, **options)
            )
        in_memory = every(devpolicy.windows(SOURCES, 32, 8, policy=policy, **options))
        for got, want in zip(from_files, in_memory, strict=True):
            np.testing.assert_array_equal(got, want)
        ended = next(e for e in events if e["event"] == "stream_ended")
        if uring:
            assert ended["reads"] == "file"
            assert ended["reads_why"].startswith(
                "read from the files by position, a group's windows in one io_uring call"
            )
        else:
            assert ended["reads"] == "mapping"
            assert (
                "fit in memory and reading by position is a system call a window here"
                in (ended["reads_why"])
            )

    def test_a_source_file_cut_short_is_an_error_naming_that_file(self, tmp_path: Path) -> None:
        """Read by position (a mapping read past its file's end is SIGBUS: host-arrays.md),
        a file of a mixture cut short mid-stream is an error naming that file."""
        paths = {}
        for name, values in SOURCES.items():
            paths[name] = tmp_path / f"{name}.bin"
            values.tofile(paths[name])
        mapped = {n: np.memmap(p, dtype=np.int32, mode="r") for n, p in paths.items()}
        stream = devpolicy.windows(
            mapped,
            32,
            8,
            order="random",
            seed=1,
            weights=WEIGHTS,
            steps=400,
            policy=policy_of(),
            reads="file",
        )
        next(stream)
        with open(paths["code"], "r+b") as f:
            f.truncate(100)
        with pytest.raises(
            (devpolicy.errors.HostViewError, devpolicy.errors.StreamEndedError)
        ) as e:
            for _ in stream:
                pass
        assert "code.bin" in str(e.value)
        stream.close()

    @pytest.mark.parametrize(
        ("tokens", "options", "error", "message"),
        [
            (TOKENS, {"weights": {"a": 1}}, ValueError, r"weights= mixes several token arrays"),
            (SOURCES, {"order": "random"}, ValueError, r"need weights="),
            (
                {"tokens": TOKENS},
                {},
                ValueError,
                r"need weights=.*: pass tokens\['tokens'\] itself for a stream of it$",
            ),
            (
                SOURCES,
                {"order": "random", "weights": {"web": 1, "code": 1}},
                ValueError,
                r"no weight for 'math'",
            ),
            (
                SOURCES,
                {"order": "random", "weights": {**WEIGHTS, "wiki": 1}},
                ValueError,
                r"no source 'wiki' in tokens",
            ),
            (
                SOURCES,
                {"order": "random", "weights": {**WEIGHTS, "math": 0}},
                ValueError,
                r"weights\['math'\] must be a finite number > 0",
            ),
            (
                SOURCES,
                {"order": "random", "weights": {**WEIGHTS, "math": float("nan")}},
                ValueError,
                r"weights\['math'\] must be a finite number > 0",
            ),
            (SOURCES, {"weights": WEIGHTS}, ValueError, r"not 'sequential'"),
            (
                SOURCES,
                {"order": "shuffled", "weights": WEIGHTS, "epochs": 2},
                ValueError,
                r"each source of a mixture has its own epochs",
            ),
            ({}, {"order": "random", "weights": {}}, ValueError, r"an empty mapping"),
            (
                {"a": TOKENS, "b": [1, 2, 3, 4, 5]},
                {"order": "random", "weights": {"a": 1, "b": 1}},
                TypeError,
                r"^windows tokens\['b'\] must be a jax.Array on a host device or a numpy array",
            ),
            (
                {"a": TOKENS, "b": TOKENS.astype(np.int64)},
                {"order": "random", "weights": {"a": 1, "b": 1}},
                ValueError,
                r"share a dtype and row shape: 'a' is int32 \(\), 'b' is int64 \(\)",
            ),
            (
                {"a": TOKENS, "b": TOKENS[:3]},
                {"order": "random", "weights": {"a": 1, "b": 1}},
                ValueError,
                r"source 'b' has 3",
            ),
            (
                {"a": TOKENS, "b": TOKENS},
                {"order": "random", "weights": {"a": 1, "b": 1e-7}},
                ValueError,
                r"weights\['b'\] is too small",
            ),
        ],
    )
    def test_bad_mixtures_are_refused_naming_what_is_wrong(
        self, tokens: Any, options: dict[str, Any], error: type[Exception], message: str
    ) -> None:
        with pytest.raises(error, match=message):
            devpolicy.windows(tokens, 4, 2, policy=policy_of(), **options)

    def test_the_allotment_is_exact_for_simple_weights_and_close_for_any(self) -> None:
        assert mixing.allotment([0.6, 0.3, 0.1]).tolist() == [6, 3, 1]
        assert mixing.allotment([1, 1, 1]).tolist() == [1, 1, 1]
        shares = [np.pi, np.e, 1.0]
        counts = mixing.allotment(shares)
        assert counts.sum() == mixing.PERIOD_MOST
        assert np.abs(counts / counts.sum() - np.asarray(shares) / sum(shares)).max() <= (
            1 / mixing.PERIOD_MOST
        )


def segments_by_hand(row: list[int], separator: int, kind: str) -> tuple[list[int], list[int]]:
    ids, positions, segment, position = [], [], 1, 0
    for i, token in enumerate(row):
        starts = i > 0 and (row[i - 1] == separator if kind == "eos" else token == separator)
        if starts:
            segment, position = segment + 1, 0
        ids.append(segment)
        positions.append(position)
        position += 1
    return ids, positions


class TestDocuments:
    @given(
        tokens=st.lists(st.integers(0, 4), min_size=8, max_size=200),
        length=st.integers(1, 8),
        batch=st.integers(1, 4),
        kind=st.sampled_from(["eos", "bos"]),
    )
    @settings(max_examples=60, deadline=None)
    def test_segment_ids_and_positions_agree_with_the_separators(
        self, tokens: list[int], length: int, batch: int, kind: str
    ) -> None:
        stream = devpolicy.windows(
            np.asarray(tokens, np.uint16), length, batch, separator=0, separator_is=kind,
            policy=policy_of(),
        )  # fmt: skip
        for b in stream:
            rows = np.asarray(b["tokens"]).tolist()
            ids = np.asarray(b["segment_ids"]).tolist()
            positions = np.asarray(b["positions"]).tolist()
            for row, row_ids, row_positions in zip(rows, ids, positions, strict=True):
                assert (row_ids, row_positions) == segments_by_hand(row, 0, kind)

    def test_segments_are_placed_with_their_batch_sharded_as_it_is(self) -> None:
        policy = policy_of(
            meshes={"rows": {"axes": {"data": 4}, "devices": "cpu"}},
            rules=[{"match": "batch", "sharding": {"mesh": "rows", "spec": ["data"]}}],
        )
        stream = devpolicy.windows(
            TOKENS % 50, 64, 8, order="shuffled", seed=1, separator=0, steps=3, policy=policy
        )
        for b in stream:
            assert set(b) == {"tokens", "segment_ids", "positions"}
            assert b["segment_ids"].dtype == np.int32
            assert b["positions"].dtype == np.int32
            for key in ("segment_ids", "positions"):
                assert b[key].shape == b["tokens"].shape
                assert b[key].sharding == b["tokens"].sharding

    def test_a_mixture_carries_segments_too(self) -> None:
        """Segments are cut from whatever windows a batch holds: a mixture's alike."""
        sources = {"a": TOKENS[:5000] % 13, "b": TOKENS[5000:9000] % 7}
        stream = devpolicy.windows(
            sources, 32, 8, order="shuffled", seed=1, weights={"a": 1, "b": 1},
            separator=0, steps=20, policy=policy_of(),
        )  # fmt: skip
        for b in stream:
            for row, ids, positions in zip(
                np.asarray(b["tokens"]).tolist(),
                np.asarray(b["segment_ids"]).tolist(),
                np.asarray(b["positions"]).tolist(),
                strict=True,
            ):
                assert (ids, positions) == segments_by_hand(row, 0, "eos")

    def test_stream_ended_counts_the_segments_bytes(self) -> None:
        policy = devpolicy.load_policy({"version": 1, "logging": {"level": "info"}}, environ={})
        with structlog.testing.capture_logs() as events:
            list(devpolicy.windows(TOKENS.astype(np.uint16), 10, 4, steps=3, separator=7,
                                   policy=policy))  # fmt: skip
        ended = next(e for e in events if e["event"] == "stream_ended")
        assert ended["nbytes"] == 3 * 4 * 10 * (2 + 4 + 4)

    @pytest.mark.parametrize(
        ("tokens", "options", "error", "message"),
        [
            (TOKENS.astype(np.uint16), {"separator": 70_000}, ValueError, r"cannot occur in"),
            (TOKENS.astype(np.uint16), {"separator": "eos"}, TypeError, r"must be an int"),
            (
                np.zeros((100, 2), np.int32),
                {"separator": 0},
                ValueError,
                r"needs a 1-D array of integer token ids",
            ),
            (np.zeros(100, np.float32), {"separator": 0}, ValueError, r"integer token ids"),
            (TOKENS, {"separator": 0, "separator_is": "end"}, ValueError, r"separator_is must"),
        ],
    )
    def test_a_bad_separator_is_refused_naming_it(
        self, tokens: Any, options: dict[str, Any], error: type[Exception], message: str
    ) -> None:
        with pytest.raises(error, match=message):
            devpolicy.windows(tokens, 4, 2, policy=policy_of(), **options)


class TestScale:
    @pytest.mark.slow
    def test_ten_thousand_steps_of_a_shuffled_mixture_with_segments_keep_memory_flat(
        self,
    ) -> None:
        """Across many epochs of each source: what Python and numpy hold after 10,000
        steps is what they held after 1,000 (no table of an epoch, no list of batches)."""
        sources = {"a": TOKENS[:3000] % 11, "b": TOKENS[3000:4000] % 5}
        stream = devpolicy.windows(
            sources, 16, 4, order="shuffled", seed=3, weights={"a": 2, "b": 1}, separator=0,
            steps=10_000, policy=policy_of(),
        )  # fmt: skip
        tracemalloc.start()
        try:
            for step, _ in enumerate(stream):
                if step == 1_000:
                    gc.collect()
                    early = tracemalloc.get_traced_memory()[0]
            gc.collect()
            late = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        # 40,000 rows allotted a, b, a (2:1): 26,667 and 13,333 windows, epochs of
        # ceil((3,000 - 15) / 16) = 187 and ceil((1,000 - 15) / 16) = 62 windows.
        assert stream.state()["epoch"] == {"a": 26_667 // 187, "b": 13_333 // 62}
        assert late - early < 256 * 1024

    def test_ten_billion_windows_are_drawn_in_range_and_an_epoch_is_a_permutation(
        self,
    ) -> None:
        """Epochs and mixtures of 10**10 windows (34-bit positions, 64-bit offsets):
        every start in range, a step's windows distinct, and a resumed step equal."""
        shuffled = shuffling.Shuffled(10**10 + 7, 64, 1, 5, None, None)
        far = shuffled.take(10**9, 4)
        assert far is not None
        assert far.min() >= 0
        assert far.max() < 10**10 + 7
        assert len(np.unique(far)) == far.size
        again = shuffling.Shuffled(10**10 + 7, 64, 1, 5, None, None).take(10**9 + 2, 1)
        assert again is not None
        np.testing.assert_array_equal(again[0], far[2])
        mixture = mixing.Mixed(
            [5 * 10**9, 10**10], np.array([0, 5 * 10**9 + 15]), [1, 3], 64, 5, None, 1
        )
        offsets = mixture.take(10**9, 4)
        assert offsets is not None
        sources = np.searchsorted(mixture.bases, offsets, side="right") - 1
        assert (offsets - mixture.bases[sources]).max() < 10**10
        assert np.bincount(sources.ravel(), minlength=2).tolist() == [64, 192]

    def test_twenty_sources_are_each_drawn_by_their_weight(self) -> None:
        """10x the sources: each source's share over 1,000 batches is its weight's."""
        sources = {f"s{i}": np.arange(i * 1000, (i + 1) * 1000, dtype=np.int32) for i in range(20)}
        weights = {f"s{i}": float(i + 1) for i in range(20)}
        stream = devpolicy.windows(
            sources, 8, 21, order="random", seed=2, weights=weights, steps=1_000,
            policy=policy_of(),
        )  # fmt: skip
        counts = Counter(v // 1000 for b in stream for v in np.asarray(b)[:, 0].tolist())
        assert [counts[i] for i in range(20)] == [(i + 1) * 100 for i in range(20)]


class TestElasticResume:
    def test_a_state_of_another_global_batch_names_how_to_go_on_with_start(self) -> None:
        policy = policy_of()
        stream = devpolicy.windows(TOKENS, 8, 4, order="shuffled", seed=2, policy=policy)
        for _ in range(6):
            next(stream)
        saved = stream.state()
        with pytest.raises(StreamStateError, match=r"start=8 \(and seed=2\), without resume=$"):
            devpolicy.windows(TOKENS, 8, 3, order="shuffled", seed=2, resume=saved, policy=policy)
        # Going on that way continues the epoch where the saved stream was.
        on = devpolicy.windows(TOKENS, 8, 3, order="shuffled", seed=2, start=8, policy=policy)
        assert on.state()["epoch"] == saved["epoch"]
        next(on)

    def test_a_state_of_the_first_version_still_resumes(self) -> None:
        policy = policy_of()
        stream = devpolicy.windows(TOKENS, 8, 4, order="random", seed=2, policy=policy)
        next(stream)
        first = {
            k: v
            for k, v in stream.state().items()
            if k not in ("epochs", "global_batch", "sources", "weights")
        }
        first[streamstate.STATE_KEY] = 1
        resumed = devpolicy.windows(
            TOKENS, 8, 4, order="random", seed=2, resume=first, policy=policy
        )
        np.testing.assert_array_equal(np.asarray(next(resumed)), np.asarray(next(stream)))

    @pytest.mark.slow
    def test_two_processes_resume_on_one_with_the_same_global_batches(self) -> None:
        """A shuffled stream and a shuffled mixture drawn by 2 jax.distributed processes
        (2 rows each of a global batch of 4): the state saved before each step, resumed
        here by one process with batch 4, yields the global batches from that step on,
        element by element; both processes saved the same states."""
        reports = reports_of(run_job(REPO / "tests" / "resume_worker.py", [[], []], timeout=240))
        tokens = np.arange(100_000, dtype=np.int32)
        cases = {
            "shuffled": (tokens, {"order": "shuffled", "stride": 3}),
            "mixed": (
                {"low": tokens[:60_000], "high": tokens[60_000:]},
                {"order": "shuffled", "weights": {"low": 3, "high": 1}},
            ),
        }
        for case, (source, options) in cases.items():
            states = [r[case]["states"] for r in reports]
            assert states[0] == states[1]
            global_batches = []
            for step in range(6):
                rows: dict[int, list[int]] = {}
                for report in reports:
                    rows |= {int(k): v for k, v in report[case]["batches"][step].items()}
                global_batches.append([rows[i] for i in range(4)])
            for step, state in enumerate(states[0]):
                assert state["step"] == step
                assert state["global_batch"] == 4
                assert state["batch"] == 2
                resumed = devpolicy.windows(
                    source, 5, 4, seed=11, steps=6, resume=state, policy=policy_of(), **options
                )
                assert [np.asarray(b).tolist() for b in resumed] == global_batches[step:]


# Every fault the stream contract holds one array's stream to, on the new kinds: each
# compared with the same stream uninterrupted, batch for batch.
KINDS = [
    "shuffled",
    "mixture",
    "mixture of files (preadv)",
    "mixture of files (kept mapped)",
    "mixture of files",
    "mixture of files (switching paths every group)",
    "documents",
]
#: How each mixture of files is read: by position though the files are warm, one `preadv`
#: a window; kept mapped (the rules' guess without io_uring); as `windows` chooses; and
#: switching between reading by position and the kept mappings nearly every group.
KIND_READS = {
    "mixture of files (preadv)": devpolicy.ReadOptions(path="file", io_uring=False),
    "mixture of files (kept mapped)": devpolicy.ReadOptions(io_uring=False, measure=False),
    "mixture of files": devpolicy.ReadOptions(),
    "mixture of files (switching paths every group)": SWITCHING,
}


def kind_stream(kind: str, tmp_path: Path, steps: int | None = 300) -> Any:
    """A stream of `kind` (its sources written under `tmp_path` for a mixture of files)."""
    policy = policy_of()
    if kind == "shuffled":
        return devpolicy.windows(
            TOKENS, 64, 4, order="shuffled", seed=5, stride=3, steps=steps, policy=policy
        )
    if kind == "documents":
        return devpolicy.windows(
            TOKENS % 97, 64, 4, order="shuffled", seed=5, separator=0, steps=steps, policy=policy
        )
    sources: dict[str, Any] = dict(SOURCES)
    if kind.startswith("mixture of files"):
        for name, values in SOURCES.items():
            path = tmp_path / f"{name}.bin"
            if not path.exists():
                values.tofile(path)
            sources[name] = np.memmap(path, dtype=np.int32, mode="r")
    return devpolicy.windows(
        sources,
        64,
        4,
        order="shuffled",
        seed=5,
        weights=WEIGHTS,
        steps=steps,
        policy=policy,
        reads=KIND_READS.get(kind),
    )


def as_key(batch: Any) -> bytes:
    if isinstance(batch, dict):
        return b"".join(np.asarray(batch[k]).tobytes() for k in sorted(batch))
    return np.asarray(batch).tobytes()


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class TestFaultsOnTheNewKinds:
    def test_ctrl_c_inside_next_skips_nothing_and_repeats_nothing(
        self, kind: str, tmp_path: Path
    ) -> None:
        want = [as_key(b) for b in kind_stream(kind, tmp_path, steps=200)]
        stream = kind_stream(kind, tmp_path, steps=200)

        def check(batch: Any, step: int) -> None:
            assert as_key(batch) == want[step]

        handed = pull_through_interrupts(stream, check)
        assert [as_key(b) for b in stream] == want[handed:]

    def test_four_threads_share_one_stream_each_step_to_exactly_one(
        self, kind: str, tmp_path: Path
    ) -> None:
        want = {as_key(b): step for step, b in enumerate(kind_stream(kind, tmp_path))}
        stream = kind_stream(kind, tmp_path)
        pulled_by_threads(stream, lambda batch: want[as_key(batch)])
        assert stream.state()["step"] == 300

    def test_close_from_another_thread_never_raises_and_leaves_nothing_open(
        self, kind: str, tmp_path: Path
    ) -> None:
        kind_stream(kind, tmp_path, steps=1).close()  # the sources written
        before = held_open()
        want = [as_key(b) for b in kind_stream(kind, tmp_path, steps=2000)]

        def check(batch: Any, step: int) -> None:
            assert as_key(batch) == want[step]

        closed_while_pulled(lambda: kind_stream(kind, tmp_path, steps=2000), check, attempts=10)
        gc.collect()
        assert held_open() == before

    @pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
    @pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
    def test_a_forked_childs_copy_refuses_and_the_parent_goes_on_exactly(
        self, kind: str, tmp_path: Path
    ) -> None:
        want = [as_key(b) for b in kind_stream(kind, tmp_path, steps=40)]
        stream = kind_stream(kind, tmp_path, steps=40)
        for step in range(3):
            assert as_key(next(stream)) == want[step]
        assert forked_child_refuses(stream, 3) == 0
        assert [as_key(b) for b in stream] == want[3:]


class TestEdgesOfTheArguments:
    """Issue 56's attack findings at the edges of the training-data arguments: each
    mixed, resumed or refused wrongly in silence, or with a raw error."""

    def test_weights_near_the_largest_float_keep_their_shares(self) -> None:
        """H2: 1.5e308 and 0.5e308 summed to inf and mixed 400/400 where 3:1 is 600/200."""
        policy = devpolicy.load_policy({"version": 1, "logging": {"level": "info"}}, environ={})
        with structlog.testing.capture_logs() as events:
            stream = devpolicy.windows(
                {"a": TOKENS, "b": TOKENS}, 4, 8, order="random", seed=1, steps=100,
                weights={"a": 1.5e308, "b": 0.5e308}, policy=policy,
            )  # fmt: skip
            list(stream)
        ended = next(e for e in events if e["event"] == "stream_ended")
        assert ended["sources"] == {"a": 600, "b": 200}

    def test_a_weight_too_small_beside_huge_ones_is_refused(self) -> None:
        """H2: a weight 10**8 times smaller than the others got a third of the rows."""
        with pytest.raises(ValueError, match=r"^windows weights\['c'\] is too small"):
            devpolicy.windows(
                {"a": TOKENS, "b": TOKENS, "c": TOKENS}, 4, 8, order="random", seed=1,
                weights={"a": 1e308, "b": 1e308, "c": 1e300}, policy=policy_of(),
            )  # fmt: skip

    @pytest.mark.parametrize("order", ["random", "shuffled"])
    def test_a_sequential_state_resumed_by_another_order_names_order_and_seed(
        self, order: str
    ) -> None:
        """M1: without seed= this was a raw AssertionError; with it, the proper error."""
        stream = devpolicy.windows(TOKENS, 4, 8, steps=5, policy=policy_of())
        next(stream)
        saved = stream.state()
        stream.close()
        for seed in (None, 3):
            with pytest.raises(StreamStateError, match=r"^windows resume: order") as raised:
                devpolicy.windows(
                    TOKENS, 4, 8, order=order, seed=seed, resume=saved, policy=policy_of()
                )
            assert "sequential" in str(raised.value)

    @pytest.mark.parametrize("order", ["random", "shuffled"])
    def test_a_one_source_mixture_ends_at_the_last_step_with_exact_counts(self, order: str) -> None:
        """M2: at step 2**63 - 1, the ending pull and state() raised numpy's OverflowError
        (int64 counts times 2**63)."""
        policy = devpolicy.load_policy({"version": 1, "logging": {"level": "info"}}, environ={})
        last = 2**63 - 1
        with structlog.testing.capture_logs() as events:
            stream = devpolicy.windows(
                {"a": TOKENS}, 4, 1, order=order, seed=1, weights={"a": 1}, start=last,
                policy=policy,
            )  # fmt: skip
            assert len(list(stream)) == 1
            state = stream.state()
        assert state["step"] == 2**63
        if order == "shuffled":
            assert state["epoch"] == {"a": 2**63 // -(-(TOKENS.size - 3) // 4)}
        ended = next(e for e in events if e["event"] == "stream_ended")
        assert ended["sources"] == {"a": 1}
        resumed = devpolicy.windows(
            {"a": TOKENS}, 4, 1, order=order, seed=1, weights={"a": 1}, resume=state,
            policy=policy_of(),
        )  # fmt: skip
        assert list(resumed) == []

    def test_the_epoch_of_a_finished_stream_is_never_past_epochs(self) -> None:
        """M3: epochs=1 of 3 windows at batch=100 ended saying epoch 33."""
        for epochs in (1, 2):
            stream = devpolicy.windows(
                np.arange(12, dtype=np.int32), 4, 100, order="shuffled", seed=1, epochs=epochs,
                policy=policy_of(),
            )  # fmt: skip
            (batch,) = list(stream)
            assert batch.shape[0] == 3 * epochs
            assert stream.state()["epoch"] == epochs

    def test_a_separator_past_int32_is_refused_with_x64_off(self) -> None:
        """L2: it fit int64 but with x64 off tokens become int32: a batch holding it raised
        (exact) or it never separated anything (lossy)."""
        for narrow in ("exact", "lossy"):
            with pytest.raises(
                ValueError, match=r"^windows separator=1099511627776 does not fit int32"
            ):
                devpolicy.windows(
                    TOKENS.astype(np.int64), 4, 2, separator=2**40, narrow=narrow,
                    policy=policy_of(),
                )  # fmt: skip

    def test_a_tampered_step_past_the_epochs_is_a_state_error_naming_step(self) -> None:
        """L3: it was refused as 'windows start=118 is past the end', a plain ValueError,
        though no start= was given."""
        stream = devpolicy.windows(
            np.arange(12, dtype=np.int32), 4, 1, order="shuffled", seed=1, epochs=1,
            policy=policy_of(),
        )  # fmt: skip
        saved = {**stream.state(), "step": 118}
        stream.close()
        with pytest.raises(
            StreamStateError,
            match=r"^windows resume: resume\['step'\]: the saved step 118 is past the end of "
            r"this stream, which has 3 batches",
        ):
            devpolicy.windows(
                np.arange(12, dtype=np.int32), 4, 1, order="shuffled", seed=1, epochs=1,
                resume=saved, policy=policy_of(),
            )  # fmt: skip
