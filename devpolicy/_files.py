"""Opening input files safely: only regular files, never blocking, with reasons people can act on.

A FIFO opened for reading blocks until a writer comes, `/dev/zero` never ends, and a symlink
loop or a dangling link is "no such file" to `open()`. Every reader of user-named files goes
through here, so each of these gets the same clear refusal. No JAX here.
"""

from __future__ import annotations

import errno
import os
import stat


class FileRefused(Exception):  # noqa: N818 - internal; callers turn it into their own error
    """An input file cannot be used; `reason` says why, in words."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def kind(mode: int) -> str:
    """What a file of this mode is, in words (`a FIFO (named pipe)`)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO or pipe (process substitution <(...) gives one too)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def why_unopenable(path: str | os.PathLike[str], error: OSError) -> str:
    """Why `open(path)` failed, telling a dangling link and a symlink loop from a missing file."""
    if error.errno == errno.ENOENT and os.path.islink(path):
        try:
            return f"dangling symlink (its target {os.readlink(path)!r} does not exist)"
        except OSError:  # pragma: no cover - it was a link a moment ago
            return "dangling symlink"
    if error.errno == errno.ENOENT:
        return "no such file"
    if error.errno == errno.ELOOP:
        return "symlink loop (links that point at each other never reach a file)"
    if error.errno == errno.ENOTDIR:
        return "a directory in its path is not a directory"
    if error.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if error.errno == errno.ENAMETOOLONG:
        return "path too long"
    return f"cannot open: {error.strerror or error}"


def open_regular(
    path: str | os.PathLike[str], what: str = "a regular file"
) -> tuple[int, os.stat_result]:
    """Open a regular file for reading without blocking; return its descriptor and status.

    The caller owns (and closes) the descriptor, which is in ordinary blocking mode.

    Raises:
        FileRefused: the file is missing, unreadable or not a regular file, with why.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise FileRefused(why_unopenable(path, e)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(f"is {kind(info.st_mode)}, not {what}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def check_regular(path: str | os.PathLike[str], what: str = "a regular file") -> str | None:
    """Why `path` is not a readable regular file, or None if it is one. Never blocks."""
    try:
        fd, _ = open_regular(path, what)
    except FileRefused as e:
        return e.reason
    os.close(fd)
    return None


def read_capped(path: str | os.PathLike[str], limit: int, what: str = "a regular file") -> bytes:
    """The whole of a regular file of at most `limit` bytes.

    Files whose size the kernel does not know (`/proc`) are read up to `limit` + 1 bytes.

    Raises:
        FileRefused: as `open_regular`, or the file is larger than `limit`.
    """
    fd, info = open_regular(path, what)
    try:
        if info.st_size > limit:
            raise FileRefused(f"is {info.st_size} bytes; at most {limit} are accepted")
        chunks = []
        total = 0
        while total <= limit:
            try:
                chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            except OSError as e:
                raise FileRefused(f"cannot read: {e.strerror or e}") from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise FileRefused(f"is more than {limit} bytes; at most {limit} are accepted")
        return b"".join(chunks)
    finally:
        os.close(fd)
