"""Weighted mixtures of several token arrays (`devpolicy._apply.stream.mixing`): each
source's share of the rows, its windows and epochs, the counts by source, and a mixture
of files read as one file is."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog

import devpolicy
from devpolicy._apply.stream import mixing
from tests.apply.conftest import batched_reads_here
from tests.helpers import policy_of

TOKENS = np.arange(100_000, dtype=np.int32)


def every(stream: Any) -> list[np.ndarray]:
    return [np.asarray(b) for b in stream]


def source_of(value: int, bounds: dict[str, tuple[int, int]]) -> str:
    return next(name for name, (low, high) in bounds.items() if low <= value < high)


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
