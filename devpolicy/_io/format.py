"""The safetensors file format: validated headers, aligned layouts, atomic writes. No JAX here.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON naming
each tensor's dtype, shape and [begin, end) byte range in the data section that
follows, then the data. Ranges must tile the data section exactly: no holes, no overlap.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import mmap
import os
import re
import resource
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

from .._base.errors import SafetensorsFileError
from .._base.files import FileRefused, kind, open_regular, read_capped, why_unopenable

#: safetensors dtype names and the numpy dtypes that hold them (F4 one value a byte: see
#: `PACKED`).
DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "U16": np.dtype(np.uint16),
    "I16": np.dtype(np.int16),
    "U32": np.dtype(np.uint32),
    "I32": np.dtype(np.int32),
    "U64": np.dtype(np.uint64),
    "I64": np.dtype(np.int64),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "C64": np.dtype(np.complex64),
}
#: safetensors dtypes that no numpy or JAX type here can hold, and why.
UNHOLDABLE: dict[str, str] = {
    "F6_E2M3": "a 6-bit float JAX cannot hold",
    "F6_E3M2": "a 6-bit float JAX cannot hold",
}
# Held by ml_dtypes types that came with the version named (and by JAX from 0.6 on).
for _name, _type, _since in (
    ("F8_E8M0", "float8_e8m0fnu", "0.5"),
    ("F8_E4M3FNUZ", "float8_e4m3fnuz", "0.2"),
    ("F8_E5M2FNUZ", "float8_e5m2fnuz", "0.2"),
    ("F4", "float4_e2m1fn", "0.5"),
):
    if hasattr(ml_dtypes, _type):
        DTYPES[_name] = np.dtype(getattr(ml_dtypes, _type))
    else:  # pragma: no cover - only below the declared ml_dtypes bound
        UNHOLDABLE[_name] = (
            f"needs ml_dtypes >= {_since} (for {_type}); this is ml_dtypes {ml_dtypes.__version__}"
        )
del _name, _type, _since
#: Bits per value in the file where fewer than the numpy type's: F4 packs two values a
#: byte (the first in the low four bits), which `float4_e2m1fn` holds one a byte.
PACKED: dict[str, int] = {"F4": 4}
# safetensors is little-endian, as is every host JAX runs on: native order is file order.
_NAMES = {dtype: name for name, dtype in DTYPES.items()}
MAX_HEADER = 100_000_000  # safetensors' own limit
#: The most dimensions numpy holds (64 from numpy 2, 32 before); JAX holds as many.
MAX_DIMS = 64 if int(np.__version__.split(".")[0]) >= 2 else 32
_U64 = 2**64  # shape and data_offsets are unsigned 64-bit in the reference reader
_JSON_DEPTH = 127  # serde_json's nesting limit as the reference reader meets it
DEFAULT_ALIGN = 64  # what XLA's CPU client needs to alias host memory
#: Largest alignment accepted: past the 2 MiB huge page nothing gains, and the header pads to it.
MAX_ALIGN = 1 << 24
#: Temporary files of `save_arrays`/`align_file` are `.<name>.devpolicy-<pid>-<random>.tmp`
#: beside the target (so a rename replaces it atomically). One left by a killed process is
#: removed by the next successful save of the same target.
TEMP_PATTERN = ".{name}.devpolicy-*.tmp"


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor of a file's header.

    Attributes:
        key: Its key in the file.
        dtype_name: The safetensors dtype (`U16`, `BF16`).
        dtype: The numpy dtype.
        shape: The shape.
        begin: Start of its bytes within the data section.
        end: End (exclusive) within the data section.
        offset: Absolute file offset of its first byte.
    """

    key: str
    dtype_name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    begin: int
    end: int
    offset: int

    @property
    def nbytes(self) -> int:
        """Its size in bytes in the file."""
        return self.end - self.begin

    @property
    def array_nbytes(self) -> int:
        """Its size in bytes as an array: twice `nbytes` for F4, held one value a byte."""
        return 2 * self.nbytes if self.packed else self.nbytes

    @property
    def packed(self) -> bool:
        """Whether the file packs its values tighter than its array holds them (F4)."""
        return self.dtype_name in PACKED


@dataclass(frozen=True, slots=True)
class Header:
    """A validated header: tensors in header order, and where the data starts."""

    path: Path
    file_size: int
    data_start: int
    tensors: tuple[TensorEntry, ...]
    #: The file's `__metadata__`; None when it has none.
    metadata: dict[str, str] | None
    #: (device, inode, size, mtime in ns) of the file the header was read from: a file
    #: opened again to read its data must be the same file, unchanged.
    identity: tuple[int, ...] = ()


def read_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """A safetensors file's `__metadata__` (`{}` when it has none), reading its header only.

    For every file of a checkpoint at once, see `Plan.metadata`.

    Raises:
        SafetensorsFileError: the file is missing, not a regular file, or malformed.

    Example:
        >>> import devpolicy, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
        >>> devpolicy.save_file({"w": np.zeros(2)}, path, metadata={"format": "pt"})
        >>> devpolicy.read_metadata(path)
        {'format': 'pt'}
    """
    return dict(read_header(path).metadata or {})


def read_header(path: str | os.PathLike[str]) -> Header:
    """Read and validate a file's header, touching none of its data.

    Raises:
        SafetensorsFileError: naming the file (and tensor) and what is wrong.

    Example:
        >>> import numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "t.safetensors")
        >>> write_file({"w": np.zeros((2, 3), np.float32)}, path)
        >>> [(t.key, t.dtype_name, t.shape, t.offset % 64) for t in read_header(path).tensors]
        [('w', 'F32', (2, 3), 0)]
    """
    path = Path(path)
    with open_tensor_file(path) as f:
        return read_header_from(f, path)


def open_tensor_file(path: str | os.PathLike[str]) -> BinaryIO:
    """Open a safetensors file for reading, with the loader's error messages.

    Only regular files are opened, and never by blocking: a FIFO, a device or a socket is
    refused at once, saying what it is.

    Raises:
        SafetensorsFileError: missing, unreadable, or not a regular file.
    """
    try:
        fd, _ = open_regular(path, "a safetensors file")
    except FileRefused as e:
        # Out of descriptors is said with the limit and the fix, like every other EMFILE.
        cause = e.__context__
        if isinstance(cause, OSError) and cause.errno in (errno.EMFILE, errno.ENFILE):
            raise os_error(path, cause, "cannot open") from None
        raise SafetensorsFileError(path, e.reason) from None
    return os.fdopen(fd, "rb")


def reopen_tensor_file(header: Header) -> BinaryIO:
    """Open again the file `header` was read from, to read its data.

    A checkpoint's files are opened one at a time (a checkpoint may hold more files than a
    process may open), so each is opened twice: once for its header, once for its data.
    The second must find the same file, unchanged: one replaced in between (as atomic
    writers do) or rewritten in place is refused, never read against the other's header.

    Raises:
        SafetensorsFileError: the file cannot be opened, or is not the file it was.
    """
    f = open_tensor_file(header.path)
    try:
        info = os.fstat(f.fileno())
        if info.st_size != header.file_size:
            raise SafetensorsFileError(
                header.path,
                f"file changed size while loading ({header.file_size} bytes when its header "
                f"was read, {info.st_size} now): is something rewriting it in place?",
            )
        if header.identity and _identity(info) != header.identity:
            raise SafetensorsFileError(
                header.path,
                "file was replaced or rewritten after its header was read: load it again "
                "once whatever is writing it has finished",
            )
    except BaseException:
        f.close()
        raise
    return f


def _identity(info: os.stat_result) -> tuple[int, ...]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def map_tensor_file(f: BinaryIO, header: Header) -> mmap.mmap:
    """One read-only map of the whole of an open file whose header is `header`.

    The file must still be the size its header was read at: a file that shrank (being
    rewritten in place) would otherwise give short buffers or, later, SIGBUS.

    Raises:
        SafetensorsFileError: the file changed size, or the map failed (address space
            exhausted, too many open files), naming the file.
    """
    try:
        size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise SafetensorsFileError(header.path, f"cannot read: {e.strerror}") from None
    if size != header.file_size:
        raise SafetensorsFileError(
            header.path,
            f"file changed size while loading ({header.file_size} bytes when its header was "
            f"read, {size} now): is something rewriting it in place?",
        )
    try:
        if sys.version_info >= (3, 13):
            # The map alone keeps the pages: no descriptor held for as long as arrays live.
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ, trackfd=False)
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError as e:  # "cannot mmap an empty file"
        raise SafetensorsFileError(header.path, f"cannot map: {e}") from None
    except OSError as e:
        raise os_error(header.path, e, "cannot map the file") from None


def os_error(
    path: str | os.PathLike[str], error: OSError, doing: str, tensor: str | None = None
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
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = hard == resource.RLIM_INFINITY
    raised = max(4 * soft, 65536) if unlimited else hard
    return (
        f"too many open files: this process may hold {soft} (RLIMIT_NOFILE, hard limit "
        f"{'unlimited' if unlimited else hard}); raise it with `ulimit -n {raised}` before "
        f"starting, or resource.setrlimit(resource.RLIMIT_NOFILE, ({raised}, hard)) in the "
        "program, or drop arrays that earlier loads mapped from files (each map holds its "
        "file open)"
    )


def read_header_from(f: BinaryIO, path: Path) -> Header:
    """Read and validate the header of an open file (so data is read from the same file).

    Raises:
        SafetensorsFileError: naming the file (and tensor) and what is wrong.
    """
    try:
        size = os.fstat(f.fileno()).st_size
        f.seek(0)
        prefix = f.read(8)
        if len(prefix) < 8:
            raise SafetensorsFileError(
                path, f"file is {size} bytes, too short to hold the 8-byte header length"
            )
        length = int.from_bytes(prefix, "little")
        if length > size - 8:
            raise SafetensorsFileError(
                path,
                f"header length {length} is larger than the rest of the file "
                f"({size - 8} bytes): truncated, or not a safetensors file",
            )
        if length > MAX_HEADER:
            raise SafetensorsFileError(
                path, f"header length {length} exceeds the {MAX_HEADER}-byte limit"
            )
        raw = f.read(length)
        identity = _identity(os.fstat(f.fileno()))
    except OSError as e:
        raise SafetensorsFileError(path, f"cannot read: {e.strerror}") from None
    return _parse(path, raw, size, identity)


def _parse(path: Path, raw: bytes, size: int, identity: tuple[int, ...]) -> Header:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SafetensorsFileError(path, f"header is not UTF-8 (byte {8 + e.start})") from None
    try:
        document = json.loads(text, object_pairs_hook=_object)
        if "-0" in text:
            # `-0` parses as the integer 0; the reference reads it as the float -0.0 and
            # refuses it as a size. Rare, so read again only then, -0 as -0.0.
            document = json.loads(text, object_pairs_hook=_object, parse_int=_negative_zero)
    except RecursionError:
        raise SafetensorsFileError(path, "header JSON is nested too deeply") from None
    except json.JSONDecodeError as e:
        raise SafetensorsFileError(
            path, f"header is not valid JSON: {e.msg} at byte {8 + e.pos}"
        ) from None
    except ValueError as e:  # e.g. an integer too long to convert
        raise SafetensorsFileError(path, f"header is not usable JSON: {e}") from None
    if not isinstance(document, dict):
        raise SafetensorsFileError(
            path, f"header must be a JSON object, got {type(document).__name__}"
        )
    if "\\u" in text:
        # Only an escape makes a string UTF-8 cannot encode (a lone surrogate, `\ud800`).
        _check_unicode(path, document)
    if isinstance(document, _Pairs) and "__metadata__" in document.duplicates:
        raise SafetensorsFileError(path, "__metadata__ given more than once")
    # A tensor given twice is taken from its last entry, and inside __metadata__ a
    # repeated key's last value wins: both as the reference reader does.
    metadata = document.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise SafetensorsFileError(path, "__metadata__ must map strings to strings")
    data_start = 8 + len(raw)
    if isinstance(document, _Pairs):
        for key, value in document.replaced:  # read, and refused if bad, though replaced
            _entry(path, key, value, data_start)
    entries = tuple(_entry(path, key, value, data_start) for key, value in document.items())
    _check_tiling(path, entries, size - data_start)
    return Header(path, size, data_start, entries, metadata, identity)


def _negative_zero(text: str) -> int | float:
    return -0.0 if text == "-0" else int(text)


def _check_unicode(path: Path, document: dict[str, Any]) -> None:
    """Refuse a header holding a string UTF-8 cannot encode, naming the tensor it is in."""
    for key, value in document.items():
        tensor = None if key == "__metadata__" else key
        if not _encodable(key) or not _all_encodable(value):
            raise SafetensorsFileError(
                path,
                "header holds a lone UTF-16 surrogate escape (like \\ud800): not Unicode text",
                tensor=tensor,
            )


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _all_encodable(value: object) -> bool:
    if isinstance(value, str):
        return _encodable(value)
    if isinstance(value, dict):
        return all(_encodable(k) and _all_encodable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_all_encodable(v) for v in value)
    return True


class _Pairs(dict[str, Any]):
    """A JSON object that remembers keys given more than once (the last value wins), and
    the values the later ones replaced."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.replaced = [] if len(self) == len(pairs) else _replaced(pairs)
        self.duplicates = [key for key, _ in self.replaced]


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object: a plain dict, or `_Pairs` where a key is repeated. The common case
    stays in C (a header may list hundreds of thousands of entries)."""
    made = dict(pairs)
    return made if len(made) == len(pairs) else _Pairs(pairs)


def _replaced(pairs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    last = {key: i for i, (key, _) in enumerate(pairs)}
    return [(key, value) for i, (key, value) in enumerate(pairs) if last[key] != i]


_FIELDS = ("dtype", "shape", "data_offsets")


def _entry(path: Path, key: str, value: Any, data_start: int) -> TensorEntry:
    # The common case first and cheaply (headers may list hundreds of thousands).
    try:
        dtype_name, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    except (KeyError, TypeError):
        missing = [f for f in _FIELDS if f not in value] if isinstance(value, dict) else []
        lacks = f" (it lacks {', '.join(missing)})" if missing else ""
        raise SafetensorsFileError(
            path, f"entry must be an object with dtype, shape and data_offsets{lacks}", tensor=key
        ) from None
    if not isinstance(value, dict):  # a list or string indexed by a string fails above
        raise SafetensorsFileError(
            path, "entry must be an object with dtype, shape and data_offsets", tensor=key
        )
    if isinstance(value, _Pairs) and value.duplicates:
        repeated = [f for f in value.duplicates if f in _FIELDS]
        if repeated:
            raise SafetensorsFileError(
                path, f"entry gives {repeated[0]!r} more than once", tensor=key
            )
    if len(value) > 3:
        # Other fields are ignored, as the reference reader does, if it could read them.
        _check_extra(path, key, {k: v for k, v in value.items() if k not in _FIELDS})
    if isinstance(dtype_name, str) and dtype_name in UNHOLDABLE:
        raise SafetensorsFileError(path, f"{dtype_name}: {UNHOLDABLE[dtype_name]}", tensor=key)
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        raise SafetensorsFileError(
            path, f"unknown dtype {dtype_name!r}; supported: {', '.join(DTYPES)}", tensor=key
        )
    if not isinstance(shape, list) or not all(map(_is_count, shape)):
        raise SafetensorsFileError(
            path,
            f"shape must be a list of non-negative integers, got {_shown(shape)} "
            "(each below 2**64)",
            tensor=key,
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(map(_is_count, offsets))
        or offsets[0] > offsets[1]
    ):
        raise SafetensorsFileError(
            path,
            f"data_offsets must be [begin, end] with begin <= end, got {_shown(offsets)}",
            tensor=key,
        )
    # The element count and bit size as the reference reader computes them: in unsigned
    # 64-bit arithmetic, left to right, any overflow an error (even before a 0, so an
    # empty tensor's running products are checked one by one).
    count = math.prod(shape)
    if count >= _U64 or (count == 0 and _overflows(shape)):
        raise SafetensorsFileError(
            path, f"shape {shape} overflows 64 bits counting its elements", tensor=key
        )
    dtype = DTYPES[dtype_name]
    bits = count * PACKED.get(dtype_name, dtype.itemsize * 8)
    if bits >= _U64:
        raise SafetensorsFileError(
            path, f"shape {shape} of {dtype_name} overflows 64 bits counting its bits", tensor=key
        )
    if bits % 8:
        raise SafetensorsFileError(
            path,
            f"shape {shape} of {dtype_name} is {count} values of {PACKED[dtype_name]} bits: "
            "not a whole number of bytes",
            tensor=key,
        )
    if len(shape) > MAX_DIMS:
        raise SafetensorsFileError(
            path,
            f"{len(shape)} dimensions; numpy {np.__version__} holds at most {MAX_DIMS}",
            tensor=key,
        )
    if count == 0 and math.prod(n for n in shape if n) * dtype.itemsize >= 2**63:
        # Empty, but numpy cannot describe an array this shape, and XLA aborts the
        # process on one (its non-zero dimensions' bytes overflow a signed 64-bit size).
        raise SafetensorsFileError(
            path,
            f"shape {shape} of {dtype_name} is too large for an array, even an empty one "
            "(its non-zero dimensions reach 2**63 bytes)",
            tensor=key,
        )
    expected = bits // 8
    begin, end = offsets
    if end - begin != expected:
        raise SafetensorsFileError(
            path,
            f"shape {shape} of {dtype_name} needs {expected} bytes "
            f"but data_offsets {offsets} give {end - begin}",
            tensor=key,
        )
    return TensorEntry(key, dtype_name, dtype, tuple(shape), begin, end, data_start + begin)


def _overflows(shape: list[int]) -> bool:
    running = 1
    for n in shape:
        running *= n
        if running >= _U64:
            return True
    return False


def _shown(value: object) -> str:
    """A JSON value as the header wrote it (-0.0 was `-0`)."""
    return json.dumps(value).replace("-0.0", "-0") if isinstance(value, list) else repr(value)


def _check_extra(path: Path, key: str, extra: dict[str, Any]) -> None:
    """Refuse an ignored field the reference reader could not read either: a number out
    of JSON's range (NaN, Infinity, 1e999) or nesting past its limit."""
    stack: list[tuple[object, int]] = [(v, 3) for v in extra.values()]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise SafetensorsFileError(
                path, f"entry holds a number JSON cannot hold ({value})", tensor=key
            )
        if isinstance(value, dict | list):
            if depth > _JSON_DEPTH:
                raise SafetensorsFileError(
                    path, f"entry nests more than {_JSON_DEPTH} levels deep", tensor=key
                )
            items = value.values() if isinstance(value, dict) else value
            stack.extend((v, depth + 1) for v in items)


def _is_count(n: object) -> bool:
    # `type(n) is int`: a bool is no count, nor an int subclass json never makes.
    return type(n) is int and 0 <= n < _U64


def _check_tiling(path: Path, entries: tuple[TensorEntry, ...], data_len: int) -> None:
    position = 0
    previous: str | None = None
    for entry in sorted(entries, key=lambda e: (e.begin, e.end)):
        if entry.begin > position:
            after = f"after {previous!r} " if previous else ""
            raise SafetensorsFileError(
                path,
                f"starts at data byte {entry.begin}, leaving a hole {after}at {position}",
                tensor=entry.key,
            )
        if entry.begin < position:
            raise SafetensorsFileError(
                path,
                f"overlaps {previous!r} (starts at {entry.begin}, before {position})",
                tensor=entry.key,
            )
        position = entry.end
        previous = entry.key
    if position > data_len:
        raise SafetensorsFileError(
            path,
            f"tensors need {position} data bytes but the file has {data_len}: truncated?",
            tensor=previous,
        )
    if position < data_len:
        raise SafetensorsFileError(
            path,
            f"{data_len - position} bytes after the last tensor are not described by the header",
        )


def dtype_name(dtype: np.dtype[Any]) -> str:
    """The safetensors name of a numpy dtype.

    Raises:
        ValueError: for dtypes safetensors cannot hold.
    """
    name = _NAMES.get(np.dtype(dtype).newbyteorder("="))
    if name is None:
        raise ValueError(
            f"dtype {np.dtype(dtype)} cannot be stored; "
            f"supported: {', '.join(str(d) for d in _NAMES)}"
        )
    return name


@dataclass(frozen=True, slots=True)
class _Slot:
    key: str
    dtype_name: str
    shape: tuple[int, ...]
    nbytes: int


def plan_layout(
    slots: Iterable[_Slot], metadata: Mapping[str, str] | None, align: int
) -> tuple[bytes, list[_Slot]]:
    """Header bytes and tensor order that start the largest tensors at `align`-byte offsets.

    The data section follows the header with no holes, so alignment comes from padding the
    header and from order: tensors whose size is a multiple of `align` first (each then
    starts aligned), largest first; the rest after, largest first.
    """
    check_align(align)
    slots = list(slots)
    order = sorted(slots, key=lambda s: (s.nbytes % align != 0, -s.nbytes, s.key))
    header: dict[str, Any] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    position = 0
    for slot in order:
        header[slot.key] = {
            "dtype": slot.dtype_name,
            "shape": list(slot.shape),
            "data_offsets": [position, position + slot.nbytes],
        }
        position += slot.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((-(8 + len(text))) % align)
    if len(text) > MAX_HEADER:
        raise ValueError(
            f"the header would be {len(text)} bytes, over safetensors' {MAX_HEADER}-byte limit "
            f"(align={align} pads it; use a smaller alignment)"
        )
    return text, order


def check_align(align: object) -> int:
    """Validate an alignment before anything is allocated or written.

    Raises:
        ValueError: unless `align` is an int power of two from 1 to MAX_ALIGN.
    """
    if (
        not isinstance(align, int)
        or isinstance(align, bool)
        or not 1 <= align <= MAX_ALIGN
        or align & (align - 1)
    ):
        raise ValueError(
            f"align must be a power of two from 1 to {MAX_ALIGN} (an int), got {align!r}"
        )
    return align


def _slots(tensors: Mapping[str, np.ndarray[Any, Any]], path: Path) -> list[_Slot]:
    slots = []
    for key, array in tensors.items():
        if not isinstance(key, str) or key == "__metadata__":
            raise ValueError(f"tensor names must be strings other than '__metadata__', got {key!r}")
        if not _encodable(key):
            raise SafetensorsFileError(
                path,
                "name holds a lone UTF-16 surrogate, which UTF-8 cannot encode: no safetensors "
                "reader could read it back; nothing written",
                tensor=key,  # shown by repr, which escapes it
            )
        name = dtype_name(array.dtype)
        nbytes = array.nbytes
        if name in PACKED:
            nbytes, odd = divmod(array.size * PACKED[name], 8)
            if odd:
                raise SafetensorsFileError(
                    path,
                    f"{array.size} values of {name} ({PACKED[name]} bits each) do not fill "
                    "whole bytes: the format cannot hold them; nothing written",
                    tensor=key,
                )
        slots.append(_Slot(key, name, tuple(array.shape), nbytes))
    return slots


def pack(array: np.ndarray[Any, Any]) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """F4 values held one a byte, packed two a byte as the file holds them (first low).

    Example:
        >>> import ml_dtypes
        >>> pack(np.array([1.0, 2.0, 0.5, -0.0], ml_dtypes.float4_e2m1fn)).tolist()
        [66, 129]
    """
    nibbles = array.reshape(-1).view(np.uint8) & np.uint8(0xF)
    packed: np.ndarray[Any, np.dtype[np.uint8]] = nibbles[0::2] | (nibbles[1::2] << np.uint8(4))
    return packed


def as_array(entry: TensorEntry, data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A tensor's file bytes (`entry.nbytes` of them, uint8) as its array: F4 unpacked to
    one value a byte (a new array), any other dtype a view of `data`.

    Example:
        >>> entry = TensorEntry("t", "F4", DTYPES["F4"], (2, 2), 0, 2, 64)
        >>> as_array(entry, np.array([66, 129], np.uint8)).astype(np.float32).tolist()
        [[1.0, 2.0], [0.5, -0.0]]
    """
    if not entry.packed:
        return data.view(entry.dtype).reshape(entry.shape)
    packed = data.view(np.uint8)
    values = np.empty(2 * packed.size, np.uint8)
    np.bitwise_and(packed, 0xF, out=values[0::2])
    np.right_shift(packed, 4, out=values[1::2])
    return values.view(entry.dtype).reshape(entry.shape)


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
    # ascontiguousarray would turn 0-d arrays into 1-d ones; big-endian arrays are swapped.
    arrays = {
        key: np.require(value.astype(value.dtype.newbyteorder("="), copy=False), requirements="C")
        for key, value in tensors.items()
    }
    if metadata is not None and not (
        isinstance(metadata, Mapping)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise ValueError(f"metadata must map strings to strings, got {metadata!r}")
    for k, v in (metadata or {}).items():
        if not (_encodable(k) and _encodable(v)):
            raise SafetensorsFileError(
                path,
                f"metadata {k!r} holds a lone UTF-16 surrogate, which UTF-8 cannot encode: no "
                "safetensors reader could read it back; nothing written",
            )
    header, order = plan_layout(_slots(arrays, Path(path)), metadata, align)

    def write_data(out: Any) -> None:
        for slot in order:
            array = arrays[slot.key]
            if slot.dtype_name in PACKED:
                out.write(pack(array).data)
            elif array.nbytes:
                out.write(array.reshape(-1).view(np.uint8).data)

    _atomic_write(Path(path), header, write_data)


def rewrite_aligned(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    *,
    align: int = DEFAULT_ALIGN,
) -> Header:
    """Rewrite a safetensors file so its largest tensors start at `align`-byte offsets.

    Streams each tensor's bytes (64 MiB at a time), so memory does not grow with the file.
    Returns the new file's header.
    """
    check_align(align)
    header = read_header(source)
    slots = [_Slot(t.key, t.dtype_name, t.shape, t.nbytes) for t in header.tensors]
    by_key = {t.key: t for t in header.tensors}
    new_header, order = plan_layout(slots, header.metadata, align)

    def copy_data(out: Any) -> None:
        with open_tensor_file(source) as f:
            for slot in order:
                entry = by_key[slot.key]
                f.seek(entry.offset)
                remaining = entry.nbytes
                while remaining:
                    chunk = f.read(min(remaining, 64 * 2**20))
                    if not chunk:
                        raise SafetensorsFileError(
                            source, "file shrank while being read", tensor=slot.key
                        )
                    out.write(chunk)
                    remaining -= len(chunk)

    _atomic_write(Path(destination), new_header, copy_data)
    return read_header(destination)


def _atomic_write(path: Path, header: bytes, write_data: Callable[[Any], None]) -> None:
    """Write a new file and rename it over `path`: never truncated or half-written in place.

    A symlink is written through (its target is replaced, the link kept), an existing file
    keeps its permission bits, and anything that exists but is not a regular file (a
    device, a FIFO, a directory) is refused before anything is written. The data goes to
    an unnamed file (`O_TMPFILE`) given a name only once complete, so a process killed in
    any thread, by any signal, leaves nothing; where the filesystem cannot do that, to a
    named temporary file removed on any error and on SIGTERM.
    """
    target = Path(os.path.realpath(path)) if os.path.islink(path) else path
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        what = "does not exist" if not os.path.lexists(directory) else "is not a directory"
        raise SafetensorsFileError(path, f"cannot write: the directory {str(directory)!r} {what}")
    try:
        info: os.stat_result | None = os.stat(target)
    except OSError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        shown = f" (the symlink's target {str(target)!r})" if target != path else ""
        raise SafetensorsFileError(
            path,
            f"cannot write: it is {kind(info.st_mode)}{shown}, not a regular file; "
            "only a regular file (or a new path) is replaced",
        )
    # A new file gets what a plain open() would give it.
    mode = stat.S_IMODE(info.st_mode) if info is not None else 0o666 & ~_umask()
    prefix = f".{target.name}.devpolicy-{os.getpid()}-"
    try:
        fd, tmp = _temporary(directory, prefix)
    except OSError as e:
        raise SafetensorsFileError(
            path, f"cannot write in {str(directory)!r}: {e.strerror}"
        ) from None
    try:
        with _removed_on_sigterm():
            try:
                os.fchmod(fd, mode)
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
    except BaseException as e:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(e, _Terminated):  # the temporary file is gone: now die as asked
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        raise
    finally:
        if tmp is not None:
            _in_flight.discard(tmp)
    remove_stale_temp_files(target)


#: Named temporary files being written, by any thread: the SIGTERM handler (main thread
#: only, where Python runs handlers) removes them all. A set's add, discard and copy are
#: each one step under the GIL, so the handler needs no lock (a lock the interrupted main
#: thread held would deadlock it).
_in_flight: set[str] = set()


def _temporary(directory: Path, prefix: str) -> tuple[int, str | None]:
    """A file to write in `directory`: (descriptor, None) for an unnamed one, else its name."""
    if _TMPFILE:
        try:
            return os.open(directory, _TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600), None
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
    _in_flight.add(tmp)
    return fd, tmp


def _named(fd: int, directory: Path, prefix: str) -> str:
    """Give the complete unnamed file `fd` a temporary name beside its target."""
    # linkat(AT_SYMLINK_FOLLOW) on /proc/self/fd/N: Python calls linkat (not link, which
    # would link the /proc symlink itself) only when given a directory descriptor.
    directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for _ in range(100):
            name = f"{prefix}{os.urandom(6).hex()}.tmp"
            tmp = str(directory / name)
            _in_flight.add(tmp)
            try:
                os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=directory_fd, follow_symlinks=True)
            except FileExistsError:
                _in_flight.discard(tmp)
                continue
            except BaseException:
                _in_flight.discard(tmp)
                raise
            return tmp
    finally:
        os.close(directory_fd)
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(directory))


# Unnamed files need O_TMPFILE (Linux) and /proc to name them by descriptor afterwards.
_TMPFILE = getattr(os, "O_TMPFILE", 0) if os.path.isdir("/proc/self/fd") else 0


def remove_stale_temp_files(target: Path) -> list[Path]:
    """Remove temporary files of ours for `target` whose writing process is gone.

    Returns:
        The files removed.
    """
    removed = []
    for candidate in target.parent.glob(TEMP_PATTERN.format(name=glob_escape(target.name))):
        pid_text = candidate.name[len(f".{target.name}.devpolicy-") :].split("-", 1)[0]
        if not pid_text.isdigit() or _alive(int(pid_text)):
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
    """SIGTERM arrived while writing: unwind (removing the temporary file), then die of it."""


@contextlib.contextmanager
def _removed_on_sigterm() -> Iterator[None]:
    # A library must not take over signals: only where SIGTERM would kill the process
    # outright (the default action), and only on the main thread, where Python runs handlers.
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def handler(signum: int, frame: object) -> None:
        for tmp in tuple(_in_flight):  # every thread's, not only this one's
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise _Terminated

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


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
) -> None:
    """Copy a safetensors file so its largest tensors start at `align`-byte offsets.

    Streams the data, so memory stays flat however large the file. The copy loads
    zero-copy with `load_file(..., mmap=True)` or a rule with `mmap: true`.

    Raises:
        SafetensorsFileError: `source` is not a readable safetensors file, or `destination`
            exists but is not a regular file, or cannot be written; nothing is written.

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
    rewrite_aligned(source, destination, align=align)


#: The index file of a sharded Hugging Face checkpoint.
INDEX_SUFFIX = ".safetensors.index.json"
_MAX_INDEX_BYTES = 64 << 20
#: Index names: `model.safetensors.index.json`, a variant's `model.safetensors.index.fp16.json`.
_INDEX = re.compile(r".+\.safetensors\.index(\.[A-Za-z0-9_]+)?\.json")
#: A shard of a checkpoint without an index: `model-00001-of-00003.safetensors`.
_SHARD = re.compile(r"(?P<stem>.+)-(?P<number>\d{5})-of-(?P<total>\d{5})\.safetensors")
#: A variant, as transformers and diffusers name them: `model.fp16.safetensors`,
#: `model.fp16-00001-of-00002.safetensors`.
_VARIANT = re.compile(r"(?P<base>[^.]+)\.(?P<variant>[A-Za-z0-9_]+)(-\d{5}-of-\d{5})?\.safetensors")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What `load_file` and `plan` read: one file, or every file of a checkpoint.

    Attributes:
        files: The safetensors files, in the order their tensors are listed.
        stem: The default name prefix: a file's stem, or a checkpoint directory's name
            (for a Hugging Face cache snapshot, the repository's name: see `default_prefix`).
        index: The index file, if the checkpoint has one.
        expected: Per file, the tensors the index puts in it (empty without an index).
        left_out: The directory's other `*.safetensors` files, each with why it is not
            part of the checkpoint (see `open_checkpoint`).
    """

    files: tuple[Path, ...]
    stem: str
    index: Path | None = None
    expected: tuple[frozenset[str], ...] = ()
    left_out: tuple[tuple[Path, str], ...] = ()

    def check(self, headers: list[Header]) -> None:
        """Raise unless the files hold what the index says, each tensor in one file only."""
        seen: dict[str, Path] = {}
        for header in headers:
            for entry in header.tensors:
                other = seen.setdefault(entry.key, header.path)
                if other != header.path:
                    raise SafetensorsFileError(
                        header.path,
                        f"also in {other}: a checkpoint holds each tensor once",
                        tensor=entry.key,
                    )
        for header, wanted in zip(headers, self.expected, strict=False):
            held = {t.key for t in header.tensors}
            missing = sorted(wanted - held)
            if missing:
                raise SafetensorsFileError(
                    header.path,
                    f"{self.index} puts {len(missing)} tensor(s) here that the file lacks: "
                    + ", ".join(repr(k) for k in missing[:5]),
                )
            unlisted = [t.key for t in header.tensors if t.key not in wanted]
            if unlisted:
                raise SafetensorsFileError(
                    header.path,
                    f"holds {len(unlisted)} tensor(s) that {self.index} does not list: "
                    + ", ".join(repr(k) for k in unlisted[:5])
                    + " (the index and its files must agree: is the index out of date?)",
                )


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """A safetensors file, a checkpoint directory, or a checkpoint index.

    A directory's files are chosen as transformers chooses them, never merged by accident:

    1. its index (`*.safetensors.index.json`, as Hugging Face writes large checkpoints):
       the files it names;
    2. else `model.safetensors` alone;
    3. else its `*.safetensors` files (regular, not hidden: see `_checkpoint_files`)
       less a PEFT adapter (`adapter_model*.safetensors`) and variants
       (`model.fp16.safetensors`, and `X.v.safetensors` beside an `X.safetensors`); if
       shards (`X-00001-of-00003.safetensors`) remain, exactly one complete set of them;
       else all that remain (one file, or parts such as `train.safetensors` and
       `valid.safetensors`).

    Every other `*.safetensors` file is in `left_out` with the reason. A variant or an
    adapter loads when named: the file itself, or a variant's index
    (`model.safetensors.index.fp16.json`).

    Raises:
        SafetensorsFileError: naming the path and what is wrong with it: several
            indexes, shards of several checkpoints or a shard missing, nothing to load.

    Example:
        >>> import numpy as np, tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> save_arrays({"a": np.zeros(2)}, os.path.join(d, "part1.safetensors"))
        >>> save_arrays({"b": np.zeros(2)}, os.path.join(d, "part2.safetensors"))
        >>> c = open_checkpoint(d)
        >>> [f.name for f in c.files], c.stem == os.path.basename(d)
        (['part1.safetensors', 'part2.safetensors'], True)
        >>> save_arrays({"a": np.zeros(2)}, os.path.join(d, "model.safetensors"))
        >>> c = open_checkpoint(d)
        >>> [f.name for f in c.files], [f.name for f, why in c.left_out]
        (['model.safetensors'], ['part1.safetensors', 'part2.safetensors'])
        >>> c.left_out[0][1]
        'model.safetensors is the checkpoint (no index): name the file to load it'
    """
    given = Path(path)
    if given.is_dir():
        return _choose(given, default_prefix(given, given.name))
    if _INDEX.fullmatch(given.name):
        return _from_index(given, default_prefix(given.parent, given.parent.resolve().name))
    return Checkpoint((given,), given.name.removesuffix(".safetensors"))


def _choose(directory: Path, stem: str) -> Checkpoint:
    """A directory's checkpoint files by the rule `open_checkpoint` gives."""
    indexes = sorted(directory.glob("*" + INDEX_SUFFIX))
    if len(indexes) > 1:
        names = ", ".join(i.name for i in indexes)
        raise SafetensorsFileError(
            directory, f"holds several checkpoint indexes ({names}): name one"
        )
    files = _checkpoint_files(directory)
    if indexes:
        checkpoint = _from_index(indexes[0], stem)
        named = set(checkpoint.files)
        why = f"not in {indexes[0].name}, the checkpoint's index: name the file to load it"
        others = tuple((f, why) for f in files if f not in named)
        return Checkpoint(checkpoint.files, stem, checkpoint.index, checkpoint.expected, others)
    model = directory / "model.safetensors"
    if model in files:
        why = "model.safetensors is the checkpoint (no index): name the file to load it"
        return Checkpoint((model,), stem, left_out=tuple((f, why) for f in files if f != model))
    file_names = {f.name for f in files}
    bases = {n.removesuffix(".safetensors") for n in file_names} | {
        m["stem"] for n in file_names if (m := _SHARD.fullmatch(n))
    }
    kept: list[Path] = []
    left_out: list[tuple[Path, str]] = []
    for f in files:
        variant = _VARIANT.fullmatch(f.name)
        if f.name.startswith("adapter_model"):
            left_out.append(
                (f, "a PEFT adapter, not the model's weights: name the file to load it")
            )
        elif variant and (variant["base"] == "model" or variant["base"] in bases):
            left_out.append(
                (
                    f,
                    f"variant {variant['variant']!r} of {variant['base']}: name the file (or its "
                    "index) to load it",
                )
            )
        else:
            kept.append(f)
    shards: dict[tuple[str, int], dict[int, Path]] = {}
    for f in kept:
        if m := _SHARD.fullmatch(f.name):
            shards.setdefault((m["stem"], int(m["total"])), {})[int(m["number"])] = f
    if len(shards) > 1:
        sets = ", ".join(f"{s}-*-of-{t:05d}" for s, t in sorted(shards))
        raise SafetensorsFileError(
            directory, f"holds shards of several checkpoints ({sets}) and no index: name one"
        )
    if shards:
        (((shard_stem, total), numbered),) = shards.items()
        missing = [n for n in range(1, total + 1) if n not in numbered]
        if missing or set(numbered) - set(range(1, total + 1)):
            lacking = ", ".join(
                f"{shard_stem}-{n:05d}-of-{total:05d}.safetensors" for n in missing[:3]
            )
            raise SafetensorsFileError(
                directory,
                f"shards of {shard_stem} are not a complete set of {total}"
                + (f": {len(missing)} missing ({lacking})" if missing else "")
                + "; a checkpoint missing a file never loads as a smaller one",
            )
        chosen = [numbered[n] for n in range(1, total + 1)]
        why = f"not a shard of {shard_stem}, which is the checkpoint: name the file to load it"
        left_out += [(f, why) for f in kept if f not in chosen]
        kept = chosen
    if not kept:
        detail = "; ".join(f"{f.name}: {why}" for f, why in left_out)
        raise SafetensorsFileError(
            directory,
            "a directory without a checkpoint: no *.safetensors.index.json, no model.safetensors"
            + (
                f", and every other file is left out ({detail})"
                if detail
                else ", no .safetensors files"
            ),
        )
    left_out.sort()
    return Checkpoint(tuple(kept), stem, left_out=tuple(left_out))


def default_prefix(directory: Path, otherwise: str) -> str:
    """The name prefix of a checkpoint directory's tensors: its name, except in a Hugging
    Face cache snapshot (`.../models--ORG--NAME/snapshots/<commit>`), whose name is a
    commit hash: there the repository's `NAME`; elsewhere `otherwise`.

    Example:
        >>> default_prefix(Path("hub/models--org--tiny-llama/snapshots/0123abcd"), "x")
        'tiny-llama'
        >>> default_prefix(Path("checkpoints/step-100"), "step-100")
        'step-100'
    """
    for form in (directory.absolute(), directory.resolve()):
        parent = form.parent
        if parent.name == "snapshots" and "--" in parent.parent.name:
            kind, _, repo = parent.parent.name.partition("--")
            if kind in ("models", "datasets", "spaces") and repo:
                return repo.rsplit("--", 1)[-1]
    return otherwise


def _checkpoint_files(directory: Path) -> tuple[Path, ...]:
    """The checkpoint files of a directory: its `*.safetensors` regular files, not hidden.

    Hidden files (`._model.safetensors`, the resource forks macOS leaves on other disks;
    a `.name.safetensors` of any tool) are not part of a checkpoint, nor is anything that
    is not a regular file once symlinks are followed (a directory or FIFO so named). A
    dangling symlink is an error: a checkpoint missing a file must not load as a smaller one.
    """
    files = []
    for candidate in sorted(directory.glob("*.safetensors")):
        if candidate.name.startswith("."):
            continue
        try:
            info = os.stat(candidate)
        except OSError as e:
            raise SafetensorsFileError(
                candidate,
                f"cannot be read as part of the checkpoint: {why_unopenable(candidate, e)}",
            ) from None
        if stat.S_ISREG(info.st_mode):
            files.append(candidate)
    return tuple(files)


def _from_index(index: Path, stem: str) -> Checkpoint:
    try:
        raw = read_capped(index, _MAX_INDEX_BYTES, "a checkpoint index")
    except FileRefused as e:
        raise SafetensorsFileError(index, e.reason) from None
    try:
        weight_map = json.loads(raw, object_pairs_hook=_object)["weight_map"]
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise SafetensorsFileError(
            index, f"not a checkpoint index (expected JSON with a `weight_map`): {reason}"
        ) from None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise SafetensorsFileError(index, "`weight_map` must map tensor names to file names")
    if isinstance(weight_map, _Pairs) and weight_map.duplicates:
        raise SafetensorsFileError(
            index,
            "listed twice in `weight_map`: each tensor is in one file",
            tensor=weight_map.duplicates[0],
        )
    by_file: dict[str, set[str]] = {}
    for tensor, file in weight_map.items():
        if not file or "\0" in file or file in (".", "..") or Path(file).name != file:
            raise SafetensorsFileError(
                index,
                f"file name {file!r} in `weight_map` is not a file of the index's directory "
                "(a plain name like 'model-00001-of-00002.safetensors')",
                tensor=tensor,
            )
        by_file.setdefault(file, set()).add(tensor)
    if not by_file:
        raise SafetensorsFileError(index, "`weight_map` lists no tensors")
    files = tuple(index.parent / name for name in sorted(by_file))
    expected = tuple(frozenset(by_file[name]) for name in sorted(by_file))
    return Checkpoint(files, stem, index, expected)
