"""What the benchmark scripts share, written once: reading a process's memory (where the
kernel reports it, and under gVisor, where it does not), running a child process that
measures, Markdown tables, the machine's state, sizes, and the token files they read.

The tests may import this module (`tests/helpers.py` takes its token-file writers from
here); it imports nothing from the tests. At import it takes only the standard library: a
child process imports it (see `child_code`) before anything it measures, and numpy, JAX
and devpolicy are imported by the functions that need them.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import mmap
import os
import platform
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

#: The checkout: the folder above `benchmarks/`.
REPO = Path(__file__).resolve().parent.parent

# --- memory ----------------------------------------------------------------------------


def status(field: str) -> int | None:
    """The `field` line of `/proc/self/status` (`VmRSS`, `VmHWM`, `RssAnon`, `RssFile`) in
    bytes, or None where the kernel does not report it: gVisor (a TPU VM's sandbox) has no
    `VmHWM` and no meaningful `VmRSS`, and a system without /proc has none at all. A
    benchmark shows None as `n/a` rather than failing after minutes of work."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_rss() -> tuple[int | None, str]:
    """This process's peak resident memory so far, in bytes, and where it was read:
    `VmHWM` where the kernel keeps it; else `getrusage`'s `ru_maxrss` (gVisor keeps no
    `VmHWM`, but counts this); else `(None, "none")`. Read in the process itself: the
    `ru_maxrss` a parent's `wait4` reports can include the pages a fork copied."""
    found = status("VmHWM")
    if found is not None:
        return found, "VmHWM"
    import resource  # Unix only: imported where it is read

    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    maxrss *= 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
    return (maxrss, "ru_maxrss") if maxrss else (None, "none")


def growth(after: int | None, before: int | None) -> int | None:
    """`after - before`, or None where either was not reported (`status` under gVisor)."""
    return None if after is None or before is None else after - before


def median_known(values: Iterable[float | None]) -> float | None:
    """The median of the values that were reported (None: not reported, `status` under
    gVisor), or None where none was."""
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


class PeakRise:
    """How far this process's resident memory rose above what it was when this was made:
    call it after the work measured. Where the kernel keeps `VmHWM`, the high-water mark
    is first reset (`/proc/self/clear_refs`, where this process may write it) so that an
    earlier peak (the imports, building the inputs) does not stand in for the work's, and
    the rise is the peak over `VmRSS` now. Under gVisor the rise is `ru_maxrss` over its
    value now: what the work added above every earlier peak."""

    def __init__(self) -> None:
        _, self.source = peak_rss()
        if self.source == "VmHWM":
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")  # the peak is what is resident now: VmHWM starts afresh
            except OSError:
                pass
            self.base = status("VmRSS")
        else:
            self.base = peak_rss()[0]

    def __call__(self) -> int | None:
        return growth(peak_rss()[0], self.base)


def statm_file_backed() -> int | None:
    """This process's resident file-backed memory as `/proc/self/statm` counts it (its
    third field), or None where there is no statm."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[2]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return None


@cache
def statm_counts_file_pages() -> bool:
    """Whether statm's third field grows when a file's pages are mapped in: not under
    gVisor, where it stays 0 (a column of it would read 0 for every reader). Found once,
    by mapping in 4 MiB of a temporary file."""
    if not sys.platform.startswith("linux"):
        return False
    with tempfile.TemporaryFile() as f:
        f.write(b"\1" * (4 * 2**20))
        f.flush()
        with mmap.mmap(f.fileno(), 4 * 2**20, prot=mmap.PROT_READ) as mapped:
            before = statm_file_backed()
            touched = sum(mapped[i] for i in range(0, len(mapped), mmap.PAGESIZE))
            after = statm_file_backed()
    return touched > 0 and before is not None and after is not None and after - before >= 2**20


def file_backed_bytes() -> int | None:
    """This process's resident file-backed memory, or None where the kernel does not
    count it (`statm_counts_file_pages`)."""
    return statm_file_backed() if statm_counts_file_pages() else None


# --- child processes -------------------------------------------------------------------


def child_env(*, cpu_devices: int | None = None, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment for a child that measures: without `DEVPOLICY_*` (a
    policy's variables set in this shell would steer what is measured) nor any variable
    starting with one of `drop`; with `cpu_devices`, `XLA_FLAGS` replaced by that many fake
    host devices."""
    leave = ("DEVPOLICY_", *drop, *(("XLA_FLAGS",) if cpu_devices is not None else ()))
    env = {k: v for k, v in os.environ.items() if not k.startswith(leave)}
    if cpu_devices is not None:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={cpu_devices}"
    return env


def child_code(body: str) -> str:
    """`body`, code for `python -c`, after a line that puts the checkout last on the
    import path: the child can import `benchmarks._common` (to read its memory), and an
    interpreter of another environment still imports its own devpolicy first."""
    return f"import sys; sys.path.append({str(REPO)!r})\n{body}"


def run_child(
    code: str,
    *args: object,
    what: str,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> list[dict[str, Any]]:
    """Run `code` (`child_code` put first) as `python -c CODE ARGS...` in a fresh process,
    its environment `env` (default `child_env()`); each JSON object it printed on a line of
    its own, in order. Its stderr is kept and shown only when it fails: then SystemExit,
    naming `what`, the exit status and the end of its stderr."""
    proc = subprocess.run(
        [python, "-c", child_code(code), *map(str, args)],
        capture_output=True,
        text=True,
        env=child_env() if env is None else env,
        cwd=cwd,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed with exit code {proc.returncode}:\n{proc.stderr[-4000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (a job's coordinator, a server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- tables and the machine's state ----------------------------------------------------


def markdown_table(heads: Sequence[object], rows: Iterable[Sequence[object]]) -> list[str]:
    """A Markdown table's lines: the heads, the rule under them, then a line a row (an
    empty cell left blank)."""

    def line(cells: Sequence[object]) -> str:
        return "|" + "".join(f" {cell} |" if str(cell) else " |" for cell in cells)

    return [line(heads), "|" + "---|" * len(heads), *(line(cells) for cells in rows)]


def text_table(rows: Sequence[tuple[str, str, str]]) -> str:
    """Rows of three cells as plain text, the first two columns padded to one width (a
    terminal's table, and a code block's in Markdown)."""
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(
        f"{a.ljust(widths[0])}  {b.ljust(widths[1])}  {c}".rstrip() for a, b, c in rows
    )


class Report:
    """The lines a benchmark prints, kept to be written to its results file as Markdown."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


@dataclass(frozen=True)
class MachineState:
    """When and on what a run was measured: a figure is read against its machine and its
    load (a shared 2-core machine at load 2 is not an idle one)."""

    date: str
    machine: str
    cores: int | None
    load: tuple[float, float, float] | None
    python: str
    jax: str
    devpolicy: str
    system: str

    def load_text(self) -> str:
        """The load average over 1, 5 and 15 minutes, or `not known`."""
        return "not known" if self.load is None else ", ".join(f"{x:.2f}" for x in self.load)

    def lines(self) -> list[str]:
        """The state as a Markdown list, for the head of a results file."""
        return [
            f"- date: {self.date}",
            f"- cores: {self.cores}; load average (1, 5, 15 min) at start: {self.load_text()}",
            f"- Python {self.python}, jax {self.jax}, devpolicy {self.devpolicy}, {self.system}",
        ]


def machine_state() -> MachineState:
    """The machine's state now: the date (UTC), the machine, its cores and load average,
    the versions of Python, jax and devpolicy (jax's from its installed metadata: JAX is
    not imported, nor its backend started, to say it)."""
    import devpolicy

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return MachineState(
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        machine=platform.machine(),
        cores=os.cpu_count(),
        load=load,
        python=platform.python_version(),
        jax=_version("jax"),
        devpolicy=getattr(devpolicy, "__version__", "?"),
        system=f"{platform.system()} {platform.release()} {platform.machine()}",
    )


def shown_argv(argv: Sequence[str], paths: tuple[str, ...] = ("--dir", "--out")) -> list[str]:
    """The arguments that shape the results, to print with them: not the options in
    `paths` and their values (where the files were written or the results go: paths of
    this machine)."""
    shown: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in paths:
            skip = True
        elif not arg.startswith(tuple(f"{p}=" for p in paths)):
            shown.append(arg)
    return shown


def at_least_one(text: str) -> int:
    """An argparse type: a whole number of 1 or more (argparse names the option)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


# --- sizes -----------------------------------------------------------------------------


def gib(n: float | None) -> str:
    """`n` bytes in GiB, two decimals (`n/a` for None: not reported)."""
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def mib(n: float | None) -> str:
    """`n` bytes in whole MiB (`n/a` for None: not reported)."""
    return "n/a" if n is None else f"{n / 2**20:.0f} MiB"


def shown_size(n: float | None) -> str:
    """GiB, or MiB below a tenth of one (a flat peak shows as its few MiB, not 0.00 GiB)."""
    return gib(n) if n is None or n >= 0.1 * 2**30 else f"{n / 2**20:.1f} MiB"


# --- token files -----------------------------------------------------------------------


def dense_tensor_file(
    path: Path, elements: int, key: str = "tokens", *, vocab: int = 32_000, seed: int = 0
) -> Path:
    """A safetensors file of one 1-D uint16 tensor of random tokens below `vocab`, every
    byte written (what a real token file is: no holes, which read as no data does), its
    data 64-byte aligned so that `load_file` maps it. Written 64 MiB at a time, under a
    temporary name renamed to `path` once whole (a run cut short leaves no short file)."""
    import numpy as np

    header = {key: {"dtype": "U16", "shape": [elements], "data_offsets": [0, elements * 2]}}
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 64)
    rng = np.random.default_rng(seed)
    chunk = 32 * 2**20  # tokens a write
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for first in range(0, elements, chunk):
            count = min(chunk, elements - first)
            # 32-bit draws seen as two tokens each: the fastest random bytes numpy makes.
            words = rng.integers(0, 2**32, -(-count // 2), dtype=np.uint32)
            tokens = words.view(np.uint16)[:count]
            tokens %= vocab
            f.write(memoryview(tokens))
    partial.rename(path)
    return path


def sparse_tensor_file(path: Path, elements: int, key: str = "tokens", dtype: str = "U16") -> Path:
    """A header-correct safetensors file of one 1-D tensor whose data is a hole: its full
    size on paper, almost nothing on disk (only headers are read by `plan`)."""
    width = {"U16": 2, "F32": 4, "U8": 1}[dtype]
    header = {key: {"dtype": dtype, "shape": [elements], "data_offsets": [0, elements * width]}}
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 64)  # the data starts 64-byte aligned: mappable
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + elements * width)
    return path


def drop_from_page_cache(path: Path, start: int = 0) -> None:
    """Write `path`'s pages to disk and drop them, from byte `start` on, from the page
    cache (Linux; elsewhere, or where the filesystem keeps them, nothing happens: measure
    what is cached)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, start, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_through(path: Path) -> None:
    """Read `path` once from start to end, so that its pages are in the page cache (warm),
    as a long training run finds its token file: no run then pays the cache's first fill."""
    with open(path, "rb", buffering=0) as f:
        chunk = bytearray(64 * 2**20)
        while f.readinto(chunk):
            pass
