"""Where a `windows` stream is (`devpolicy._apply.stream.state`): resumed at step N it yields
exactly what an uninterrupted one yields from N on: by `start=`, by a saved `state()`, for
both orders, sharded rows and two processes; a state that does not match is an error
naming the field; and a state resumed by a job of another size (2 processes -> 1)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import devpolicy
from devpolicy._apply.stream import sampling, state
from devpolicy.errors import StreamStateError
from tests.conftest import REPO
from tests.helpers import policy_of, reports_of, run_job

TOKENS = np.arange(200_000, dtype=np.int32)
#: The tokens of the elastic resume (a job of another size).
TOKENS_100K = np.arange(100_000, dtype=np.int32)
SHARDED = {
    "meshes": {"rows": {"axes": {"data": 4}, "devices": "cpu"}},
    "rules": [{"match": "batch", "sharding": {"mesh": "rows", "spec": ["data"]}}],
}


def drawn(stream: Iterable[Any]) -> list[np.ndarray]:
    return [np.asarray(b) for b in stream]


def assert_same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


ORDERS = [
    pytest.param({"order": "random", "seed": 5, "steps": 40}, id="random"),
    pytest.param({"order": "sequential", "stride": 300, "steps": 40}, id="sequential"),
    pytest.param({"order": "sequential"}, id="sequential, one pass"),
]


class TestResumeAtAStep:
    @pytest.mark.parametrize("options", ORDERS)
    @pytest.mark.parametrize("fields", [{}, SHARDED], ids=["one device", "sharded rows"])
    def test_start_n_yields_what_an_uninterrupted_stream_yields_from_n(
        self, options: dict[str, object], fields: dict[str, object]
    ) -> None:
        """Batches N..end of one stream equal a stream started at N, element for element,
        for both orders, and with the rows sharded over 4 devices."""
        policy = policy_of(**fields)
        whole = drawn(devpolicy.windows(TOKENS, 301, 8, policy=policy, **options))
        for n in (0, 1, 7, 8, 9, 23):
            resumed = drawn(devpolicy.windows(TOKENS, 301, 8, start=n, policy=policy, **options))
            assert_same(resumed, whole[n:])

    @pytest.mark.parametrize("options", ORDERS)
    def test_a_saved_state_resumes_the_stream_where_it_was(
        self, options: dict[str, object]
    ) -> None:
        """state() after 13 batches, through JSON (as a checkpoint's metadata carries
        it), rebuilds a stream that yields batch 13 on, the batches in flight not lost."""
        policy = policy_of()
        stream = devpolicy.windows(TOKENS, 301, 8, policy=policy, **options)
        first = [np.asarray(next(stream)) for _ in range(13)]
        saved = json.dumps(stream.state())
        rest = drawn(stream)
        resumed = devpolicy.windows(TOKENS, 301, 8, resume=saved, policy=policy, **options)
        assert resumed.state()["step"] == 13
        assert_same(drawn(resumed), rest)
        assert len(first) == 13

    def test_a_seedless_random_stream_keeps_its_seed_in_its_state(self) -> None:
        """seed=None draws fresh entropy once; the state names it, and a resume without a
        seed takes it, so even a seedless run comes back to the same batches."""
        stream = devpolicy.windows(TOKENS, 64, 4, order="random", policy=policy_of())
        [next(stream) for _ in range(5)]
        saved = stream.state()
        assert isinstance(saved["seed"], int)
        after = [np.asarray(next(stream)) for _ in range(6)]
        resumed = devpolicy.windows(TOKENS, 64, 4, order="random", resume=saved, policy=policy_of())
        assert_same([np.asarray(next(resumed)) for _ in range(6)], after)

    def test_a_state_survives_a_checkpoints_metadata(self, tmp_path: Path) -> None:
        """The state saved in save_file's metadata beside the model, read back from the
        file, resumes the stream."""
        policy = policy_of()
        stream = devpolicy.windows(TOKENS, 33, 2, order="random", seed=1, policy=policy)
        [next(stream) for _ in range(4)]
        path = tmp_path / "ckpt.safetensors"
        devpolicy.save_file(
            {"w": np.zeros(3, np.float32)}, path, metadata={"stream": json.dumps(stream.state())}
        )
        want = np.asarray(next(stream))
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            saved = f.metadata()["stream"]
        resumed = devpolicy.windows(
            TOKENS, 33, 2, order="random", seed=1, resume=saved, policy=policy
        )
        np.testing.assert_array_equal(np.asarray(next(resumed)), want)


class TestStateThatDoesNotMatch:
    @pytest.mark.parametrize(
        ("change", "field"),
        [
            ({"length": 65}, "length"),
            ({"tokens": TOKENS[:-1]}, "rows"),
            ({"tokens": TOKENS.astype(np.int64)}, "dtype"),
            ({"seed": 4}, "seed"),
            ({"steps": 99}, "steps"),
        ],
        ids=["length", "token count", "dtype", "seed", "steps"],
    )
    def test_other_arguments_are_an_error_naming_the_field(
        self, change: dict[str, object], field: str
    ) -> None:
        """A state resumed with another length, token count, dtype, seed or steps would
        draw other batches: StreamStateError names the field and both values (another
        global batch goes on from the same row: `TestElasticResume`)."""
        arguments: dict[str, object] = {
            "tokens": TOKENS, "length": 64, "batch": 4, "seed": 3, "steps": 50,
        }  # fmt: skip
        stream = devpolicy.windows(order="random", policy=policy_of(), **arguments)  # type: ignore[arg-type]
        next(stream)
        saved = stream.state()
        with pytest.raises(
            devpolicy.errors.StreamStateError,
            match=rf"^windows resume: {field}: the saved stream had {field}=",
        ):
            devpolicy.windows(  # type: ignore[misc]
                order="random", resume=saved, policy=policy_of(), **(arguments | change)
            )

    @pytest.mark.parametrize(
        "saved",
        [{"step": 3}, "not json {", [1, 2], {"devpolicy.windows": 1, "step": "3"}],
        ids=["no marker", "not JSON", "a list", "a damaged step"],
    )
    def test_what_is_not_a_saved_state_is_refused_clearly(self, saved: object) -> None:
        with pytest.raises(devpolicy.errors.StreamStateError, match=r"^windows resume: resume"):
            devpolicy.windows(TOKENS, 4, 2, resume=saved, policy=policy_of())  # type: ignore[arg-type]

    def test_start_past_the_end_and_start_with_resume_are_refused(self) -> None:
        """A sequential pass has so many batches: a start past them is an error saying
        how many; start and resume together are ambiguous."""
        with pytest.raises(
            ValueError,
            match=r"^windows start=501 is past the end: a sequential pass of this stream has 500 batches",
        ):
            devpolicy.windows(np.arange(1000), 2, 1, start=501, policy=policy_of())
        stream = devpolicy.windows(np.arange(1000), 2, 1, policy=policy_of())
        with pytest.raises(ValueError, match=r"^windows takes start= or resume=, not both"):
            devpolicy.windows(
                np.arange(1000), 2, 1, start=2, resume=stream.state(), policy=policy_of()
            )
        with pytest.raises(
            ValueError, match=r"^windows start must be an int from 0 to 2\*\*63 - 1, got -1"
        ):
            devpolicy.windows(np.arange(1000), 2, 1, start=-1, policy=policy_of())


def _rows(stream: Any, batches: int) -> list[int]:
    """The window starts of the next `batches` batches, row after row (global row order
    for one process)."""
    return [int(r) for _ in range(batches) for r in np.asarray(next(stream))[:, 0]]


ELASTIC_CASES = {
    "random": (TOKENS_100K, {"order": "random"}),
    "shuffled": (TOKENS_100K, {"order": "shuffled", "stride": 3}),
    "mixed": (
        {"low": TOKENS_100K[:60_000], "high": TOKENS_100K[60_000:] + 10**6},
        {"order": "shuffled", "weights": {"low": 3, "high": 1}},
    ),
    "mixed random": (
        {"low": TOKENS_100K[:60_000], "high": TOKENS_100K[60_000:] + 10**6},
        {"order": "random", "weights": {"low": 0.7, "high": 0.3}},
    ),
}


class TestElasticResume:
    @pytest.mark.parametrize("case", ELASTIC_CASES)
    @pytest.mark.parametrize("other", [48, 96])
    def test_a_state_saved_at_64_rows_resumes_at_another_global_batch_from_the_same_row(
        self, case: str, other: int
    ) -> None:
        """Saved with B=64 after 5 steps, resumed with B'=48 or 96: its first batch holds
        the rows that would have come next, and every later row is the uninterrupted
        stream's; saved again and resumed at 64, it goes on from that row too."""
        source, options = ELASTIC_CASES[case]
        policy = policy_of()
        whole = _rows(devpolicy.windows(source, 8, 64, seed=4, policy=policy, **options), 30)
        stream = devpolicy.windows(source, 8, 64, seed=4, policy=policy, **options)
        before = _rows(stream, 5)
        saved = json.loads(json.dumps(stream.state()))
        assert (saved["step"], saved["row"], saved["global_batch"]) == (5, 320, 64)
        resumed = devpolicy.windows(
            source, 8, other, seed=4, resume=saved, policy=policy, **options
        )
        after = _rows(resumed, 6)
        assert before + after == whole[: len(before) + len(after)]
        again = resumed.state()
        assert (again["step"], again["row"], again["global_batch"]) == (11, 320 + 6 * other, other)
        back = devpolicy.windows(source, 8, 64, seed=4, resume=again, policy=policy, **options)
        done = len(before) + len(after)
        assert _rows(back, 2) == whole[done : done + 128]

    def test_an_epoch_resumed_at_another_global_batch_still_holds_every_window_once(
        self,
    ) -> None:
        """epochs=1 of 1,000 windows: 7 steps of 64, then 96 a step to the end: every
        window exactly once, the last batch the epoch's rest."""
        tokens = np.arange(8_000, dtype=np.int32)
        policy = policy_of()
        stream = devpolicy.windows(tokens, 8, 64, order="shuffled", seed=3, epochs=1, policy=policy)
        seen = _rows(stream, 7)
        resumed = devpolicy.windows(
            tokens, 8, 96, order="shuffled", seed=3, epochs=1, resume=stream.state(), policy=policy
        )
        shapes = []
        for batch in resumed:
            shapes.append(batch.shape[0])
            seen.extend(int(r) for r in np.asarray(batch)[:, 0])
        assert sorted(seen) == list(range(0, 8_000, 8))
        assert shapes == [96] * 5 + [1_000 - 7 * 64 - 5 * 96]
        assert resumed.state()["epoch"] == 1

    def test_a_sequential_pass_of_another_batch_is_refused_naming_how_to_go_on(self) -> None:
        policy = policy_of()
        stream = devpolicy.windows(TOKENS_100K, 8, 4, policy=policy)
        for _ in range(6):
            next(stream)
        with pytest.raises(
            StreamStateError,
            match=r"^windows resume: global_batch: .*a sequential pass resumes at its own "
            r"batch only: go on from the same place in the data with start=8, without resume=$",
        ):
            devpolicy.windows(TOKENS_100K, 8, 3, resume=stream.state(), policy=policy)
        on = devpolicy.windows(TOKENS_100K, 8, 3, start=8, policy=policy)
        assert _rows(on, 1) == [24 * 8, 25 * 8, 26 * 8]

    def test_a_sequential_state_whose_row_is_not_its_step_is_refused_as_damaged(self) -> None:
        policy = policy_of()
        stream = devpolicy.windows(TOKENS_100K, 8, 4, policy=policy)
        next(stream)
        saved = {**stream.state(), "row": 5}
        with pytest.raises(
            StreamStateError, match=r"^windows resume: resume\['row'\]: a sequential"
        ):
            devpolicy.windows(TOKENS_100K, 8, 4, resume=saved, policy=policy)

    def test_a_state_of_the_second_version_resumes_from_its_step_times_its_batch(self) -> None:
        policy = policy_of()
        stream = devpolicy.windows(TOKENS_100K, 8, 4, order="random", seed=2, policy=policy)
        next(stream)
        second = {k: v for k, v in stream.state().items() if k != "row"}
        second[state.STATE_KEY] = 2
        resumed = devpolicy.windows(
            TOKENS_100K, 8, 2, order="random", seed=2, resume=second, policy=policy
        )
        assert _rows(resumed, 2) == _rows(stream, 1)

    def test_a_shuffled_state_of_an_older_version_with_small_epochs_is_refused(self) -> None:
        """Epochs of at most SMALL windows were drawn in another order before version 3:
        resumed now they would hand out other windows, so the state is refused, saying
        why; a larger epoch's order is the one it was, and resumes."""
        policy = policy_of()
        for length, refused in ((8, False), (64, True)):  # 12,500 and 1,562 windows
            stream = devpolicy.windows(
                TOKENS_100K, length, 4, order="shuffled", seed=2, stride=length, policy=policy
            )
            next(stream)
            older = {k: v for k, v in stream.state().items() if k != "row"}
            older[state.STATE_KEY] = 2
            again = {"order": "shuffled", "seed": 2, "stride": length, "resume": older}
            if refused:
                with pytest.raises(
                    StreamStateError, match=r"this state is version 2: its shuffled"
                ):
                    devpolicy.windows(TOKENS_100K, length, 4, policy=policy, **again)  # type: ignore[arg-type]
            else:
                resumed = devpolicy.windows(TOKENS_100K, length, 4, policy=policy, **again)  # type: ignore[arg-type]
                np.testing.assert_array_equal(np.asarray(next(resumed)), np.asarray(next(stream)))

    def test_a_state_of_the_first_version_still_resumes(self) -> None:
        policy = policy_of()
        stream = devpolicy.windows(TOKENS_100K, 8, 4, order="random", seed=2, policy=policy)
        next(stream)
        first = {
            k: v
            for k, v in stream.state().items()
            if k not in ("epochs", "global_batch", "sources", "weights")
        }
        first[state.STATE_KEY] = 1
        resumed = devpolicy.windows(
            TOKENS_100K, 8, 4, order="random", seed=2, resume=first, policy=policy
        )
        np.testing.assert_array_equal(np.asarray(next(resumed)), np.asarray(next(stream)))

    @pytest.mark.slow
    def test_two_processes_resume_on_one_with_the_same_global_batches(self) -> None:
        """A shuffled stream, a shuffled mixture and packed rows drawn by 2 jax.distributed processes
        (2 rows each of a global batch of 4): the state saved before each step, resumed
        here by one process with batch 4, yields the global batches from that step on,
        element by element, and with another global batch (3, 6) the same rows from the
        same row; both processes saved the same states."""
        reports = reports_of(run_job(REPO / "tests" / "resume_worker.py", [[], []], timeout=240))
        tokens = np.arange(100_000, dtype=np.int32)
        cases = {
            "shuffled": (tokens, {"order": "shuffled", "stride": 3}),
            "mixed": (
                {"low": tokens[:60_000], "high": tokens[60_000:]},
                {"order": "shuffled", "weights": {"low": 3, "high": 1}},
            ),
        }
        self.check_packed(reports)
        for case, (source, options) in cases.items():
            states = [r[case]["states"] for r in reports]
            assert states[0] == states[1]
            global_batches = []
            for step in range(6):
                rows: dict[int, list[int]] = {}
                for report in reports:
                    rows |= {int(k): v for k, v in report[case]["batches"][step].items()}
                global_batches.append([rows[i] for i in range(4)])
            for step, saved in enumerate(states[0]):
                assert saved["step"] == step
                assert saved["global_batch"] == 4
                assert saved["batch"] == 2
                resumed = devpolicy.windows(
                    source, 5, 4, seed=11, steps=6, resume=saved, policy=policy_of(), **options
                )
                assert [np.asarray(b).tolist() for b in resumed] == global_batches[step:]
                # At another global batch (3 and 6 rows): the same rows, from the same row.
                flat = [window for batch in global_batches[step:] for window in batch]
                for other in (3, 6):
                    resumed = devpolicy.windows(
                        source, 5, other, seed=11, steps=6, resume=saved, policy=policy_of(),
                        **options,
                    )  # fmt: skip
                    rows = [w for b in resumed for w in np.asarray(b).tolist()]
                    assert rows[: len(flat)] == flat[: len(rows)]
                    assert bool(rows) == bool(flat)  # none past the last step

    @staticmethod
    def check_packed(reports: list[Any]) -> None:
        """Packed rows drawn by the 2 processes: each state resumed by one process, at the
        global batch of 4 and at 3 and 6, gives the same rows from the same row."""
        lengths = (np.arange(3_000) * 7919) % 40 + 1  # as the worker's `packed_corpus`
        tokens = np.concatenate(
            [np.append((np.arange(n) % 900) + 1, 0) for n in lengths.tolist()]
        ).astype(np.uint16)
        states = [r["packed"]["states"] for r in reports]
        assert states[0] == states[1]
        global_batches = []
        for step in range(6):
            rows: dict[int, list[int]] = {}
            for report in reports:
                rows |= {int(k): v for k, v in report["packed"]["batches"][step].items()}
            global_batches.append([rows[i] for i in range(4)])
        options = {"order": "shuffled", "seed": 11, "pack": "first_fit", "separator": 0,
                   "pad": 999, "policy": policy_of()}  # fmt: skip
        for step, saved in enumerate(states[0]):
            assert saved["step"] == step
            flat = [row for batch in global_batches[step:] for row in batch]
            for batch in (4, 3, 6):
                resumed = devpolicy.windows(tokens, 16, batch, resume=saved, steps=6, **options)
                rows_got = [r for b in resumed for r in np.asarray(b["tokens"]).tolist()]
                assert rows_got[: len(flat)] == flat[: len(rows_got)]
                if batch == 4:
                    assert rows_got == flat


@given(
    st.dictionaries(
        st.text(max_size=12),
        st.one_of(
            st.none(), st.integers(), st.text(max_size=8), st.lists(st.integers(), max_size=3)
        ),
        max_size=12,
    )
)
def test_any_mapping_either_reads_as_a_state_or_is_a_stream_state_error(
    saved: dict[str, object],
) -> None:
    """The state reader never fails with anything but StreamStateError, marker or not."""
    for candidate in (saved, {**saved, state.STATE_KEY: 1}):
        with contextlib.suppress(devpolicy.errors.StreamStateError):
            state.read_state(candidate)


@pytest.mark.slow
def test_two_processes_resumed_at_a_step_build_their_rows_of_the_same_global_batches() -> None:
    """Two jax.distributed processes, a global batch of 4 rows sharded over 2 x 2 devices,
    one seed: each process's rows of batches 3..5, resumed by start and by state, equal
    its rows of the uninterrupted run; the two processes draw different windows, and the
    global batches are the ones one process alone would draw (rows by global index)."""
    reports = reports_of(run_job(REPO / "tests" / "resume_worker.py", [[], []], timeout=180))
    rows = np.arange(4, dtype=np.uint64)
    global_starts = sampling.random_starts(11, 0, 6, rows, 4, 100_000 - 5 + 1)
    for index, report in enumerate(reports):
        assert report["process_index"] == index
        assert report["saved_step"] == 3
        assert report["shapes"] == [[4, 5]]
        assert report["by_start"] == report["uninterrupted"][3:]
        assert report["by_state"] == report["uninterrupted"][3:]
    for step in range(6):
        whole = [r for report in reports for r in report["uninterrupted"][step]]
        assert [row[0] for row in whole] == global_starts[step].tolist()
