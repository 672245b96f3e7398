"""The safetensors file format: dtypes, tensor entries, and headers read and validated.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON naming
each tensor's dtype, shape and [begin, end) byte range in the data section that
follows, then the data. Ranges must tile the data section exactly: no holes, no overlap.

The header is read from a byte source (`sources.ByteSource`), so it is read the same way
wherever the file lives; a file that is not safetensors is named as what it is (`foreign`).
Where files go on disk is `checkpoints`; how written files are laid out is `layout`, and
written, `local_files`. No JAX here.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ..._base.errors import SafetensorsFileError
from ..._base.locations import FilePath
from .foreign import what_it_is
from .sources import ByteSource, file_identity, open_tensor_file

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

    #: The file: a local path, or a `URLPath` (shown without credentials).
    path: FilePath
    file_size: int
    data_start: int
    tensors: tuple[TensorEntry, ...]
    #: The file's `__metadata__`; None when it has none.
    metadata: dict[str, str] | None
    #: (device, inode, size, mtime in ns) of the file the header was read from: a file
    #: opened again to read its data must be the same file, unchanged.
    identity: tuple[int, ...] = ()


def read_header(path: str | os.PathLike[str]) -> Header:
    """Read and validate a file's header, touching none of its data.

    Raises:
        SafetensorsFileError: naming the file (and tensor) and what is wrong.

    Example:
        >>> import devpolicy, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "t.safetensors")
        >>> devpolicy.save_file({"w": np.zeros((2, 3), np.float32)}, path)
        >>> [(t.key, t.dtype_name, t.shape, t.offset % 64) for t in read_header(path).tensors]
        [('w', 'F32', (2, 3), 0)]
    """
    path = Path(path)
    with open_tensor_file(path) as f:
        return read_header_from(f, path)


def read_header_from(source: ByteSource, path: FilePath) -> Header:
    """Read and validate the header of an open source (so data is read from the same file).

    `path` is what the header records as its file (`Header.path`): for a local file, the
    path it was opened by.

    A file that is not safetensors at all (a NumPy `.npy` or `.npz`, a PyTorch checkpoint,
    a pickle) is named as what it is, with what to do (`foreign`).

    Raises:
        SafetensorsFileError: naming the file (and tensor) and what is wrong.
    """
    try:
        return _read_header_from(source, path)
    except SafetensorsFileError:
        found = what_it_is(source)  # only now: a good file never pays for the question
        if found is None:
            raise
        raise SafetensorsFileError(path, found) from None


def _read_header_from(source: ByteSource, path: FilePath) -> Header:
    size = source.size
    if size < 8:
        raise SafetensorsFileError(
            path, f"file is {size} bytes, too short to hold the 8-byte header length"
        )
    try:
        prefix = bytearray(8)
        source.read_into(0, memoryview(prefix))
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
        raw = bytearray(length)
        source.read_into(8, memoryview(raw))
        # A local file is opened again for its data: it must then be this file, unchanged.
        fd = source.fileno()
        identity = file_identity(os.fstat(fd)) if fd is not None else ()
    except OSError as e:
        raise SafetensorsFileError(path, f"cannot read: {e.strerror}") from None
    return _parse(path, raw, size, identity)


def _parse(path: FilePath, raw: bytes | bytearray, size: int, identity: tuple[int, ...]) -> Header:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SafetensorsFileError(path, f"header is not UTF-8 (byte {8 + e.start})") from None
    try:
        document = json.loads(text, object_pairs_hook=json_object)
        if "-0" in text:
            # `-0` parses as the integer 0; the reference reads it as the float -0.0 and
            # refuses it as a size. Rare, so read again only then, -0 as -0.0.
            document = json.loads(text, object_pairs_hook=json_object, parse_int=_negative_zero)
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
    if isinstance(document, RepeatedKeys) and "__metadata__" in document.duplicates:
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
    if isinstance(document, RepeatedKeys):
        for key, value in document.replaced:  # read, and refused if bad, though replaced
            _entry(path, key, value, data_start)
    entries = tuple(_entry(path, key, value, data_start) for key, value in document.items())
    _check_tiling(path, entries, size - data_start)
    return Header(path, size, data_start, entries, metadata, identity)


def _negative_zero(text: str) -> int | float:
    return -0.0 if text == "-0" else int(text)


def _check_unicode(path: FilePath, document: dict[str, Any]) -> None:
    """Refuse a header holding a string UTF-8 cannot encode, naming the tensor it is in."""
    for key, value in document.items():
        tensor = None if key == "__metadata__" else key
        if not encodable(key) or not _all_encodable(value):
            raise SafetensorsFileError(
                path,
                "header holds a lone UTF-16 surrogate escape (like \\ud800): not Unicode text",
                tensor=tensor,
            )


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _all_encodable(value: object) -> bool:
    if isinstance(value, str):
        return encodable(value)
    if isinstance(value, dict):
        return all(encodable(k) and _all_encodable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_all_encodable(v) for v in value)
    return True


class RepeatedKeys(dict[str, Any]):
    """A JSON object that remembers keys given more than once (the last value wins), and
    the values the later ones replaced."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.replaced = [] if len(self) == len(pairs) else _replaced(pairs)
        self.duplicates = [key for key, _ in self.replaced]


def json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object: a plain dict, or `RepeatedKeys` where a key is repeated. The common case
    stays in C (a header may list hundreds of thousands of entries)."""
    made = dict(pairs)
    return made if len(made) == len(pairs) else RepeatedKeys(pairs)


def _replaced(pairs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    last = {key: i for i, (key, _) in enumerate(pairs)}
    return [(key, value) for i, (key, value) in enumerate(pairs) if last[key] != i]


_FIELDS = ("dtype", "shape", "data_offsets")


def _entry(path: FilePath, key: str, value: Any, data_start: int) -> TensorEntry:
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
    if isinstance(value, RepeatedKeys) and value.duplicates:
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


def _check_extra(path: FilePath, key: str, extra: dict[str, Any]) -> None:
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


def _check_tiling(path: FilePath, entries: tuple[TensorEntry, ...], data_len: int) -> None:
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
