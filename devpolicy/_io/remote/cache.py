"""A local cache of remote objects: fetched once, in parallel ranges, then mapped from disk.

An entry is named by a hash of the object's identity (the URL shown, its version and size),
so a changed object (new ETag, generation or commit) is a different entry and never served
stale. Filling is safe with several processes on one host: the filler holds an exclusive
`flock` on the entry's lock file, the others wait for it and then find the entry complete.
Bytes go into `<entry>.partial` through a shared map (no copy in this process's memory), and
`<entry>.progress` marks each chunk once its bytes are in; a fill that was cut short (the
process killed) is resumed by the next one, which fetches only the chunks not yet marked.
When all are in, the file is synced and renamed to `<entry>.data` in one step, so a reader
sees a whole file or none. `<entry>.json` says what the entry holds, for people.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import mmap
import os
import re
import time
from pathlib import Path

from ..sources import LocalFile
from .source import Counters, RemoteObject

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


class CachedFile(LocalFile):
    """A cached remote object as a local byte source: `fileno()` is the local file, so the
    loader maps it. `name` is still the URL (as shown); `counters` say what filling cost
    (zero requests on a hit). Reads and closing are `LocalFile`'s."""

    __slots__ = ("counters", "path")

    def __init__(self, path: Path, name: str, counters: Counters) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        super().__init__(fd, name, os.fstat(fd).st_size)
        self.path = path
        self.counters = counters

    def read_into(self, offset: int, buffer: memoryview) -> None:
        """Fill `buffer` from `offset` of the cached file, or raise (never short); a range
        outside the object is refused as `RemoteObject` refuses it."""
        length = memoryview(buffer).nbytes
        if offset < 0 or offset + length > self.size:
            raise ValueError(
                f"{self.name}: bytes {offset}-{offset + length - 1} are outside the object "
                f"({self.size} bytes)"
            )
        super().read_into(offset, buffer)


class RemoteCache:
    """Cached objects under `directory` (made when first filled)."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)

    def base(self, source: RemoteObject) -> Path:
        """The entry's path without suffix: a hash of the identity, then the file's name."""
        digest = hashlib.sha256(source.identity().encode()).hexdigest()[:32]
        leaf = _SAFE.sub("_", source.name.rsplit("/", 1)[-1])[:80]
        return self.directory / f"{digest}-{leaf}"

    def lookup(self, source: RemoteObject) -> Path | None:
        """The complete entry for `source`'s version, or None."""
        data = _data(self.base(source))
        try:
            return data if data.stat().st_size == source.size else None
        except FileNotFoundError:
            return None

    def open(self, source: RemoteObject) -> CachedFile:
        """`source` as a cached local file: served from the cache, else fetched into it first.

        Closes `source`. On a hit no data request is made.
        """
        try:
            path = self.lookup(source) or self.fill(source)
            return CachedFile(path, source.name, source.counters)
        finally:
            source.close()

    def fill(self, source: RemoteObject) -> Path:
        """Fetch `source` into the cache (resuming a cut-short fill); returns the data file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        base = self.base(source)
        data = _data(base)
        with open(f"{base}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if self.lookup(source) is None:
                    self._fill_locked(source, base)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        return data

    def _fill_locked(self, source: RemoteObject, base: Path) -> None:
        size = source.size
        chunk = source.options.chunk_bytes
        count = -(-size // chunk)
        partial = Path(f"{base}.partial")
        progress = Path(f"{base}.progress")
        fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
                progress.unlink(missing_ok=True)
            done = bytearray(progress.read_bytes()) if progress.exists() else bytearray()
            if len(done) != count:
                done = bytearray(count)
            missing = [i for i in range(count) if not done[i]]
            if missing:
                with (
                    mmap.mmap(fd, size) as mapped,
                    open(progress, "r+b" if progress.exists() else "w+b") as marks,
                ):
                    marks.truncate(count)
                    view = memoryview(mapped)
                    try:
                        batch = max(1, source.options.streams)
                        for first in range(0, len(missing), batch):
                            chunks = missing[first : first + batch]
                            source.read_many(
                                [(i * chunk, view[i * chunk : (i + 1) * chunk]) for i in chunks]
                            )
                            # Marked only once the bytes are in the file's pages: a fill cut
                            # short after this point is resumed without these chunks.
                            for i in chunks:
                                os.pwrite(marks.fileno(), b"\1", i)
                    finally:
                        view.release()
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(partial, _data(base))
        progress.unlink(missing_ok=True)
        meta = {"url": source.name, "version": source.version, "size": size, "fetched": time.time()}
        tmp = Path(f"{base}.json.{os.getpid()}")
        tmp.write_text(json.dumps(meta), encoding="utf-8")
        os.replace(tmp, f"{base}.json")
        with contextlib.suppress(OSError):
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


def _data(base: Path) -> Path:
    return Path(f"{base}.data")
