"""A hostile review of packed rows from shards and of the packed stream's device path:
each test a claim a user relies on, probed where the code is most likely to break
(shards that are views of files, shards edited behind the stream's back, indexes built
by two at once, lengths that are no multiple of a word, meshes that split rows or a
row's tokens)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import devpolicy
from devpolicy._apply.stream import indexfile
from tests.apply.stream.test_groups import ROWS
from tests.apply.stream.test_packstream import (
    PAD,
    SEPARATOR,
    as_numpy,
    compiled,
    corpus,
    device_calls,
)
from tests.apply.stream.test_packstream_shards import all_of, assert_same, cut
from tests.apply.streams import closed_while_pulled, pulled_by_threads
from tests.helpers import policy_of
from tests.read.test_parts import open_count

TOKENS = corpus(300, seed=11)


def packed(tokens: Any, length: int = 64, batch: int = 4, **options: Any) -> Any:
    options = {"report_every": None, "pack": "first_fit", "separator": SEPARATOR, "pad": PAD,
               "order": "sequential", "policy": policy_of(), **options}  # fmt: skip
    return devpolicy.windows(tokens, length, batch, **options)


class TestShardViews:
    """Shards that are views of memmapped files: their rows are those of the
    concatenation of what the views hold, not of the file's bytes under them."""

    @pytest.mark.parametrize(
        "view",
        ["strided", "reversed", "reversed-slice", "slice", "offset", "npy"],
    )
    def test_a_view_of_a_memmap_as_a_shard_packs_the_tokens_the_view_holds(
        self, tmp_path: Path, view: str
    ) -> None:
        """A strided or reversed view of a memmap read as the file's bytes from the view's
        first address gave other documents (or "ended before its tokens did")."""
        TOKENS.tofile(tmp_path / "a.bin")
        np.save(tmp_path / "b.npy", TOKENS[::-1].copy())
        whole = np.memmap(tmp_path / "a.bin", np.uint16, "r")
        made = {
            "strided": lambda: whole[::2],
            "reversed": lambda: whole[::-1],
            "reversed-slice": lambda: whole[100:3_000][::-1],
            "slice": lambda: whole[101:3_001],
            "offset": lambda: np.memmap(tmp_path / "a.bin", np.uint16, "r", offset=2 * 123),
            "npy": lambda: np.load(tmp_path / "b.npy", mmap_mode="r")[5:],
        }
        shards = [made[view](), whole[:777], whole[3:9]]
        want = all_of(packed(np.concatenate([np.asarray(s) for s in shards])))
        assert_same(all_of(packed(shards)), want)

    def test_a_document_spanning_many_shards_of_one_token_packs_as_the_concatenation(
        self, tmp_path: Path
    ) -> None:
        """Shards of a token each (and empty ones): a document spans dozens of shards."""
        tokens = corpus(40, seed=3, mean=50)
        pieces = [tokens[k : k + 1] for k in range(tokens.size)]
        shards: list[Any] = []
        for k, piece in enumerate(pieces[:300]):
            if k % 7 == 3:
                shards.append(np.zeros(0, np.uint16))
            piece.tofile(tmp_path / f"s{k:04d}.bin")
            shards.append(np.memmap(tmp_path / f"s{k:04d}.bin", np.uint16, "r"))
        for side in ("eos", "bos"):
            assert_same(
                all_of(packed(shards, separator_is=side)),
                all_of(packed(tokens[:300], separator_is=side)),
            )


class TestIndexBuiltByTwo:
    def test_two_streams_opened_at_once_over_the_same_shards_both_start(
        self, tmp_path: Path
    ) -> None:
        """Two threads of one process (a training and an evaluation stream, say) open
        streams over the same shard files, no index kept yet: both build it into one
        temporary file (named for the process alone), and every stream but the first to
        rename it fails with FileNotFoundError. Hosts sharing a filesystem whose
        processes have one pid (containers) would meet the same."""
        tokens = np.tile(corpus(3_000, seed=1), 40)
        shards = []
        for k, part in enumerate(np.array_split(tokens, 4)):
            part.tofile(tmp_path / f"s{k}.bin")
            shards.append(np.memmap(tmp_path / f"s{k}.bin", np.uint16, "r"))
        want = all_of(packed(tokens, steps=3))
        errors: list[BaseException] = []
        got: list[Any] = []
        barrier = threading.Barrier(4)

        def run() -> None:
            try:
                barrier.wait()
                got.append(all_of(packed(shards, steps=3)))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=run) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        for rows in got:
            assert_same(rows, want)


def rows_rule_spec(*spec: Any) -> list[dict[str, object]]:
    return [{"match": "batch", "sharding": {"mesh": "rows", "spec": list(spec)}}]


class TestDeviceGivesTheHostsValues:
    """On a device that copies host memory, a packed group's ids and positions worked
    out on the device (or the host's, where it cannot) are exactly the host path's."""

    def stream_both_ways(
        self,
        request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch,
        tokens: Any,
        length: int,
        batch: int,
        **options: Any,
    ) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]], list[int]]:
        want = all_of(packed(tokens, length, batch, **options))
        request.getfixturevalue("copying_device")
        all_of(packed(tokens, length, batch, **options))  # the group shapes compile
        compiled()
        calls = device_calls(monkeypatch)
        got = all_of(packed(tokens, length, batch, **options))
        return got, want, calls

    @pytest.mark.parametrize("length", [1, 32, 33, 70])
    def test_any_row_length_gives_the_hosts_ids_and_positions(
        self, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, length: int
    ) -> None:
        """Lengths no multiple of a word of starts, a row of one token, documents as
        long as a row, rows of padding alone in the last batch."""
        tokens = corpus(150, seed=length, mean=length / 2 + 1)
        got, want, calls = self.stream_both_ways(
            request, monkeypatch, tokens, length, 5, order="shuffled", seed=1, epochs=2
        )
        assert calls
        assert_same(got, want)

    def test_shards_with_64_bit_tokens_narrowed_give_the_hosts_values(
        self, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        tokens = corpus(200, seed=5).astype(np.int64)
        tokens[::97] = 70_000  # a token that needs more than 16 bits
        shards = cut(tokens, [10, 10, 500, 3_001])
        got, want, calls = self.stream_both_ways(request, monkeypatch, shards, 64, 4)
        assert calls
        assert_same(got, want)
        assert got[0]["tokens"].dtype == np.int32

    def test_a_pad_equal_to_a_real_token_gives_the_hosts_values(
        self, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        tokens = corpus(200, seed=6)
        got, want, calls = self.stream_both_ways(request, monkeypatch, tokens, 64, 4, pad=5)
        assert calls
        assert_same(got, want)

    @pytest.mark.parametrize(
        ("spec", "batch"),
        [(["data"], 8), (["data"], 12), ([None, "data"], 4), ([None, None], 4)],
        ids=["rows-of-4", "rows-of-4-batch-12", "length-split", "replicated"],
    )
    def test_a_sharded_mesh_gives_the_hosts_values(
        self,
        request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch,
        spec: list[Any],
        batch: int,
    ) -> None:
        """Rows split over 4 devices; a row's tokens split (the device cannot work
        them out from starts: the host's are placed); replicated."""
        policy = policy_of(meshes=ROWS, rules=rows_rule_spec(*spec))
        got, want, calls = self.stream_both_ways(
            request,
            monkeypatch,
            TOKENS,
            64,
            batch,
            policy=policy,
            order="shuffled",
            seed=2,
            epochs=2,
        )
        assert_same(got, want)
        assert bool(calls) == (spec[1:] != ["data"])  # a split row: the host's ids


class TestCtrlCWhileIndexing:
    def test_ctrl_c_while_the_shards_are_indexed_leaves_no_file_and_no_descriptor(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Ctrl-C while a shard is being indexed: no temporary file is left, and no shard
        is held open while the interrupt's traceback lives (a notebook keeps it in
        `sys.last_traceback` until the next error). The shard being read was left open
        by the generator the interrupt suspended (`_shards_chunks`'s `finally`)."""
        tokens = corpus(400, seed=2)
        shards = []
        for k, part in enumerate(np.array_split(tokens, 3)):
            part.tofile(tmp_path / f"s{k}.bin")
            shards.append(np.memmap(tmp_path / f"s{k}.bin", np.uint16, "r"))
        mapped = open_count(tmp_path)
        real = indexfile._written
        calls = []

        def struck(*args: Any) -> None:
            calls.append(1)
            if len(calls) == 2:  # the second shard's chunk: its file open
                raise KeyboardInterrupt
            real(*args)

        monkeypatch.setattr(indexfile, "_written", struck)
        with pytest.raises(KeyboardInterrupt) as caught:
            packed(shards)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["s0.bin", "s1.bin", "s2.bin"]
        assert open_count(tmp_path) == mapped, "a shard left open by the interrupted build"
        del caught
        monkeypatch.setattr(indexfile, "_written", real)
        assert_same(all_of(packed(shards)), all_of(packed(tokens)))


class TestShardsOnTheDevicePath:
    """Shard files streamed to a device that copies host memory, the device function
    compiled: threads share the stream, and close from another thread never raises."""

    @pytest.fixture
    def setup(
        self, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> Any:
        shards: list[Any] = []
        for k, part in enumerate(cut(TOKENS, [5, 5, 2_000, 2_001, 7_000])):
            if part.size:
                part.tofile(tmp_path / f"s{k}.bin")
                shards.append(np.memmap(tmp_path / f"s{k}.bin", np.uint16, "r"))
            else:
                shards.append(part.copy())
        options = {"order": "shuffled", "seed": 4, "steps": 120}
        want = all_of(packed(TOKENS, **options))
        request.getfixturevalue("copying_device")
        all_of(packed(shards, **options))
        compiled()
        return shards, options, want, device_calls(monkeypatch)

    def test_threads_share_a_stream_of_shards_each_step_once(self, setup: Any) -> None:
        shards, options, want, calls = setup
        step_of = {b["tokens"].tobytes(): step for step, b in enumerate(want)}
        assert len(step_of) == len(want)
        pulled_by_threads(
            packed(shards, **options), lambda b: step_of[np.asarray(b["tokens"]).tobytes()]
        )
        assert calls

    def test_close_from_another_thread_never_raises(self, setup: Any) -> None:
        shards, options, want, calls = setup

        def check(batch: Any, step: int) -> None:
            for key, value in as_numpy(batch).items():
                np.testing.assert_array_equal(value, want[step][key])

        closed_while_pulled(lambda: packed(shards, **options), check, attempts=6)
        assert calls


class TestShardNames:
    def test_a_shard_whose_file_name_is_no_utf8_packs_as_a_single_file_does(
        self, tmp_path: Path
    ) -> None:
        """A shard file named by bytes that are no UTF-8 (Python's surrogate escapes, as
        `os.listdir` hands them out): the index of one such file is kept, and a list of
        shards holding it failed with UnicodeEncodeError while digesting their paths."""
        tokens = corpus(200, seed=3)
        name = tmp_path / os.fsdecode(b"shard_\xff.bin")
        tokens[:3_000].tofile(name)
        tokens[3_000:].tofile(tmp_path / "rest.bin")
        shards = [np.memmap(name, np.uint16, "r"), np.memmap(tmp_path / "rest.bin", np.uint16, "r")]
        assert_same(all_of(packed(shards[0])), all_of(packed(tokens[:3_000])))
        assert_same(all_of(packed(shards)), all_of(packed(tokens)))

    def test_64_bit_shard_files_pack_as_their_concatenation(self, tmp_path: Path) -> None:
        tokens = corpus(200, seed=3).astype(np.int64)
        for k, part in enumerate(np.array_split(tokens, 3)):
            part.tofile(tmp_path / f"s{k}.bin")
        shards = [np.memmap(tmp_path / f"s{k}.bin", np.int64, "r") for k in range(3)]
        assert_same(all_of(packed(shards)), all_of(packed(tokens)))
        assert len(list(tmp_path.glob("*.docs"))) == 1
