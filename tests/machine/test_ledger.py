"""The live ledger: `report()` shows where the bytes of live arrays are, by device and rule."""

from __future__ import annotations

import contextlib
import gc
import re
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import devpolicy
from devpolicy._machine import ledger as _ledger
from tests.helpers import policy_of, run_threads, write

POLICY_YAML = """\
version: 1
rules:
  - match: "ckpt/a"
    device: cpu:1
  - match: "ckpt/b"
    device: cpu:2
  - match: "ckpt/c"
    device: cpu:2
"""


def mine(
    device: devpolicy.types.LedgerDevice, policy: devpolicy.Policy
) -> list[devpolicy.types.LedgerEntry]:
    """The entries of `device` placed by `policy`'s rules (other tests' arrays may still be
    alive in this process)."""
    origins = {rule.origin for rule in policy.rules}
    return [e for e in device.entries if e.origin in origins]


@pytest.fixture
def policy(tmp_path: Path) -> devpolicy.Policy:
    return devpolicy.load_policy(write(tmp_path / "policy.yaml", POLICY_YAML), environ={})


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    path = tmp_path / "ckpt.safetensors"
    devpolicy.save_file(
        {
            "a": np.ones(1000, np.float32),
            "b": np.ones((16, 16), np.int16),
            "c": np.ones(3, np.uint8),
        },
        path,
    )
    return path


class TestReport:
    def test_live_bytes_by_device_and_rule_after_one_array_is_freed(
        self, policy: devpolicy.Policy, ckpt: Path, tmp_path: Path
    ) -> None:
        """Loaded to two devices, one array freed: exactly the live bytes remain, each
        under the rule (file:line) that placed it, and the freed one is gone."""
        out = policy.load_file(ckpt)
        del out["c"]
        gc.collect()
        ledger = devpolicy.report()
        cpu1 = mine(ledger.by_device["cpu:1"], policy)
        cpu2 = mine(ledger.by_device["cpu:2"], policy)
        assert [(e.origin, e.names, e.arrays, e.nbytes) for e in cpu1] == [
            ("policy.yaml:3", ("ckpt/a",), 1, 4000)
        ]
        assert [(e.origin, e.names, e.arrays, e.nbytes) for e in cpu2] == [
            ("policy.yaml:5", ("ckpt/b",), 1, 512)
        ]
        assert mine(ledger.by_device["cpu:0"], policy) == []

    def test_mapped_bytes_are_reported_apart(self, tmp_path: Path) -> None:
        """A tensor mapped from its file is file-backed; the same tensor read is not."""
        path = tmp_path / "data.safetensors"
        devpolicy.save_file({"tokens": np.arange(4096, dtype=np.uint16)}, path)
        policy = devpolicy.load_policy(
            write(tmp_path / "p.yaml", 'version: 1\nrules:\n  - match: "*"\n    device: cpu:3\n'),
            environ={},
        )
        mapped = policy.load_file(path, mmap=True, prefix="mapped")["tokens"]
        read = policy.load_file(path, mmap=False, prefix="read")["tokens"]
        (entry,) = mine(devpolicy.report().by_device["cpu:3"], policy)
        assert (entry.names, entry.arrays, entry.nbytes) == (
            ("mapped/tokens", "read/tokens"),
            2,
            16384,
        )
        assert entry.file_backed == 8192
        device = devpolicy.report().by_device["cpu:3"]
        assert device.file_backed >= 8192
        assert "file-backed" in str(devpolicy.report())
        del mapped, read

    def test_arrays_made_outside_devpolicy_are_unplaced(self) -> None:
        """An array JAX made on its own counts on its device as `unplaced`."""
        before = sum(
            e.nbytes
            for e in devpolicy.report().by_device["cpu:0"].entries
            if e.origin == "unplaced"
        )
        x = jnp.ones(12345, jnp.int8) + 1
        after = devpolicy.report().by_device["cpu:0"]
        unplaced = [e for e in after.entries if e.origin == "unplaced"]
        assert [e.names for e in unplaced] == [()]
        assert unplaced[0].nbytes - before == x.nbytes

    def test_every_placing_verb_is_recorded_under_its_name(self, tmp_path: Path) -> None:
        """put, to, a committed @place result and prefetch batches are each found under
        their name and rule."""
        rules = [{"match": f"verb/{v}*", "device": "cpu:3"} for v in ("put", "to", "place")]
        rules.append({"match": "verbbatch", "device": "cpu:3"})
        policy = policy_of(rules=rules)

        @policy.place("verb/place")
        def made() -> jax.Array:
            return jnp.zeros(10, jnp.float32)

        kept = [
            policy.put("verb/put", np.zeros(8, np.float32)),
            policy.to(jnp.zeros(4, jnp.float32), "verb/to"),
            made(),
            *policy.prefetch([np.zeros(2, np.float32)], name="verbbatch"),
        ]
        names = {
            n: e.nbytes
            for e in devpolicy.report().by_device["cpu:3"].entries
            for n in e.names
            if n.startswith("verb")
        }
        assert names == {"verb/put": 32, "verb/to": 16, "verb/place": 40, "verbbatch": 8}
        assert len(kept) == 4

    def test_a_sharded_array_counts_its_shard_on_each_device(self) -> None:
        """Sharded over a 2x2 mesh by data: each device holds half, counted there."""
        mesh = {"grid": {"axes": {"data": 2, "model": 2}, "devices": "cpu"}}
        rule = {"match": "shardme", "sharding": {"mesh": "grid", "spec": ["data"]}}
        policy = policy_of(meshes=mesh, rules=[rule])
        x = policy.put("shardme", np.zeros((8, 4), np.float32))
        ledger = devpolicy.report()
        per_device = {
            d.device: sum(e.nbytes for e in d.entries if e.names == ("shardme",))
            for d in ledger.devices
        }
        assert per_device == {"cpu:0": 64, "cpu:1": 64, "cpu:2": 64, "cpu:3": 64}
        assert x.nbytes == 128  # replicated over `model`: 2 x 64 bytes per data half

    def test_sharded_arrays_count_once_with_their_shards_as_a_detail(self) -> None:
        """24 arrays sharded over 4 devices are 24 arrays in 96 shards, not 96 arrays:
        each device's row counts the 24 as shards, the ledger counts each array once."""
        mesh = {"grid": {"axes": {"data": 2, "model": 2}, "devices": "cpu"}}
        rule = {"match": "counted/*", "sharding": {"mesh": "grid", "spec": ["data"]}}
        policy = policy_of(meshes=mesh, rules=[rule])
        gc.collect()
        before = devpolicy.report()
        layers = [policy.put(f"counted/{i}", np.zeros((8, 4), np.float32)) for i in range(24)]
        after = devpolicy.report()
        assert (after.arrays - before.arrays, after.sharded - before.sharded) == (24, 24)
        assert after.shards - before.shards == 96
        for device in after.devices:
            (row,) = [e for e in device.entries if e.names and e.names[0].startswith("counted/")]
            assert (row.arrays, row.sharded, row.nbytes) == (24, 24, 24 * 64)
        text = str(after).splitlines()
        rows = [line for line in text if "counted/0, counted/1" in line]
        assert len(rows) == 4
        assert all(" 24 shards " in row for row in rows)
        assert re.fullmatch(r"total: \d+ arrays? (\(\d+ of them in|in) \d+ shards\)?, .*", text[-1])
        del layers

    def test_the_arrays_jax_keeps_for_shards_are_those_shards_not_arrays_apart(self) -> None:
        """`addressable_shards[i].data` are live single-device arrays of their own (JAX
        keeps them with the sharded array): each device counts the shard once, under the
        rule, and no unplaced bytes appear beside it."""
        mesh = {"row": {"axes": {"data": 4}, "devices": "cpu"}}
        rule = {"match": "viewed", "sharding": {"mesh": "row", "spec": ["data"]}}
        policy = policy_of(meshes=mesh, rules=[rule])
        gc.collect()
        before = devpolicy.report()
        x = policy.put("viewed", np.zeros((8, 13), np.float32))
        views = [s.data for s in x.addressable_shards]
        assert {id(a) for a in views} <= {id(a) for a in jax.live_arrays()}
        after = devpolicy.report()
        assert (after.arrays - before.arrays, after.shards - before.shards) == (1, 4)
        for device in after.devices:
            (row,) = [e for e in device.entries if e.names == ("viewed",)]
            assert (row.arrays, row.sharded, row.nbytes) == (1, 1, 104)
        assert after.nbytes - before.nbytes == 4 * 104
        again = devpolicy.report()  # the views made by the report before are live now
        assert (again.arrays, again.shards, again.nbytes) == (
            after.arrays,
            after.shards,
            after.nbytes,
        )
        del x, views

    def test_arrays_a_sharded_array_was_assembled_from_count_apart_while_they_live(
        self,
    ) -> None:
        """The single-device arrays given to `make_array_from_single_device_arrays` hold the
        shards' memory, but a shard's address is never read (reading it crashed jaxlib
        0.12.1 under a donating thread): kept alive, they count as unplaced arrays too."""
        devices = jax.devices("cpu")[:4]
        mesh = jax.make_mesh((4,), ("data",), devices=devices)
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
        parts = [jax.device_put(np.full((2, 11), i, np.float32), d) for i, d in enumerate(devices)]
        gc.collect()
        before = devpolicy.report()
        whole = jax.make_array_from_single_device_arrays((8, 11), sharding, parts)
        after = devpolicy.report()
        assert (after.arrays - before.arrays, after.shards - before.shards) == (1, 4)
        assert after.nbytes - before.nbytes == whole.nbytes
        del parts
        gc.collect()
        alone = devpolicy.report()
        assert (alone.arrays - before.arrays, alone.shards - before.shards) == (-3, 4)
        assert alone.nbytes == before.nbytes
        del whole

    def test_one_buffer_held_by_two_arrays_counts_once(self) -> None:
        """An uncommitted array and its committed twin share a buffer: counted once,
        under the rule that committed it."""
        policy = policy_of(rules=[{"match": "twin", "device": "cpu:2"}])
        with jax.default_device(devpolicy.get_device("cpu:2")):
            loose = jnp.arange(777, dtype=jnp.int32)
        committed = policy.to(loose, "twin")
        assert committed.unsafe_buffer_pointer() == loose.unsafe_buffer_pointer()
        device = devpolicy.report().by_device["cpu:2"]
        twins = [e for e in device.entries if e.names == ("twin",)]
        assert [(e.arrays, e.nbytes) for e in twins] == [(1, 3108)]
        pointers = [
            a.unsafe_buffer_pointer()
            for a in jax.live_arrays()
            if a.devices() == {devpolicy.get_device("cpu:2")} and a.nbytes == 3108
        ]
        assert pointers.count(loose.unsafe_buffer_pointer()) >= 2  # JAX holds both

    def test_free_memory_comes_from_the_capacity(self) -> None:
        """Each device's free memory is the capacity's (host RAM by default)."""
        caps = devpolicy.StaticCapacity({"cpu:1": "1GiB"})
        ledger = devpolicy.report(capacity=caps)
        assert ledger.by_device["cpu:1"].free == 2**30
        assert ledger.by_device["cpu:0"].free is None
        assert devpolicy.report().by_device["cpu:0"].pool == "host RAM"
        assert devpolicy.report().by_device["cpu:0"].free > 0  # type: ignore[operator]


class TestRecords:
    def test_the_ledger_never_keeps_an_array_alive(self) -> None:
        """Recording holds a weak reference: a placed array goes when its user drops it."""
        policy = policy_of(default="cpu:1")
        x = policy.put("alive", np.zeros(5))
        gone = weakref.ref(x)
        del x
        gc.collect()
        assert gone() is None
        assert all("alive" not in e.names for d in devpolicy.report().devices for e in d.entries)

    def test_dead_records_are_pruned_as_the_table_grows(self) -> None:
        """Placing many short-lived arrays does not grow the table without bound."""
        _ledger._prune()  # from a table as it stands, whatever earlier tests left in it
        policy = policy_of(default="cpu:1")
        for _ in range(3000):
            policy.put("churn", np.zeros(1, np.float32))
        assert len(_ledger._placed) < 2 * 1024 + 100


@contextlib.contextmanager
def switching_often(gc_threshold: int | None = None) -> Iterator[None]:
    """Threads switch every microsecond (and the collector runs at `gc_threshold`), restored
    afterwards: interleavings that are rare at the default 5 ms become common."""
    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    if gc_threshold is not None:
        gc.set_threshold(gc_threshold)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)


class _Yields:
    """Garbage whose finalizer lets other threads run, as finalizers that touch a lock, a
    file or a socket do."""

    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it

    def __del__(self) -> None:
        time.sleep(0)


class TestThreads:
    @pytest.mark.slow
    def test_put_from_several_threads_while_the_table_is_pruned_never_fails(self) -> None:
        """A collection during the pruning runs finalizers that let other threads place
        arrays: the pruning must not fail (it raised `RuntimeError: dictionary changed size
        during iteration` out of put()), and every array placed meanwhile stays recorded."""
        policy = policy_of(default="cpu:1")
        cpu1 = devpolicy.get_device("cpu:1")
        # A table of live records one short of its pruning point, which is past 16,384.
        kept: list[jax.Array] = []

        def fill(count: int) -> None:
            more = jax.device_put([np.zeros(1, np.float32)] * count, cpu1)
            _ledger.record_each((a, "fill", "fill", None) for a in more)
            kept.extend(more)

        fill(8192)
        _ledger._prune()  # the pruning point becomes twice the live records
        fill(_ledger._prune_at[0] - 1 - len(_ledger._placed))
        assert len(_ledger._placed) == _ledger._prune_at[0] - 1 >= 16383
        errors: list[BaseException] = []
        placed: list[jax.Array] = []

        def place() -> None:
            try:
                for _ in range(100):
                    placed.append(policy.put("threaded", np.zeros(1, np.float32)))
            except BaseException as e:
                errors.append(e)

        gc.collect()
        # The first collection comes inside the pruning's walk over the table (thousands of
        # records), when the finalizers of this garbage run.
        with switching_often(gc_threshold=10_000):
            garbage = [_Yields() for _ in range(300)]
            del garbage
            run_threads(place, place)
        assert errors == []
        live = {id(a) for a in placed}
        recorded = {
            k for k, e in _ledger._placed.items() if e[1] == "threaded" and e[0]() is not None
        }
        assert live <= recorded
        kept.clear()

    @pytest.mark.slow
    def test_arrays_donated_by_another_thread_during_a_report_are_gone_not_errors(self) -> None:
        """A thread donating arrays to a jitted step (single-device and sharded) while
        report() runs: each report succeeds (it raised `RuntimeError: Array has been
        deleted` or `TypeError: 'NoneType' object is not iterable` in about 1 report in
        100), counting a deleted array as gone."""
        mesh = {"row": {"axes": {"data": 4}, "devices": "cpu"}}
        rule = {"match": "donated/sharded", "sharding": {"mesh": "row", "spec": ["data"]}}
        policy = policy_of(meshes=mesh, rules=[rule], default="cpu:1")
        step = jax.jit(lambda x: x + 1, donate_argnums=0)
        stop = threading.Event()
        donor_errors: list[BaseException] = []

        def donate() -> None:
            try:
                while not stop.is_set():
                    one = policy.put("donated/one", np.zeros(256, np.float32))
                    sharded = policy.put("donated/sharded", np.zeros((8, 4), np.float32))
                    for _ in range(20):
                        one, sharded = step(one), step(sharded)
            except BaseException as e:
                donor_errors.append(e)

        errors: list[str] = []
        with switching_often():
            donor = threading.Thread(target=donate)
            donor.start()
            try:
                for _ in range(600):
                    try:
                        devpolicy.report()
                    except Exception as e:
                        errors.append(repr(e))
            finally:
                stop.set()
                donor.join(60)
        assert not donor.is_alive()
        assert donor_errors == []
        assert errors == []


class TestText:
    def test_print_shows_devices_rules_names_and_free_memory(
        self, policy: devpolicy.Policy, ckpt: Path, tmp_path: Path
    ) -> None:
        """The table names each device with its free memory, then each rule with its
        names, arrays and bytes; rich prints the same text, never as markup."""
        out = policy.load_file(ckpt)
        text = str(devpolicy.report())
        lines = text.splitlines()
        assert lines[0] == "live arrays by device (devpolicy.report):"
        device_line = next(line for line in lines if line.startswith("cpu:1: "))
        assert "free (host RAM)" in device_line
        rule_line = next(line for line in lines if "policy.yaml:3" in line)
        assert rule_line.startswith("  ")
        assert rule_line.split()[1:] == ["ckpt/a", "1", "array", "3.9", "KiB"]
        assert lines[-1].startswith("total: ")
        rich = devpolicy.report().__rich__()
        assert rich.plain.splitlines()[0] == lines[0]
        assert not rich.spans
        del out

    def test_control_characters_in_names_are_shown_escaped(self) -> None:
        """A name from a file cannot move the cursor or forge a line."""
        policy = policy_of(default="cpu:1")
        x = policy.put("evil\x1b[2J\nname", np.zeros(1, np.float32))
        text = str(devpolicy.report())
        assert "evil\\x1b[2J\\nname" in text
        assert "\x1b" not in text
        del x

    def test_rules_sharing_one_origin_text_are_told_apart(self) -> None:
        """Two DEVPOLICY_RULES items both read `env:DEVPOLICY_RULES`: shown with their index."""
        policy = devpolicy.load_policy(
            {"version": 1}, environ={"DEVPOLICY_RULES": "envone=cpu:1,envtwo=cpu:1"}
        )
        kept = [policy.put("envone", np.zeros(1)), policy.put("envtwo", np.zeros(1))]
        text = str(devpolicy.report())
        assert "env:DEVPOLICY_RULES item 0  envone" in text
        assert "env:DEVPOLICY_RULES item 1  envtwo" in text
        del kept
