"""A document index kept in a file beside the tokens (or where the caller says), mapped for
reuse, and never used stale.

The index of a token file is built in one pass, a chunk read by position at a time into
one buffer (memory stays flat at 10**10 tokens), with the load's progress bar, and
written atomically (a temporary file in the same folder, synced, renamed). Its header
says what it describes: the token file's size, mtime, ctime, inode and device, where the
tokens lie in it, their dtype and count, the separator and its side, and a digest of
`SAMPLES` blocks spread over the tokens; then the documents, (start, length) pairs of
uint64, and the digests of the documents and of the header. Opened again, each is checked
against the file as it is now: a changed file means a rebuilt index, never a stale one,
and an event says why. A damaged index (cut short, a bad header, an unknown version,
documents that are not what was written) is rebuilt, and a warning says so; a file that
is no index at all is refused, never overwritten. No JAX here.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import struct
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import numpy as np

from ..._base.events import EventLog
from ..._base.files import FileRefused, open_regular, sync_directory
from ..._base.progress import progress_bar
from ..._read.exact import read_at
from ..._read.pages import maps_lines
from ..._read.parts import MemmapPart, memmap_part
from .docindex import (
    CHUNK,
    SPAN,
    DocumentIndex,
    Finder,
    TokenFile,
    in_memory,
    mapped_file,
    token_file,
    token_file_possible,
)
from .documents import SEPARATOR_KINDS, SeparatorIs
from .shards import Shards

#: Blocks of the tokens whose digest an index keeps, evenly spread (first and last among
#: them), and each block's bytes: where the tokens are no larger, all of them.
SAMPLES = 16
SAMPLE_BYTES = 1 << 16
MAGIC = b"DPDOCIDX"
VERSION = 1
SUFFIX = ".docs"
#: The header: magic, version, its size, separator, side, dtype, where the tokens lie and
#: how many, the file's identity (size, mtime_ns, ctime_ns, inode, device), the sampled
#: digest, documents, separators alone, the longest document, tokens in documents, the
#: body's digest; then the digest of all of that.
_HEAD = struct.Struct("<8sII q B 7x 8s QQ QqqQQ 16s QQQQ 16s")
_HEADER_BYTES = 256
_DIGEST = 16


def index_path(file: TokenFile, separator: int, separator_is: str, where: Any = None) -> Path:
    """Where the index of `file` is kept: `where` itself (a file's path), in the folder
    `where` (named for the token file, its real path's digest told apart), or beside the
    token file (`where` None)."""
    # The tokens' place and count: two arrays mapped from one file keep two indexes.
    name = f"{file.path.name}.{separator_is}{separator}.{file.offset}-{file.count}{SUFFIX}"
    if where is None:
        return file.path.with_name(name)
    place = Path(where)
    if place.is_dir():
        real = os.path.realpath(file.path).encode("utf-8", "surrogateescape")
        return place / f"{hashlib.blake2b(real, digest_size=6).hexdigest()}.{name}"
    return place


#: A file's identity (`_identity`).
Identity = tuple[int, int, int, int, int]


def _identity(info: os.stat_result) -> Identity:
    """What tells a file changed: size, mtime_ns, ctime_ns (an edit whose mtime was put
    back still moves it), inode and device."""
    return info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev


def sampled_digest(fd: int, file: TokenFile) -> bytes:
    """The digest of `SAMPLES` blocks of `SAMPLE_BYTES` spread evenly over the tokens'
    bytes (all of them where they are no more): an edit in place is seen wherever a
    block lies."""
    size = file.count * file.dtype.itemsize
    digest = hashlib.blake2b(digest_size=_DIGEST)
    if size <= SAMPLES * SAMPLE_BYTES:
        places = [(0, size)]
    else:
        last = size - SAMPLE_BYTES
        places = [(last * k // (SAMPLES - 1), SAMPLE_BYTES) for k in range(SAMPLES)]
    buffer = bytearray(max(n for _, n in places) if places else 0)
    for at, n in places:
        view = memoryview(buffer)[:n]
        got = read_at(fd, [view], file.offset + at)
        digest.update(view[:got])
    return digest.digest()


def index_of(
    tokens: np.ndarray[Any, Any] | Shards,
    separator: int,
    separator_is: SeparatorIs,
    events: EventLog,
    *,
    where: Any = None,
    progress: bool | None = None,
) -> DocumentIndex:
    """The index of a 1-D token view: of the file it maps, kept there (`document_index`),
    or of tokens in memory, in memory (`in_memory`: nothing is written). Of shards, one
    index of their concatenation: kept beside the first shard where every shard is a
    file's (`shards_index`), else in memory."""
    if isinstance(tokens, Shards):
        files = shard_files(tokens.views)
        if not files or None in files:
            return in_memory(tokens, separator, separator_is)
        kept = [f for f in files if f is not None]
        return shards_index(kept, separator, separator_is, events, where=where, progress=progress)
    file = token_file(tokens)
    if file is None:
        return in_memory(tokens, separator, separator_is)
    return document_index(file, separator, separator_is, events, where=where, progress=progress)


def shard_files(views: list[np.ndarray[Any, Any]]) -> list[TokenFile | None]:
    """The file each shard maps (`token_file`): asked of an `np.memmap` itself where it is
    one (`_memmap_file`), else of `/proc/self/maps`, read once for them all (a thousand
    shards' lines read one at a time read the whole table a thousand times)."""
    # A view that is no file's bytes in order (reversed, strided) has no part, and no
    # maps line either (`token_file_possible`): it is indexed in memory.
    parts = [memmap_part(view) for view in views]
    found: list[TokenFile | None] = [
        None if part is None else _memmap_file(part, view)
        for part, view in zip(parts, views, strict=True)
    ]
    rest = [
        k
        for k, (part, view) in enumerate(zip(parts, views, strict=True))
        if part is None and token_file_possible(view)
    ]
    lines = maps_lines([int(views[k].ctypes.data) for k in rest]) if rest else []
    for k, fields in zip(rest, lines, strict=True):
        found[k] = mapped_file(views[k], fields)
    return found


def _memmap_file(part: MemmapPart, view: np.ndarray[Any, Any]) -> TokenFile | None:
    """The file an `np.memmap`'s shard maps, the file at its path checked to be the one
    mapped (no read of `/proc/self/maps`)."""
    place = part.place()
    if place is None or not place.by_path:
        return None
    try:
        info = os.stat(part.path)
    except OSError:
        return None
    if (info.st_dev, info.st_ino) != place.identity:
        return None
    return TokenFile(Path(part.path), part.offset, view.dtype, int(view.shape[0]))


def document_index(
    file: TokenFile,
    separator: int,
    separator_is: SeparatorIs,
    events: EventLog,
    *,
    where: Any = None,
    progress: bool | None = None,
) -> DocumentIndex:
    """The index of the tokens `file` holds: the kept one where it still describes the
    file, else built now (one pass, with a progress bar), written and mapped.

    Raises:
        ValueError: the token file cannot be read, `where` names a file that is no
            index, or the index cannot be written there (each naming `index=`).
    """
    path = index_path(file, separator, separator_is, where)
    try:
        fd, info = open_regular(file.path, "a token file")
    except FileRefused as e:
        raise ValueError(f"windows tokens: {file.path} {e.reason}") from None
    try:
        expected = _expected(fd, info, file, separator, separator_is)
        why = _stale(path, expected)
        if why is None:
            return _mapped(path, separator, separator_is, file.count)
        _rebuilt(events, path, str(file.path), why)
        began = time.perf_counter()
        _build(fd, file, separator, separator_is, expected, path, progress)
    finally:
        os.close(fd)
    return _built(events, path, str(file.path), separator, separator_is, file.count, began)


def _rebuilt(events: EventLog, path: Path, tokens: str, why: str) -> None:
    """Say why a kept index is built again (a damaged one is a warning); nothing where
    none was kept."""
    if why != "none kept":
        level = "warning" if why.startswith("damaged") else "info"
        fields = {"index": str(path), "tokens": tokens, "reason": why}
        events.emit(level, "document_index_rebuilt", fields)


def _built(
    events: EventLog,
    path: Path,
    tokens: str,
    separator: int,
    separator_is: SeparatorIs,
    count: int,
    began: float,
) -> DocumentIndex:
    """The index just built at `path`, mapped, and an event saying what it holds."""
    index = _mapped(path, separator, separator_is, count)
    events.emit(
        "info",
        "document_index_built",
        {
            "index": str(path),
            "tokens": tokens,
            "documents": len(index),
            "alone": index.alone,
            "longest": index.longest,
            "seconds": round(time.perf_counter() - began, 3),
        },
    )
    return index


def shards_index(
    files: list[TokenFile],
    separator: int,
    separator_is: SeparatorIs,
    events: EventLog,
    *,
    where: Any = None,
    progress: bool | None = None,
) -> DocumentIndex:
    """The index of shards' concatenation, every shard a file's (`files`, in order): the
    kept one where it still describes every shard (each one's identity, where its tokens
    lie, and blocks sampled over them all), else built now in one pass over the shards,
    a shard open at a time, written and mapped.

    Raises:
        ValueError: a shard cannot be read, changed while it was indexed, `where` names a
            file that is no index, or the index cannot be written there.
    """
    path = shards_index_path(files, separator, separator_is, where)
    total = sum(f.count for f in files)
    identities = [_identity(_regular(f.path)) for f in files]
    expected = (
        MAGIC, VERSION, _HEADER_BYTES, separator, SEPARATOR_KINDS.index(separator_is),
        files[0].dtype.str.encode().ljust(8, b"\0"), 0, total, 0, 0, 0, 0, 0,
        _shards_digest(files, identities),
    )  # fmt: skip
    why = _stale(path, expected)
    if why is None:
        return _mapped(path, separator, separator_is, total)
    tokens = f"{files[0].path} and {len(files) - 1:,} more shards"
    if why.startswith("the token file changed"):
        why = "a shard changed (its size, times, inode or place, or its bytes sampled)"
    _rebuilt(events, path, tokens, why)
    began = time.perf_counter()

    def unchanged() -> None:
        for file, identity in zip(files, identities, strict=True):
            if _identity(_regular(file.path)) != identity:
                raise ValueError(
                    f"windows tokens: the shard {file.path} changed while the shards' "
                    "documents were indexed: index shards that are not being written"
                )

    nbytes = total * files[0].dtype.itemsize
    title = f"indexing {len(files):,} shards from {files[0].path.name}"
    chunks = _shards_chunks(files, identities)
    _write_index(
        path, expected, separator, separator_is, nbytes, title, progress, chunks, unchanged
    )
    return _built(events, path, tokens, separator, separator_is, total, began)


def shards_index_path(
    files: list[TokenFile], separator: int, separator_is: str, where: Any = None
) -> Path:
    """Where the index of shards' concatenation is kept: `where` itself (a file's path),
    in the folder `where`, or beside the first shard; named for the first shard, the
    shards' count and a digest of every shard's real path and place (another list of
    shards keeps another index)."""
    listed = hashlib.blake2b(digest_size=6)
    for file in files:
        real = os.path.realpath(file.path).encode("utf-8", "surrogateescape")
        listed.update(real + b"\0" + f"{file.offset}-{file.count}".encode() + b"\0")
    first = files[0]
    total = sum(f.count for f in files)
    name = (
        f"{first.path.name}.{len(files)}shards-{listed.hexdigest()}."
        f"{separator_is}{separator}.{total}{SUFFIX}"
    )
    if where is None:
        return first.path.with_name(name)
    place = Path(where)
    return place / name if place.is_dir() else place


def _regular(path: Path) -> os.stat_result:
    """A shard's status, refused unless it is a regular file (naming it)."""
    try:
        info = os.stat(path)
    except OSError as e:
        raise ValueError(f"windows tokens: the shard {path} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"windows tokens: the shard {path} is no regular file")
    return info


def _shards_digest(files: list[TokenFile], identities: list[Identity]) -> bytes:
    """The digest of every shard's path, place and identity, and of `SAMPLES` blocks of
    `SAMPLE_BYTES` spread evenly over their concatenation's bytes (a shard opened for
    each block that lies in it: 16 at most)."""
    digest = hashlib.blake2b(digest_size=_DIGEST)
    for file, identity in zip(files, identities, strict=True):
        place = f"{file.path}\0{file.offset}\0{file.count}\0{identity}\0"
        digest.update(place.encode("utf-8", "surrogateescape"))  # a name no UTF-8 too
    itemsize = files[0].dtype.itemsize
    ends = np.cumsum([f.count * itemsize for f in files])
    size = int(ends[-1])
    if size <= SAMPLES * SAMPLE_BYTES:
        places = [(0, size)]
    else:
        last = size - SAMPLE_BYTES
        places = [(last * k // (SAMPLES - 1), SAMPLE_BYTES) for k in range(SAMPLES)]
    for at, n in places:
        while n > 0:  # a block may run on into the next shards
            shard = int(np.searchsorted(ends, at, side="right"))
            file = files[shard]
            begins = int(ends[shard]) - file.count * itemsize
            take = min(n, int(ends[shard]) - at)
            try:
                fd, _ = open_regular(file.path, "a token file")
            except FileRefused as e:
                raise ValueError(f"windows tokens: the shard {file.path} {e.reason}") from None
            try:
                block = bytearray(take)
                got = read_at(fd, [memoryview(block)], file.offset + at - begins)
            finally:
                os.close(fd)
            digest.update(block[:got])
            at, n = at + take, n - take
    return digest.digest()


def _shards_chunks(
    files: list[TokenFile], identities: list[Identity]
) -> Generator[np.ndarray[Any, Any], None, None]:
    """Every shard's tokens in order, a `CHUNK` at a time, one shard open at a time (each
    checked to be the file whose identity was taken)."""
    for file, identity in zip(files, identities, strict=True):
        try:
            fd, info = open_regular(file.path, "a token file")
        except FileRefused as e:
            raise ValueError(f"windows tokens: the shard {file.path} {e.reason}") from None
        try:
            if _identity(info) != identity:
                raise ValueError(
                    f"windows tokens: the shard {file.path} changed while the shards' "
                    "documents were indexed: index shards that are not being written"
                )
            yield from _file_chunks(fd, file)
        finally:
            os.close(fd)


def _expected(
    fd: int, info: os.stat_result, file: TokenFile, separator: int, separator_is: str
) -> tuple[Any, ...]:
    """The header fields an index of `file` as it is now must hold, up to the counts."""
    return (
        MAGIC, VERSION, _HEADER_BYTES, separator, SEPARATOR_KINDS.index(separator_is),
        file.dtype.str.encode().ljust(8, b"\0"), file.offset, file.count, *_identity(info),
        sampled_digest(fd, file),
    )  # fmt: skip


#: The names of the header's fields (`_HEAD`), for saying which one differs.
_NAMES = (
    "magic", "version", "header size", "separator", "separator_is", "dtype", "offset",
    "token count", "file size", "mtime_ns", "ctime_ns", "inode", "device", "sampled digest",
)  # fmt: skip


def _stale(path: Path, expected: tuple[Any, ...]) -> str | None:
    """Why the index at `path` cannot be used for the file as it is now (None: it can).

    Raises:
        ValueError: `path` holds something that is no index (never overwritten).
    """
    try:
        kind = os.stat(path).st_mode
    except FileNotFoundError:
        return "none kept"
    except OSError as e:
        raise ValueError(f"windows index={str(path)!r} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(kind):
        # A FIFO would hang the read; a device or socket would be replaced by the rebuild.
        raise ValueError(
            f"windows index={str(path)!r} is not a regular file (a "
            f"{_KINDS.get(stat.S_IFMT(kind), 'special file')}): pass the path of an index "
            "file, or a folder to keep indexes in; it was left as it is"
        )
    try:
        with open(path, "rb") as f:
            head = f.read(_HEADER_BYTES)
            size = os.fstat(f.fileno()).st_size
            # An index cut short (even to nothing: it held nothing to lose) is rebuilt; a
            # file that starts otherwise is someone else's, never overwritten.
            if (len(head) < len(MAGIC) and MAGIC.startswith(head)) or head[:8] == MAGIC:
                if len(head) < _HEADER_BYTES:
                    return f"damaged: cut short ({size} bytes, a header alone is {_HEADER_BYTES})"
                fields = _HEAD.unpack_from(head)
                own = hashlib.blake2b(head[: _HEAD.size], digest_size=_DIGEST)
                if fields[1] != VERSION:
                    return f"damaged: version {fields[1]}, this devpolicy reads {VERSION}"
                if own.digest() != head[_HEAD.size : _HEAD.size + _DIGEST]:
                    return "damaged: its header is not what was written"
                documents = fields[14]
                if size != _HEADER_BYTES + documents * 2 * SPAN.itemsize:
                    return f"damaged: {size} bytes, where {documents} documents take more"
                for name, want, got in zip(_NAMES, expected, fields, strict=False):
                    if want != got:
                        return f"the token file changed: {name} was {got!r}, is {want!r}"
                if _body_digest(f) != fields[18]:
                    return "damaged: its documents are not what was written"
                return None
    except FileNotFoundError:
        return "none kept"
    except OSError as e:
        raise ValueError(f"windows index={str(path)!r} cannot be read: {e.strerror}") from None
    raise ValueError(
        f"windows index={str(path)!r} is not a document index (no {MAGIC.decode()} header): "
        "pass the path of an index, or a folder to keep indexes in; it was left as it is"
    )


_KINDS = {
    stat.S_IFIFO: "FIFO",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFSOCK: "socket",
    stat.S_IFDIR: "folder",
}


def _body_digest(f: Any) -> bytes:
    digest = hashlib.blake2b(digest_size=_DIGEST)
    f.seek(_HEADER_BYTES)
    while block := f.read(1 << 22):
        digest.update(block)
    return digest.digest()


def _build(
    fd: int,
    file: TokenFile,
    separator: int,
    separator_is: SeparatorIs,
    expected: tuple[Any, ...],
    path: Path,
    progress: bool | None,
) -> None:
    """Index the tokens of `file` (read by position a chunk at a time) into `path`,
    atomically (`_write_index`)."""

    def unchanged() -> None:
        if _identity(os.fstat(fd)) != expected[8:13]:
            raise ValueError(
                f"windows tokens: {file.path} changed while its documents were indexed: "
                "index a file that is not being written"
            )

    _write_index(
        path, expected, separator, separator_is, file.count * file.dtype.itemsize,
        f"indexing {file.path.name}", progress, _file_chunks(fd, file), unchanged,
    )  # fmt: skip


def _file_chunks(fd: int, file: TokenFile) -> Generator[np.ndarray[Any, Any], None, None]:
    """The tokens of `file` read by position into one buffer, a `CHUNK` at a time (each
    chunk used before the next is read)."""
    buffer = np.empty(min(CHUNK, max(file.count, 1)), file.dtype)
    for at in range(0, file.count, CHUNK):
        chunk = buffer[: min(CHUNK, file.count - at)]
        got = read_at(fd, [chunk.data.cast("B")], file.offset + at * chunk.itemsize)
        if got < chunk.nbytes:
            raise ValueError(f"windows tokens: {file.path} ended before its tokens did")
        yield chunk


def _write_index(
    path: Path,
    expected: tuple[Any, ...],
    separator: int,
    separator_is: SeparatorIs,
    nbytes: int,
    title: str,
    progress: bool | None,
    chunks: Generator[np.ndarray[Any, Any], None, None],
    unchanged: Callable[[], None],
) -> None:
    """The documents of the tokens `chunks` yields, in order (`nbytes` of them), written
    to `path` with the header `expected` says, atomically: a temporary file beside it,
    synced, then renamed over it once `unchanged` raised nothing (the tokens' files are
    as they were when `expected` was made); removed on any failure, Ctrl-C too, and
    `chunks` closed (a shard it holds open is closed then, not when a traceback goes).

    Each build its own temporary file, made exclusively: two streams (threads, or
    processes of one pid on hosts sharing a folder) building one index at once each
    write their own, and the last rename wins with an index as good as the first's."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    try:
        out = open(temporary, "xb")  # noqa: SIM115 - closed below, removed on failure
    except OSError as e:
        chunks.close()
        raise ValueError(
            f"windows index={str(path)!r} cannot be written ({e.strerror}): pass index= a "
            "folder you can write to keep it in"
        ) from None
    try:
        with out:
            out.write(bytes(_HEADER_BYTES))
            body = hashlib.blake2b(digest_size=_DIGEST)
            finder = Finder(separator, separator_is)
            counts = [0, 0, 0]  # documents, longest, covered
            at = 0
            with progress_bar(title, nbytes, progress) as advance:
                for chunk in chunks:
                    _written(out, body, finder.add(chunk, at), counts)
                    at += chunk.shape[0]
                    advance(chunk.nbytes)
                _written(out, body, finder.end(at), counts)
            head = _HEAD.pack(
                *expected, counts[0], finder.alone, counts[1], counts[2], body.digest()
            )
            out.seek(0)
            out.write(head + hashlib.blake2b(head, digest_size=_DIGEST).digest())
            out.flush()
            os.fsync(out.fileno())
        unchanged()
        os.replace(temporary, path)
        sync_directory(path.parent)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    finally:
        chunks.close()


def _written(out: Any, body: Any, pairs: np.ndarray[Any, Any], counts: list[int]) -> None:
    data = pairs.tobytes()
    out.write(data)
    body.update(data)
    if pairs.shape[0]:
        counts[0] += pairs.shape[0]
        counts[1] = max(counts[1], int(pairs[:, 1].max()))
        counts[2] += int(pairs[:, 1].sum())


def _mapped(path: Path, separator: int, separator_is: SeparatorIs, tokens: int) -> DocumentIndex:
    """The index at `path`, checked already, its documents mapped read-only."""
    with open(path, "rb") as f:
        fields = _HEAD.unpack_from(f.read(_HEADER_BYTES))
    documents, alone, longest, covered = fields[14:18]
    spans: np.ndarray[Any, Any]
    if documents:
        spans = np.memmap(path, SPAN, "r", offset=_HEADER_BYTES, shape=(documents, 2))
    else:
        spans = np.zeros((0, 2), SPAN)
    digest = fields[18].hex()
    return DocumentIndex(
        spans, separator, separator_is, tokens, alone, longest, covered, path, digest
    )
