"""A range of a file read whole by position: `preadv` until the buffers are full or the file
ends.

A `preadv` may return short (a signal, a pipe-like file system, a range past one call's
limit), so every positional reader loops; this is that loop, once, for the loads (`_io`'s
`LocalFile` and scattered reads) and the stream's windows (`positional`). It says how many
bytes it read and leaves the error, which names the file, to its caller.
"""

from __future__ import annotations

import os


def read_at(fd: int, views: list[memoryview], offset: int) -> int:
    """Fill `views`, in order, with the file's bytes from `offset`, resuming after a short
    read; return the bytes read: their total, or less where the file ended first. The list
    given is left as it was.

    Raises:
        OSError: a read failed (EIO, EBADF once closed).
    """
    pending = list(views)
    total = sum(len(v) for v in pending)
    done = 0
    first = 0  # the first view not yet filled
    while done < total:
        count = os.preadv(fd, pending[first:] if first else pending, offset + done)
        if count <= 0:
            break
        done += count
        while first < len(pending) and count >= len(pending[first]):  # resume after the filled
            count -= len(pending[first])
            first += 1
        if count:
            pending[first] = pending[first][count:]
    return done
