"""Training data from `windows` across its kinds (shuffled epochs, mixtures of arrays and of
files, documents): at scale, under the faults the stream contract holds one array's stream
to, and at the edges of their arguments. Each kind's own tests are beside its module, in
tests/apply/stream/ (`test_shuffling.py`, `test_mixing.py`, `test_documents.py`, and the
elastic resume in `test_state.py`)."""

from __future__ import annotations

import gc
import itertools
import os
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog

import devpolicy
from devpolicy._apply.stream import mixing, shuffling
from devpolicy._apply.stream.sampling import Rows
from devpolicy.errors import HostViewError, StreamEndedError, StreamStateError
from tests.apply.stream.test_mixing import SOURCES, WEIGHTS
from tests.helpers import policy_of

from .streams import (
    FILE_PATHS,
    SWITCHING,
    assert_exact,
    closed_while_pulled,
    forked_child_refuses,
    held_open,
    pull_through_interrupts,
    pulled_by_threads,
    use_read_path,
)

TOKENS = np.arange(100_000, dtype=np.int32)


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
        shuffled = shuffling.Shuffled(10**10 + 7, Rows.every(64), 1, 5, None, None)
        far = shuffled.take(10**9, 4)
        assert far is not None
        assert far.min() >= 0
        assert far.max() < 10**10 + 7
        assert len(np.unique(far)) == far.size
        again = shuffling.Shuffled(10**10 + 7, Rows.every(64), 1, 5, None, None).take(10**9 + 2, 1)
        assert again is not None
        np.testing.assert_array_equal(again[0], far[2])
        mixture = mixing.Mixed(
            [5 * 10**9, 10**10], np.array([0, 5 * 10**9 + 15]), [1, 3], Rows.every(64), 5, None, 1
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
    "shards",
    "shard files (preadv)",
    "shard files (kept mapped)",
    "shard files",
    "shard files (switching paths every group)",
    "mixture of shard files",
]
#: How each mixture of files is read: by position though the files are warm, one `preadv`
#: a window; kept mapped (the rules' guess without io_uring); as `windows` chooses; and
#: switching between reading by position and the kept mappings nearly every group.
KIND_READS = {
    "mixture of files (preadv)": devpolicy.ReadOptions(path="file", io_uring=False),
    "mixture of files (kept mapped)": devpolicy.ReadOptions(io_uring=False, measure=False),
    "mixture of files": devpolicy.ReadOptions(),
    "mixture of files (switching paths every group)": SWITCHING,
    "shard files (preadv)": devpolicy.ReadOptions(path="file", io_uring=False),
    "shard files (kept mapped)": devpolicy.ReadOptions(io_uring=False, measure=False),
    "shard files": devpolicy.ReadOptions(),
    "shard files (switching paths every group)": SWITCHING,
    "mixture of shard files": devpolicy.ReadOptions(),
}
#: Where the shards are cut: 60 of them (more than a reader keeps open), some shorter
#: than a window, one a single token.
SHARD_CUTS = sorted({0, 1, 2, 40, 41, *range(97, 100_000, 1_693), 99_990, 100_000})


def shards_of(tokens: np.ndarray, folder: Path | None) -> list[Any]:
    """`tokens` cut at `SHARD_CUTS` (those within them): in memory, or as raw files in
    `folder`, mapped."""
    shards: list[Any] = []
    cuts = [*(cut for cut in SHARD_CUTS if cut < tokens.size), tokens.size]
    for index, (low, high) in enumerate(itertools.pairwise(cuts)):
        if folder is None:
            shards.append(tokens[low:high])
            continue
        path = folder / f"shard_{index:03d}.bin"
        if not path.exists():
            tokens[low:high].tofile(path)
        shards.append(np.memmap(path, dtype=tokens.dtype, mode="r"))
    return shards


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
    if kind.startswith("shard files") or kind == "shards":
        shards = shards_of(TOKENS % 97, None if kind == "shards" else tmp_path)
        return devpolicy.windows(
            shards, 64, 4, order="shuffled", seed=5, separator=0, steps=steps, policy=policy,
            reads=KIND_READS.get(kind),
        )  # fmt: skip
    sources: dict[str, Any] = dict(SOURCES)
    if kind == "mixture of shard files":
        sources["web"] = shards_of(SOURCES["web"], tmp_path)
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


class TestATruncatedShard:
    @pytest.mark.parametrize("way", FILE_PATHS)
    def test_a_shard_truncated_mid_stream_is_an_error_naming_its_file(
        self, way: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """One of 60 shard files truncated under a stream reading them by position: the
        pull that reads it raises the error the one-file stream raises (whether the file
        was open or is opened for that read), naming that shard's file, every batch
        before it exact; every pull after raises
        `StreamEndedError`; close leaves no descriptor of the shards open."""
        reads = use_read_path(way, monkeypatch).reads
        count = SHARD_CUTS[-1]
        shards = shards_of(np.arange(count, dtype=np.uint32), tmp_path)
        mapped = len(os.listdir("/proc/self/fd"))  # each memmap's own among them
        stream = devpolicy.windows(
            shards, 64, 4, order="random", seed=5, steps=None, policy=policy_of(), reads=reads
        )
        for step in range(5):
            assert_exact(next(stream), 5, step, 64, count)
        victim = tmp_path / "shard_030.bin"
        os.truncate(victim, 16)
        handed = 5
        with pytest.raises(  # noqa: PT012
            HostViewError, match=rf"{victim.name}: the file .*truncated after it was mapped"
        ):
            for batch in stream:
                assert_exact(batch, 5, handed, 64, count)
                handed += 1
                assert handed < 100_000
        with pytest.raises(StreamEndedError, match=r"failed at step \d+: HostViewError"):
            next(stream)
        stream.close()
        assert len(os.listdir("/proc/self/fd")) <= mapped


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
        though no start= was given. (Since a state says its global row too, a step and row
        past the end: the row says where in the data the stream is.)"""
        stream = devpolicy.windows(
            np.arange(12, dtype=np.int32), 4, 1, order="shuffled", seed=1, epochs=1,
            policy=policy_of(),
        )  # fmt: skip
        saved = {**stream.state(), "step": 118, "row": 118}
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
