"""PRNG key arrays in files: saved as their key data, wrapped again when loaded.

safetensors holds numbers only. A typed key array (`jax.random.key`, the `key` of an nnx
`Rngs` stream in `nnx.state(model)`) is written as `jax.random.key_data(key)` (threefry2x32:
two uint32 per key, one more trailing dimension), and the file's `__metadata__` names the
implementation of each such tensor under `KEYS_METADATA`, a JSON object of tensor key to
implementation name (`{"drop/rngs/key": "threefry2x32"}`). A load wraps those tensors again
with `jax.random.wrap_key_data(..., impl=...)`; any other reader sees the plain integers.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..._base.errors import SafetensorsFileError
from .header import Header

#: The `__metadata__` entry naming each key tensor's implementation.
KEYS_METADATA = "devpolicy.prng_keys"


def is_key_dtype(dtype: Any) -> bool:
    """Whether `dtype` is a typed PRNG key's (`key<fry>`), not a number's."""
    if dtype is None or isinstance(dtype, np.dtype):
        return False  # the common case, asked of every leaf: no JAX call
    try:
        return bool(jnp.issubdtype(dtype, jax.dtypes.prng_key))
    except TypeError:  # not a dtype at all (None, an object's)
        return False


def is_key(value: Any) -> bool:
    """Whether `value` is a typed PRNG key array, or a `jax.ShapeDtypeStruct` of one."""
    return is_key_dtype(getattr(value, "dtype", None))


def key_data_shape(leaf: Any) -> tuple[tuple[int, ...], Any]:
    """The shape and dtype of a key leaf's data (array or `jax.ShapeDtypeStruct`): what the
    file holds for it. Nothing is computed."""
    # A struct, not the leaf itself: the leaf may be an array (only its type is read).
    struct = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)  # type: ignore[no-untyped-call]
    data = jax.eval_shape(jax.random.key_data, struct)
    return tuple(int(d) for d in data.shape), data.dtype


def key_metadata(
    arrays: Mapping[str, Any], metadata: Mapping[str, str] | None
) -> tuple[dict[str, str], Mapping[str, str] | None]:
    """The key arrays among `arrays` (name to implementation name), and `metadata` with
    the entry naming them (unchanged where there are none). Their data is the caller's to
    take (`jax.random.key_data`), leaf by leaf.

    Raises:
        ValueError: `metadata` already has the entry (it is devpolicy's to write).
    """
    impls = {name: str(jax.random.key_impl(a)) for name, a in arrays.items() if is_key(a)}
    if not impls:
        return impls, metadata
    if metadata is not None and KEYS_METADATA in metadata:
        raise ValueError(
            f"metadata key {KEYS_METADATA!r} is written by save_file to name the PRNG key "
            f"arrays' implementations (here: {', '.join(map(repr, impls))}); use another key"
        )
    return impls, {**(metadata or {}), KEYS_METADATA: json.dumps(impls, sort_keys=True)}


def key_impls(header: Header) -> dict[str, str]:
    """The file's key tensors (tensor key to implementation name) as its metadata names
    them; `{}` for a file without any.

    Raises:
        SafetensorsFileError: the entry is not a JSON object of names, or names a tensor
            the file lacks or one that is not unsigned 32-bit integers.
    """
    text = (header.metadata or {}).get(KEYS_METADATA)
    if text is None:
        return {}
    try:
        found = json.loads(text)
    except ValueError:
        found = None
    if not isinstance(found, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in found.items()
    ):
        raise SafetensorsFileError(
            header.path,
            f"__metadata__[{KEYS_METADATA!r}] must be a JSON object of tensor keys to PRNG "
            f"implementation names (as save_file writes it), got {text[:80]!r}",
        )
    dtypes = {t.key: t.dtype_name for t in header.tensors}
    for key in found:
        if dtypes.get(key) != "U32":
            why = "which the file does not hold" if key not in dtypes else f"a {dtypes[key]}"
            raise SafetensorsFileError(
                header.path,
                f"__metadata__[{KEYS_METADATA!r}] names it as PRNG key data, {why}: key data "
                "is unsigned 32-bit (U32)",
                tensor=key,
            )
    return found


@functools.cache
def key_dtype_of(impl: str) -> Any | None:
    """The key dtype of implementation `impl` (`key<fry>` for threefry2x32), or None for
    a name this JAX does not know."""
    try:
        return jax.eval_shape(lambda: jax.random.key(0, impl=impl)).dtype
    except (ValueError, TypeError, KeyError):
        return None


def wrapped(data: jax.Array, impl: str, file: str | os.PathLike[str], key: str) -> jax.Array:
    """The key array whose data `data` is (placed as `data` is).

    Raises:
        SafetensorsFileError: this JAX knows no implementation `impl`, or the data's last
            dimensions are not that implementation's.
    """
    try:
        keys: jax.Array = jax.random.wrap_key_data(data, impl=impl)
    except (ValueError, TypeError, KeyError) as e:
        raise SafetensorsFileError(
            file,
            f"holds PRNG key data of implementation {impl!r} (its __metadata__ says), which "
            f"cannot be wrapped as keys here: {e}",
            tensor=key,
        ) from None
    return keys
