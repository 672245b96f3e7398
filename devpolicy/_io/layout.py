"""How a file devpolicy writes is laid out: tensors ordered and the header padded so the
largest tensors start at aligned offsets (zero-copy loading), and any safetensors reader
reads it. No JAX here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._base.errors import SafetensorsFileError
from .format import MAX_HEADER, PACKED, dtype_name, encodable

DEFAULT_ALIGN = 64  # what XLA's CPU client needs to alias host memory
#: Largest alignment accepted: past the 2 MiB huge page nothing gains, and the header pads to it.
MAX_ALIGN = 1 << 24


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


def slots_of(tensors: Mapping[str, np.ndarray[Any, Any]], path: Path) -> list[Slot]:
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
