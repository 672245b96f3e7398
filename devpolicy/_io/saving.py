"""Saving a tree or a mapping of arrays as a safetensors file laid out for zero-copy
loading, each leaf under the name `load_file(into=...)` reads it back by.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from .._apply.leaves import ARRAY_LIKE, leaf_names
from .format import dtype_name
from .keys import key_metadata
from .layout import DEFAULT_ALIGN, check_align
from .naming import PathLike
from .writing import save_arrays

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
    path: PathLike,
    *,
    align: int = DEFAULT_ALIGN,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write arrays (numpy or JAX) as a safetensors file laid out for zero-copy loading.

    `tensors` is a mapping of keys to arrays (written under those keys), or any pytree:
    nested dicts, flax params, `nnx.state(model)`, each leaf written under its name as
    `put` names it, less the first part (`layers/0/kernel`; no `/value`), so that
    `load_file(path, into=tree)` fills the same tree back.

    A PRNG key array (`jax.random.key`, the RNG streams of `nnx.state(model)` with
    `nnx.Dropout`) is written as its key data (`jax.random.key_data`) and the file's
    metadata names its implementation (under `"devpolicy.prng_keys"`): `load_file`
    gives it back as a key array.

    The header is padded and tensors ordered so the largest start at `align`-byte file
    offsets (the format allows no holes between tensors). Any safetensors reader reads it.
    Written to a temporary file and renamed: an error leaves nothing behind.

    Raises:
        SafetensorsFileError: `path` exists but is not a regular file (a device, a FIFO, a
            directory), or cannot be written; nothing is written.
        ValueError: a bad `align`, dtype, name or metadata; two leaves of the same name;
            a leaf whose values cannot be read (deleted, or not all in this process),
            named by its path.
        TypeError: a leaf that is not an array or number, named by its path.

    Example:
        >>> import devpolicy, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
        >>> devpolicy.save_file({"w": np.ones((4, 4), np.float32)}, path)
        >>> from safetensors.numpy import load_file
        >>> float(load_file(path)["w"].sum())
        16.0
        >>> devpolicy.save_file({"layers": [{"w": np.ones(2)}], "step": np.int32(3)}, path)
        >>> sorted(load_file(path))
        ['layers/0/w', 'step']
    """
    check_align(align)  # before any array is converted or anything written
    if _flat_tensors(tensors):
        _save(dict(tensors), path, align, metadata)
        return
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
    _save(arrays, path, align, metadata)


def _save(
    arrays: dict[str, Any], path: PathLike, align: int, metadata: Mapping[str, str] | None
) -> None:
    """Key arrays as their data, every array read to the host, then written; a leaf that
    cannot be is named with why and what to do, before anything is written."""
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
    save_arrays(host, path, align=align, metadata=metadata)
