"""How a file devpolicy writes is laid out: tensors ordered and the header padded so the
largest tensors start at aligned offsets (zero-copy loading), and any safetensors reader
reads it; and where a slice of a tensor lies in it (`slice_runs`: what each process of a
multi-process save writes). No JAX here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..._base.errors import SafetensorsFileError
from ..._base.limits import ALIGN
from ..._base.locations import URLPath
from .header import MAX_HEADER, PACKED, Header, TensorEntry, dtype_name, encodable

DEFAULT_ALIGN = 64  # what XLA's CPU client needs to alias host memory
#: Largest alignment accepted: past the 2 MiB huge page nothing gains, and the header pads to it.
MAX_ALIGN = 1 << 24
#: 64-bit dtypes JAX narrows to 32 bits with x64 off: read into a new buffer, never mapped.
WIDE = frozenset({"I64", "U64", "F64"})


@dataclass(frozen=True, slots=True)
class Slot:
    """One tensor of a file to write: its key, dtype, shape and size in the file."""

    key: str
    dtype_name: str
    shape: tuple[int, ...]
    nbytes: int


def plan_layout(
    slots: Iterable[Slot], metadata: Mapping[str, str] | None, align: int
) -> tuple[bytes, list[Slot]]:
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


class Shaped(Protocol):
    """What a tensor's slot is worked out from: a numpy array, or a JAX array spanning
    several processes (its global shape; no process holds all of it)."""

    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def size(self) -> int: ...
    @property
    def nbytes(self) -> int: ...


def slots_of(tensors: Mapping[str, Shaped], path: Path | URLPath) -> list[Slot]:
    """Each array's slot, refusing a name or size no safetensors reader could read back."""
    slots = []
    for key, array in tensors.items():
        if not isinstance(key, str) or key == "__metadata__":
            raise ValueError(f"tensor names must be strings other than '__metadata__', got {key!r}")
        if not encodable(key):
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
        slots.append(Slot(key, name, tuple(array.shape), nbytes))
    return slots


def slice_runs(
    shape: tuple[int, ...], itemsize: int, bounds: tuple[tuple[int, int], ...]
) -> tuple[np.ndarray[Any, np.dtype[np.int64]], int]:
    """Where a slice of a row-major tensor lies in the tensor's bytes: the offset of each
    contiguous run (in the slice's own C order, so run k holds the slice's bytes
    `[k * run, (k + 1) * run)`) and the bytes of one run.

    The trailing dimensions the slice spans whole, and the last one it does not, make one
    run; there is one run per index of the dimensions before. `itemsize` may be any unit
    (an F4 file counts half bytes).

    Args:
        shape: The whole tensor's shape.
        itemsize: Bytes (or units) per value.
        bounds: Per dimension, the slice's `[start, stop)`.

    Example:
        >>> offsets, run = slice_runs((4, 6), 2, ((0, 2), (3, 6)))  # rows 0-1, columns 3-5
        >>> offsets.tolist(), run
        ([6, 18], 6)
        >>> offsets, run = slice_runs((4, 6), 2, ((2, 4), (0, 6)))  # whole rows: one run
        >>> offsets.tolist(), run
        ([24], 24)
    """
    if not shape:
        return np.zeros(1, np.int64), itemsize
    extents = [stop - start for start, stop in bounds]
    if 0 in extents:
        return np.zeros(0, np.int64), 0
    split = len(shape) - 1
    while split > 0 and extents[split] == shape[split]:
        split -= 1
    strides = [math.prod(shape[d + 1 :]) * itemsize for d in range(len(shape))]
    offsets: np.ndarray[Any, np.dtype[np.int64]] = np.zeros((), np.int64)
    for d in range(split):  # each leading dimension adds an axis: C order once raveled
        start, stop = bounds[d]
        offsets = np.add.outer(offsets, np.arange(start, stop, dtype=np.int64) * strides[d])
    offsets = offsets.reshape(-1) + bounds[split][0] * strides[split]
    return offsets, math.prod(extents[split:]) * itemsize


def mapping_obstacles(entry: TensorEntry, *, x64: bool) -> tuple[str, ...]:
    """What keeps a tensor with bytes from being mapped from a local file, if anything:
    `"packed"` (F4, two values a byte), `"narrowed"` (64-bit while x64 is off), and
    `"unaligned"` (data not at an `ALIGN`-byte offset), in that order. The one definition
    the loader, the plan, the `mmap_refused` event and `unmappable` all ask.

    Example:
        >>> from devpolicy._io.format.header import TensorEntry
        >>> mapping_obstacles(TensorEntry("t", "I64", np.dtype("<i8"), (1,), 0, 8, 72), x64=False)
        ('narrowed', 'unaligned')
    """
    found = []
    if entry.packed:
        found.append("packed")
    if not x64 and entry.dtype_name in WIDE:
        found.append("narrowed")
    if entry.offset % ALIGN:
        found.append("unaligned")
    return tuple(found)


def unmappable_reasons(header: Header, *, x64: bool) -> dict[str, str]:
    """Why each tensor of `header` would be read rather than mapped
    from a local file, by key; a tensor that maps, or has no bytes, is left out.

    A tensor maps when its data starts at an `ALIGN`-byte offset (what XLA's CPU client
    needs to adopt host memory) and its bytes are the array's: not packed (F4), and not
    64-bit where JAX narrows it (`x64` False).

    Example:
        >>> from devpolicy._io.format.header import TensorEntry
        >>> entry = TensorEntry("t", "U16", np.dtype("<u2"), (4,), 0, 8, 100)
        >>> header = Header(Path("f"), 108, 100, (entry,), None)
        >>> print(unmappable_reasons(header, x64=False)["t"])  # doctest: +ELLIPSIS
        its data starts at byte 100, 36 past a 64-byte boundary: a tensor maps only ...
    """
    reasons: dict[str, str] = {}
    for entry in header.tensors:
        if not entry.nbytes:
            continue
        said = {
            "unaligned": f"its data starts at byte {entry.offset}, {entry.offset % ALIGN} past "
            f"a {ALIGN}-byte boundary: a tensor maps only from a {ALIGN}-byte-aligned offset",
            "packed": f"{entry.dtype_name} is stored two values a byte, and JAX holds one a "
            "byte: it is unpacked into a new buffer",
            "narrowed": f"{entry.dtype_name} is narrowed to 32 bits (x64 is off): a new "
            "buffer; with jax_enable_x64 on it maps",
        }
        order = ("unaligned", "packed", "narrowed")  # as this text has always listed them
        obstacles = mapping_obstacles(entry, x64=x64)
        why = [said[kind] for kind in order if kind in obstacles]
        if why:
            reasons[entry.key] = "; ".join(why)
    return reasons
