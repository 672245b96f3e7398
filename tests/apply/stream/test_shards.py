"""Shards as one source (`devpolicy._apply.stream.shards`): a list of token arrays is their
concatenation, window for window, whatever the order, the read path, a mixture or
segment ids; a saved state covers the shards; bad lists are refused naming the shard,
with nothing opened; a thousand shard files stream with flat memory and a bounded number
of descriptors; a process out of descriptors is told its limit and how to raise it."""

from __future__ import annotations

import gc
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import tracemalloc
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import devpolicy
from devpolicy import ReadOptions
from devpolicy._apply.stream.groups import every_window
from devpolicy._apply.stream.mixing import MixedViews
from devpolicy._apply.stream.shards import Shards, gather_parts
from devpolicy._read.parts import OPEN_MOST
from devpolicy.errors import HostViewError, StreamEndedError, StreamStateError
from tests.apply.conftest import batched_reads_here
from tests.helpers import policy_of
from tests.read.test_parts import open_count

COUNT = 20_000
#: Shard sizes: shards longer than a window, shorter (down to one token), and empty.
CUTS = [0, 5_000, 5_001, 5_010, 5_010, 12_345, 12_346, 12_400, COUNT]
LENGTH = 64
BATCH = 8


def concatenated() -> np.ndarray:
    """The tokens the shards are cut from: token i is i % 50_000 (a separator's worth of
    documents: 0 every so often)."""
    return (np.arange(COUNT, dtype=np.uint16) * 7) % 997


def cut(tokens: np.ndarray, cuts: list[int] = CUTS) -> list[np.ndarray]:
    return [tokens[low:high] for low, high in itertools.pairwise(cuts)]


def written(folder: Path, tokens: np.ndarray, cuts: list[int] = CUTS) -> list[Any]:
    """The shards as files: raw `.bin` (nanoGPT's uint16) mapped by `np.memmap`, and
    `.npy` mapped by `np.load` (an empty shard stays in memory: nothing maps an empty
    file)."""
    shards: list[Any] = []
    for index, shard in enumerate(cut(tokens, cuts)):
        if not shard.size:
            shards.append(shard.copy())
            continue
        if index % 2:
            path = folder / f"shard_{index:04d}.npy"
            np.save(path, shard)
            shards.append(np.load(path, mmap_mode="r"))
        else:
            path = folder / f"shard_{index:04d}.bin"
            shard.tofile(path)
            shards.append(np.memmap(path, dtype=np.uint16, mode="r"))
    return shards


def batches(tokens: Any, **options: Any) -> list[Any]:
    stream = devpolicy.windows(tokens, LENGTH, BATCH, steps=options.pop("steps", 40),
                               policy=policy_of(), **options)  # fmt: skip
    return list(stream)


def assert_same(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for mine, theirs in zip(got, want, strict=True):
        if isinstance(theirs, dict):
            assert mine.keys() == theirs.keys()
            for key in theirs:
                np.testing.assert_array_equal(np.asarray(mine[key]), np.asarray(theirs[key]))
        else:
            np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))


ORDERS = {
    "sequential": {"order": "sequential"},
    "random": {"order": "random", "seed": 3},
    "shuffled": {"order": "shuffled", "seed": 3},
    "shuffled, stride 7": {"order": "shuffled", "seed": 4, "stride": 7},
}
#: Every read path of a file, held to by `ReadOptions` (those this machine cannot have
#: are skipped).
PATHS = {
    "keep": (ReadOptions(path="keep"), False),
    "budget": (ReadOptions(path="budget"), False),
    "preadv": (ReadOptions(path="file", io_uring=False), False),
    "io_uring": (ReadOptions(path="file", polled=False), True),
    "io_uring polled": (ReadOptions(path="file"), True),
    "auto, switching paths every group": (
        ReadOptions(trial_groups=1, trial_rounds=1, recheck_seconds=1e-6),
        False,
    ),
}


def read_path(name: str) -> ReadOptions:
    reads, ring = PATHS[name]
    if ring and not batched_reads_here(polled=name.endswith("polled")):
        pytest.skip(f"{name} cannot be had here")
    return reads


class TestShardsAreTheirConcatenation:
    @pytest.mark.parametrize("order", list(ORDERS))
    @pytest.mark.parametrize("separator", [None, 0], ids=["tokens", "segment ids"])
    def test_shards_in_memory_give_the_concatenations_batches(
        self, order: str, separator: int | None
    ) -> None:
        """Shards in memory (one token long, shorter than a window, empty) give exactly the
        batches of their concatenation, with its segment ids and positions."""
        tokens = concatenated()
        options = {**ORDERS[order], "separator": separator}
        assert_same(batches(cut(tokens), **options), batches(tokens, **options))

    @pytest.mark.parametrize("path", list(PATHS))
    @pytest.mark.parametrize("order", ["sequential", "random", "shuffled"])
    def test_shard_files_give_the_concatenations_batches_on_every_read_path(
        self, path: str, order: str, tmp_path: Path
    ) -> None:
        """`.bin` and `.npy` shards, mapped, on each read path: the batches of the
        concatenated file, windows across two shards (and across several short ones)
        included."""
        reads = read_path(path)
        tokens = concatenated()
        one = tmp_path / "all.bin"
        tokens.tofile(one)
        whole = np.memmap(one, dtype=np.uint16, mode="r")
        shards = written(tmp_path, tokens)
        steps = 300 if path.startswith("auto") else 40
        options = {**ORDERS[order], "steps": steps, "separator": 0}
        assert_same(batches(shards, reads=reads, **options), batches(whole, reads=reads, **options))

    def test_files_load_file_mapped_are_shards_too(self, tmp_path: Path) -> None:
        """Tensors `load_file` mapped (host arrays) and a tuple of them: the same."""
        tokens = concatenated()
        policy = policy_of(rules=[{"match": "*", "device": "cpu:0", "mmap": True}])
        loaded = []
        for index, shard in enumerate(cut(tokens, [0, 7_000, 7_030, COUNT])):
            path = tmp_path / f"shard_{index}.safetensors"
            devpolicy.save_file({"tokens": shard}, path, policy=policy)
            loaded.append(devpolicy.load_file(path, policy=policy)["tokens"])
        options = ORDERS["shuffled"]
        assert_same(batches(tuple(loaded), **options), batches(tokens, **options))

    @pytest.mark.parametrize("order", ["random", "shuffled"])
    def test_a_mixtures_source_may_be_shards(self, order: str, tmp_path: Path) -> None:
        """`{"web": [w0, w1, ...], "code": c}`: the mixture of the concatenation, from
        memory and from files."""
        web, code = concatenated(), np.arange(3_000, dtype=np.uint16)
        options = {**ORDERS[order], "weights": {"web": 0.7, "code": 0.3}, "separator": 0}
        want = batches({"web": web, "code": code}, **options)
        assert_same(batches({"web": cut(web), "code": code}, **options), want)
        assert_same(batches({"web": written(tmp_path, web), "code": code}, **options), want)

    @settings(max_examples=40, deadline=None)
    @given(
        st.lists(st.integers(0, 40), min_size=1, max_size=12),
        st.integers(1, 16),
        st.sampled_from(["sequential", "random", "shuffled"]),
    )
    def test_any_shard_sizes_give_the_concatenations_batches(
        self, sizes: list[int], length: int, order: str
    ) -> None:
        """Random shard sizes (empty, one token, shorter than a window, longer): the
        stream of the list is the stream of the concatenation."""
        total = sum(sizes)
        if total < length:
            return
        tokens = np.arange(total, dtype=np.int32)
        cuts = np.cumsum([0, *sizes]).tolist()
        seed = {} if order == "sequential" else {"seed": 1}
        made = [
            devpolicy.windows(t, length, 3, order=order, steps=6, policy=policy_of(), **seed)
            for t in (cut(tokens, cuts), tokens)
        ]
        assert_same(*(list(stream) for stream in made))


class TestGatherParts:
    @settings(max_examples=100, deadline=None)
    @given(
        st.lists(st.integers(1, 20), min_size=1, max_size=10),
        st.integers(1, 24),
        st.data(),
    )
    def test_the_windows_gathered_are_the_concatenations(
        self, sizes: list[int], length: int, data: st.DataObject
    ) -> None:
        """Any part sizes (length-1 parts, parts shorter than a window): the windows at
        any offsets are those of the concatenated array."""
        total = sum(sizes)
        if total < length:
            return
        offsets = np.asarray(
            data.draw(st.lists(st.integers(0, total - length), min_size=1, max_size=12)),
            np.int64,
        ).reshape(-1, 1)
        tokens = np.arange(total, dtype=np.int64) * 3
        edges = np.cumsum([0, *sizes])
        parts = [tokens[lo:hi] for lo, hi in itertools.pairwise(edges)]
        got = gather_parts(parts, lambda i: every_window(parts[i], length), edges, length, offsets)
        np.testing.assert_array_equal(got, every_window(tokens, length)[offsets])

    @settings(max_examples=100, deadline=None)
    @given(
        st.lists(
            st.one_of(st.integers(1, 20), st.lists(st.integers(0, 12), min_size=1, max_size=6)),
            min_size=1,
            max_size=5,
        ),
        st.integers(1, 8),
        st.data(),
    )
    def test_a_mixtures_arrays_and_shards_are_one_range_of_rows(
        self, sources: list[Any], length: int, data: st.DataObject
    ) -> None:
        """Sources that are arrays or lists of shards (empty shards among them): each
        part's rows lie in the mixture's one range where the concatenation of every
        source has them, so the windows gathered at any offsets are the concatenation's."""
        rows = [s if isinstance(s, int) else sum(s) for s in sources]
        if 0 in rows or sum(rows) < length or min(rows) < 1:
            return
        tokens = np.arange(sum(rows), dtype=np.int64) * 3
        views: list[Any] = []
        at = 0
        for source in sources:
            if isinstance(source, int):
                views.append(tokens[at : at + source])
                at += source
                continue
            ends = np.cumsum([at, *source])
            views.append(Shards([tokens[lo:hi] for lo, hi in itertools.pairwise(ends)]))
            at = int(ends[-1])
        mixture = MixedViews(views, length)
        assert mixture.bases.tolist() == np.cumsum([0, *rows[:-1]]).tolist()
        offsets = np.asarray(
            data.draw(st.lists(st.integers(0, sum(rows) - length), min_size=1, max_size=12)),
            np.int64,
        )
        every = every_window(tokens, length)
        np.testing.assert_array_equal(mixture.gather(offsets), every[offsets])


class TestBadLists:
    @pytest.mark.parametrize(
        ("tokens", "error", "match"),
        [
            ([], ValueError, r"^windows tokens is an empty list: a list of shards"),
            ((), ValueError, r"^windows tokens is an empty tuple"),
            (
                [np.arange(10, dtype=np.uint16), np.arange(10, dtype=np.int32)],
                ValueError,
                r"^windows tokens\[1\] is int32, and windows tokens\[0\] is uint16: the shards "
                r"of one source share a dtype",
            ),
            (
                [np.arange(100), np.zeros((3, 4), np.int64)],
                ValueError,
                r"^windows tokens\[1\] has shape \(3, 4\): each shard of a list is a 1-D array",
            ),
            (
                [np.arange(100), np.array(["a", "b"])],
                TypeError,
                r"^windows tokens\[1\] are <U1: a stream's tokens must be numbers",
            ),
            (
                [np.arange(100), [1, 2, 3]],
                TypeError,
                r"^windows tokens\[1\] must be a jax\.Array .*got a list: a list is shards",
            ),
            ([np.arange(3), np.arange(2)], ValueError, r"the array \(its 2 shards, in all\) has 5"),
        ],
    )
    def test_a_bad_list_is_refused_naming_the_shard(
        self, tokens: Any, error: type[Exception], match: str
    ) -> None:
        with pytest.raises(error, match=match):
            devpolicy.windows(tokens, 10, 2, policy=policy_of())

    def test_an_empty_list_in_a_mixture_is_named(self) -> None:
        with pytest.raises(ValueError, match=r"^windows tokens\['code'\] is an empty list"):
            devpolicy.windows(
                {"web": np.arange(100), "code": []}, 4, 2, order="random",
                weights={"web": 1, "code": 1}, policy=policy_of(),
            )  # fmt: skip

    def test_a_shard_of_a_mixture_is_named_by_source_and_index(self) -> None:
        with pytest.raises(ValueError, match=r"^windows tokens\['web'\]\[2\] is int64"):
            devpolicy.windows(
                {"web": [np.arange(50, dtype=np.int32)] * 2 + [np.arange(5)], "code": np.arange(9)},
                4, 2, order="random", weights={"web": 1, "code": 1}, policy=policy_of(),
            )  # fmt: skip

    def test_nothing_is_opened_for_a_list_refused(self, tmp_path: Path) -> None:
        """Shard files of mixed dtypes: refused before any file is opened."""
        shards = written(tmp_path, concatenated(), [0, 100, 200])
        path = tmp_path / "wide.bin"
        np.arange(100, dtype=np.int32).tofile(path)
        shards.append(np.memmap(path, dtype=np.int32, mode="r"))
        before = sorted(os.listdir("/proc/self/fd"))
        with pytest.raises(ValueError, match=r"windows tokens\[2\] is int32"):
            devpolicy.windows(shards, 10, 2, policy=policy_of())
        assert sorted(os.listdir("/proc/self/fd")) == before


class TestResume:
    @pytest.mark.parametrize("order", ["sequential", "shuffled"])
    def test_a_state_saved_over_shards_resumes_exactly(self, order: str) -> None:
        """Saved at step 7 of 20 (its JSON), resumed over the same shards: the steps after
        7 of the uninterrupted stream."""
        shards, options = cut(concatenated()), {**ORDERS[order], "steps": 20}
        whole = batches(shards, **options)
        stream = devpolicy.windows(shards, LENGTH, BATCH, policy=policy_of(), **options)
        for _ in range(7):
            next(stream)
        state = json.dumps(stream.state())
        stream.close()
        assert json.loads(state)["shards"] == Shards(shards).fingerprint()
        assert_same(batches(shards, resume=state, **options), whole[7:])

    def test_another_list_of_shards_is_refused_naming_the_field(self) -> None:
        """The same tokens cut otherwise, or one shard fewer: the resume is refused, the
        field `shards` named with both values."""
        tokens = concatenated()
        options = {**ORDERS["shuffled"], "steps": 40}
        stream = devpolicy.windows(cut(tokens), LENGTH, BATCH, policy=policy_of(), **options)
        next(stream)
        state = stream.state()
        stream.close()
        other = cut(tokens, [0, 10_000, COUNT])
        with pytest.raises(
            StreamStateError, match=r"^windows resume: shards: the saved stream had shards='8 "
        ):
            batches(other, resume=state, **options)
        with pytest.raises(StreamStateError, match=r"rows, shards"):
            batches(cut(tokens)[:-1], resume=state, **options)
        with pytest.raises(
            StreamStateError, match=r"^windows resume: shards: .*this one has shards=None"
        ):
            batches(tokens, resume=state, **options)

    def test_a_mixtures_state_names_its_sharded_sources(self) -> None:
        web = cut(concatenated())
        options = {**ORDERS["random"], "weights": {"web": 1, "code": 1}, "steps": 40}
        stream = devpolicy.windows(
            {"web": web, "code": np.arange(500, dtype=np.uint16)},
            LENGTH,
            BATCH,
            policy=policy_of(),
            **options,
        )
        state = stream.state()
        stream.close()
        assert state["shards"] == {"web": Shards(web).fingerprint()}
        batches({"web": web, "code": np.arange(500, dtype=np.uint16)}, resume=state, **options)
        other = [*web[:3], np.concatenate(web[3:])]
        with pytest.raises(StreamStateError, match=r"^windows resume: shards: "):
            batches(
                {"web": other, "code": np.arange(500, dtype=np.uint16)}, resume=state, **options
            )

    def test_a_state_of_one_array_holds_no_shards_field(self) -> None:
        """A state of one array is as it was (older versions read it)."""
        stream = devpolicy.windows(concatenated(), LENGTH, BATCH, policy=policy_of())
        assert "shards" not in stream.state()
        stream.close()


def many_files(folder: Path, count: int, rows: int) -> list[np.memmap]:
    """`count` raw uint16 shard files of `rows` tokens, token i of them all i % 65,536."""
    mapped = []
    for index in range(count):
        path = folder / f"shard_{index:04d}.bin"
        (np.arange(index * rows, (index + 1) * rows) % 65_536).astype(np.uint16).tofile(path)
        mapped.append(np.memmap(path, dtype=np.uint16, mode="r"))
    return mapped


class TestAThousandShards:
    @pytest.mark.slow
    @pytest.mark.parametrize("path", ["preadv", "io_uring", "io_uring polled", "keep"])
    def test_memory_stays_flat_and_descriptors_bounded(self, path: str, tmp_path: Path) -> None:
        """1,000 shard files of 500 tokens, 1,600 random steps reading them all: what the
        stream holds open is never more than `OPEN_MOST` descriptors past a group and one
        group's files during it (each `np.memmap` holds one of its own, counted out), none
        after close; what Python and numpy hold after 1,600 steps is what they held after
        800 (by then nearly every shard was opened once: a shard's file record is made
        when it is first opened and kept, bounded by the shards, not by the steps)."""
        reads = read_path(path)
        shards = many_files(tmp_path, 1_000, 500)
        mapped = open_count(tmp_path)  # the memmaps' own
        stream = devpolicy.windows(
            shards, LENGTH, 4, order="random", seed=2, steps=1_600, policy=policy_of(), reads=reads
        )
        most = 0
        tracemalloc.start()
        try:
            for step, batch in enumerate(stream):
                if not step % 7:  # a look at 2,000 descriptors is dear: every few steps
                    most = max(most, open_count(tmp_path) - mapped)
                first = np.asarray(batch)[:, 0].astype(np.int64)
                assert (np.asarray(batch) == (first[:, None] + np.arange(LENGTH)) % 65_536).all()
                if step == 800:
                    gc.collect()
                    early = tracemalloc.get_traced_memory()[0]
            gc.collect()
            late = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        # A group is at most 32 batches of 4 windows, each in two shards at most.
        assert most <= OPEN_MOST + 2 * 32 * 4
        assert open_count(tmp_path) - mapped == 0
        assert late - early < 256 * 1024

    @pytest.mark.slow
    @pytest.mark.parametrize("path", ["preadv", "io_uring"])
    def test_read_in_place_the_descriptors_stay_within_the_bound(
        self, path: str, tmp_path: Path
    ) -> None:
        """Nothing read ahead: after each pull at most `OPEN_MOST` of the 1,000 files are
        open, and opening the stream opened one."""
        reads = read_path(path)
        reads = ReadOptions(path="file", ahead=False, io_uring=reads.io_uring, polled=False)
        shards = many_files(tmp_path, 1_000, 100)
        mapped = open_count(tmp_path)
        stream = devpolicy.windows(
            shards, 16, 8, order="random", seed=2, steps=100, policy=policy_of(), reads=reads
        )
        assert open_count(tmp_path) - mapped <= 1
        for _ in stream:
            assert open_count(tmp_path) - mapped <= OPEN_MOST
        assert open_count(tmp_path) - mapped == 0


class TestTheFirstBatch:
    @pytest.mark.parametrize("path", ["preadv", "io_uring", "io_uring polled", "auto"])
    def test_the_first_batch_of_many_shard_files_opens_none_of_them_on_the_callers_thread(
        self, path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """100 shard files (more than `OPEN_MOST`): the first batch is copied from their
        memmaps' mappings, the caller's thread opening none of their files for it; read
        through a ring, no later pull opens one there either (the worker opens a group's
        files before the pull that uses it); the batches are the concatenation's, and no
        descriptor of the shards is left once the stream ends."""
        reads = ReadOptions() if path == "auto" else read_path(path)
        shards = many_files(tmp_path, 100, 300)
        mapped = open_count(tmp_path)
        options = {"order": "random", "seed": 5, "steps": 20, "policy": policy_of()}
        stream = devpolicy.windows(shards, 16, 8, reads=reads, **options)
        assert open_count(tmp_path) - mapped <= 1
        caller = threading.get_ident()
        on_caller: list[str] = []
        real_open = os.open

        def recorded(file: Any, *args: Any, **kwargs: Any) -> int:
            if threading.get_ident() == caller and str(file).startswith(str(tmp_path)):
                on_caller.append(str(file))
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr(os, "open", recorded)
        got = [np.asarray(next(stream))]
        assert on_caller == []
        got += [np.asarray(b) for b in stream]
        monkeypatch.undo()
        if path in ("io_uring", "io_uring polled"):
            assert on_caller == []
        want = [np.asarray(b) for b in devpolicy.windows(np.concatenate(shards), 16, 8, **options)]
        assert_same(got, want)
        assert open_count(tmp_path) == mapped

    @pytest.mark.parametrize("path", ["preadv", "io_uring polled"])
    def test_a_shard_truncated_before_the_first_batch_is_named_not_sigbus(
        self, path: str, tmp_path: Path
    ) -> None:
        """A shard cut short after the stream opened, before its first batch (copied from
        the mappings): the pull raises an error naming that file, never SIGBUS, and the
        stream holds none of the shards' descriptors after."""
        shards = many_files(tmp_path, 100, 300)
        mapped = open_count(tmp_path)
        stream = devpolicy.windows(shards, 16, 8, order="sequential", policy=policy_of(),
                                   reads=read_path(path))  # fmt: skip
        os.truncate(tmp_path / "shard_0000.bin", 10)
        with pytest.raises(
            HostViewError, match=r"shard_0000\.bin: the file is 10 bytes.*truncated"
        ):
            next(stream)
        assert open_count(tmp_path) == mapped


class TestAKeptMapping:
    def test_shards_are_checked_whole_through_their_mappings_and_a_truncated_one_is_named(
        self, tmp_path: Path
    ) -> None:
        """Held to the kept mapping, 100 memmap shards: before each group, the shards it
        reads are checked whole through their own mappings, no shard file opened for it
        (the stream holds its reader's first file alone); a shard truncated between two
        groups is an error naming it at the next group that reads it, never SIGBUS, and
        none of the shards' descriptors is left after."""
        shards = many_files(tmp_path, 100, 300)
        mapped = open_count(tmp_path)
        stream = devpolicy.windows(
            shards, 16, 8, order="sequential", size=1, policy=policy_of(),
            reads=ReadOptions(path="keep", ahead=False),
        )  # fmt: skip
        for _ in range(10):
            next(stream)
            assert open_count(tmp_path) - mapped <= 1
        os.truncate(tmp_path / "shard_0090.bin", 10)
        with pytest.raises(  # noqa: PT012
            HostViewError, match=r"shard_0090\.bin: the file is 10 bytes.*truncated"
        ):
            for _ in range(400):
                next(stream)
                assert open_count(tmp_path) - mapped <= 1
        with pytest.raises(StreamEndedError, match="HostViewError"):
            next(stream)
        stream.close()
        assert open_count(tmp_path) == mapped


def pulled_to_the_end(stream: Any, want: list[Any]) -> int:
    """Pull `stream` until it handed out every batch of `want`, each exact, pulling again
    after each KeyboardInterrupt; the interrupts met."""
    handed = interrupts = 0
    while handed < len(want):
        try:
            batch = next(stream)
        except KeyboardInterrupt:
            interrupts += 1
            continue
        np.testing.assert_array_equal(np.asarray(batch), np.asarray(want[handed]))
        handed += 1
    return interrupts


class TestInterrupts:
    def test_ctrl_c_as_a_shards_file_opens_mid_stream_skips_nothing_and_leaks_nothing(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """SIGINT the moment each shard's file is opened for a read (the open's system
        call returned, nothing stored yet): every pull it strikes raises
        `KeyboardInterrupt`, the pulls after hand out the uninterrupted stream's steps in
        order, and once closed no descriptor of the shards is left."""
        shards = many_files(tmp_path, 100, 300)
        mapped = open_count(tmp_path)
        reads = ReadOptions(path="file", io_uring=False, ahead=False)
        options = {"order": "random", "seed": 1, "steps": 100, "policy": policy_of()}
        want = list(devpolicy.windows(shards, 16, 4, reads=reads, **options))
        stream = devpolicy.windows(shards, 16, 4, reads=reads, **options)
        real_open = os.open

        def opened_then_interrupted(*args: Any, **kwargs: Any) -> int:
            fd = real_open(*args, **kwargs)
            signal.raise_signal(signal.SIGINT)  # acted on at the next chance
            return fd

        monkeypatch.setattr(os, "open", opened_then_interrupted)
        interrupts = pulled_to_the_end(stream, want)
        monkeypatch.undo()
        assert interrupts > 10
        stream.close()
        gc.collect()
        assert open_count(tmp_path) == mapped

    @pytest.mark.parametrize("path", ["io_uring", "io_uring polled"])
    def test_ctrl_c_as_the_caller_waits_for_the_workers_opens_skips_nothing_and_leaks_nothing(
        self, path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Read through a ring, a group's shard files are opened by the worker thread: a
        Ctrl-C striking the caller's wait for it (before the opens and reads are done, or
        just after) raises `KeyboardInterrupt` from that pull, the pulls after hand out
        the uninterrupted stream's steps in order, and once closed no descriptor of the
        shards is left."""
        reads = read_path(path)
        shards = many_files(tmp_path, 100, 300)
        mapped = open_count(tmp_path)
        options = {"order": "random", "seed": 1, "steps": 300, "policy": policy_of()}
        want = list(devpolicy.windows(shards, 16, 4, reads=reads, **options))
        stream = devpolicy.windows(shards, 16, 4, reads=reads, **options)
        real_result = Future.result
        waits = itertools.count()

        def interrupted(future: Future[Any], timeout: float | None = None) -> Any:
            if threading.current_thread() is threading.main_thread():
                wait = next(waits)
                if wait % 3 == 0:  # at once: the worker still opening
                    raise KeyboardInterrupt
                if wait % 3 == 1:  # once the worker is done
                    real_result(future)
                    raise KeyboardInterrupt
            return real_result(future, timeout)

        monkeypatch.setattr(Future, "result", interrupted)
        interrupts = pulled_to_the_end(stream, want)
        monkeypatch.undo()
        assert interrupts >= 4
        stream.close()
        gc.collect()
        assert open_count(tmp_path) == mapped


#: A process out of descriptors: 200 shard files mapped, then, for each read path, the
#: limit lowered to what is open plus `free`, a stream over them pulled until it fails.
OUT_OF_DESCRIPTORS = """
import json, os, resource, sys
import numpy as np
import devpolicy
from devpolicy.errors import HostViewError, StreamEndedError

folder, cases = sys.argv[1], json.loads(sys.argv[2])
policy = devpolicy.load_policy({"version": 1, "logging": {"level": "error"}}, environ={})
shards = []
for index in range(200):
    path = os.path.join(folder, f"shard_{index:04d}.bin")
    np.arange(index * 300, (index + 1) * 300, dtype=np.uint16).tofile(path)
    shards.append(np.memmap(path, dtype=np.uint16, mode="r"))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
found = []
for reads, free in cases:
    options = {"order": "random", "seed": 0, "steps": 50, "policy": policy,
               "reads": devpolicy.ReadOptions(**reads)}
    list(devpolicy.windows(shards, 16, 4, **options))  # JAX's and the stream's first uses
    held = len(os.listdir("/proc/self/fd")) - 1  # the listing's own descriptor not counted
    lowest = os.dup(0)  # the lowest free descriptor: no other open may succeed below it
    os.close(lowest)
    limit = lowest if free == 0 else held + free
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    error, stream = None, None
    try:
        stream = devpolicy.windows(shards, 16, 4, **options)
        for _ in stream:
            pass
    except HostViewError as e:
        error = str(e)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    after = len(os.listdir("/proc/self/fd")) - 1
    again = None
    if stream is not None:
        try:
            next(stream)
        except StreamEndedError as e:
            again = str(e)
        except StopIteration:
            again = "ended"
    found.append({"error": error, "limit": limit, "held": held, "after": after,
                  "started": stream is not None, "again": again})
print(json.dumps(found))
"""


class TestOutOfDescriptors:
    @pytest.mark.slow
    def test_a_stream_out_of_descriptors_names_the_limit_and_the_fix_and_leaks_nothing(
        self, tmp_path: Path
    ) -> None:
        """A process at its descriptor limit (RLIMIT_NOFILE lowered to what it holds, or a
        few more), 200 shard files mapped: on every read path the stream fails, at its
        start or at the pull whose shard's file cannot be opened, with an error naming the
        file, the limit and how to raise it (never "moved"); every descriptor it opened
        is closed by then, and a later pull names the error. The kept mapping, which
        checks memmap shards through their own mappings, needs no descriptor past its
        start's one: with two free it runs to its end."""
        cases = [
            [{"path": "file", "io_uring": False}, 0],
            [{"path": "file", "io_uring": False}, 3],
            [{"path": "file", "polled": False}, 5],
            [{"path": "file"}, 5],
            [{"path": "keep"}, 0],
            [{"path": "keep"}, 2],
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOLICY_", "XLA_"))}
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(OUT_OF_DESCRIPTORS), str(tmp_path),
             json.dumps(cases)],
            capture_output=True, text=True, timeout=300, env=env, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        found = json.loads(result.stdout.strip().splitlines()[-1])
        for (reads, free), got in zip(cases, found, strict=True):
            error = got["error"]
            assert got["after"] == got["held"], (reads, free, got)
            if reads == {"path": "keep"} and free:
                assert (error, got["again"]) == (None, "ended"), (reads, free, got)
                continue
            assert error is not None, (reads, free, got)
            assert error.startswith(f"{tmp_path}/shard_"), error
            assert (
                "no descriptor left to open the file and read it by position: every one "
                f"below this process's limit of {got['limit']:,} is open (RLIMIT_NOFILE"
            ) in error
            assert "ulimit -n" in error
            assert "hold fewer files open" in error
            assert "moved" not in error
            assert got["after"] == got["held"], (reads, free, got)
            if free == 0:  # not even the stream's first file: it never started
                assert not got["started"]
                assert error.startswith(f"{tmp_path}/shard_0000.bin")
            if got["started"]:
                assert got["again"] is not None  # the child caught a StreamEndedError
                assert "no descriptor left" in got["again"]
