"""Filling a tree (`load_file(into=...)`): each leaf matched to the tensor of its name,
every difference found before anything is read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

import jax
import numpy as np

from .._apply.leaves import leaf_names_and_axes, leaf_shape_dtype
from .._base.errors import CheckpointMismatchError
from .._base.events import EventLog
from .._base.visible import visible
from .._document.axes import Attached
from .._document.schema import NamesSpec
from .format import Header, TensorEntry
from .mapping import x64_enabled
from .naming import PathLike, tensor_names


@dataclass(frozen=True, slots=True)
class Fitted:
    """A checkpoint matched to an `into=` tree: what to read, and which tensor fills
    each leaf."""

    #: The files and headers to read, each header holding only the tensors leaves take.
    headers: list[tuple[Any, Header]]
    #: Per leaf, in `tree_leaves` order, the key of the tensor that fills it.
    keys: list[str]
    treedef: Any
    #: Tensors no leaf takes, left unread (`strict=False`).
    skipped: list[str]
    #: By tensor key, the axis names its leaf's framework attached (`axes: attached`).
    attached: dict[str, Attached | None]


def fit_into(
    into: Any,
    headers: list[tuple[Any, Header]],
    naming: NamesSpec,
    strict: bool,
    path: PathLike,
) -> Fitted:
    """Match each leaf of `into` to the tensor of the same name, every difference found
    before anything is read (`CheckpointMismatchError` lists them all)."""
    leaves, treedef = jax.tree_util.tree_flatten(into)
    # Named as `put` names them, less its first part: `layers/0/kernel`.
    full_names, axes = leaf_names_and_axes("", into)
    paths = [name[1:] for name in full_names]
    attached: dict[str, Attached | None] = {}
    if not leaves or paths == [""]:
        raise TypeError(
            "load_file(into=...) takes a tree whose leaves have names (a dict, nnx.State, "
            f"flax params; their paths are matched to tensor keys), got {type(into).__name__}"
        )
    separator = naming.separator
    by_name: dict[str, TensorEntry] = {}
    mismatched: list[tuple[str, str]] = []
    for _, header in headers:
        # Named as a load names them, without the prefix: the leaf's own name.
        for name, entry in zip(tensor_names(header, "", naming), header.tensors, strict=True):
            other = by_name.setdefault(name, entry)
            if other is not entry:
                mismatched.append(
                    (name, f"both tensors {other.key!r} and {entry.key!r} are named so")
                )
    x64 = x64_enabled()
    keys: list[str] = []
    missing: list[str] = []
    taken: set[str] = set()
    for leaf_path, leaf, leaf_axes in zip(paths, leaves, axes, strict=True):
        # Split as the file's keys are: a leaf named `model.layers.0.w` (a flat dict of
        # Hugging Face keys) finds `model.layers.0.w` under separator '.'.
        name = leaf_path if separator == "/" else leaf_path.replace(separator, "/")
        found = by_name.get(name)
        if found is None:
            missing.append(leaf_path)
            continue
        if name in taken:
            mismatched.append((leaf_path, "another leaf of the tree has the same name"))
            continue
        taken.add(name)
        shape, dtype = leaf_shape_dtype(leaf, "load_file(into=...)", leaf_path)
        held, wanted = _held(found.dtype, x64), _held(dtype, x64)
        if found.shape != shape or held != wanted:
            mismatched.append(
                (
                    leaf_path,
                    f"the file's {found.key!r} is {_typed(held, found.shape)}, "
                    f"the leaf is {_typed(wanted, shape)}",
                )
            )
        keys.append(found.key)
        attached[found.key] = leaf_axes
    unexpected = [entry.key for name, entry in by_name.items() if name not in taken]
    if missing or mismatched or (unexpected and strict):
        raise CheckpointMismatchError(
            os.fspath(path),
            missing=missing,
            unexpected=unexpected if strict else (),
            mismatched=mismatched,
            hint=None if taken else _naming_hint(missing, unexpected, separator),
        )
    if not unexpected:
        return Fitted(headers, keys, treedef, [], attached)
    wanted_keys = set(keys)
    kept = []
    for file, header in headers:
        tensors = tuple(t for t in header.tensors if t.key in wanted_keys)
        if tensors:  # a file no leaf takes from is not opened again
            kept.append((file, replace(header, tensors=tensors)))
    return Fitted(kept, keys, treedef, unexpected, attached)


def _held(dtype: np.dtype[Any], x64: bool) -> np.dtype[Any]:
    """The dtype JAX holds for `dtype`: 64-bit types in 32 bits with x64 disabled."""
    return dtype if x64 else np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _typed(dtype: np.dtype[Any], shape: tuple[int, ...]) -> str:
    return f"{dtype.name}[{', '.join(map(str, shape))}]"


def _naming_hint(missing: list[str], unexpected: list[str], separator: str) -> str | None:
    """When no leaf found its tensor, the two namings side by side."""
    if not missing or not unexpected:
        return None
    return (
        f"leaves are named by their path, parts joined by '/' (first: {missing[0]!r}); "
        f"the file's keys are split at {separator!r} (first unmatched: {unexpected[0]!r}). "
        "Where they differ in separator, pass separator= (or set names.separator in the "
        "policy); where the file's keys carry an extra first part, load into a tree that "
        "has it ({'model': tree})."
    )


def skipped_event(events: EventLog, path: PathLike, skipped: list[str]) -> None:
    """One info event for the tensors `strict=False` left unread, if any."""
    if skipped and events.enabled("info"):
        events.emit(
            "info",
            "into_skipped",
            {
                "file": visible(os.fspath(path)),
                "count": len(skipped),
                "first": [visible(key) for key in skipped[:5]],
                "reason": "strict=False: tensors no leaf of the tree takes are not read",
            },
        )
