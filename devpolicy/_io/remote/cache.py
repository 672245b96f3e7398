"""A local cache of remote objects: fetched once, in parallel ranges, then mapped from disk.

An entry is named by a hash of the object's identity (the URL shown, its version and size),
so a changed object (new ETag, generation or commit) is a different entry and never served
stale. Filling is safe with several processes on one host: the filler holds an exclusive
`flock` on `<entry>.lock`, the others wait for it and then find the entry complete.
Bytes go into `<entry>.partial` through a shared map (no copy in this process's memory), and
`<entry>.progress` marks each chunk once its bytes are in. These three are what a resume
needs: a fill cut short (the process killed, the server gone) leaves them, and the next load
of the same version takes the lock and fetches only the chunks not yet marked; a fill of a
newer version of the same URL removes an older version's leftovers. When all are in, the
file is synced and renamed to `<entry>.data` in one step, so a reader sees a whole file or
none. `<entry>.json` says what the entry holds (URL, version, size, the CRC-32 of its
bytes): the checksum is checked each time the entry is opened, and an entry that fails it
is fetched again (offline: an error).

Trust (docs/trust.md): whoever can write the cache chooses the bytes a load returns. The
directory is made mode 0700 and entries 0600; an existing directory is refused when another
account owns it or others can write it (the same check as a policy file's, with the fix);
entries are opened without following symlinks and must be owned by you or root.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import mmap
import os
import re
import stat
import time
import zlib
from pathlib import Path

from ..._base.files import untrusted
from ..format.sources import LocalFile
from .errors import RemoteCacheError, RemoteOfflineError
from .source import Counters, RemoteObject, forget_frames

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: What a `.json` beside an entry may weigh, at most.
_META_LIMIT = 64 * 2**10
_CHECK_BLOCK = 64 * 2**20
# An entry whose fill never finished (no `.data` yet): not damage, just not there.
_INCOMPLETE = "is not complete"
_ELSEWHERE = (
    "choose a directory you can write, or load without the cache (a load that asked for "
    "one does not go on uncached)"
)


class CachedFile(LocalFile):
    """A cached remote object as a local byte source: `fileno()` is the local file, so the
    loader maps it. `name` is still the URL (as shown); `counters` say what filling cost
    (zero requests on a hit). Reads and closing are `LocalFile`'s."""

    __slots__ = ("counters", "path")

    def __init__(self, path: Path, name: str, counters: Counters) -> None:
        fd = _open_entry(path, os.O_RDONLY)
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


def _refuse_link(path: Path | str, error: OSError) -> RemoteCacheError:
    if error.errno == errno.ELOOP:
        return RemoteCacheError(
            str(path), "a symlink: a cache entry is never opened through a link",
            "remove it (another account may have planted it)",
        )  # fmt: skip
    return RemoteCacheError(
        str(path), f"cannot be opened: {error.strerror or type(error).__name__}",
        "check the cache directory's permissions, or load without the cache",
    )  # fmt: skip


def _open_entry(path: Path | str, flags: int, *, create: bool = False) -> int:
    """A descriptor of a cache entry opened without following a symlink, checked to be a
    regular file owned by you (or root) that nobody else can write; made 0600.

    Raises:
        RemoteCacheError: a link, another account's file, one others can write.
        FileNotFoundError: it does not exist (and `create` is false).
    """
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _refuse_link(path, e) from None
    try:
        info = os.fstat(fd)
        me = os.geteuid()
        if not stat.S_ISREG(info.st_mode):
            raise RemoteCacheError(str(path), "not a regular file", "remove it")
        if info.st_uid not in (me, 0):
            raise RemoteCacheError(
                str(path), f"owned by uid {info.st_uid}, not by you (uid {me}) or root: its "
                "bytes were not fetched by you", "remove it, and keep the cache in a directory "
                "of your own",
            )  # fmt: skip
        if stat.S_IMODE(info.st_mode) & 0o077 and info.st_uid == me:
            os.fchmod(fd, 0o600)  # an entry of an older devpolicy, made 0644
        elif stat.S_IMODE(info.st_mode) & 0o022:
            raise RemoteCacheError(str(path), "writable by others", f"chmod go-w {path}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_entry(path: Path | str) -> bytes | None:
    """A small entry file's bytes (`.json`, `.progress`), or None when it does not exist."""
    try:
        fd = _open_entry(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return os.read(fd, _META_LIMIT)
    finally:
        os.close(fd)


def checksum(fd: int, size: int) -> int:
    """The CRC-32 of the first `size` bytes of the file open at `fd` (read through a map:
    no copy; zlib releases the GIL): 0.2 s for 256 MiB on a busy 2-core machine."""
    crc = 0
    if size == 0:
        return crc
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped, memoryview(mapped) as view:
        for first in range(0, size, _CHECK_BLOCK):
            crc = zlib.crc32(view[first : first + _CHECK_BLOCK], crc)  # a view: no copy
    return crc


class RemoteCache:
    """Cached objects under `directory` (made, mode 0700, when first filled).

    Args:
        directory: The cache directory.
        option: How the user set it, for messages.
    """

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)

    def base(self, source: RemoteObject) -> Path:
        """The entry's path without suffix: a hash of the identity, then the file's name."""
        digest = hashlib.sha256(source.identity().encode()).hexdigest()[:32]
        return self.directory / f"{digest}-{_leaf(source.name)}"

    def check_directory(self, *, create: bool) -> bool:
        """Whether the directory exists (made 0700 when `create`), after checking that
        nobody but you or root could have put its entries there.

        Raises:
            RemoteCacheError: another account owns it, others can write it, or it cannot
                be made or written; the message says how to fix it.
        """
        directory = self.directory
        if create:
            try:
                if not directory.is_dir():
                    directory.parent.mkdir(parents=True, exist_ok=True)
                    with contextlib.suppress(FileExistsError):  # made by another filler
                        os.mkdir(directory, 0o700)
            except OSError as e:
                raise RemoteCacheError(
                    str(directory), f"cannot be made: {e.strerror or type(e).__name__}",
                    _ELSEWHERE,
                ) from None  # fmt: skip
        elif not directory.exists():
            return False
        if not directory.is_dir():
            raise RemoteCacheError(str(directory), "not a directory", _ELSEWHERE)
        why = untrusted(directory, "the cache")
        if why is not None:
            raise RemoteCacheError(
                str(directory), f"refused: {why.reason}; its entries could be another "
                f"account's bytes", why.fix,
            )  # fmt: skip
        if create and not os.access(directory, os.W_OK | os.X_OK):
            raise RemoteCacheError(str(directory), "not writable", _ELSEWHERE)
        return True

    def lookup(self, source: RemoteObject) -> Path | None:
        """The complete, checked entry for `source`'s version, or None."""
        if not self.check_directory(create=False):
            return None
        base = self.base(source)
        return base.with_name(base.name + ".data") if self._valid(base, source.size) else None

    def _valid(self, base: Path, size: int | None) -> bool:
        return self._fault(base, size) is None

    def _fault(self, base: Path, size: int | None) -> str | None:
        """What is wrong with `<base>.data`, in words: None when it is complete (of `size`
        bytes, when given) and its bytes match the checksum kept beside it."""
        raw = _read_entry(f"{base}.json")
        try:
            fd = _open_entry(f"{base}.data", os.O_RDONLY)
        except FileNotFoundError:
            return _INCOMPLETE
        try:
            try:
                meta = json.loads(raw) if raw else {}
            except ValueError:
                meta = None
            if not isinstance(meta, dict):
                return f"has a record ({base}.json) that cannot be read"
            length = os.fstat(fd).st_size
            if size is not None and length != size:
                return f"holds {length} bytes, not the object's {size}"
            if meta.get("size") != length:
                return f"holds {length} bytes where {meta.get('size')} were fetched"
            if meta.get("crc32") != checksum(fd, length):
                return "failed its checksum (its bytes changed since it was fetched)"
            return None
        finally:
            os.close(fd)

    def open(self, source: RemoteObject) -> CachedFile:
        """`source` as a cached local file: served from the cache, else fetched into it first.

        Closes `source`. On a hit no data request is made.
        """
        try:
            path = self.lookup(source) or self.fill(source)
            return CachedFile(path, source.name, source.counters)
        finally:
            source.close()

    def offline(self, name: str, switch: str) -> CachedFile:
        """The newest complete, checked entry of the URL shown as `name`, with no request.

        Raises:
            RemoteOfflineError: there is none (naming `switch`, the variable that set
                offline).
        """
        found: list[tuple[float, Path]] = []
        if self.check_directory(create=False):
            for meta in self.directory.glob(f"*-{_leaf(name)}.json"):
                try:
                    held = json.loads(_read_entry(meta) or b"{}")
                except ValueError:
                    continue
                if isinstance(held, dict) and held.get("url") == name:
                    found.append((float(held.get("fetched", 0)), meta.with_suffix("")))
        damaged: list[tuple[Path, str]] = []
        for _, base in sorted(found, reverse=True):
            fault = self._fault(base, None)
            if fault is None:
                return CachedFile(base.with_name(base.name + ".data"), name, Counters())
            if fault != _INCOMPLETE:
                damaged.append((base, fault))
        if damaged:  # the newest: what a load online would have fetched again
            base, fault = damaged[0]
            raise RemoteOfflineError(
                name,
                f"offline ({switch}=1) and the cached copy {base}.data {fault}: nothing was "
                f"asked of the server; load it once online to fetch it again, or unset {switch}",
            )
        raise RemoteOfflineError(
            name,
            f"offline ({switch}=1) and not complete in the cache {self.directory}: nothing "
            f"was asked of the server; load it once online, or unset {switch}",
        )

    def fill(self, source: RemoteObject) -> Path:
        """Fetch `source` into the cache (resuming a cut-short fill); returns the data file."""
        self.check_directory(create=True)
        base = self.base(source)
        fd = _open_entry(f"{base}.lock", os.O_RDWR, create=True)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not self._valid(base, source.size):
                self._sweep(source.name, base)
                self._fill_locked(source, base)
        finally:
            os.close(fd)  # and the lock with it
        return base.with_name(base.name + ".data")

    def _sweep(self, name: str, keep: Path) -> None:
        """Remove what fills of other versions of the URL shown as `name` left (`.partial`,
        `.progress`), where no filler holds their lock: they would never be resumed."""
        for meta in self.directory.glob(f"*-{_leaf(name)}.json"):
            base = meta.with_suffix("")
            if base == keep or not os.path.exists(f"{base}.partial"):
                continue
            try:
                held = json.loads(_read_entry(meta) or b"{}")
                lock = _open_entry(f"{base}.lock", os.O_RDWR, create=True)
            except (ValueError, OSError):
                continue
            try:
                if not isinstance(held, dict) or held.get("url") != name:
                    continue
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                for suffix in (".partial", ".progress"):
                    Path(f"{base}{suffix}").unlink(missing_ok=True)
            except BlockingIOError:
                continue  # another process is filling it
            finally:
                os.close(lock)

    def _fill_locked(self, source: RemoteObject, base: Path) -> None:
        size = source.size
        chunk = source.options.chunk_bytes
        count = -(-size // chunk)
        partial = f"{base}.partial"
        progress = f"{base}.progress"
        # Said first, so that a fill of a newer version can find this one's leftovers.
        meta: dict[str, object] = {"url": source.name, "version": source.version,
                                   "size": size, "fetched": time.time()}  # fmt: skip
        self._write_meta(base, meta)
        fd = _open_entry(partial, os.O_RDWR, create=True)
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
                Path(progress).unlink(missing_ok=True)
            marks = _open_entry(progress, os.O_RDWR, create=True)
            try:
                done = bytearray(os.read(marks, count + 1))
                if len(done) != count:
                    done = bytearray(count)
                    os.ftruncate(marks, count)
                missing = [i for i in range(count) if not done[i]]
                if missing:
                    self._fetch_chunks(source, fd, marks, missing)
            finally:
                os.close(marks)
            os.fsync(fd)
            meta["crc32"] = checksum(fd, size)
        finally:
            os.close(fd)
        os.replace(partial, f"{base}.data")
        Path(progress).unlink(missing_ok=True)
        self._write_meta(base, meta)
        with contextlib.suppress(OSError):
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    @staticmethod
    def _fetch_chunks(source: RemoteObject, fd: int, marks: int, missing: list[int]) -> None:
        """Receive chunks `missing` into the file at `fd` through a map, marking each in
        `marks` once its bytes are in."""
        size = source.size
        chunk = source.options.chunk_bytes
        with mmap.mmap(fd, size) as mapped:
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
                        os.pwrite(marks, b"\1", i)
            except BaseException as e:
                # The failed reads' frames hold slices of `view`: let them go, so the map
                # closes and the real error (not a BufferError) reaches the caller.
                forget_frames(e)
                raise
            finally:
                view.release()

    def _write_meta(self, base: Path, meta: dict[str, object]) -> None:
        tmp = f"{base}.json.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)  # fmt: skip
        try:
            os.write(fd, json.dumps(meta).encode())
        finally:
            os.close(fd)
        os.replace(tmp, f"{base}.json")


def _leaf(name: str) -> str:
    return _SAFE.sub("_", name.rsplit("/", 1)[-1])[:80]
