"""Packed rows from shards (`windows(shards, pack="first_fit")`): a list of token arrays
packs as their concatenation, row for row, documents spanning shards included; the
document index of shard files is one, kept beside the first shard, reused, rebuilt when a
shard changes; a truncated shard ends the stream naming it; a thousand shard files pack
with no descriptor of the stream's held and flat memory; every stream promise holds."""

from __future__ import annotations

import gc
import itertools
import json
import os
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

import devpolicy
from devpolicy.errors import HostViewError, StreamEndedError, StreamStateError
from tests.apply.stream.test_packstream import SEPARATOR, as_numpy, batch_checker, corpus, packed
from tests.apply.streams import closed_while_pulled, forked_child_refuses, pull_through_interrupts
from tests.helpers import policy_of
from tests.read.test_parts import open_count

TOKENS = corpus(800, seed=4)


def cut(tokens: np.ndarray, cuts: list[int]) -> list[np.ndarray]:
    return [tokens[low:high] for low, high in itertools.pairwise([0, *cuts, tokens.size])]


#: Shards cut anywhere: inside documents, right after a separator, an empty shard, one
#: of a single token.
CUTS = [37, 37, 1_000, 1_001, 5_000, 9_999, 10_000]


def written(folder: Path, shards: list[np.ndarray]) -> list[Any]:
    """Each non-empty shard a raw file mapped by `np.memmap` (every third a `.npy` by
    `np.load`); an empty one stays in memory."""
    mapped: list[Any] = []
    for index, shard in enumerate(shards):
        if not shard.size:
            mapped.append(shard.copy())
        elif index % 3 == 2:
            np.save(folder / f"shard_{index:04d}.npy", shard)
            mapped.append(np.load(folder / f"shard_{index:04d}.npy", mmap_mode="r"))
        else:
            shard.tofile(folder / f"shard_{index:04d}.bin")
            mapped.append(np.memmap(folder / f"shard_{index:04d}.bin", np.uint16, "r"))
    return mapped


def all_of(stream: Any) -> list[dict[str, np.ndarray]]:
    return [as_numpy(b) for b in stream]


def assert_same(got: list[dict[str, np.ndarray]], want: list[dict[str, np.ndarray]]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert sorted(a) == sorted(b)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def index_events(logs: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in logs if e["event"].startswith("document_index")]


class TestShardsPackAsTheirConcatenation:
    @pytest.mark.parametrize("order", ["sequential", "shuffled"])
    def test_shards_in_memory_pack_the_rows_of_their_concatenation(self, order: str) -> None:
        options: dict[str, Any] = {"order": order}
        if order == "shuffled":
            options |= {"seed": 3, "epochs": 2}
        want = all_of(packed(TOKENS, **options))
        assert_same(all_of(packed(cut(TOKENS, CUTS), **options)), want)

    @pytest.mark.parametrize("side", ["eos", "bos"])
    def test_shard_files_pack_the_rows_of_their_concatenation(
        self, side: str, tmp_path: Path
    ) -> None:
        options = {"order": "shuffled", "seed": 5, "epochs": 1, "separator_is": side}
        shards = written(tmp_path, cut(TOKENS, CUTS))
        want = all_of(packed(TOKENS, **options))
        with capture_logs() as logs:
            got = all_of(packed(shards, **options))
        assert_same(got, want)
        (ended,) = [e for e in logs if e["event"] == "stream_ended"]
        assert ended["reads"] == "mapping"

    def test_the_index_is_kept_beside_the_first_shard_and_used_again(self, tmp_path: Path) -> None:
        shards = written(tmp_path, cut(TOKENS, CUTS))
        with capture_logs() as first:
            want = all_of(packed(shards, order="sequential"))
        (kept,) = tmp_path.glob("*.docs")
        assert kept.name.startswith("shard_0000.bin.7shards-")  # the empty one maps no file
        assert index_events(first) == ["document_index_built"]
        with capture_logs() as again:
            assert_same(all_of(packed(shards, order="sequential")), want)
        assert index_events(again) == []

    def test_the_index_goes_into_the_folder_index_names(self, tmp_path: Path) -> None:
        (tmp_path / "shards").mkdir()
        (tmp_path / "indexes").mkdir()
        shards = written(tmp_path / "shards", cut(TOKENS, CUTS))
        all_of(packed(shards, order="sequential", index=tmp_path / "indexes"))
        assert len(list((tmp_path / "indexes").glob("*.docs"))) == 1
        assert not list((tmp_path / "shards").glob("*.docs"))

    def test_shards_load_file_mapped_pack_and_keep_one_index(self, tmp_path: Path) -> None:
        """Tensors `load_file` mapped (no `np.memmap`: their files found from
        `/proc/self/maps`, read once for them all)."""
        policy = policy_of(rules=[{"match": "*", "device": "cpu:0", "mmap": True}])
        loaded = []
        for index, shard in enumerate(cut(TOKENS, [3_000, 3_001, 20_000])):
            path = tmp_path / f"shard_{index}.safetensors"
            devpolicy.save_file({"tokens": shard}, path, policy=policy)
            loaded.append(devpolicy.load_file(path, policy=policy)["tokens"])
        options = {"order": "shuffled", "seed": 1, "epochs": 1}
        with capture_logs() as logs:
            got = all_of(packed(loaded, **options))
        assert_same(got, all_of(packed(TOKENS, **options)))
        assert index_events(logs) == ["document_index_built"]
        assert len(list(tmp_path.glob("*.docs"))) == 1

    def test_a_reversed_view_of_a_mapped_shard_packs_its_tokens_in_its_order(
        self, tmp_path: Path
    ) -> None:
        """A shard that is no file's bytes in order (a reversed view of a memmap) is
        indexed in memory, as the view reads: never from its file's order."""
        shards = written(tmp_path, cut(TOKENS, [5_000]))
        shards[1] = shards[1][::-1]
        concatenation = np.concatenate([shards[0], shards[1]])
        options = {"order": "sequential"}
        assert_same(all_of(packed(shards, **options)), all_of(packed(concatenation, **options)))

    def test_a_shard_changed_in_place_rebuilds_the_index_saying_so(self, tmp_path: Path) -> None:
        tokens = TOKENS.copy()
        shards = written(tmp_path, cut(tokens, CUTS))
        all_of(packed(shards, order="sequential"))
        # Two documents of the fourth shard joined: same size, other documents.
        changed = tokens.copy()
        inside = 1_001 + int(np.flatnonzero(changed[1_001:5_000] == SEPARATOR)[0])
        changed[inside] = 7
        time.sleep(0.01)
        changed[1_001:5_000].tofile(tmp_path / "shard_0004.bin")
        shards[4] = np.memmap(tmp_path / "shard_0004.bin", np.uint16, "r")
        with capture_logs() as logs:
            got = all_of(packed(shards, order="sequential"))
        rebuilt = [e for e in logs if e["event"] == "document_index_rebuilt"]
        assert len(rebuilt) == 1
        assert "a shard changed" in rebuilt[0]["reason"]
        assert_same(got, all_of(packed(changed, order="sequential")))

    def test_a_saved_state_resumes_exactly_and_other_shards_are_refused(self) -> None:
        options = {"order": "shuffled", "seed": 6, "epochs": 1}
        shards = cut(TOKENS, CUTS)
        stream = packed(shards, **options)
        for _ in range(9):
            next(stream)
        saved = json.loads(json.dumps(stream.state()))
        rest = all_of(stream)
        assert_same(all_of(packed(shards, resume=saved, **options)), rest)
        other = cut(TOKENS, [37, 2_000, 10_000])  # the same tokens, cut otherwise
        with pytest.raises(StreamStateError, match="shards"):
            packed(other, resume=saved, **options)


@settings(max_examples=40, deadline=None)
@given(
    cuts=st.lists(st.integers(0, 3_000), max_size=8).map(sorted),
    side=st.sampled_from(["eos", "bos"]),
    seed=st.integers(0, 3),
)
def test_any_cut_into_shards_packs_the_same_rows(cuts: list[int], side: str, seed: int) -> None:
    tokens = corpus(120, seed=seed, mean=20)
    cuts = [min(c, tokens.size) for c in cuts]
    options = {"order": "shuffled", "seed": seed, "epochs": 1, "separator_is": side}
    assert_same(all_of(packed(cut(tokens, cuts), **options)), all_of(packed(tokens, **options)))


class TestFaults:
    def check(self, want: list[dict[str, np.ndarray]]) -> Any:
        return batch_checker(want)

    def test_a_truncated_shard_ends_the_stream_naming_it(self, tmp_path: Path) -> None:
        shards = written(tmp_path, cut(np.tile(TOKENS, 8), [30_000, 60_000, 90_000]))
        stream = packed(shards, order="shuffled", seed=2)
        for _ in range(3):
            next(stream)
        os.truncate(tmp_path / "shard_0001.bin", 4096)
        with pytest.raises(HostViewError, match=r"shard_0001\.bin"):  # noqa: PT012
            for _ in range(10_000):
                next(stream)
        with pytest.raises(StreamEndedError, match="HostViewError"):
            next(stream)
        stream.close()

    def test_ctrl_c_anywhere_in_a_pull_skips_and_repeats_nothing(self, tmp_path: Path) -> None:
        shards = written(tmp_path, cut(TOKENS, CUTS))
        options = {"order": "shuffled", "seed": 4, "steps": 160}
        want = all_of(packed(shards, **options))
        stream = packed(shards, **options)
        # A pull that packs a group is struck at one of 1,000 places again and again until
        # a draw passes it (seed 1: 15 steps in 150 pulls); this seed passes 105.
        reached = pull_through_interrupts(stream, self.check(want), pulls=150, places=1000, seed=2)
        assert 20 < reached <= 140  # and at least 10 pulls struck
        stream.close()

    def test_close_from_another_thread_never_raises(self, tmp_path: Path) -> None:
        shards = written(tmp_path, cut(TOKENS, CUTS))
        options = {"order": "shuffled", "seed": 4, "steps": 200}
        want = all_of(packed(shards, **options))
        closed_while_pulled(lambda: packed(shards, **options), self.check(want), attempts=8)

    @pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
    @pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
    def test_a_forked_childs_copy_refuses_to_run(self, tmp_path: Path) -> None:
        stream = packed(written(tmp_path, cut(TOKENS, CUTS)), order="shuffled", seed=4)
        next(stream)
        assert forked_child_refuses(stream, 1) == 0
        next(stream)
        stream.close()


@pytest.mark.slow
def test_a_thousand_shard_files_pack_with_no_descriptor_held_and_flat_memory(
    tmp_path: Path,
) -> None:
    """1,000 shard files (documents cut by shards' ends everywhere): the index is built
    with one shard open at a time, and the stream holds no descriptor of the shards'
    (each `np.memmap` holds one of its own, counted out); what Python and numpy hold after
    300 steps is what they held after 100; the rows are those of the concatenation."""
    tokens = corpus(20_000, seed=7, mean=25)
    shards = written(tmp_path, cut(tokens, np.linspace(0, tokens.size, 1_001)[1:-1].astype(int)))
    mapped = open_count(tmp_path)
    options = {"order": "shuffled", "seed": 2, "steps": 300}
    want = all_of(packed(tokens, **options))
    stream = packed(shards, **options)
    most = 0
    tracemalloc.start()
    try:
        for step, batch in enumerate(stream):
            if not step % 10:
                most = max(most, open_count(tmp_path) - mapped)
            for key, value in as_numpy(batch).items():
                np.testing.assert_array_equal(value, want[step][key])
            if step == 100:
                gc.collect()
                early = tracemalloc.get_traced_memory()[0]
        gc.collect()
        late = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert most <= 1  # the index's, kept mapped
    assert late - early < 256 * 1024
