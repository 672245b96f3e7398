"""The loader's fast paths decide and report exactly what the per-name path does: runs of
names one rule decides alike (memory judged, fallbacks, shardings, maps), the ledger
filled for a whole file at once (the collector's pause: test_load_collector.py)."""

from __future__ import annotations

import os
import threading
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._base.errors import SafetensorsFileError
from devpolicy._decide.decider import Decider
from devpolicy._decide.decision import Decision
from devpolicy._decide.items import claim, make_query
from devpolicy._decide.routing import NEVER_MAPPED, Route
from devpolicy._io.format.header import read_header
from devpolicy._io.format.sources import open_tensor_file
from devpolicy._io.reading import checkpoint_sources as places
from devpolicy._io.reading import readahead
from devpolicy._io.reading import tensor_reads as whole
from devpolicy._machine.inventory import _distribution_names, _installed

QUIET = {"level": "debug"}
FOUR = {"four": {"axes": {"data": 4}, "devices": "cpu"}}


def per_name(decider: Decider, items: list[Any]) -> list[Decision]:
    """`resolve_many` as it was: every item decided on its own, in full."""
    claimed: dict[Hashable, int] = {}
    fit = decider._fit.snapshot()
    decisions = []
    for item in items:
        query = make_query(fit, claimed, item)
        decision = decider._resolve(query, "debug")
        claim(claimed, decision, fit, query[3])  # its maps
        decisions.append(decision)
    return decisions


def both_ways(
    fields: dict[str, Any], items: list[Any], capacity: Any = None
) -> tuple[list[Decision], list[Decision], list[Any], list[Any]]:
    """Decisions and events of `resolve_many` and of the per-name path, each on a fresh
    policy."""
    kwargs = {} if capacity is None else {"capacity": capacity}
    fast_policy = devpolicy.load_policy({"version": 1, **fields}, environ={}, **kwargs)
    slow_policy = devpolicy.load_policy({"version": 1, **fields}, environ={}, **kwargs)
    with capture_logs() as fast_events:
        fast = fast_policy.decider.resolve_many(items, summarised=True)
    with capture_logs() as slow_events:
        slow = per_name(slow_policy.decider, items)
    return fast, slow, fast_events, slow_events


class TestRunsOfNamesAreDecidedOncePerRule:
    def test_a_run_one_rule_decides_is_walked_once(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """10,000 tensors, one rule judged by memory: one walk, not 10,000."""
        walks = []
        walk = Route.walk

        def counted(self: Route[Any], *args: Any, **kwargs: Any) -> Any:
            walks.append(args[0])
            return walk(self, *args, **kwargs)

        monkeypatch.setattr(Route, "walk", counted)
        policy = devpolicy.load_policy(
            {"version": 1, "rules": [{"match": "*", "device": "cpu:1"}]},
            environ={},
            capacity=devpolicy.StaticCapacity({"cpu:1": "1GiB"}),
        )
        items = [(f"w{i}", 1024, (256,), NEVER_MAPPED, None) for i in range(10_000)]
        decisions = policy.decider.resolve_many(items)
        assert walks == ["w0"]
        assert [d.name for d in decisions[:2]] == ["w0", "w1"]
        assert {d.device_text for d in decisions} == {"cpu:1"}

    def test_a_run_that_outgrows_its_device_falls_back_where_the_per_name_path_does(
        self,
    ) -> None:
        """cpu:1 holds 1000 bytes: three 300-byte tensors fit, the fourth falls back (by
        the policy's chain), a 50-byte one after it fits cpu:1 again; events alike,
        fallback warned once."""
        sizes = [300, 300, 300, 300, 50, 300, 80]
        items = [(f"t{i}", n, (n,), NEVER_MAPPED, None) for i, n in enumerate(sizes)]
        fields = {
            "headroom": 0,
            "fallback": ["cpu:2"],
            "rules": [{"match": "*", "device": "cpu:1"}],
        }
        capacity = devpolicy.StaticCapacity({"cpu:1": 1000, "cpu:2": 1000})
        fast, slow, fast_events, slow_events = both_ways(fields, items, capacity)
        assert fast == slow
        assert [d.device_text for d in fast] == [
            "cpu:1",
            "cpu:1",
            "cpu:1",
            "cpu:2",
            "cpu:1",
            "cpu:2",
            "cpu:2",
        ]
        assert fast_events == slow_events
        assert [e["log_level"] for e in fast_events].count("warning") == 1

    @pytest.mark.parametrize(
        "fields",
        [
            {"default": "cpu:2"},
            {"rules": [{"match": "*", "device": "cpu:1", "fits": False}]},
            {"rules": [{"match": "*", "device": "gpu", "fallback": ["cpu:3"]}]},
            {"rules": [{"match": "a*", "device": "cpu:1"}, {"match": "*", "device": "cpu:2"}]},
            {"rules": [{"match": "*", "device": "cpu:1", "mmap": True}]},
            {"default": "auto"},
            {
                "meshes": FOUR,
                "rules": [{"match": "*", "sharding": {"mesh": "four", "spec": ["data"]}}],
            },
        ],
        ids=["default", "fits-false", "fallback", "two-rules", "mmap", "auto", "sharded"],
    )
    @pytest.mark.parametrize("maps", [0, 1, 2])
    def test_decisions_and_events_match_the_per_name_path(
        self, fields: dict[str, Any], maps: int
    ) -> None:
        """Every kind of rule, mapped or not: the same decisions, the same events."""
        items = [
            (f"{'a' if i % 3 else 'b'}{i}", 64 * (i + 1), (16 * (i + 1),), maps, None)
            for i in range(40)
        ]
        fast, slow, fast_events, slow_events = both_ways({"logging": QUIET, **fields}, items)
        assert fast == slow
        assert fast_events == slow_events

    def test_repeated_names_are_reported_as_repeats(self) -> None:
        """A name decided again in the same placement is a debug repeat either way."""
        items = [("x", 64, (16,), NEVER_MAPPED, None)] * 3 + [("y", 64, (16,), 0, None)]
        fast, slow, fast_events, slow_events = both_ways(
            {"logging": QUIET, "default": "cpu:1"}, items
        )
        assert fast == slow
        assert fast_events == slow_events


def file_of(tmp_path: Path, count: int) -> Path:
    path = tmp_path / "m.safetensors"
    devpolicy.save_file({f"w{i}": np.full(4 + i, i, np.float32) for i in range(count)}, path)
    return path


class TestLoadFileAlike:
    @pytest.mark.parametrize(
        "fields",
        [
            {"default": "cpu:1"},
            {"rules": [{"match": "w1*", "device": "cpu:2"}, {"match": "*", "device": "cpu:3"}]},
            {"rules": [{"file": "m.safetensors", "device": "cpu:2", "mmap": True}]},
            {
                "meshes": FOUR,
                "rules": [{"match": "*", "sharding": {"mesh": "four", "spec": [None]}}],
            },
        ],
        ids=["default", "rules", "file-mmap", "sharded"],
    )
    def test_a_load_places_and_reports_as_the_per_name_path(
        self, tmp_path: Path, fields: dict[str, Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Arrays, devices and every event (but the load's seconds) alike."""
        path = file_of(tmp_path, 30)

        def load() -> tuple[dict[str, jax.Array], list[Any]]:
            policy = devpolicy.load_policy({"version": 1, "logging": QUIET, **fields}, environ={})
            with capture_logs() as events:
                out = devpolicy.load_file(path, policy=policy, progress=False)
            for event in events:
                event.pop("seconds", None)
            return out, events

        fast, fast_events = load()
        monkeypatch.setattr(Decider, "_alike", lambda *args: None)
        slow, slow_events = load()
        assert fast_events == slow_events
        assert fast.keys() == slow.keys()
        for key in fast:
            assert fast[key].sharding == slow[key].sharding
            np.testing.assert_array_equal(np.asarray(fast[key]), np.asarray(slow[key]))


class TestTheLedgerHoldsAWholeFile:
    def test_every_loaded_array_is_recorded_by_its_rule(self, tmp_path: Path) -> None:
        policy = devpolicy.load_policy(
            {"version": 1, "rules": [{"match": "m/*", "device": "cpu:2"}]}, environ={}
        )
        out = devpolicy.load_file(file_of(tmp_path, 5), policy=policy)
        entries = devpolicy.report().by_device["cpu:2"].entries
        names = {n for e in entries for n in e.names}
        assert {f"m/w{i}" for i in range(5)} <= names
        del out


class TestInstalledDistributions:
    def test_names_are_those_importlib_metadata_reports(self) -> None:
        import importlib.metadata

        expected = {d.metadata["Name"] for d in importlib.metadata.distributions()}
        assert _distribution_names() == expected
        assert "jaxlib" in _installed(("jaxlib",))


def big_file(tmp_path: Path, nbytes: int = 40 * 2**20) -> tuple[Path, np.ndarray]:
    tokens = np.arange(nbytes // 2, dtype=np.uint16)
    path = tmp_path / "big.safetensors"
    devpolicy.save_file({"tokens": tokens}, path)
    return path, tokens


def reading_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads that read, one per read."""
    names: list[str] = []
    read = whole.read_range

    def spying(*args: Any) -> None:
        names.append(threading.current_thread().name)
        read(*args)

    monkeypatch.setattr(whole, "read_range", spying)
    return names


class TestLargeReadsOnSeveralThreads:
    @pytest.mark.slow
    def test_a_large_host_tensor_is_read_in_pieces_on_reader_threads(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(whole, "_READERS", 2)
        path, tokens = big_file(tmp_path)
        names = reading_threads(monkeypatch)
        policy = devpolicy.load_policy({"version": 1, "default": "cpu:1"}, environ={})
        with capture_logs() as events:
            out = devpolicy.load_file(path, policy=policy, mmap=False, progress=False)
        np.testing.assert_array_equal(np.asarray(out["tokens"]), tokens)
        assert len(names) == 3  # 40 MiB in 16 MiB pieces
        assert all(n.startswith("devpolicy-read") for n in names)
        (summary,) = [e for e in events if e["event"] == "load_file"]
        assert summary["bytes_read"] == tokens.nbytes

    def test_the_progress_bar_moves_by_every_piece_in_order(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(whole, "_READERS", 2)
        path, tokens = big_file(tmp_path)
        header = read_header(path)
        moved: list[int] = []
        source = open_tensor_file(path)
        try:
            array = whole.read_tensor(source, header, header.tensors[0], moved.append)
        finally:
            source.close()
        assert moved == [16 * 2**20, 16 * 2**20, 8 * 2**20]
        np.testing.assert_array_equal(array, tokens)

    def test_a_truncated_large_tensor_is_an_error_naming_it(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(whole, "_READERS", 2)
        path, _ = big_file(tmp_path)
        header = read_header(path)  # read whole, then the file shrinks under it
        os.truncate(path, path.stat().st_size - 20 * 2**20)
        source = open_tensor_file(path)
        try:
            with pytest.raises(
                SafetensorsFileError, match=r"file ended after .* 'tokens'|truncated"
            ):
                whole.read_tensor(source, header, header.tensors[0], lambda _n: None)
        finally:
            source.close()

    @pytest.mark.parametrize("mmap", [False, True])
    def test_sharded_slices_are_read_together_on_reader_threads(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mmap: bool
    ) -> None:
        """Four 10 MiB slices: read on reader threads (mapped instead where the file
        is aligned and mmap asked); each device holds its own slice."""
        monkeypatch.setattr(whole, "_READERS", 2)
        path, tokens = big_file(tmp_path)
        names = reading_threads(monkeypatch)
        policy = devpolicy.load_policy(
            {
                "version": 1,
                "meshes": FOUR,
                "rules": [{"match": "*", "sharding": {"mesh": "four", "spec": ["data"]}}],
            },
            environ={},
        )
        with capture_logs() as events:
            out = devpolicy.load_file(path, policy=policy, mmap=mmap, progress=False)
        placed = out["tokens"]
        np.testing.assert_array_equal(np.asarray(placed), tokens)
        quarter = tokens.size // 4
        for shard in placed.addressable_shards:
            start = shard.index[0].start or 0
            np.testing.assert_array_equal(np.asarray(shard.data), tokens[start : start + quarter])
        (summary,) = [e for e in events if e["event"] == "load_file"]
        counted = (summary["bytes_read"], summary["bytes_mapped"])
        assert counted == ((0, tokens.nbytes) if mmap else (tokens.nbytes, 0))
        if mmap:
            assert names == []
            assert summary["mapped"] == 4
        else:
            assert len(names) == 4
            assert all(n.startswith("devpolicy-read") for n in names)


def many_small(tmp_path: Path, count: int = 3000) -> tuple[Path, dict[str, np.ndarray[Any, Any]]]:
    """`count` float32 tensors of 4 KiB: three runs of at most 1,024 (`_READ_BATCH`)."""
    tensors = {f"t{i:05d}": np.full(1024, i, np.float32) for i in range(count)}
    path = tmp_path / "small.safetensors"
    devpolicy.save_file(tensors, path)
    return path, tensors


class TestSmallRunsReadAhead:
    def test_each_run_after_the_first_is_read_on_the_read_ahead_thread(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        path, tensors = many_small(tmp_path)
        threads: list[str] = []
        read_run = readahead._read_run

        def spying(*args: Any) -> Any:
            threads.append(threading.current_thread().name)
            return read_run(*args)

        monkeypatch.setattr(readahead, "_read_run", spying)
        policy = devpolicy.load_policy({"version": 1, "default": "cpu:2"}, environ={})
        out = devpolicy.load_file(path, policy=policy, mmap=False, progress=False)
        assert threads[0] == threading.current_thread().name
        assert len(threads) == 3
        assert all(name.startswith("devpolicy-read-ahead") for name in threads[1:])
        assert list(out) == list(tensors)
        for key in ("t00000", "t01500", "t02999"):
            np.testing.assert_array_equal(np.asarray(out[key]), tensors[key])
        assert not [t for t in threading.enumerate() if t.name.startswith("devpolicy-read-ahead")]

    def test_a_run_truncated_under_the_read_ahead_is_an_error_and_no_thread_is_left(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        path, _ = many_small(tmp_path)
        read_header_from = places.read_header_from

        def then_truncate(f: Any, where: Path) -> Any:
            header = read_header_from(f, where)
            os.truncate(path, path.stat().st_size - 4096 * 1500)  # the last runs' bytes
            return header

        monkeypatch.setattr(places, "read_header_from", then_truncate)
        # The identity check would refuse the shrunk file first; the read is what is tested.
        monkeypatch.setattr(places, "reopen_tensor_file", lambda header: path.open("rb"))
        with pytest.raises(SafetensorsFileError, match=r"file ended after .* bytes of a run"):
            devpolicy.load_file(path, mmap=False, progress=False)
        assert not [t for t in threading.enumerate() if t.name.startswith("devpolicy-read-ahead")]
