"""Saving a tree or a mapping of arrays as a safetensors file laid out for zero-copy
loading, each leaf under the name `load_file(into=...)` reads it back by; arrays that span
the processes of a `jax.distributed` job are written by all of them together (`joint_save`).
One `save_file` event per file, and one `devpolicy.save` span in the profiler's trace
(`_machine/spans`) around its reading to the host and its writing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..._apply.leaves import ARRAY_LIKE, leaf_names
from ..._base.events import EventLog
from ..._base.locations import FilePath, URLPath, location
from ..._machine.spans import SAVE, span
from ..format.header import dtype_name
from ..format.keys import key_metadata
from ..format.layout import DEFAULT_ALIGN, check_align, slots_of
from ..remote.upload import RemoteUpload, upload_target
from .joint_save import JointSaved, save_joint, spans_processes
from .local_files import save_arrays

#: Seconds each process of a multi-process save waits for the others at each step.
JOINT_TIMEOUT = 600.0

#: What to do about a leaf that is not an array, said where one is refused.
_ARRAYS_ONLY = (
    "save the tree's arrays only: leave that leaf out (for an nnx model, "
    "`nnx.state(model, nnx.Param)` holds its parameters alone)"
)

_SCALARS = (np.generic, bool, int, float, complex)


def _flat_tensors(tensors: Any) -> bool:
    """A mapping of arrays (keys as written), not a tree to be named leaf by leaf: its
    values arrays, numbers, or lists of numbers (one tensor each, as `np.asarray` makes)."""
    return isinstance(tensors, Mapping) and all(
        isinstance(value, ARRAY_LIKE)
        or (
            isinstance(value, (list, tuple))
            and all(isinstance(x, _SCALARS) for x in jax.tree_util.tree_leaves(value))
        )
        for value in tensors.values()
    )


def save_file(
    tensors: Any,
    path: str | os.PathLike[str],
    events: EventLog,
    *,
    align: int = DEFAULT_ALIGN,
    metadata: Mapping[str, str] | None = None,
    timeout: float = JOINT_TIMEOUT,
) -> None:
    """Write `tensors` (a mapping of keys to arrays, or a tree named leaf by leaf) as one
    aligned safetensors file; `devpolicy.save_file` documents it. Arrays that span
    processes make it a joint save: every process writes its part (`joint_save`)."""
    check_align(align)  # before any array is converted or anything written
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout < float("inf")
    ):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    file = location(path)
    upload = upload_target(str(path), os.environ) if isinstance(file, URLPath) else None
    arrays = _named_arrays(tensors)
    started = time.perf_counter()
    nbytes = sum(int(getattr(value, "nbytes", 0)) for value in arrays.values())
    with span(SAVE, verb="save_file", file=file.name, tensors=len(arrays), bytes=nbytes):
        saved = _saved(arrays, file, path, upload, align, metadata, float(timeout))
    # One meaning per field across every event (docs/logging.md): `nbytes` the tensors'
    # bytes, `file_bytes` the file's size.
    fields: dict[str, Any] = {
        "file": str(file),
        "tensors": len(arrays),
        "nbytes": saved.nbytes,
        "file_bytes": saved.file_bytes,
        "bytes_written": saved.bytes_written,
        "processes": saved.processes,
        "seconds": round(time.perf_counter() - started, 4),
    }
    if saved.gathered_bytes:
        fields["gathered_bytes"] = saved.gathered_bytes
    events.emit("info", "save_file", fields)


def _saved(
    arrays: dict[str, Any],
    file: FilePath,
    path: str | os.PathLike[str],
    upload: RemoteUpload | None,
    align: int,
    metadata: Mapping[str, str] | None,
    timeout: float,
) -> JointSaved:
    """`arrays` written to `file` (`path` as given; `upload`: its object-storage target):
    alone, or jointly where an array spans processes."""
    joint = any(spans_processes(value) for value in arrays.values())
    if joint:
        # Key arrays as their key data, still sharded: each process writes its part of it.
        keys, metadata = key_metadata(arrays, metadata)
        ready = {n: jax.random.key_data(v) if n in keys else v for n, v in arrays.items()}
    else:
        ready, metadata = _host_arrays(arrays, metadata)
    if joint or upload is not None:  # alone: this process's own arrays, uploaded by it
        saved = save_joint(
            ready, file, align=align, metadata=metadata, timeout=timeout,
            target=upload, alone=not joint,
        )  # fmt: skip
    else:
        save_arrays(ready, path, align=align, metadata=metadata)
        size = Path(path).stat().st_size
        data = sum(slot.nbytes for slot in slots_of(ready, Path(path)))
        saved = JointSaved(size, data, size, 1)
    return saved


def _named_arrays(tensors: Any) -> dict[str, Any]:
    """Keys to arrays: a mapping's own keys, or a tree's leaves under their names."""
    if _flat_tensors(tensors):
        return dict(tensors)
    leaves = jax.tree_util.tree_leaves(tensors)
    names = [name[1:] for name in leaf_names("", tensors)]
    if names == [""]:
        raise TypeError(
            "save_file() takes a mapping of names to arrays or a tree whose leaves have "
            f"names, got one {type(tensors).__name__}"
        )
    arrays: dict[str, Any] = {}
    for name, leaf in zip(names, leaves, strict=True):
        if name in arrays:
            raise ValueError(f"save_file(): two leaves of the tree are named {name!r}")
        if not isinstance(leaf, ARRAY_LIKE):
            raise TypeError(
                f"save_file(): leaf {name!r} is a {type(leaf).__name__}, not an array or "
                f"number; {_ARRAYS_ONLY}"
            )
        arrays[name] = leaf
    return arrays


def _host_arrays(
    arrays: dict[str, Any], metadata: Mapping[str, str] | None
) -> tuple[dict[str, Any], Mapping[str, str] | None]:
    """Key arrays as their data, every array read to the host (and the metadata naming the
    keys); a leaf that cannot be is named with why and what to do, before anything is
    written."""
    keys, metadata = key_metadata(arrays, metadata)
    host: dict[str, Any] = {}
    for name, value in arrays.items():
        try:
            host[name] = np.asarray(jax.random.key_data(value) if name in keys else value)
        except Exception as e:  # JAX's own (deleted, not addressable, ...): name the leaf
            what = f"{type(value).__name__} {getattr(value, 'dtype', '')}".rstrip()
            raise ValueError(
                f"save_file(): {name!r} ({what}) cannot be written: {type(e).__name__}: {e}"
            ) from e
        if host[name].dtype == object:
            raise TypeError(
                f"save_file(): {name!r} is an array of Python objects, not of numbers; "
                f"{_ARRAYS_ONLY}"
            )
        try:
            dtype_name(host[name].dtype)
        except ValueError as e:
            raise ValueError(f"save_file(): {name!r}: {e}") from None
    return host, metadata
