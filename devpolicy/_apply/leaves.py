"""A tree's leaves as placement reads them: each leaf's name (as its framework prints the
tree), the axis names a framework attached to it, and what a leaf may be (`ARRAY_LIKE`,
`leaf_shape_dtype`).

Framework boxes (flax, nnx, haliax) are recognised by class name and module: neither
library is imported.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from .._document.axes import Attached

#: What a leaf may be to be placed: an array or a number.
ARRAY_LIKE = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def leaf_shape_dtype(leaf: Any, call: str, leaf_name: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """The shape and dtype of a leaf that is an array, a `jax.ShapeDtypeStruct` or a
    number (only these are read); TypeError naming `call` and the leaf otherwise."""
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    if shape is None or dtype is None:
        if not isinstance(leaf, ARRAY_LIKE):
            raise TypeError(
                f"{call}: leaf {leaf_name!r} is a {type(leaf).__name__}, not an array, "
                "jax.ShapeDtypeStruct or number"
            )
        value = np.asarray(leaf)
        shape, dtype = value.shape, value.dtype
    return tuple(int(d) for d in shape), np.dtype(dtype)


# Boxes around one array that a framework prints as the array itself: flax's
# `AxisMetadata` (`Partitioned`, `LogicallyPartitioned`), nnx's `Variable` (`Param`...)
# and `VariableState`, haliax's `NamedArray`. Recognised by class name and module, so
# neither library is imported.
_FLAX_BOXES = frozenset({"AxisMetadata", "Variable", "VariableState"})


def _is_box(node: Any) -> bool:
    return _box_kind(type(node)) is not None


def leaf_names(name: str, tree: Any) -> list[str]:
    """Each leaf's name, in `jax.tree_util.tree_leaves(tree)` order: `name/` and the
    leaf's path with `/` between its parts, as the framework prints the tree.

    Dict keys, attribute names and list indices are written as they print (`layers/0/w`);
    a box that holds one array is not a part of the name: nnx's `Param`/`Variable` and
    flax's `Partitioned` (no `/value`), haliax's `NamedArray` (no `/0`). A tree that is one
    leaf is named `name`.

    Example:
        >>> import numpy as np
        >>> leaf_names("params", {"dense": {"kernel": np.zeros(2)}, "layers": [np.zeros(1)]})
        ['params/dense/kernel', 'params/layers/0']
    """
    return leaf_names_and_axes(name, tree)[0]


def leaf_axes(tree: Any) -> list[Attached | None]:
    """The axis names each leaf's framework attached to it, in `tree_leaves` order (None
    for a leaf that carries none): what rules with `axes: attached` shard by.

    Read from the box around the array: flax's `LogicallyPartitioned.names` (logical
    names) and `Partitioned.names` (mesh axes, `mesh_axes=True`), nnx Variables' sharding
    metadata (`out_sharding`, `sharding_names` before flax 0.12, `sharding` before 0.11;
    a `PartitionSpec` as its entries), haliax `NamedArray` axis names. Neither library is
    imported.

    Example:
        >>> import numpy as np
        >>> leaf_axes({"w": np.zeros(2)})
        [None]
    """
    return leaf_names_and_axes("", tree)[1]


def leaf_names_and_axes(name: str, tree: Any) -> tuple[list[str], list[Attached | None]]:
    """`leaf_names(name, tree)` and `leaf_axes(tree)` from one walk of the tree: what a
    placement passes its decider (items' sixth element).

    Example:
        >>> import numpy as np
        >>> leaf_names_and_axes("params", {"w": np.zeros(2)})
        (['params/w'], [None])
    """
    names: list[str] = []
    axes: list[Attached | None] = []
    interned: dict[tuple[Any, bool], Attached] = {}

    def walk(prefix: tuple[Any, ...], node: Any, boxed: bool, carried: Attached | None) -> None:
        def inner_box(n: Any) -> bool:
            return n is not node and _is_box(n)

        for sub, leaf in jax.tree_util.tree_flatten_with_path(node, is_leaf=inner_box)[0]:
            # A box's own key (`value`, haliax's flat index 0) is not part of the name.
            path = prefix + (sub[1:] if boxed else sub)
            if inner_box(leaf):
                walk(path, leaf, True, _attached(leaf, interned) or carried)
            else:
                names.append(_joined(name, path))
                axes.append(carried)

    walk((), tree, _is_box(tree), _attached(tree, interned) if _is_box(tree) else None)
    return names, axes


# The metadata keys nnx Variables keep their axis names under, newest first: flax 0.12
# `out_sharding`, 0.11 `sharding_names`, 0.10 `sharding`.
_NNX_SHARDING_KEYS = ("out_sharding", "sharding_names", "sharding")


def _attached(box: Any, interned: dict[tuple[Any, bool], Attached]) -> Attached | None:
    """The axis names a framework box carries, or None. One `Attached` per distinct names
    (`interned`): equal names are one object, so decisions cached by them compare fast."""
    how = _box_kind(type(box))
    names: Any = None
    mesh_axes = False
    if how == "logical":
        names = getattr(box, "names", None)
    elif how == "mesh":
        names, mesh_axes = getattr(box, "names", None), True
    elif how == "named":
        names = tuple(getattr(a, "name", None) for a in getattr(box, "axes", ()) or ())
    else:  # nnx Variable / VariableState
        get = getattr(box, "get_metadata", None)
        metadata = get() if callable(get) else None
        if isinstance(metadata, dict):
            for key in _NNX_SHARDING_KEYS:
                if metadata.get(key) is not None:
                    names = metadata[key]
                    break
    if names is None or isinstance(names, str):
        return None
    try:
        entries = tuple(_entry(n) for n in names)
    except (TypeError, ValueError):
        return None  # not names (a Sharding object, say): nothing a rule can read
    found = interned.get((entries, mesh_axes))
    if found is None:
        found = interned[(entries, mesh_axes)] = Attached(entries, mesh_axes)
    return found


# By type: the test runs once per node of every tree.
_BOX_KINDS: dict[type, str | None] = {}
_UNSEEN = object()


def _box_kind(kind: type) -> str | None:
    """Whether a type is a box around one array, and how it carries axis names: flax
    `logical` or `mesh` axes, haliax `named`, nnx `metadata`; None for no box. Worked out
    once per type."""
    known = _BOX_KINDS.get(kind, _UNSEEN)
    if known is not _UNSEEN:
        return known  # type: ignore[return-value]
    found: str | None = None
    for cls in kind.__mro__:
        module = cls.__module__
        if (cls.__name__ in _FLAX_BOXES and module.startswith("flax.")) or (
            cls.__name__ == "NamedArray" and (module == "haliax" or module.startswith("haliax."))
        ):
            names = {c.__name__ for c in kind.__mro__}
            if "LogicallyPartitioned" in names:
                found = "logical"
            elif "Partitioned" in names:
                found = "mesh"
            elif "NamedArray" in names:
                found = "named"
            else:
                found = "metadata"
            break
    if len(_BOX_KINDS) < 4096:
        _BOX_KINDS[kind] = found
    return found


def _entry(name: Any) -> str | tuple[str, ...] | None:
    """One dimension's entry: a name, None, or several names (a tuple of strings)."""
    if name is None or isinstance(name, str):
        return name
    if isinstance(name, tuple | list) and all(isinstance(n, str) for n in name):
        return tuple(name)
    raise ValueError(f"not an axis name: {name!r}")


def _part(key: Any) -> str:
    """One path entry as `jax.tree_util.keystr(..., simple=True)` writes it."""
    kind = type(key)
    if kind is jax.tree_util.DictKey:
        return str(key.key)
    if kind is jax.tree_util.GetAttrKey:
        return str(key.name)
    if kind is jax.tree_util.SequenceKey:
        return str(key.idx)
    return jax.tree_util.keystr((key,), simple=True, separator="/")


def _joined(name: str, path: tuple[Any, ...]) -> str:
    if not path:
        return name
    return "/".join([name, *map(_part, path)])
