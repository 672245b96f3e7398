"""Files that map: one tensor written from chunks without holding it (`save_chunks`), and
which tensors of a file a load would read instead of map, and why (`unmappable`).

A token file is often larger than memory and made piece by piece (a tokenizer's output,
an existing `np.memmap`). `save_chunks` streams the pieces into a file laid out as
`save_file` lays one out (the data at an aligned offset, so `load_file(..., mmap=True)`
maps it), through the same atomic write: the header's place is reserved before the first
byte of data (its length cannot depend on a total not yet known) and filled in last.
Memory stays bounded by one chunk, or for an array by one block, whose pages, where the
array is a file mapping, are given back as the copy goes. Runs of zeros are left as holes
where a reader can read them back (`sparse`). The whole write is one `devpolicy.save` span
in the profiler's trace (`_machine/spans`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..._base.errors import SafetensorsFileError
from ..._base.progress import progress_bar
from ..._machine.spans import SAVE, span
from ..._read.pages import Pager
from ..format.header import dtype_name, encodable, read_header
from ..format.layout import (
    DEFAULT_ALIGN,
    Slot,
    check_align,
    mapping_obstacles,
    plan_layout,
    unmappable_reasons,
)
from .local_files import _atomic_write, _prepared_target, check_local, check_metadata
from .sparse import SparseSink

#: Bytes of an array written (and, for a file mapping, given back) at a time.
BLOCK_BYTES = 64 * 2**20
#: What a dimension or a byte count could be: the reserved header holds numbers this wide.
_WIDEST = 10**20 - 1

_NOTHING = "nothing written"


def save_chunks(
    chunks: Iterable[Any],
    path: str | os.PathLike[str],
    *,
    key: str = "tokens",
    align: int = DEFAULT_ALIGN,
    metadata: Mapping[str, str] | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
) -> None:
    """Write one tensor, given in chunks, as a safetensors file that maps with no copy.

    For a token file larger than memory: `chunks` is an iterable of numpy arrays (a
    generator of a tokenizer's output, say), concatenated along their first axis, each
    held only while it is written; or one array, such as an existing `np.memmap`, written
    64 MiB at a time, its mapped pages given back as the copy goes, so the process never
    holds it. The tensor's data starts at an `align`-byte offset: `load_file(path,
    mmap=True)` (or a rule with `mmap: true`) maps it zero-copy, and any safetensors
    reader reads it. Runs of zeros (1 MiB, aligned in the file) are left as holes where a
    reader can read them back (not on a tmpfs, where reading one through a mapping takes
    memory: there they are given their space): a sparse source stays sparse on disk.

    Written to a temporary file and renamed into place once complete: a bad chunk, an
    error or an exception from `chunks` itself leaves nothing behind.

    Args:
        chunks: An iterable of arrays of one dtype and one shape past the first axis, or
            one array (a `np.memmap` included).
        path: The file to write (local).
        key: The tensor's key in the file (`load_file` names it `<file stem>/<key>`).
        align: Alignment of the data's file offset (a power of two).
        metadata: The header's `__metadata__` (strings to strings).
        overwrite: Replace an existing file at `path` (default: refuse it).
        progress: Show the bar `load_file` shows (bytes written, rate, time left) on a
            terminal: None (default) for a write over 256 MiB (for chunks whose total is
            not known, once 256 MiB are written, with no time left), True always, False
            never.

    Raises:
        SafetensorsFileError: `path` exists (without `overwrite`), or is a URL, a FIFO, a
            directory, or cannot be written; `chunks` gave none; a chunk is not an array
            of numbers, is 0-d, or differs from the first in dtype, rank or shape past
            the first axis; a packed dtype (F4); a tmpfs too small for the zeros (see
            above). Nothing is written.
        ValueError: a bad `align` or `metadata`.

    Example:
        >>> import devpolicy, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "train.safetensors")
        >>> pieces = (np.arange(i, i + 1000, dtype=np.uint16) for i in range(0, 5000, 1000))
        >>> devpolicy.save_chunks(pieces, path)
        >>> devpolicy.unmappable(path)  # every tensor maps
        {}
        >>> from safetensors.numpy import load_file
        >>> load_file(path)["tokens"][998:1002].tolist()
        [998, 999, 1000, 1001]
    """
    check_align(align)
    check_local(path)
    check_metadata(metadata, path)
    _check_key(key, path)
    target = Path(path)
    _prepared_target(target)  # a FIFO, a directory, a missing folder: refused unopened
    if not overwrite and os.path.lexists(target):
        raise SafetensorsFileError(path, f"exists; pass overwrite=True to replace it; {_NOTHING}")
    stream = _Chunks(chunks, path, key)
    first = stream.first()
    trailing = first.shape[1:]
    row_bytes = first.itemsize * int(np.prod(trailing, dtype=np.int64))
    name = dtype_name(first.dtype)
    reserved, _ = plan_layout([Slot(key, name, (_WIDEST, *trailing), _WIDEST)], metadata, align)
    start = 8 + len(reserved)

    def write_data(out: Any) -> None:
        total = first.nbytes if stream.whole else None
        with progress_bar(target.name, total, progress) as advance:
            sink = SparseSink(out, start, path, advance)
            rows = 0
            for chunk in stream.all(first):
                rows += chunk.shape[0]
                sink.write(chunk)
        nbytes = rows * row_bytes
        header, _ = plan_layout([Slot(key, name, (rows, *trailing), nbytes)], metadata, align)
        sink.finish()
        out.seek(8)
        out.write(header + b" " * (len(reserved) - len(header)))  # still ends at `start`

    try:
        with span(SAVE, verb="save_chunks", file=target.name, tensors=1):
            _atomic_write(target, reserved, write_data)
    except _SourceFailedError as failed:  # the caller's own error, as raised (not "cannot write")
        raise failed.error from None


def unmappable(path: str | os.PathLike[str]) -> dict[str, str]:
    """The tensors of a safetensors file that `load_file(..., mmap=True)` would read into
    memory instead of map, each with why; empty when every tensor maps.

    A tensor maps from a local file when its data starts at a 64-byte-aligned offset and
    its bytes are the array's: not F4 (two values a byte in the file, one in JAX), and
    not 64-bit with JAX's x64 off, as it is now (narrowed to 32 bits: a new buffer). An
    empty tensor has nothing to map and is not named. `devpolicy align --check FILE`
    says the same on the command line; `align_file` (`devpolicy align IN OUT`) writes a
    copy whose tensors map.

    Raises:
        SafetensorsFileError: `path` is missing, not a safetensors file, or a URL (only a
            local file maps).

    Example:
        >>> import devpolicy, numpy as np, tempfile, os
        >>> from safetensors.numpy import save_file as plain_save
        >>> path = os.path.join(tempfile.mkdtemp(), "plain.safetensors")
        >>> plain_save({"a": np.ones(16, np.uint8), "b": np.ones(16, np.float32)}, path)
        >>> print(devpolicy.unmappable(path)["b"])  # doctest: +ELLIPSIS
        its data starts at byte 120, 56 past a 64-byte boundary: a tensor maps only ...
        >>> copy = path.replace("plain", "aligned")
        >>> devpolicy.align_file(path, copy)  # the same tensors, laid out to map
        >>> devpolicy.unmappable(copy)
        {}
    """
    check_local(path)
    header = read_header(path)
    x64 = bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined]
    return unmappable_reasons(header, x64=x64)


def mapped_once_aligned(path: str | os.PathLike[str]) -> set[str]:
    """The tensors of `path` that `unmappable` names and that would map in the copy
    `align_file` writes: those it names for their offset alone and that the copy starts
    aligned. Empty where no rewrite maps any more of the file: what is left is F4, 64-bit
    with x64 off, or small tensors that follow one whose size is not a multiple of 64 bytes
    (the format has no gaps between tensors)."""
    check_local(path)
    header = read_header(path)
    x64 = bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined]
    slots = [Slot(t.key, t.dtype_name, t.shape, t.nbytes) for t in header.tensors]
    new_header, order = plan_layout(slots, header.metadata, DEFAULT_ALIGN)
    entries = {t.key: t for t in header.tensors}
    mapped = set()
    position = 8 + len(new_header)
    for slot in order:
        entry = entries[slot.key]
        starts_aligned = position % DEFAULT_ALIGN == 0
        if entry.nbytes and starts_aligned and mapping_obstacles(entry, x64=x64) == ("unaligned",):
            mapped.add(slot.key)
        position += slot.nbytes
    return mapped


class _SourceFailedError(Exception):
    """The caller's chunks raised `error` while the file was being written."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _Chunks:
    """The caller's chunks, checked one by one against the first as they come."""

    def __init__(self, chunks: Iterable[Any], path: str | os.PathLike[str], key: str) -> None:
        self.path = path
        self.key = key
        if isinstance(chunks, np.ndarray):
            self._source: Iterator[Any] = iter(())
            self._array: np.ndarray[Any, Any] | None = chunks
        else:
            self._source = iter(chunks)
            self._array = None
        self._index = 0

    @property
    def whole(self) -> bool:
        """Whether the chunks are one array, whose size is known before it is written."""
        return self._array is not None

    def _refuse(self, problem: str) -> SafetensorsFileError:
        return SafetensorsFileError(self.path, f"{problem}; {_NOTHING}", tensor=self.key)

    def first(self) -> np.ndarray[Any, Any]:
        """The first chunk (the whole array, for an array): its dtype and shape past the
        first axis hold for every chunk."""
        if self._array is not None:
            return self._checked(self._array, None)
        try:
            chunk = next(self._source)
        except StopIteration:
            raise self._refuse(
                "no chunks: the tensor's dtype and shape come from the first one"
            ) from None
        return self._checked(chunk, None)

    def all(self, first: np.ndarray[Any, Any]) -> Iterator[np.ndarray[Any, Any]]:
        """Every chunk, the first included, each C-contiguous in native byte order; an
        array in blocks of at most `BLOCK_BYTES`."""
        if self._array is not None:
            yield from _blocks(first)
            return
        yield _native(first)
        while True:
            try:
                chunk = next(self._source)
            except StopIteration:
                return
            except Exception as e:  # carried past the writer's handling of OSError
                raise _SourceFailedError(e) from e
            self._index += 1
            yield _native(self._checked(chunk, first))

    def _checked(self, given: Any, first: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
        which = f"chunk {self._index}"
        if not isinstance(given, np.ndarray) and not hasattr(given, "__array__"):
            raise self._refuse(f"{which} is {type(given).__name__}, not an array of numbers")
        chunk: np.ndarray[Any, Any] = np.asarray(given)
        if chunk.ndim == 0:
            raise self._refuse(
                f"{which} is a 0-d array (a scalar): chunks are joined along their first "
                "axis, so each needs one"
            )
        try:
            name = dtype_name(chunk.dtype)
        except ValueError as e:
            raise self._refuse(f"{which}: {e}") from None
        if name == "F4":
            raise self._refuse(
                "F4 packs two values a byte, which chunks of odd lengths would split; write "
                "it with devpolicy.save_file"
            )
        if first is None:
            return chunk
        if name != dtype_name(first.dtype):  # byte order aside: each is written little-endian
            raise self._refuse(
                f"{which} is {chunk.dtype} ({name}), but chunk 0 was {first.dtype} "
                f"({dtype_name(first.dtype)}): every chunk must have one dtype"
            )
        if chunk.ndim != first.ndim:
            raise self._refuse(
                f"{which} has shape {chunk.shape} ({_dims(chunk.ndim)}), but chunk 0 had "
                f"{first.shape} ({_dims(first.ndim)}): every chunk must have one rank"
            )
        if chunk.shape[1:] != first.shape[1:]:
            raise self._refuse(
                f"{which} has shape {chunk.shape}, but chunk 0 had {first.shape}: every "
                "chunk must have the same shape past the first axis"
            )
        return chunk


def _dims(n: int) -> str:
    return f"{n} dimension{'s' if n != 1 else ''}"


def _native(chunk: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """`chunk` C-contiguous and little-endian as the format stores it (a copy only if not)."""
    return np.require(chunk.astype(chunk.dtype.newbyteorder("<"), copy=False), requirements="C")


def _blocks(array: np.ndarray[Any, Any]) -> Iterator[np.ndarray[Any, Any]]:
    """`array` in pieces of whole rows, at most `BLOCK_BYTES` each (at least one row); a
    file mapping's pages given back once each piece is written."""
    row_bytes = max(1, array.itemsize * int(np.prod(array.shape[1:], dtype=np.int64)))
    rows = max(1, BLOCK_BYTES // row_bytes)
    pager = Pager(array, random=False)
    try:
        for start in range(0, array.shape[0], rows):
            yield _native(array[start : start + rows])
            if pager.active:
                pager.release([start], min(rows, array.shape[0] - start))
    finally:
        pager.close()


def _check_key(key: object, path: str | os.PathLike[str]) -> None:
    if not isinstance(key, str) or not key or key == "__metadata__" or not encodable(key):
        raise SafetensorsFileError(
            path,
            "key must be a non-empty string other than '__metadata__' that UTF-8 can encode, "
            f"got {key!r}; {_NOTHING}",
        )
