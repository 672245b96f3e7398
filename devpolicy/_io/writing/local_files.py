"""Writing safetensors files: atomically (a new file renamed into place), so an error or a
signal never leaves a truncated file, and laid out by `layout` for zero-copy loading.

Also a file several processes write together (`LocalJointFile`: laid out in advance,
each process's runs written in place, renamed last), copying a file into that layout
(`align_file`) and what is left of writers killed mid-write (`remove_stale_temp_files`).
No JAX here.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import os
import re
import signal
import socket
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..._base.errors import SafetensorsFileError
from ..._base.files import kind, sync_directory, why_unopenable
from ..._base.locations import URLPath, is_url, shown_url
from ..._base.progress import progress_bar
from ..format.header import PACKED, Header, encodable, pack, read_header
from ..format.layout import DEFAULT_ALIGN, Slot, check_align, plan_layout, slots_of
from ..format.sources import SourceEndedError, open_tensor_file
from .sparse import SparseSink

#: Named temporary files of `save_arrays`/`align_file` (where the filesystem has no
#: `O_TMPFILE`) are `.<name>.devpolicy-<host>-<pid>-<random>.tmp` beside the target (so a
#: rename replaces it atomically). One left by a process killed where no handler could
#: run is removed by the next save of the same target, once that host's process is gone.
TEMP_PATTERN = ".{name}.devpolicy-*.tmp"
#: Bytes copied at a time by `rewrite_aligned`: memory stays flat however large the file.
_COPY_BYTES = 64 * 2**20


def write_file(
    tensors: Mapping[str, np.ndarray[Any, Any]],
    path: str | os.PathLike[str],
    *,
    align: int = DEFAULT_ALIGN,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write numpy arrays as a safetensors file whose largest tensors start `align`-aligned.

    Written to a temporary file beside `path` and renamed into place: an error leaves no
    partial file. `metadata` (even `{}`) is written as the header's `__metadata__`.
    """
    check_align(align)
    check_local(path)
    # ascontiguousarray would turn 0-d arrays into 1-d ones; big-endian arrays are swapped.
    arrays = {
        key: np.require(value.astype(value.dtype.newbyteorder("="), copy=False), requirements="C")
        for key, value in tensors.items()
    }
    check_metadata(metadata, path)
    header, order = plan_layout(slots_of(arrays, Path(path)), metadata, align)

    def write_data(out: Any) -> None:
        for slot in order:
            array = arrays[slot.key]
            if slot.dtype_name in PACKED:
                out.write(pack(array).data)
            elif array.nbytes:
                out.write(array.reshape(-1).view(np.uint8).data)

    _atomic_write(Path(path), header, write_data)


def check_local(path: str | os.PathLike[str]) -> None:
    """Refuse a URL as a place for a local write: `Path` would read `s3://b/m` as the
    local `s3:/b/m` and write there if such a folder happened to exist."""
    if is_url(path):
        raise SafetensorsFileError(
            shown_url(str(path)),
            "cannot write to a URL: devpolicy reads URLs (load_file, plan, read_metadata) "
            "and saves to s3:// with save_file; align a local file and upload it with the "
            "storage's own tool",
        )


def check_metadata(metadata: object, path: str | os.PathLike[str] | URLPath) -> None:
    """Refuse metadata a header cannot hold: strings to strings, each encodable as UTF-8.

    Raises:
        ValueError: not a mapping of strings to strings.
        SafetensorsFileError: a key or value no safetensors reader could read back.
    """
    if metadata is not None and not (
        isinstance(metadata, Mapping)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise ValueError(f"metadata must map strings to strings, got {metadata!r}")
    for k, v in (metadata or {}).items():
        if not (encodable(k) and encodable(v)):
            raise SafetensorsFileError(
                path,
                f"metadata {k!r} holds a lone UTF-16 surrogate, which UTF-8 cannot encode: no "
                "safetensors reader could read it back; nothing written",
            )


def rewrite_aligned(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    *,
    align: int = DEFAULT_ALIGN,
    progress: bool | None = None,
) -> Header:
    """Rewrite a safetensors file so its largest tensors start at `align`-byte offsets.

    Streams each tensor's bytes (64 MiB at a time), so memory does not grow with the file;
    runs of zeros are left out as holes where a reader can read them back (`sparse`).
    `progress`: the terminal bar, as `align_file` says. Returns the new file's header.
    """
    check_align(align)
    check_local(destination)
    header = read_header(source)
    slots = [Slot(t.key, t.dtype_name, t.shape, t.nbytes) for t in header.tensors]
    by_key = {t.key: t for t in header.tensors}
    new_header, order = plan_layout(slots, header.metadata, align)

    def copy_data(out: Any) -> None:
        largest = max((t.nbytes for t in header.tensors), default=0)
        chunk = np.empty(min(largest, _COPY_BYTES), np.uint8)
        total = sum(t.nbytes for t in header.tensors)
        with (
            progress_bar(Path(destination).name, total, progress) as advance,
            open_tensor_file(source) as f,
        ):
            sink = SparseSink(out, 8 + len(new_header), destination, advance)
            for slot in order:
                entry = by_key[slot.key]
                for start in range(0, entry.nbytes, _COPY_BYTES):
                    piece = chunk[: min(_COPY_BYTES, entry.nbytes - start)]
                    try:
                        f.read_into(entry.offset + start, piece.data)
                    except SourceEndedError:
                        raise SafetensorsFileError(
                            source, "file shrank while being read", tensor=slot.key
                        ) from None
                    sink.write(piece)
            sink.finish()

    _atomic_write(Path(destination), new_header, copy_data)
    return read_header(destination)


def _atomic_write(path: Path, header: bytes, write_data: Callable[[Any], None]) -> None:
    """Write a new file and rename it over `path`: never truncated or half-written in place.

    A symlink is written through (its target is replaced, the link kept), an existing file
    keeps its permission bits and, where this process may give them (root may), its owner
    and group (`_keep_attributes`), and anything that exists but is not a regular file (a
    device, a FIFO, a directory) or a symlink loop is refused before anything is written.
    The data goes to an unnamed file (`O_TMPFILE`) given a name only once complete, so a
    process killed in any thread, by any signal, leaves nothing; where the filesystem
    cannot do that (NFS), to a named temporary file (`TEMP_PATTERN`) removed on any error,
    on the signals that can be caught (`_removed_on_signals`) and when the interpreter exits
    with it unfinished (a daemon thread's); one a kill left is removed by the next save of
    `path`.
    """
    target, directory, existing, prefix = _prepared_target(path)
    try:
        fd, tmp = _temporary(directory, prefix)
    except OSError as e:
        raise SafetensorsFileError(
            path, f"cannot write in {str(directory)!r}: {e.strerror}"
        ) from None
    try:
        with temporaries_removed_on_sigterm(named=tmp is not None):
            try:
                _keep_attributes(fd, existing)
                with os.fdopen(fd, "wb") as out:
                    out.write(len(header).to_bytes(8, "little"))
                    out.write(header)
                    write_data(out)
                    out.flush()
                    os.fsync(out.fileno())
                    if tmp is None:  # complete: only now does it get a name
                        tmp = _named(out.fileno(), directory, prefix)
                os.replace(tmp, target)
            except OSError as e:
                raise SafetensorsFileError(path, f"cannot write: {e.strerror or e}") from None
            except BaseException:  # before a signal's kill: the file goes first
                if tmp is not None:
                    Path(tmp).unlink(missing_ok=True)
                raise
    finally:
        if tmp is not None:
            _in_flight.discard(tmp)


def _where(path: Path) -> tuple[Path, Path]:
    """(the file a write replaces, its directory): a symlink is written through."""
    target = Path(os.path.realpath(path)) if os.path.islink(path) else path
    return target, target.parent if str(target.parent) else Path(".")


def _prepared_target(path: Path) -> tuple[Path, Path, os.stat_result | None, str]:
    """(target, directory, the status of the file replaced or None, the temporary name's
    prefix) for a write of `path`, or a refusal before anything is written: a missing
    directory, a symlink loop, or something there that is not a regular file. Leftovers of
    this host's dead saves of `path` are removed first; the prefix is `TEMP_PATTERN`'s with
    this host and process.
    """
    target, directory = _where(path)
    if not directory.is_dir():
        what = "does not exist" if not os.path.lexists(directory) else "is not a directory"
        raise SafetensorsFileError(path, f"cannot write: the directory {str(directory)!r} {what}")
    try:
        info: os.stat_result | None = os.stat(target)
    except OSError as e:
        if e.errno == errno.ELOOP:  # else the rename would replace one link of the loop
            raise SafetensorsFileError(
                path, f"cannot write: it is a {why_unopenable(path, e)}; nothing written"
            ) from None
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        shown = f" (the symlink's target {str(target)!r})" if target != path else ""
        raise SafetensorsFileError(
            path,
            f"cannot write: it is {kind(info.st_mode)}{shown}, not a regular file; "
            "only a regular file (or a new path) is replaced",
        )
    remove_stale_temp_files(target)
    return target, directory, info, f".{target.name}.devpolicy-{host_tag()}-{os.getpid()}-"


def _keep_attributes(fd: int, existing: os.stat_result | None) -> None:
    """Give the new file `fd` what the file it replaces had: its permission bits, and its
    owner and group where this process may give them (root may; anyone the group, being
    in it). Where it may not, the file is the writer's, as a new file would be. A new path
    gets what a plain open() would give it."""
    if existing is None:
        os.fchmod(fd, 0o666 & ~_umask())
        return
    mine = os.fstat(fd)
    if (mine.st_uid, mine.st_gid) != (existing.st_uid, existing.st_gid):
        # Before the mode: a change of owner clears the set-user-ID and set-group-ID bits.
        for uid in (existing.st_uid, -1):
            try:
                os.fchown(fd, uid, existing.st_gid)
                break
            except PermissionError:
                continue
    os.fchmod(fd, stat.S_IMODE(existing.st_mode))


#: Named temporary files being written, by any thread: the signal handler (main thread
#: only, where Python runs handlers) and the exit handler remove them all. A set's add,
#: discard and copy are each one step under the GIL, so the handlers need no lock (a lock
#: the interrupted main thread held would deadlock them).
_in_flight: set[str] = set()


def _remove_in_flight() -> None:
    """Remove every temporary file still being written (by any thread)."""
    for tmp in tuple(_in_flight):
        with contextlib.suppress(OSError):
            os.unlink(tmp)


# When the interpreter exits with a save unfinished (a daemon thread's; a worker Python
# stops waiting for once Ctrl-C lands in its join()), that save's file goes too. Python
# runs exit handlers after waiting for the threads it waits for: those have finished.
atexit.register(_remove_in_flight)
# A child forked mid-save has none of the parent's saves in flight: on its exit, or on a
# signal, it must not remove the parent's files.
os.register_at_fork(after_in_child=_in_flight.clear)


def _temporary(directory: Path, prefix: str) -> tuple[int, str | None]:
    """A file to write in `directory`: (descriptor, None) for an unnamed one, else its name."""
    if _TMPFILE:
        try:
            return os.open(directory, _TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600), None
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    return _named_temporary(directory, prefix)


_Made = TypeVar("_Made")


def _named_temporary(directory: Path, prefix: str) -> tuple[int, str]:
    """A new named temporary file in `directory`: (descriptor, name), `_in_flight`."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    tmp, fd = _claim_name(directory, prefix, lambda path, _: os.open(path, flags, 0o600))
    return fd, tmp


def _claim_name(
    directory: Path, prefix: str, create: Callable[[str, str], _Made]
) -> tuple[str, _Made]:
    """A free temporary name in `directory` that `create(path, name)` made a file of
    (raising FileExistsError when taken), and what `create` returned: recorded in
    `_in_flight` before it exists, so a signal between the two removes nothing else."""
    for _ in range(100):
        name = f"{prefix}{os.urandom(6).hex()}.tmp"
        tmp = str(directory / name)
        _in_flight.add(tmp)
        try:
            made = create(tmp, name)
        except FileExistsError:
            _in_flight.discard(tmp)
            continue
        except BaseException:
            _in_flight.discard(tmp)
            raise
        return tmp, made
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(directory))


@functools.cache
def host_tag() -> str:
    """This machine in temporary files' names: its host name, made safe for a file name.

    On storage several machines share (NFS), a process id alone says nothing: only a
    temporary file of this host is judged by whether its process is alive.
    """
    name = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname().split(".")[0])[:32]
    return name or "host"


def _named(fd: int, directory: Path, prefix: str) -> str:
    """Give the complete unnamed file `fd` a temporary name beside its target."""
    # linkat(AT_SYMLINK_FOLLOW) on /proc/self/fd/N: Python calls linkat (not link, which
    # would link the /proc symlink itself) only when given a directory descriptor.
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        tmp, _ = _claim_name(
            directory,
            prefix,
            lambda _, name: os.link(
                f"/proc/self/fd/{fd}", name, dst_dir_fd=directory_fd, follow_symlinks=True
            ),
        )
        return tmp
    finally:
        os.close(directory_fd)


# Unnamed files need O_TMPFILE (Linux) and /proc to name them by descriptor afterwards.
_TMPFILE = getattr(os, "O_TMPFILE", 0) if os.path.isdir("/proc/self/fd") else 0


def remove_stale_temp_files(target: Path) -> list[Path]:
    """Remove temporary files of ours for `target` whose writing process is gone: of this
    host (`host_tag`), with the pid of no live process.

    Files of other hosts are kept (their pids mean nothing here), and so are those of the
    first form (`.<name>.devpolicy-<pid>-<random>.tmp`, no host) whose pid is alive.

    Returns:
        The files removed.
    """
    removed = []
    start = len(f".{target.name}.devpolicy-")
    for candidate in target.parent.glob(TEMP_PATTERN.format(name=glob_escape(target.name))):
        parts = candidate.name[start : -len(".tmp")].rsplit("-", 2)
        if len(parts) == 3:
            host, pid_text, _ = parts
        elif len(parts) == 2:  # written before the host was part of the name
            host, pid_text = host_tag(), parts[0]
        else:
            continue
        if host != host_tag() or not pid_text.isdigit() or _alive(int(pid_text)):
            continue
        try:
            candidate.unlink()
        except OSError:
            continue
        removed.append(candidate)
    return removed


def glob_escape(text: str) -> str:
    """`text` with glob metacharacters matched literally."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's live process
        return True
    return True


class _Terminated(BaseException):
    """A signal that would have ended the process arrived while writing: unwind (removing
    the temporary file), then die of it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    def __str__(self) -> str:  # what a joint save tells the other processes
        return f"terminated by {signal.Signals(self.signum).name}"


#: Signals whose default action ends the process, cleaned up after where Python may run a
#: handler. SIGINT's is usually Python's own (KeyboardInterrupt, which unwinds the save
#: like any exception); it is taken only where the application made it the default.
_FATAL = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def _removed_on_signals(*, named: bool) -> Iterator[None]:
    """While a named temporary file is written on the main thread: SIGTERM, SIGINT and
    SIGHUP, where they would end the process outright (their default action), first
    remove every thread's temporary files, then end it as they would have.

    A library must not take over signals: a signal the application handles is left to
    it (its handler runs; if it exits, the exit handler removes the files), and outside
    a save nothing is changed. Python runs handlers on the main thread only and lets
    only the main thread install them, so a save on another thread installs none: there
    SIGTERM's default action ends the process with no Python code run, as SIGKILL does,
    and the next save of the same target removes what it left.
    """
    if not named or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        _remove_in_flight()
        raise _Terminated(signum)

    taken = [s for s in _FATAL if signal.getsignal(s) is signal.SIG_DFL]
    for signum in taken:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum in taken:
            signal.signal(signum, signal.SIG_DFL)


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    current = os.umask(0o022)  # no way to read it without setting it elsewhere
    os.umask(current)
    return current


class _UnfinishedFileGoneError(SafetensorsFileError):
    """The unfinished file process 0 created is not where this process looks: another
    filesystem, or process 0 failed and removed it (which its verdict then says)."""


class LocalJointFile:
    """A file several processes write together on a filesystem they all see (one machine's,
    or one shared between hosts): laid out in advance, each process's byte runs written in
    place, named last. What `joint.JointTarget` asks of a place a joint save writes to.

    Process 0 `create`s a named temporary file beside the target, sized to the whole file
    with its header written; every process (process 0 too) `write`s its pieces with
    `pwrite` at their offsets and syncs them (on a filesystem shared between hosts only the
    writer's sync sends its pages); once every process has, process 0 `publish`es it with a
    rename (readers never see a half file), or `discard`s it. The temporary file is named
    as `save_arrays`' are (`TEMP_PATTERN`, process 0's pid): one left by a killed job is
    removed by the next save of the same target on that host.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def create(self, header: bytes, size: int) -> str:
        """Make the unfinished file, `size` bytes with `header` (and its length) written at
        the start; return the name every process opens it by."""
        _, directory, existing, prefix = _prepared_target(self.path)
        try:
            fd, tmp = _named_temporary(directory, prefix)
        except OSError as e:
            raise SafetensorsFileError(
                self.path, f"cannot write in {str(directory)!r}: {e.strerror}"
            ) from None
        try:
            _keep_attributes(fd, existing)
            os.ftruncate(fd, size)  # sparse until written: every process's runs fill it
            _pwrite_all(fd, memoryview(len(header).to_bytes(8, "little") + header), 0)
        except BaseException as e:
            self.discard(os.path.basename(tmp))
            if isinstance(e, OSError):
                raise SafetensorsFileError(self.path, f"cannot write: {e.strerror or e}") from None
            raise
        finally:
            os.close(fd)
        return os.path.basename(tmp)

    def write(
        self, token: str, pieces: Iterable[tuple[int, memoryview]], parts: object = None
    ) -> tuple[int, str]:
        """Write each (file offset, bytes) into the unfinished file and sync them; return
        (bytes written, a receipt for `publish`: nothing for a file). `parts` is for an
        upload in parts: a file takes the pieces where they fall."""
        tmp = _where(self.path)[1] / token
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise _UnfinishedFileGoneError(
                self.path,
                f"the unfinished file {token!r} that process 0 created is not in "
                f"{str(tmp.parent)!r} here: every process of a multi-process save must see "
                "the same filesystem (one shared between hosts)",
            ) from None
        except OSError as e:
            raise SafetensorsFileError(self.path, f"cannot write: {e.strerror or e}") from None
        written = 0
        try:
            for offset, data in pieces:
                _pwrite_all(fd, data, offset)
                written += len(data)
            os.fsync(fd)
        except OSError as e:
            raise SafetensorsFileError(self.path, f"cannot write: {e.strerror or e}") from None
        finally:
            os.close(fd)
        return written, ""

    def publish(self, token: str, receipts: Sequence[str]) -> None:
        """Name the complete file: sync it, rename it over the target, sync the directory."""
        del receipts  # a file needs none: every process synced its own writes
        target, directory = _where(self.path)
        tmp = directory / token
        try:
            fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, target)
        except OSError as e:
            raise SafetensorsFileError(self.path, f"cannot write: {e.strerror or e}") from None
        _in_flight.discard(str(tmp))
        sync_directory(directory)
        remove_stale_temp_files(target)

    def discard(self, token: str) -> None:
        """Remove the unfinished file (any process may; missing is fine)."""
        tmp = str(_where(self.path)[1] / token)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        _in_flight.discard(tmp)


@contextlib.contextmanager
def temporaries_removed_on_sigterm(*, named: bool = True) -> Iterator[None]:
    """Around a write whose named temporary files are `_in_flight` (a joint save's, which
    waits for other processes; a single save's): SIGTERM, SIGINT or SIGHUP removes them,
    lets the block unwind (a joint save tells the other processes why), then kills the
    process as asked. `named` False: the file has no name yet (`O_TMPFILE`) and goes
    with the process, so nothing is installed."""
    try:
        with _removed_on_signals(named=named):
            yield
    except _Terminated as e:
        signal.signal(e.signum, signal.SIG_DFL)
        os.kill(os.getpid(), e.signum)
        raise


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """`pwrite` all of `data` at `offset` (a call may write less: Linux stops near 2 GiB)."""
    data = data.cast("B")
    while data:
        done = os.pwrite(fd, data, offset)
        data, offset = data[done:], offset + done


def save_arrays(
    tensors: Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    align: int = DEFAULT_ALIGN,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write a mapping of keys to arrays (numpy, JAX, or what `np.asarray` takes) as an
    aligned safetensors file; `devpolicy.save_file` also names a tree's leaves first."""
    check_align(align)  # before any array is converted or anything written
    arrays = {key: np.asarray(value) for key, value in tensors.items()}
    write_file(arrays, path, align=align, metadata=metadata)


def align_file(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    *,
    align: int = DEFAULT_ALIGN,
    progress: bool | None = None,
) -> None:
    """Copy a safetensors file so its largest tensors start at `align`-byte offsets.

    Streams the data, so memory stays flat however large the file. The copy loads
    zero-copy with `load_file(..., mmap=True)` or a rule with `mmap: true`. Runs of zeros
    stay holes, as `save_chunks` leaves them. `progress`: show the bar `load_file` shows
    (bytes copied, rate, time left) on a terminal: None (default) for a file over 256 MiB,
    True always, False never.

    Raises:
        SafetensorsFileError: `source` is not a readable safetensors file, or `destination`
            is a URL, exists but is not a regular file, or cannot be written; nothing is
            written.

    Example:
        >>> import devpolicy, numpy as np, tempfile, os
        >>> from safetensors.numpy import save_file as plain_save
        >>> d = tempfile.mkdtemp()
        >>> plain_save({"t": np.arange(100, dtype=np.uint16)}, os.path.join(d, "in.safetensors"))
        >>> source, copy = os.path.join(d, "in.safetensors"), os.path.join(d, "out.safetensors")
        >>> devpolicy.align_file(source, copy)
        >>> devpolicy.plan(copy).tensors[0].offset % 64
        0
    """
    rewrite_aligned(source, destination, align=align, progress=progress)
