"""A save interrupted on a filesystem without `O_TMPFILE` (NFS) leaves no temporary file
where a signal can be caught, and a recognisable one, removed by the next save to that
path, where it cannot (issue 28, D11). Real signals to a real process; the named-file path
forced with `writing._TMPFILE = 0`."""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import devpolicy
from devpolicy._io.writing import local_files as writing
from tests.conftest import REPO

pytestmark = pytest.mark.slow

# argv: where the save runs (main, worker, daemon), and what the application did first
# (nothing, or exits on SIGTERM by its own handler). The save stops in fsync, after
# every byte is written, until the file `release` appears.
_SAVING = """
    import os, signal, sys, threading, time, numpy as np
    # As a program started from a terminal has them, even when the tests run under nohup
    # or in a background job (which start every child with SIGHUP or SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    from devpolicy._io.writing import local_files as writing
    writing._TMPFILE = 0  # as on a filesystem without O_TMPFILE
    def held(fd):
        open("started", "w").close()
        for _ in range(6000):
            if os.path.exists("release"):
                return
            time.sleep(0.1)
    writing.os.fsync = held
    if sys.argv[2] == "exits-on-sigterm":
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    save = lambda: writing.write_file({"a": np.zeros(1 << 20)}, "m.safetensors")
    if sys.argv[1] == "main":
        save()
    else:
        worker = threading.Thread(target=save, daemon=sys.argv[1] == "daemon")
        worker.start()
        worker.join()
"""
_TEMPORARY = ".m.safetensors.devpolicy-*.tmp"


def _start(tmp_path: Path, where: str, application: str = "plain") -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPOLICY_")}
    env["PYTHONPATH"] = str(REPO)
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_SAVING), where, application],
        cwd=tmp_path,
        env=env,
    )
    for _ in range(1200):
        if (tmp_path / "started").exists() or child.poll() is not None:
            break
        time.sleep(0.1)
    assert (tmp_path / "started").exists(), "the child never started saving"
    assert len(list(tmp_path.glob(_TEMPORARY))) == 1  # named: the forced path
    return child


def _ended(child: subprocess.Popen[bytes]) -> int:
    try:
        return child.wait(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


class TestCaughtSignals:
    @pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
    def test_a_save_on_the_main_thread_leaves_nothing_and_dies_of_the_signal(
        self, tmp_path: Path, signum: int
    ) -> None:
        """SIGTERM, SIGINT or SIGHUP mid-save on the main thread: the temporary file is
        removed, no target is made, and the process dies of the signal as it would have."""
        child = _start(tmp_path, "main")
        child.send_signal(signum)
        assert _ended(child) == -signum
        assert not list(tmp_path.glob(_TEMPORARY))
        assert not (tmp_path / "m.safetensors").exists()

    @pytest.mark.parametrize("where", ["daemon", "worker"])
    def test_sigint_while_another_thread_saves_leaves_no_temporary_file(
        self, tmp_path: Path, where: str
    ) -> None:
        """Ctrl-C stops the main thread and the process exits with a save unfinished in
        another thread (a daemon thread; or a worker Python 3.11-3.12 stops waiting for
        once Ctrl-C lands in `join()`): its temporary file is removed on the way out. A
        target, if the save got to finish, is whole."""
        child = _start(tmp_path, where)
        child.send_signal(signal.SIGINT)
        time.sleep(0.5)  # not a measurement: the interrupt lands while the save is held
        (tmp_path / "release").touch()  # where Python does wait for the worker
        assert _ended(child) == -signal.SIGINT
        assert not list(tmp_path.glob(_TEMPORARY))
        if (tmp_path / "m.safetensors").exists():
            assert devpolicy.plan(tmp_path / "m.safetensors").tensors[0].shape == (1 << 20,)

    def test_sigterm_to_an_application_that_exits_on_it_leaves_nothing(
        self, tmp_path: Path
    ) -> None:
        """An application whose own SIGTERM handler exits, while a daemon thread saves:
        the handler is left to it, and the temporary file is removed on the way out."""
        child = _start(tmp_path, "daemon", "exits-on-sigterm")
        child.send_signal(signal.SIGTERM)
        assert _ended(child) == 143
        assert not list(tmp_path.glob(_TEMPORARY))


class TestUncaughtSignals:
    @pytest.mark.parametrize(
        ("where", "signum"), [("main", signal.SIGKILL), ("worker", signal.SIGTERM)]
    )
    def test_the_leftover_names_its_process_and_the_next_save_removes_it(
        self, tmp_path: Path, where: str, signum: int
    ) -> None:
        """SIGKILL, or SIGTERM while only a worker thread saves (Python can run no
        handler there), leaves the temporary file: named with the host and the dead
        process's pid, and removed by the next save to the same path."""
        child = _start(tmp_path, where)
        child.send_signal(signum)
        assert _ended(child) == -signum
        (left,) = tmp_path.glob(_TEMPORARY)
        host = writing.host_tag()
        assert left.name.startswith(f".m.safetensors.devpolicy-{host}-{child.pid}-")
        (tmp_path / "other.safetensors").touch()  # another target's are not touched
        other = tmp_path / f".other.safetensors.devpolicy-{host}-{child.pid}-0a1b.tmp"
        other.touch()
        devpolicy.save_file({"w": np.ones(2)}, tmp_path / "m.safetensors")
        assert not left.exists()
        assert other.exists()


class TestOnlyDeadWritersAreCleanedUp:
    def test_a_live_writers_file_is_kept(self, tmp_path: Path) -> None:
        """A temporary file whose process is alive (here, this one's: another thread's
        save) is a save in progress: never removed."""
        alive = tmp_path / f".m.safetensors.devpolicy-{writing.host_tag()}-{os.getpid()}-0a1b.tmp"
        alive.touch()
        devpolicy.save_file({"w": np.ones(2)}, tmp_path / "m.safetensors")
        assert alive.exists()

    def test_another_hosts_file_is_kept(self, tmp_path: Path) -> None:
        """On storage several machines share, a pid means nothing on another host: a
        temporary file of another host is never removed, even if no local process has
        its pid."""
        other_host = "another-host" if socket.gethostname() != "another-host" else "elsewhere"
        dead = _dead_pid()
        theirs = tmp_path / f".m.safetensors.devpolicy-{other_host}-{dead}-0a1b.tmp"
        ours = tmp_path / f".m.safetensors.devpolicy-{writing.host_tag()}-{dead}-0a1b.tmp"
        theirs.touch()
        ours.touch()
        devpolicy.save_file({"w": np.ones(2)}, tmp_path / "m.safetensors")
        assert theirs.exists()
        assert not ours.exists()


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


_FORK_WHILE_SAVING = """
    import os, sys, threading, time, numpy as np
    from devpolicy._io.writing import local_files as writing
    writing._TMPFILE = 0
    def held(fd):
        open("started", "w").close()
        while not os.path.exists("release"):
            time.sleep(0.05)
    writing.os.fsync = held
    worker = threading.Thread(
        target=lambda: writing.write_file({"a": np.zeros(16)}, "m.safetensors"))
    worker.start()
    while not os.path.exists("started"):
        time.sleep(0.05)
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # the child exits normally: its exit handlers run
    os.waitpid(pid, 0)
    open("release", "w").close()
    worker.join()
    print(os.path.exists("m.safetensors"))
"""


class TestForkedChild:
    def test_a_child_forked_during_a_save_leaves_the_parents_file_alone(
        self, tmp_path: Path
    ) -> None:
        """A child forked while another thread saves and then exiting normally does not
        remove the parent's temporary file: the parent's save completes."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPOLICY_")}
        env["PYTHONPATH"] = str(REPO)
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_FORK_WHILE_SAVING)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=tmp_path,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert result.stdout.strip() == "True"
        assert not list(tmp_path.glob(_TEMPORARY))


def _write(writer: str, source: Path, target: Path) -> None:
    """Write `target` as `writer` does: four values under the key `a`."""
    if writer == "save_file":
        devpolicy.save_file({"a": np.ones(4)}, target)
    elif writer == "save_chunks":
        devpolicy.save_chunks([np.ones(4, np.uint16)], target, key="a", overwrite=True)
    else:
        devpolicy.align_file(source, target)


class TestExistingTargets:
    @pytest.mark.parametrize("writer", ["save_file", "save_chunks", "align_file"])
    def test_a_symlink_loop_is_refused_and_its_links_kept(
        self, tmp_path: Path, writer: str
    ) -> None:
        """Links that point at each other reach no file to replace: the save is refused,
        naming the loop, and both links stay links (a save once replaced one with a file)."""
        source = tmp_path / "in.safetensors"
        devpolicy.save_file({"a": np.zeros(4, np.float32)}, source)
        os.symlink("b.safetensors", tmp_path / "a.safetensors")
        os.symlink("a.safetensors", tmp_path / "b.safetensors")
        target = tmp_path / "a.safetensors"
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=rf"^{re.escape(str(target))}: cannot write: it is a symlink loop \(links that "
            r"point at each other never reach a file\); nothing written$",
        ):
            _write(writer, source, target)
        assert os.readlink(tmp_path / "a.safetensors") == "b.safetensors"
        assert os.readlink(tmp_path / "b.safetensors") == "a.safetensors"
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "a.safetensors",
            "b.safetensors",
            "in.safetensors",
        ]

    @pytest.mark.parametrize("writer", ["save_file", "save_chunks", "align_file"])
    def test_a_file_of_another_account_keeps_its_owner_and_mode(
        self, tmp_path: Path, writer: str
    ) -> None:
        """Overwriting a file another account owns (as root may) keeps its owner, group and
        permission bits: the new file is given them before it is renamed into place."""
        if os.geteuid() != 0:
            pytest.skip("giving a file to another account needs root")
        source = tmp_path / "in.safetensors"
        devpolicy.save_file({"a": np.zeros(4, np.float32)}, source)
        target = tmp_path / "out.safetensors"
        devpolicy.save_file({"a": np.zeros(2, np.float32)}, target)
        os.chown(target, 4321, 8765)
        os.chmod(target, 0o640)
        _write(writer, source, target)
        after = os.stat(target)
        assert (after.st_uid, after.st_gid, after.st_mode & 0o7777) == (4321, 8765, 0o640)
        assert devpolicy.load_file(target, prefix="")["a"].shape == (4,)


class TestAlignFile:
    def test_runs_of_zeros_stay_holes_in_the_copy(self, tmp_path: Path) -> None:
        """A sparse file copied by `align_file` stays sparse (1 MiB runs of zeros, aligned in
        the file, are not written, as `save_chunks` leaves them) and reads back exact."""
        source = tmp_path / "in.safetensors"
        tokens = np.zeros(48 * 2**20, np.uint16)  # 96 MiB, zeros but for two runs
        tokens[:1000] = 1
        tokens[32 * 2**20 : 32 * 2**20 + 1000] = 2
        devpolicy.save_chunks(tokens, source)
        copy = tmp_path / "out.safetensors"

        devpolicy.align_file(source, copy)

        assert copy.stat().st_size == source.stat().st_size
        assert copy.stat().st_blocks * 512 < 4 * 2**20
        back = np.asarray(devpolicy.load_file(copy, prefix="", mmap=True)["tokens"])
        assert np.array_equal(back, tokens)

    def test_a_long_copy_shows_the_bar_load_file_shows(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Over 256 MiB, on a terminal, the copy shows the bar with the copy's name and the
        bytes copied of the whole; `progress=False` shows nothing."""

        class Terminal(io.StringIO):
            def isatty(self) -> bool:
                return True

        source = tmp_path / "in.safetensors"
        devpolicy.save_chunks(np.zeros(160 * 2**20, np.uint16), source, progress=False)
        screen = Terminal()
        monkeypatch.setattr(sys, "stderr", screen)
        monkeypatch.setenv("TERM", "xterm")
        devpolicy.align_file(source, tmp_path / "quiet.safetensors", progress=False)
        assert screen.getvalue() == ""
        devpolicy.align_file(source, tmp_path / "copy.safetensors")
        assert "copy.safetensors" in screen.getvalue()
        assert "320.0 MiB" in screen.getvalue()
