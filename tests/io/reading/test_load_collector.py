"""The load's pause of Python's cyclic garbage collector (issue 28, D2): only around the
hot loops, only while no other Python thread runs, the process's own state restored
exactly, and reset in a child forked meanwhile."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog
from structlog.testing import LogCapture

import devpolicy
from devpolicy._io.reading import load as _load
from tests.conftest import REPO

POLICY = {"version": 1}


def file_of(tmp_path: Path, count: int) -> Path:
    path = tmp_path / "m.safetensors"
    devpolicy.save_file({f"w{i}": np.full(4 + i % 7, i, np.float32) for i in range(count)}, path)
    return path


def _others() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t is not threading.current_thread()]


@pytest.fixture
def alone() -> None:
    """The test starts with no other Python thread (what the pause asks for); a stream's
    compile thread, which ends with its compile, is waited for."""
    for thread in _others():
        if thread.name == "devpolicy-compile":
            thread.join(timeout=60)
    assert not _others(), f"threads left running by earlier tests: {_others()}"


@pytest.fixture
def inside_the_load(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Calls appended here run inside the load's hot loop (each file's placing), once."""
    calls: list[Any] = []
    placing = _load._load_opened

    def spying(*args: Any) -> Any:
        for call in calls:
            call()
        calls.clear()
        return placing(*args)

    monkeypatch.setattr(_load, "_load_opened", spying)
    return calls


class TestPausedWhileAlone:
    def test_off_in_the_hot_loop_and_on_after(
        self, tmp_path: Path, alone: None, inside_the_load: list[Any]
    ) -> None:
        """With no other Python thread, the collector is off while a file's tensors are
        placed, and on again after."""
        seen: list[bool] = []
        inside_the_load.append(lambda: seen.append(gc.isenabled()))
        assert gc.isenabled()
        devpolicy.load_file(file_of(tmp_path, 3), policy=devpolicy.load_policy(POLICY))
        assert seen == [False]
        assert gc.isenabled()

    def test_on_again_after_a_failed_load(self, tmp_path: Path) -> None:
        """A load that fails leaves the collector on."""
        bad = tmp_path / "bad.safetensors"
        bad.write_bytes(b"\x00" * 4)
        with pytest.raises(devpolicy.DevicePolicyError, match=r"bad\.safetensors"):
            devpolicy.load_file(bad, policy=devpolicy.load_policy(POLICY))
        assert gc.isenabled()

    def test_left_off_where_the_application_turned_it_off(self, tmp_path: Path) -> None:
        """An application that turned the collector off before the load finds it off after."""
        gc.disable()
        try:
            devpolicy.load_file(file_of(tmp_path, 3), policy=devpolicy.load_policy(POLICY))
            assert not gc.isenabled()
        finally:
            gc.enable()

    def test_events_are_emitted_with_the_collector_on(self, tmp_path: Path, alone: None) -> None:
        """Outside the hot loops (the events, the application's log processors) the
        collector is as the application left it."""
        capture = LogCapture()

        def note(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
            event["collector_on"] = gc.isenabled()
            return event

        structlog.configure(processors=[note, capture])
        devpolicy.load_file(file_of(tmp_path, 3), policy=devpolicy.load_policy(POLICY))
        loaded = [e for e in capture.entries if e["event"] == "load_file"]
        assert loaded
        assert all(e["collector_on"] for e in loaded)


class TestNeverPausedBesideAnotherThread:
    def test_another_thread_never_sees_the_collector_off(self, tmp_path: Path, alone: None) -> None:
        """While another Python thread runs (and could make reference cycles), a load
        leaves the collector on: it saw it off all through a load of many tensors."""
        path = file_of(tmp_path, 2000)
        policy = devpolicy.load_policy(POLICY)
        done = threading.Event()
        seen: list[bool] = []

        def watch() -> None:
            while not done.is_set():
                seen.append(gc.isenabled())
                done.wait(0.0005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            devpolicy.load_file(path, policy=policy)
        finally:
            done.set()
            watcher.join()
        assert seen
        assert all(seen)

    def test_the_applications_gc_disable_during_a_load_is_kept(
        self, tmp_path: Path, alone: None, inside_the_load: list[Any]
    ) -> None:
        """An application thread that turns the collector off while a load runs finds it
        off after the load: the load restores only what it changed."""
        go, done = threading.Event(), threading.Event()

        def application() -> None:
            go.wait(60)
            gc.disable()
            done.set()

        thread = threading.Thread(target=application)
        thread.start()

        def meanwhile() -> None:
            go.set()
            assert done.wait(60)

        inside_the_load.append(meanwhile)
        try:
            devpolicy.load_file(file_of(tmp_path, 3), policy=devpolicy.load_policy(POLICY))
            thread.join(60)
            assert not gc.isenabled()
        finally:
            gc.enable()


_FORK_DURING_LOAD = """
    import gc, json, os, sys, numpy as np, devpolicy
    from devpolicy._io.reading import load as _load
    policy = devpolicy.load_policy({"version": 1, "logging": {"level": "error"}}, environ={})
    devpolicy.save_file({f"w{i}": np.ones(4, np.float32) for i in range(10)}, "m.safetensors")
    placing = _load._load_opened
    child = []
    def forking(*args):
        if not child:
            pid = os.fork()
            if pid == 0:  # the child: it never finishes the parent's load
                before = gc.isenabled()
                # What its own loads do around their hot loops (a forked JAX process
                # cannot run JAX: it has none of the parent's threads).
                with _load._collector_paused():
                    pass
                os._exit((0 if before else 1) + (0 if gc.isenabled() else 2))
            child.append(pid)
        return placing(*args)
    _load._load_opened = forking
    devpolicy.load_file("m.safetensors", policy=policy)
    _, status = os.waitpid(child[0], 0)
    print(json.dumps({"child": os.waitstatus_to_exitcode(status), "parent": gc.isenabled()}))
"""


class TestForkedChild:
    @pytest.mark.slow
    def test_a_child_forked_during_a_load_has_the_collector_on(self, tmp_path: Path) -> None:
        """A child forked while a load has the collector off starts with it on (the
        process's state before the load), and its own loads leave it on."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVPOLICY_")}
        env["PYTHONPATH"] = str(REPO)
        result = subprocess.run(
            [sys.executable, "-W", "ignore", "-c", textwrap.dedent(_FORK_DURING_LOAD)],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
            cwd=tmp_path,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert report == {"child": 0, "parent": True}
