"""Where a checkpoint file's bytes come from: the byte source every reader reads ranges of.

The header parser, the whole-tensor reader and the shard-range reader ask a `ByteSource`
for ranges of bytes; none of them opens a file. `LocalFile` is today's only source. A
source elsewhere (an object store, a web server) implements the same protocol, returns
None from `fileno()`, and the readers read it as they read a file: a new place bytes
live is a new source, not a second loader.

What only a local file allows stays a fast path behind `fileno()`: mapping the file
(zero-copy host arrays) and scattered reads of many small tensors with one `preadv`.
No JAX here.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from typing import Protocol

from ..._base.errors import SafetensorsFileError
from ..._base.files import DescriptorLimit, FileRefused, open_regular
from ..._base.locations import URLPath
from ..._read.exact import read_at


class ByteSource(Protocol):
    """Bytes of one checkpoint file, wherever they live; readers only ever ask for ranges.

    `read_into` and `read_many` may be called from several threads at once (the loader
    reads a large tensor's pieces on reader threads): a source reads by position, never
    by a shared file offset.

    A read that fails raises `OSError` (a network source's `ConnectionError` and
    `TimeoutError` are ones): the reader says it as an error naming the file and the
    tensor. A source that holds fewer bytes than a read asks for raises `SourceEndedError`,
    saying where its bytes stop. A read never returns short.
    """

    @property
    def name(self) -> str:
        """What events and errors show: the path, or the URL without credentials."""
        ...

    @property
    def size(self) -> int:
        """Total bytes, known at open."""
        ...

    def fileno(self) -> int | None:
        """A local descriptor the loader may map or `preadv` directly; None for remote sources."""
        ...

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill `buffer` exactly from `offset`, or raise (never short)."""
        ...

    def read_many(self, requests: Sequence[tuple[int, memoryview]]) -> None:
        """Fill each (offset, buffer); a source may read them concurrently; all or raise."""
        ...

    def close(self) -> None:
        """Let go of what the source holds (a descriptor, a connection)."""
        ...


class SourceEndedError(SafetensorsFileError):
    """A read asked for bytes past the end of a source (a file truncated under the reader).

    Attributes:
        end: Where the source's bytes stopped: the reader says how much of a tensor it got.
    """

    def __init__(self, name: str, offset: int, length: int, end: int) -> None:
        super().__init__(
            name, f"ended at byte {end}, reading {length} bytes at {offset}: truncated?"
        )
        self.end = end


class LocalFile:
    """A regular local file as a `ByteSource`: positional reads of one open descriptor.

    Opened through `_base.files`' safe opening (`LocalFile.open`): only regular files,
    never by blocking. Reads are `preadv` at an offset, so any number of threads may read
    at once. The descriptor is the loader's for the local fast paths (`fileno`).

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "b.bin")
        >>> with open(path, "wb") as f:
        ...     _ = f.write(bytes(range(10)))
        >>> with LocalFile.open(path) as source:
        ...     buffer = bytearray(3)
        ...     source.read_into(4, memoryview(buffer))
        ...     source.size, bytes(buffer)
        (10, b'\\x04\\x05\\x06')
    """

    __slots__ = ("_fd", "_name", "_size")

    def __init__(self, fd: int, name: str, size: int) -> None:
        """Take over an open descriptor of a regular file (closed by `close`)."""
        self._fd = fd
        self._name = name
        self._size = size

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> LocalFile:
        """Open a safetensors file for reading, with the loader's error messages.

        Only regular files are opened, and never by blocking: a FIFO, a device or a
        socket is refused at once, saying what it is.

        Raises:
            SafetensorsFileError: missing, unreadable, or not a regular file.
        """
        try:
            fd, info = open_regular(path, "a safetensors file")
        except FileRefused as e:
            # Out of descriptors is said with the limit and the fix, like every other EMFILE.
            cause = e.__context__
            if isinstance(cause, OSError) and cause.errno in (errno.EMFILE, errno.ENFILE):
                raise os_error(path, cause, "cannot open") from None
            raise SafetensorsFileError(path, e.reason) from None
        return cls(fd, os.fspath(path), info.st_size)

    @property
    def name(self) -> str:
        """The path it was opened by."""
        return self._name

    @property
    def size(self) -> int:
        """Its size in bytes when it was opened."""
        return self._size

    def fileno(self) -> int:
        """Its descriptor (-1 once closed)."""
        return self._fd

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill `buffer` from `offset`, in as many `preadv` calls as the kernel needs.

        Raises:
            SourceEndedError: the file ends before `buffer` is full, naming the file.
            OSError: the read failed (EIO, EBADF once closed).
        """
        total = len(buffer)
        done = read_at(self._fd, [buffer], offset)
        if done < total:
            raise SourceEndedError(self._name, offset, total, offset + done)

    def read_many(self, requests: Sequence[tuple[int, memoryview]]) -> None:
        """Fill each (offset, buffer) in turn, on this thread.

        The loader's own parallel reads call `read_into` from reader threads; a local
        file gains nothing from a second way of doing so.
        """
        for offset, buffer in requests:
            self.read_into(offset, buffer)

    def close(self) -> None:
        """Close the descriptor (a map of the file keeps its own); closing twice is allowed."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> LocalFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LocalFile({self._name!r}, size={self._size})"


def open_tensor_file(path: str | os.PathLike[str]) -> LocalFile:
    """Open a local safetensors file as a byte source (see `LocalFile.open`).

    Raises:
        SafetensorsFileError: missing, unreadable, or not a regular file.
    """
    return LocalFile.open(path)


def file_identity(info: os.stat_result) -> tuple[int, ...]:
    """(device, inode, size, mtime in ns): a file opened again must be the same, unchanged."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def os_error(
    path: str | os.PathLike[str] | URLPath, error: OSError, doing: str, tensor: str | None = None
) -> SafetensorsFileError:
    """An OSError met while reading or placing a tensor, as an error naming file and tensor."""
    hints = {
        errno.ENOMEM: "not enough memory or address space",
        errno.EMFILE: _too_many_open_files(),
        errno.ENFILE: "too many open files on this system (the kernel's `fs.file-max`)",
        errno.EIO: "input/output error (a failing disk or network filesystem)",
    }
    reason = hints.get(error.errno or 0, error.strerror or str(error))
    return SafetensorsFileError(path, f"{doing}: {reason}", tensor=tensor)


def _too_many_open_files() -> str:
    """EMFILE in words: the limit this process has, and how to raise it."""
    soft, hard, raised = DescriptorLimit.now()
    return (
        f"too many open files: this process may hold {soft} (RLIMIT_NOFILE, hard limit "
        f"{'unlimited' if hard is None else hard}); raise it with `ulimit -n {raised}` before "
        f"starting, or resource.setrlimit(resource.RLIMIT_NOFILE, ({raised}, hard)) in the "
        "program, or drop arrays that earlier loads mapped from files (each map holds its "
        "file open)"
    )
