"""Small helpers shared by the tests."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import devpolicy

# The token files, dropping a file from the page cache and a free port are the benchmarks'
# too: written once, in benchmarks/_common.py, and importable from here as before.
from benchmarks._common import dense_tensor_file as dense_tensor_file
from benchmarks._common import drop_from_page_cache as drop_from_page_cache
from benchmarks._common import free_port
from benchmarks._common import sparse_tensor_file as sparse_tensor_file
from tests.conftest import REPO


def write(path: Path, text: str) -> Path:
    """Write `text` (dedented by the caller) to `path` and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def policy_of(**fields: object) -> devpolicy.Policy:
    """A policy from keyword fields, version 1, no environment."""
    return devpolicy.load_policy({"version": 1, **fields}, environ={})


def run_threads(*targets: Callable[[], object], timeout: float = 120) -> None:
    """Start one thread per target, then wait for all of them."""
    threads = [threading.Thread(target=target) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a test thread did not finish"


def safetensors_bytes(header: object, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A safetensors file's bytes from a header (JSON-able, or raw bytes) and data.

    `length` overrides the 8-byte header length, to make files that lie about it.
    """
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def within(seconds: float, call: Callable[[], object]) -> object:
    """`call()`'s result or exception, failing the test (not hanging it) if it blocks.

    Runs in a daemon thread, so a call that blocks forever (a FIFO with no writer) cannot keep
    the test run from ending. The limit guards against hangs only; it measures nothing.
    """
    outcome: list[object] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as e:  # handed to the test thread below
            failure.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the call did not return within {seconds} s: it hangs"
    if failure:
        raise failure[0]
    return outcome[0]


def schema_form(schema: object) -> object:
    """A JSON Schema with pydantic's version-dependent spellings made one: pydantic before 2.9
    wraps a described reference as `{"allOf": [{"$ref": ...}], ...}`, later ones write `$ref`
    beside the description."""
    if isinstance(schema, list):
        return [schema_form(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: schema_form(value) for key, value in schema.items()}
    wrapped = out.get("allOf")
    if isinstance(wrapped, list) and len(wrapped) == 1 and list(wrapped[0]) == ["$ref"]:
        del out["allOf"]
        out["$ref"] = wrapped[0]["$ref"]
    return out


def _cpu_memory_kinds() -> set[str]:
    import jax

    return {m.kind for m in jax.local_devices(backend="cpu")[0].addressable_memories()}


#: CPU devices have `pinned_host` (and `device`) memory from jaxlib 0.7.1, only
#: `unpinned_host` before.
needs_cpu_pinned_host = pytest.mark.skipif(
    "pinned_host" not in _cpu_memory_kinds(),
    reason="this jaxlib's CPU devices have no pinned_host memory (from jaxlib 0.7.1)",
)


def count_data_reads(monkeypatch: pytest.MonkeyPatch, path: Path) -> list[int]:
    """The byte counts of the `preadv` calls that read `path`'s data from now on (the
    header goes through the same source and is left out), filled as a load runs."""
    import os

    from devpolicy._io.format import sources
    from devpolicy._io.format.header import read_header

    reads: list[int] = []
    real = os.preadv
    data_start = read_header(path).data_start

    def counting(fd: int, buffers: list[memoryview], offset: int) -> int:
        n = real(fd, buffers, offset)
        if offset >= data_start:
            reads.append(n)
        return n

    monkeypatch.setattr(sources.os, "preadv", counting)
    return reads


@dataclass(frozen=True)
class Finished:
    """One process of a job, once it ended: its exit status, the last JSON object it
    printed on a line of its own (None if none: killed, or aborted by JAX), its stderr."""

    returncode: int
    report: dict[str, Any] | None
    stderr: str


def run_job(
    worker: Path,
    arguments: Sequence[Sequence[str]],
    *,
    environs: Sequence[Mapping[str, str]] = (),
    timeout: float = 240,
) -> list[Finished]:
    """Run `worker` as the processes of one jax.distributed job on 127.0.0.1, one per entry
    of `arguments` (each called with the coordinator's port and its index first), in an
    environment without DEVPOLICY_* and XLA_FLAGS plus that process's `environs` entry.
    Every process is ended (killed if need be) before this returns."""
    from tests.conftest import REPO

    port = free_port()
    base = {
        k: v for k, v in os.environ.items() if not k.startswith("DEVPOLICY_") and k != "XLA_FLAGS"
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(port), str(i), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**base, **(environs[i] if environs else {})},
            cwd=REPO,
        )
        for i, extra in enumerate(arguments)
    ]
    finished = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            report = json.loads(lines[-1]) if lines else None
            finished.append(Finished(proc.returncode, report, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return finished


def reports_of(finished: list[Finished]) -> list[dict[str, Any]]:
    """Each process's report, asserting that every process exited 0 and printed one."""
    for process in finished:
        assert process.returncode == 0, process.stderr[-3000:]
        assert process.report is not None, process.stderr[-3000:]
    return [process.report for process in finished if process.report is not None]


def run_script(code: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run `code` (dedented) in a fresh Python in `cwd`, this checkout importable and no
    devpolicy or XLA variable of the caller's environment passed on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOLICY_", "XLA_FLAGS"))}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        check=False,
    )
