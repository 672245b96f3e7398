"""Saving from many processes: a 2-process jax.distributed job (2 CPU devices each) saves a
sharded nnx state with `save_file`; each process writes its own half into one file that a
single process reads back bit-identical, and a process that dies or fails leaves nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import devpolicy
from tests.conftest import REPO
from tests.helpers import reports_of, run_job

WORKER = REPO / "tests" / "save_worker.py"
TEMPS = ".model.safetensors.devpolicy-*.tmp"


def run_save_job(directory: Path, mode: str) -> list[tuple[int, dict[str, Any] | None]]:
    """Run both processes of the worker's job in `mode`: each one's exit status and its
    JSON report (None when it printed none: killed, or aborted by JAX's coordination)."""
    finished = run_job(WORKER, [[str(directory), mode]] * 2)
    return [(process.returncode, process.report) for process in finished]


def assert_told_the_creator_failed(
    folder: Path, status: int, report: dict[str, Any] | None
) -> None:
    """Process 1's end once process 0 was terminated mid-save: the error names process 0's
    failure, or says process 0 did not answer (never only a filesystem not shared); or
    JAX's coordination service, which process 0 ran, aborted it first."""
    if report is None:
        assert status == -6
        return
    path = folder / "model.safetensors"
    assert report["error"] in (
        f"{path}: saved by no process: process 0 of 2 failed: terminated by SIGTERM; "
        "nothing written",
        f"{path}: saved by no process: the unfinished file process 0 created is gone and "
        "process 0 of 2 did not answer: it failed (and removed the file), or this process "
        "sees another filesystem than process 0 (every process of a multi-process save "
        "must see the same one, shared between hosts); nothing written",
    )


def read_all(path: Path) -> dict[str, np.ndarray[Any, Any]]:
    """Every tensor of a file through the reference reader (`safe_open`); F4 through
    devpolicy: the reference's flax reader asks numpy for a packed F4 type it lacks."""
    from safetensors import safe_open

    with safe_open(str(path), framework="flax") as f:
        out = {key: np.asarray(f.get_tensor(key)) for key in f.keys() if key != "codes"}  # noqa: SIM118
        assert "codes" in f.keys()  # noqa: SIM118
    out["codes"] = np.asarray(devpolicy.load_file(path, prefix="")["codes"])
    return out


def same_bits(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and np.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """One job that saves the sharded state twice (a new file, then over it)."""
    directory = tmp_path_factory.mktemp("joint")
    return directory, reports_of(run_job(WORKER, [[str(directory), "save"]] * 2))


@pytest.mark.slow
class TestSavedFromTwoProcesses:
    def test_the_file_is_the_one_a_single_process_writes(
        self, saved: tuple[Path, list[dict[str, Any]]]
    ) -> None:
        """Byte for byte the file one process writes of the same values (process 0 wrote
        that reference from its own copy): same header, same layout, same data."""
        directory, _ = saved
        joint = (directory / "model.safetensors").read_bytes()
        assert joint == (directory / "reference.safetensors").read_bytes()

    def test_the_reference_reader_and_a_fresh_process_read_it_back(
        self, saved: tuple[Path, list[dict[str, Any]]]
    ) -> None:
        """`safetensors.safe_open` accepts it, and devpolicy in this process (another job,
        4 devices) loads every tensor bit-identical to the values saved: bf16, F4, a 0-d
        step, shards split by rows, by columns and replicated."""
        directory, _ = saved
        expected = read_all(directory / "reference.safetensors")
        assert sorted(expected) == [
            "codes",
            "down/bias",
            "down/kernel",
            "embed",
            "norm/bias",
            "norm/scale",
            "step",
            "up/bias",
            "up/kernel",
        ]
        by_reference = read_all(directory / "model.safetensors")
        loaded = devpolicy.load_file(directory / "model.safetensors", prefix="")
        for key, value in expected.items():
            assert same_bits(by_reference[key], value), key
            assert same_bits(np.asarray(loaded[key]), value), key
        assert str(expected["embed"].dtype) == "bfloat16"
        assert str(expected["codes"].dtype) == "float4_e2m1fn"
        assert int(expected["step"]) == 7

    def test_each_process_writes_about_half_and_nothing_twice(
        self, saved: tuple[Path, list[dict[str, Any]]]
    ) -> None:
        """Each process's `save_file` event counts the bytes it wrote: about half each, and
        together exactly the file (replicas are not written twice). The kernel's own count
        of the process's writes (`/proc/self/io` wchar) agrees."""
        directory, reports = saved
        size = (directory / "model.safetensors").stat().st_size
        for save in range(2):  # a new file, and the same written over it
            events = [report["saves"][save] for report in reports]
            assert [e["process_index"] for e in events] == [0, 1]
            assert all(e["processes"] == 2 and e["file_bytes"] == size for e in events)
            assert all(e["tensors"] == 9 for e in events)
            assert sum(e["bytes_written"] for e in events) == size
            for event in events:
                assert 0.45 < event["bytes_written"] / size < 0.55
                # wchar also counts what else the process wrote meanwhile (a few bytes).
                assert 0 <= event["wchar"] - event["bytes_written"] < 64 * 1024

    def test_nothing_is_left_beside_the_file(
        self, saved: tuple[Path, list[dict[str, Any]]]
    ) -> None:
        """No temporary file remains once the save returned."""
        directory, _ = saved
        assert sorted(p.name for p in directory.iterdir()) == [
            "model.safetensors",
            "reference.safetensors",
        ]


@pytest.mark.slow
class TestFailures:
    def test_a_process_killed_mid_save_leaves_no_file(self, tmp_path: Path) -> None:
        """Process 1 is killed (SIGKILL) after writing its first piece: process 0 fails the
        save after its timeout, naming process 1, removes the unfinished file, and no file
        appears."""
        (_, first), (second_status, second) = run_save_job(tmp_path, "kill1")
        assert second_status == -9
        assert second is None
        assert first is not None
        assert first["error"] == (
            f"{tmp_path / 'model.safetensors'}: saved by no process: process 1 of 2 did not "
            "reach step 'written' within 5 s (killed, stuck, or not taking part); nothing "
            "written"
        )
        assert first["left"] == []
        assert list(tmp_path.iterdir()) == []

    def test_the_creator_killed_mid_save_leaves_a_temp_the_next_save_removes(
        self, tmp_path: Path
    ) -> None:
        """Process 0 (which created the unfinished file) is killed mid-save: no file
        appears; its temporary file stays, and the next save of the same path removes it.
        Process 1 fails the save naming process 0, unless JAX's coordination service (run
        by process 0) aborts it first: JAX's doing, not catchable."""
        (first_status, first), (second_status, second) = run_save_job(tmp_path, "kill0")
        assert first_status == -9
        assert first is None
        if second is not None:
            assert "process 0 of 2 did not reach step 'written'" in second["error"]
        else:
            assert second_status == -6  # SIGABRT: the coordination service is gone
        path = tmp_path / "model.safetensors"
        assert not path.exists()
        (temp,) = tmp_path.glob(TEMPS)
        devpolicy.save_file({"w": np.arange(4, dtype=np.float32)}, path)
        assert not temp.exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
        assert devpolicy.load_file(path)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]

    def test_the_creator_terminated_mid_save_removes_its_temp_and_dies_of_it(
        self, tmp_path: Path
    ) -> None:
        """Process 0 gets SIGTERM mid-save: its unfinished file is removed, it tells process
        1 why (unless JAX's coordination service, which process 0 ran, aborts process 1
        first) and dies of the signal; nothing is left."""
        (first_status, first), (second_status, second) = run_save_job(tmp_path, "term0")
        assert first_status == -15
        assert first is None
        assert_told_the_creator_failed(tmp_path, second_status, second)
        assert list(tmp_path.iterdir()) == []

    def test_a_writer_that_finds_the_creators_file_removed_names_the_creators_failure(
        self, tmp_path: Path
    ) -> None:
        """Process 1 opens the unfinished file only after process 0, terminated, removed
        it: process 1 never blames a filesystem that is not shared."""
        (first_status, _), (second_status, second) = run_save_job(tmp_path, "term0late1")
        assert first_status == -15
        assert_told_the_creator_failed(tmp_path, second_status, second)
        assert list(tmp_path.iterdir()) == []

    def test_processes_that_see_different_folders_are_told_to_share_one(
        self, tmp_path: Path
    ) -> None:
        """Each process given its own folder (as hosts with local disks): process 0 writes
        its part; process 1 finds no unfinished file and, since process 0 passed, says the
        filesystem must be shared; process 0 names process 1's failure; nothing is left."""
        folders = [tmp_path / "host0", tmp_path / "host1"]
        for folder in folders:
            folder.mkdir()
        finished = run_job(WORKER, [[str(folder), "plain"] for folder in folders])
        first, second = (process.report for process in finished)
        assert first is not None
        assert second is not None
        assert (
            "every process of a multi-process save must see the same filesystem"
            in (second["error"])
        )
        assert first["error"] == (
            f"{folders[0] / 'model.safetensors'}: saved by no process: process 1 of 2 failed: "
            f"SafetensorsFileError: {second['error']}; nothing written"
        )
        assert [list(folder.iterdir()) for folder in folders] == [[], []]

    def test_a_failed_write_fails_the_save_on_every_process(self, tmp_path: Path) -> None:
        """Process 1's writes fail (no space): it raises its own error, process 0 raises
        naming process 1 and why, and nothing is left."""
        (_, first), (_, second) = run_save_job(tmp_path, "fail1")
        path = tmp_path / "model.safetensors"
        assert first is not None
        assert second is not None
        assert second["error"] == f"{path}: cannot write: No space left on device"
        assert first["error"] == (
            f"{path}: saved by no process: process 1 of 2 failed: SafetensorsFileError: "
            f"{path}: cannot write: No space left on device; nothing written"
        )
        assert list(tmp_path.iterdir()) == []

    def test_different_trees_are_refused_on_every_process(self, tmp_path: Path) -> None:
        """Process 1 saves one leaf more: every process refuses, saying how the files
        would differ, and nothing is written."""
        (_, first), (_, second) = run_save_job(tmp_path, "differ")
        assert first is not None
        assert second is not None
        assert first["error"] == second["error"]
        assert first["error"].startswith(
            f"{tmp_path / 'model.safetensors'}: the processes would write different files "
            "(every process must save the same names, shapes, dtypes and metadata; "
            "process 0: 9 tensors, "
        )
        assert "process 1: 10 tensors" in first["error"]
        assert list(tmp_path.iterdir()) == []
