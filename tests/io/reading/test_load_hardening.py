"""The loader and the file format against hostile or awkward inputs (issue 16, item 3):
write targets that are not files, descriptor limits, index/file disagreement, trailing-dim
shards, whole-tensor narrowing errors, and SIGTERM in a worker thread."""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._cli.main import main
from devpolicy._io.format.header import read_header
from devpolicy._io.format.sources import open_tensor_file, os_error
from devpolicy._io.reading import checkpoint_sources as places
from devpolicy._io.reading import ranges, readahead
from tests.conftest import REPO
from tests.helpers import count_data_reads, policy_of, run_script, within

MESH = {"grid": {"axes": {"data": 2, "model": 2}, "devices": "cpu"}}


def sharded(spec: list[object], match: str = "m/w") -> devpolicy.Policy:
    rule = {"match": match, "sharding": {"mesh": "grid", "spec": spec}}
    return policy_of(meshes=MESH, rules=[rule])


def _non_regular(tmp_path: Path, what: str) -> tuple[Path, Path]:
    """(the path to write to, the thing that must survive untouched)."""
    if what == "fifo":
        os.mkfifo(tmp_path / "out.safetensors")
        return tmp_path / "out.safetensors", tmp_path / "out.safetensors"
    if what == "directory":
        (tmp_path / "out.safetensors").mkdir()
        return tmp_path / "out.safetensors", tmp_path / "out.safetensors"
    # A device of our own in tmp_path (never a system one): makes a device node, so root only.
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    node = tmp_path / "null-device"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.symlink(node, tmp_path / "out.safetensors")
    return tmp_path / "out.safetensors", node


KINDS = {
    "fifo": "a FIFO or pipe",
    "directory": "a directory",
    "symlink to a device": r"a character device \(the symlink's target '.*null-device'\)",
}


class TestWriteTargets:
    @pytest.mark.parametrize("what", list(KINDS))
    @pytest.mark.parametrize("writer", ["save_file", "align_file"])
    def test_a_target_that_is_not_a_regular_file_is_refused_untouched(
        self, tmp_path: Path, what: str, writer: str
    ) -> None:
        """save_file and align_file never replace a FIFO, directory or device."""
        source = tmp_path / "in.safetensors"
        devpolicy.save_file({"a": np.zeros(4, np.float32)}, source)
        target, kept = _non_regular(tmp_path, what)
        before = os.lstat(kept)

        def write() -> None:
            if writer == "save_file":
                devpolicy.save_file({"a": np.ones(4)}, target)
            else:
                devpolicy.align_file(source, target)

        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=rf"^{re.escape(str(tmp_path))}/out\.safetensors: cannot write: it is {KINDS[what]}.*, not a "
            r"regular file; only a regular file \(or a new path\) is replaced$",
        ):
            within(30, write)
        after = os.lstat(kept)
        assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
        assert not list(tmp_path.glob(".*.tmp"))

    def test_devpolicy_align_refuses_a_fifo_destination(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`devpolicy align x FIFO` is an input error (exit 2) and the FIFO stays a FIFO."""
        source = tmp_path / "in.safetensors"
        devpolicy.save_file({"a": np.zeros(4, np.float32)}, source)
        target, _ = _non_regular(tmp_path, "fifo")
        assert within(60, lambda: main(["align", str(source), str(target)])) == 2
        assert "not a regular file" in capsys.readouterr().err
        assert stat.S_ISFIFO(os.lstat(target).st_mode)


_SAVE_STUCK = """
    import os, sys, threading, time, numpy as np
    from devpolicy._io.writing import local_files as _tensorfile
    if sys.argv[2] == "named":
        _tensorfile._TMPFILE = 0  # as on a filesystem without O_TMPFILE
    def stuck(fd):
        open("started", "w").close()
        time.sleep(600)
    _tensorfile.os.fsync = stuck
    save = lambda: _tensorfile.write_file({"a": np.zeros(1 << 20)}, "m.safetensors")
    if sys.argv[1] == "worker":
        worker = threading.Thread(target=save)
        worker.start()
        worker.join()
    else:
        save()
"""


class TestSigterm:
    @pytest.mark.slow
    @pytest.mark.parametrize(
        ("thread", "temporary"),
        [("worker", "unnamed"), ("main", "unnamed"), ("main", "named")],
    )
    def test_sigterm_mid_save_leaves_no_temporary_file(
        self, tmp_path: Path, thread: str, temporary: str
    ) -> None:
        """Killed by SIGTERM mid-save, in any thread: no temporary file, and it dies of it."""
        script = textwrap.dedent(_SAVE_STUCK)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPOLICY_")}
        env["PYTHONPATH"] = str(REPO)
        child = subprocess.Popen(
            [sys.executable, "-c", script, thread, temporary], cwd=tmp_path, env=env
        )
        try:
            for _ in range(1200):
                if (tmp_path / "started").exists():
                    break
                time.sleep(0.1)
            assert (tmp_path / "started").exists()
            named = list(tmp_path.glob(".m.safetensors.devpolicy-*.tmp"))
            assert len(named) == (temporary == "named")
            child.send_signal(signal.SIGTERM)
            assert child.wait(timeout=60) == -signal.SIGTERM
        finally:
            child.kill()
        assert not list(tmp_path.glob(".m.safetensors.devpolicy-*.tmp"))
        assert not (tmp_path / "m.safetensors").exists()


class TestDescriptors:
    @pytest.mark.slow
    def test_a_checkpoint_of_more_files_than_the_descriptor_limit_loads(
        self, tmp_path: Path
    ) -> None:
        """Files are opened one at a time: 3x the limit loads, by load_file and plan."""
        result = run_script(
            """
            import json, os, resource, numpy as np, devpolicy
            policy = devpolicy.load_policy({"version": 1, "logging": {"level": "error"}},
                                           environ={})
            policy.put("warmup", np.zeros(1))  # the backend is up: its files open
            limit = len(os.listdir("/proc/self/fd")) + 40
            os.mkdir("ckpt")
            for i in range(3 * limit):
                devpolicy.save_file({f"t{i}": np.full(3, i, np.int32)}, f"ckpt/p{i:04}.safetensors")
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
            out = devpolicy.load_file("ckpt", policy=policy)
            planned = devpolicy.plan("ckpt", policy=policy)
            print(json.dumps({"files": 3 * limit, "limit": limit, "loaded": len(out),
                              "planned": len(planned.tensors),
                              "last": int(out[f"t{3 * limit - 1}"][0])}))
            """,
            tmp_path,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert report["loaded"] == report["planned"] == report["files"]
        assert report["last"] == report["files"] - 1

    @pytest.mark.slow
    def test_running_out_of_descriptors_names_the_limit_and_the_fix(self, tmp_path: Path) -> None:
        """EMFILE is a SafetensorsFileError with this process's limit and how to raise it."""
        result = run_script(
            """
            import os, resource, numpy as np, devpolicy
            policy = devpolicy.load_policy({"version": 1, "logging": {"level": "error"}},
                                           environ={})
            devpolicy.save_file({"a": np.zeros(3)}, "m.safetensors")
            policy.put("warmup", np.zeros(1))
            limit = len(os.listdir("/proc/self/fd")) - 1  # every descriptor is taken
            resource.setrlimit(resource.RLIMIT_NOFILE,
                               (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
            try:
                devpolicy.load_file("m.safetensors", policy=policy)
            except devpolicy.SafetensorsFileError as e:
                print(limit)
                print(e)
            """,
            tmp_path,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        limit, message = result.stdout.strip().split("\n", 1)
        assert message.startswith(
            f"m.safetensors: cannot open: too many open files: this process may hold {limit} "
            "(RLIMIT_NOFILE, hard limit "
        )
        assert "ulimit -n" in message
        assert "resource.setrlimit(resource.RLIMIT_NOFILE" in message

    def test_the_emfile_message_reads_the_limit_now(self) -> None:
        """The hint is the process's current soft limit, not a fixed text."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        error = os_error(
            "m.safetensors", OSError(errno.EMFILE, "Too many open files"), "cannot map"
        )
        assert f"this process may hold {soft} (RLIMIT_NOFILE" in str(error)

    def test_a_file_replaced_between_header_and_data_is_refused(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Opened again to be read, a file must be the one its header came from."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"w": np.zeros(16, np.float32)}, path)
        real = places.read_header_from

        def then_replace(f: Any, where: Path) -> object:
            header = real(f, where)
            devpolicy.save_file({"w": np.ones(16, np.float32)}, path)  # same size, new inode
            return header

        monkeypatch.setattr(places, "read_header_from", then_replace)
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=rf"^{re.escape(str(path))}: file was replaced or rewritten after its header was "
            "read: load it again",
        ):
            devpolicy.load_file(path, policy=policy_of())


class TestTrailingDimensionShards:
    def test_a_split_on_the_last_dimension_reads_the_covering_range_once(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """[null, x] over 4 devices: two 8 MiB reads of 16 MiB, not 4 reads per row (4M)."""
        path = tmp_path / "m.safetensors"
        w = np.arange(2**20 * 4, dtype=np.float32).reshape(2**20, 4)
        devpolicy.save_file({"w": w}, path)
        reads = count_data_reads(monkeypatch, path)
        with capture_logs() as logs:
            out = devpolicy.load_file(path, policy=sharded([None, ["data", "model"]]))
        assert len(reads) == 2
        assert sum(reads) == w.nbytes
        assert next(e for e in logs if e["event"] == "load_file")["bytes_read"] == w.nbytes
        np.testing.assert_array_equal(np.asarray(out["w"]), w)

    @pytest.mark.parametrize("gather_bytes", [8 * 2**20, 96, 40], ids=["8MiB", "96B", "40B"])
    @pytest.mark.parametrize(
        ("shape", "spec", "dtype"),
        [
            ((8, 4, 6), [None, None, "data"], np.int16),
            ((8, 4, 6), ["model", None, "data"], np.int16),
            ((8, 4, 6), [None, "data", "model"], np.int16),
            ((2, 64, 4), [None, None, ["data", "model"]], np.int16),
            ((16, 2), [None, "data"], np.int16),
            ((4, 2, 2, 6), ["data", None, None, "model"], np.int16),
            ((16, 4), [None, "data"], np.int64),  # narrowed slice by slice
        ],
    )
    def test_slices_cut_from_covering_reads_hold_the_right_values(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        shape: tuple[int, ...],
        spec: list[object],
        dtype: type[np.generic],
        gather_bytes: int,
    ) -> None:
        """Every layout and chunk size (small ones force chunking along inner dimensions)."""
        monkeypatch.setattr(ranges, "_GATHER_BYTES", gather_bytes)
        path = tmp_path / "m.safetensors"
        w = np.arange(np.prod(shape), dtype=dtype).reshape(shape)
        devpolicy.save_file({"w": w, "pad": np.zeros(3, np.int8)}, path)
        with capture_logs() as logs:
            out = devpolicy.load_file(path, policy=sharded(spec))
        np.testing.assert_array_equal(np.asarray(out["w"]), w)
        assert out["w"].sharding.spec == jax.sharding.PartitionSpec(*spec)
        read = next(e for e in logs if e["event"] == "load_file")["bytes_read"]
        assert w.nbytes <= read - 3 <= 2 * w.nbytes

    def test_a_process_holding_some_slices_reads_only_their_covering_range(
        self, tmp_path: Path
    ) -> None:
        """As in one process of several: columns 1 and 2 of the first half of the rows are
        read as the one range covering them (about half the file), not one read per row."""
        path = tmp_path / "m.safetensors"
        w = np.arange(4096 * 4, dtype=np.float32).reshape(4096, 4)
        devpolicy.save_file({"w": w}, path)
        header = read_header(path)
        held = [(slice(0, 2048), slice(1, 2)), (slice(0, 2048), slice(2, 3))]
        with open_tensor_file(path) as source:
            reader = ranges.ShardReader(
                source, header, header.tensors[0], None, None, "exact", held
            )
            slices = [reader(index) for index in held]
        np.testing.assert_array_equal(slices[0], w[:2048, 1:2])
        np.testing.assert_array_equal(slices[1], w[:2048, 2:3])
        assert reader.bytes_read == (2047 * 4 + 2) * 4  # row 0 col 1 .. row 2047 col 2


class _NoCopy(list[int]):
    def __getitem__(self, index: Any) -> Any:
        assert not isinstance(index, slice), "the order was copied"
        return super().__getitem__(index)


class TestSmallTensorRuns:
    def test_a_run_never_copies_the_rest_of_the_order(self, tmp_path: Path) -> None:
        """Finding a run is linear: no `order[start + 1:]` copy per run (quadratic in files
        of many small tensors: 400,000 took 197 s)."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({f"t{i}": np.full(3, i, np.int8) for i in range(50)}, path)
        header = read_header(path)
        decisions = [
            policy_of().resolve(f"m/{t.key}", nbytes=t.nbytes, shape=t.shape)
            for t in header.tensors
        ]
        order = _NoCopy(sorted(range(50), key=lambda i: header.tensors[i].offset))
        run = readahead.small_run(header, decisions, order, 0, None, False)
        assert run == list(order)


class TestCheckpointIndex:
    @pytest.mark.parametrize(
        "name",
        ["", "a\0b.safetensors", "..", ".", "/tmp/x.safetensors", "../x.safetensors", "a/b"],
        ids=["empty", "nul", "dotdot", "dot", "absolute", "escaping", "subdirectory"],
    )
    def test_a_file_name_that_is_not_a_plain_name_is_an_error_naming_the_index(
        self, tmp_path: Path, name: str
    ) -> None:
        """Only plain names of the index's directory: nothing outside it, no NUL."""
        devpolicy.save_file({"a": np.zeros(2)}, tmp_path / "one.safetensors")
        index = tmp_path / "m.safetensors.index.json"
        index.write_text(json.dumps({"weight_map": {"a": "one.safetensors", "b": name}}))
        for call in (devpolicy.load_file, devpolicy.plan):
            with pytest.raises(
                devpolicy.SafetensorsFileError,
                match=rf"^{re.escape(str(index))}: tensor 'b': file name .* in `weight_map` is not a file of "
                r"the index's directory \(a plain name like ",
            ):
                call(index, policy=policy_of())

    def test_a_tensor_the_index_does_not_list_is_an_error(self, tmp_path: Path) -> None:
        """The index and the files must agree both ways."""
        devpolicy.save_file({"a": np.zeros(2), "z": np.ones(2)}, tmp_path / "one.safetensors")
        index = tmp_path / "m.safetensors.index.json"
        index.write_text(json.dumps({"weight_map": {"a": "one.safetensors"}}))
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=rf"^{re.escape(str(tmp_path))}/one\.safetensors: holds 1 tensor\(s\) that "
            rf"{re.escape(str(index))} does not list: 'z' ",
        ):
            devpolicy.load_file(index, policy=policy_of())

    def test_a_tensor_listed_twice_is_an_error(self, tmp_path: Path) -> None:
        """A duplicate `weight_map` key is not silently resolved (JSON would keep the last)."""
        devpolicy.save_file({"a": np.zeros(2)}, tmp_path / "one.safetensors")
        devpolicy.save_file({"b": np.zeros(2)}, tmp_path / "two.safetensors")
        index = tmp_path / "m.safetensors.index.json"
        index.write_text(
            '{"weight_map": {"a": "one.safetensors", "b": "two.safetensors", '
            '"a": "two.safetensors"}}'
        )
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=rf"^{re.escape(str(index))}: tensor 'a': listed twice in `weight_map`",
        ):
            devpolicy.plan(index, policy=policy_of())

    def test_hidden_and_non_checkpoint_files_of_a_directory_are_not_loaded(
        self, tmp_path: Path
    ) -> None:
        """`._x` resource forks, hidden files, directories and FIFOs so named are skipped."""
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        devpolicy.save_file({"a": np.zeros(2)}, ckpt / "part1.safetensors")
        (ckpt / "._part1.safetensors").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
        devpolicy.save_file({"hidden": np.zeros(2)}, ckpt / ".old.safetensors")
        (ckpt / "notes.txt").write_text("not a tensor file")
        (ckpt / "dir.safetensors").mkdir()
        os.mkfifo(ckpt / "pipe.safetensors")
        out = within(60, lambda: devpolicy.load_file(ckpt, policy=policy_of()))
        assert list(out) == ["a"]  # type: ignore[call-overload]
        assert [t.key for t in devpolicy.plan(ckpt, policy=policy_of()).tensors] == ["a"]

    def test_a_dangling_symlink_in_a_checkpoint_directory_is_an_error(self, tmp_path: Path) -> None:
        """A missing file is never loaded as a smaller checkpoint."""
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        devpolicy.save_file({"a": np.zeros(2)}, ckpt / "part1.safetensors")
        os.symlink("../blobs/gone", ckpt / "part2.safetensors")
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=rf"^{re.escape(str(ckpt))}/part2\.safetensors: cannot be read as part of the "
            "checkpoint: dangling symlink",
        ):
            devpolicy.load_file(ckpt, policy=policy_of())


class TestShardedNarrowing:
    @pytest.mark.parametrize(
        ("values", "message"),
        [
            (
                [0.5, 0.25, 0.0, 0.1, 1.0, 0.2, 2.0, 4.0],
                r"2 values lose precision in float32 \(first at flat index 3: 0\.1 -> ",
            ),
            (
                [0.5, 0.25, 0.0, 1.0, 1.0, 0.2, 0.3, 4.0],
                r"2 values lose precision in float32 \(first at flat index 5: 0\.2 -> ",
            ),
            (
                [-(2**40), 0, 0, 0, 0, 0, 0, 2**41],
                r"values -1099511627776\.\.2199023255552 do not fit int32 ",
            ),
        ],
        ids=["count", "index", "range"],
    )
    def test_a_sharded_narrowing_error_describes_the_whole_tensor(
        self, tmp_path: Path, values: list[float], message: str
    ) -> None:
        """Counts, first index and range are the tensor's, not one shard's."""
        path = tmp_path / "m.safetensors"
        dtype = np.int64 if isinstance(values[0], int) else np.float64
        devpolicy.save_file({"w": np.array(values, dtype)}, path)
        with pytest.raises(
            devpolicy.errors.NarrowingError,
            match=rf"^{re.escape(str(path))}: tensor 'w': {message}",
        ):
            devpolicy.load_file(path, policy=sharded(["data"]))
