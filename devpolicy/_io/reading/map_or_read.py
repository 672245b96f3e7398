"""Which tensors are mapped from their file (zero-copy host arrays), which are sent to
their device straight from the file's mapping, and which are read.

One answer for the loader, the read-ahead, the `mmap_refused` event and the plan's
`file_backed` bytes: a tensor maps when mapping is asked for (the call's `mmap`, else its
rule's), it is not empty, it starts at a 64-byte-aligned offset, and its bytes are the
array's bytes (not F4, packed two values a byte; not a 64-bit tensor narrowed to 32 bits
because x64 is off).

A tensor bound for an accelerator's memory is copied by the device anyway, so its host
bytes need not be read into fresh memory first: it is sent from a view of the file's
mapping, at any offset (`sends_from_map`). Measured on a TPU v5e (December 2026, a 2 GiB
checkpoint written by `safetensors.numpy.save_file`, page cache warm): `read()` into
fresh memory ran 1.16 GiB/s there and the load 1.00 GiB/s, while views of a mapping sent
in one `device_put` ran 11.8 GiB/s, above one `device_put` of the same tree already in
memory (8.9-10.3 GiB/s). The view lives only until the transfer is done: host memory is
the file's pages in the page cache, at most the checkpoint once.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ..._apply.hostview import copies_host_memory
from ..._decide.decision import Decision
from ..._decide.routing import ALWAYS_MAPPED, MAPPED_IF_RULE, NEVER_MAPPED
from ..format.header import TensorEntry
from ..format.layout import mapping_obstacles

#: What a 64-bit tensor is held as with x64 off (JAX's own narrowing), by safetensors dtype.
NARROW: dict[str, np.dtype[Any]] = {
    "I64": np.dtype(np.int32),
    "U64": np.dtype(np.uint32),
    "F64": np.dtype(np.float32),
}


def x64_enabled() -> bool:
    """Whether JAX holds 64-bit types (`jax_enable_x64`); read once per load or plan."""
    return bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined]


def map_hint(entry: TensorEntry, mmap: bool | None, x64: bool) -> int:
    """Whether this tensor would be mapped, were it placed on a host device (for `fits`)."""
    if mmap is False or not entry.nbytes or mapping_obstacles(entry, x64=x64):
        return NEVER_MAPPED
    return ALWAYS_MAPPED if mmap else MAPPED_IF_RULE


def may_map(entry: TensorEntry, decision: Decision, mmap: bool | None) -> bool:
    """Whether the loader maps this tensor (before narrowing, which the caller checks)."""
    wanted = decision.mmap if mmap is None else mmap
    return bool(wanted) and entry.nbytes > 0 and not mapping_obstacles(entry, x64=True)


def sends_from_map(entry: TensorEntry, decision: Decision, mmap: bool | None, x64: bool) -> bool:
    """Whether the loader sends this tensor (or, sharded, its slices) to its device from
    views of the file's map (the device copies them; nothing is read into host memory
    first): a local file that may be mapped (`mmap` not False), a tensor neither empty,
    packed nor narrowed, bound for device memory that copies host memory."""
    return (
        mmap is not False
        and entry.nbytes > 0
        and not entry.packed
        and (x64 or entry.dtype_name not in NARROW)
        and copies_host_memory(decision)
    )
