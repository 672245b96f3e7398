"""Filling a tree (`load_file(into=...)`): each leaf matched to the tensor of its name,
every difference found before anything is read.
"""

from __future__ import annotations

import difflib
import unicodedata
from dataclasses import dataclass, replace
from typing import Any

import jax
import numpy as np

from ..._apply.leaves import leaf_names_and_axes, leaf_shape_dtype
from ..._base.errors import CheckpointMismatchError
from ..._base.events import EventLog
from ..._base.visible import visible
from ..._document.axes import Attached
from ..._document.schema import NamesSpec
from ..format.header import Header, TensorEntry
from ..format.keys import is_key, key_data_shape, key_dtype_of, key_impls
from .checkpoints import Checkpoint
from .map_or_read import x64_enabled
from .naming import PathLike, path_text, tensor_names


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
    #: By tensor key, the PRNG implementation of a leaf that is a key array: its data is
    #: wrapped as keys again once loaded.
    prng_keys: dict[str, str]


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
    paths, axes = _leaf_paths(into)
    attached: dict[str, Attached | None] = {}
    if not leaves or paths == [""]:
        raise TypeError(
            "load_file(into=...) takes a tree whose leaves have names (a dict, nnx.State, "
            f"flax params; their paths are matched to tensor keys), got {type(into).__name__}"
        )
    separator = naming.separator
    by_name: dict[str, TensorEntry] = {}
    mismatched: list[tuple[str, str]] = []
    file_keys: dict[str, str] = {}  # tensors the files hold as PRNG key data
    for _, header in headers:
        file_keys.update(key_impls(header))
        # Named as a load names them, without the prefix: the leaf's own name.
        for name, entry in zip(tensor_names(header, "", naming), header.tensors, strict=True):
            other = by_name.setdefault(name, entry)
            if other is not entry:
                mismatched.append(
                    (name, f"both tensors {other.key!r} and {entry.key!r} are named so")
                )
    x64 = x64_enabled()
    keys: list[str] = []
    wrap: dict[str, str] = {}
    missing: list[str] = []
    missing_names: list[tuple[str, str]] = []  # (leaf path, name), for look-alikes
    taken: set[str] = set()
    for leaf_path, leaf, leaf_axes in zip(paths, leaves, axes, strict=True):
        name = _split(leaf_path, separator)
        found = by_name.get(name)
        if found is None:
            missing.append(leaf_path)
            missing_names.append((leaf_path, name))
            continue
        if name in taken:
            mismatched.append((leaf_path, "another leaf of the tree has the same name"))
            continue
        taken.add(name)
        if is_key(leaf):
            problem = _key_problem(leaf, found, file_keys.get(found.key))
            if problem is not None:
                mismatched.append((leaf_path, problem))
            wrap[found.key] = file_keys.get(found.key, "")
            keys.append(found.key)
            # The data has more dimensions than the keys (each key's words): unnamed.
            words = len(key_data_shape(leaf)[0]) - len(leaf.shape)
            attached[found.key] = (
                None
                if leaf_axes is None
                else Attached((*leaf_axes.names, *[None] * words), leaf_axes.mesh_axes)
            )
            continue
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
            path_text(path),
            missing=missing,
            unexpected=unexpected if strict else (),
            mismatched=mismatched,
            hint=_hints(
                None if taken else _naming_hint(missing, unexpected, separator),
                _look_alikes(
                    missing_names, [(n, e.key) for n, e in by_name.items() if n not in taken]
                ),
            ),
        )
    if not unexpected:
        return Fitted(headers, keys, treedef, [], attached, wrap)
    wanted_keys = set(keys)
    kept = []
    for file, header in headers:
        tensors = tuple(t for t in header.tensors if t.key in wanted_keys)
        if tensors:  # a file no leaf takes from is not opened again
            kept.append((file, replace(header, tensors=tensors)))
    return Fitted(kept, keys, treedef, unexpected, attached, wrap)


def _leaf_paths(into: Any) -> tuple[list[str], list[Attached | None]]:
    """Each leaf's path, named as `put` names it less its first part (`layers/0/kernel`),
    and the axis names its framework attached."""
    full_names, axes = leaf_names_and_axes("", into)
    return [name[1:] for name in full_names], axes


def _split(key: str, separator: str) -> str:
    """A leaf's path or a file's key in parts joined by '/', split where the file's keys
    are: a leaf named `model.layers.0.w` (a flat dict of Hugging Face keys) finds the key
    `model.layers.0.w` under separator '.'."""
    return key if separator == "/" else key.replace(separator, "/")


def shards_needed(
    into: Any, checkpoint: Checkpoint, naming: NamesSpec
) -> tuple[Checkpoint, list[str]]:
    """For `strict=False`: only the files of an indexed checkpoint that hold a tensor some
    leaf of `into` takes, and the keys of the others, which are never opened (a shard no
    leaf needs may be missing or damaged). Without an index every file is kept (only
    their headers say what they hold), and where no leaf finds its tensor in the index,
    too (the mismatch is then reported against what the files hold)."""
    if checkpoint.index is None:
        return checkpoint, []
    separator = naming.separator
    wanted = {_split(path, separator) for path in _leaf_paths(into)[0]}
    kept = [any(_split(key, separator) in wanted for key in keys) for keys in checkpoint.expected]
    if all(kept) or not any(kept):
        return checkpoint, []
    unread = sorted(
        key
        for keys, keep in zip(checkpoint.expected, kept, strict=True)
        if not keep
        for key in keys
    )
    return checkpoint.only(kept), unread


def _held(dtype: np.dtype[Any], x64: bool) -> np.dtype[Any]:
    """The dtype JAX holds for `dtype`: 64-bit types in 32 bits with x64 disabled."""
    return dtype if x64 else np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _typed(dtype: Any, shape: tuple[int, ...]) -> str:
    return f"{getattr(dtype, 'name', dtype)}[{', '.join(map(str, shape))}]"


def _key_problem(leaf: Any, found: TensorEntry, impl: str | None) -> str | None:
    """Why the file's tensor cannot fill a leaf that is a PRNG key array, or None: the file
    must name it as key data of the leaf's implementation, shaped as the leaf's data."""
    leaf_text = _typed(leaf.dtype, tuple(leaf.shape))
    if impl is None:
        return (
            f"the file's {found.key!r} is {_typed(found.dtype, found.shape)}, the leaf is PRNG "
            f"keys {leaf_text}: keys load from key data whose implementation the file's "
            "metadata names (as save_file writes them)"
        )
    if key_dtype_of(impl) != leaf.dtype:
        return f"the file's {found.key!r} holds {impl} keys, the leaf is {leaf_text}"
    shape, dtype = key_data_shape(leaf)
    if found.shape != shape or found.dtype != dtype:
        return (
            f"the file's {found.key!r} is {impl} key data {_typed(found.dtype, found.shape)}, "
            f"the leaf {leaf_text} needs {_typed(np.dtype(dtype), shape)}"
        )
    return None


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


def _hints(*hints: str | None) -> str | None:
    return "\n".join(h for h in hints if h) or None


#: The most look-alike pairs a mismatch names.
_LOOK_ALIKES = 5

# Letters of other scripts drawn like a Latin one (after Unicode's confusables, UTS #39),
# and dashes and slashes drawn like '-' and '/'. Accents, fullwidth and ligature forms are
# NFKD's to undo; invisible (format) characters are dropped.
_LIKE = (
    # Cyrillic: aeopcyxsijdhqwl
    "\u0430\u0435\u043e\u0440\u0441\u0443\u0445\u0455\u0456\u0458\u0501\u04bb\u051b\u051d\u04cf"
    # Cyrillic: ABEKMHOPCTXSIJY
    "\u0410\u0412\u0415\u041a\u041c\u041d\u041e\u0420\u0421\u0422\u0425\u0405\u0406\u0408\u04ae"
    # Greek: ABEZHIKMNOPTYXova
    "\u0391\u0392\u0395\u0396\u0397\u0399\u039a\u039c\u039d\u039f\u03a1\u03a4\u03a5\u03a7\u03bf\u03bd\u03b1"
    # dotless i, script g; dashes; division slash: ig-----/
    "\u0131\u0261\u2010\u2011\u2012\u2013\u2212\u2215"
)
_LATIN = "aeopcyxsijdhqwlABEKMHOPCTXSIJYABEZHIKMNOPTYXovaig-----/"
_DRAWN_AS = str.maketrans(_LIKE, _LATIN)


def _skeleton(text: str) -> str:
    """What `text` looks like: names that look the same have the same skeleton."""
    if text.isascii():
        return text
    decomposed = unicodedata.normalize("NFKD", text)
    kept = "".join(c for c in decomposed if unicodedata.category(c) not in ("Cf", "Mn"))
    return kept.translate(_DRAWN_AS)


def _look_alikes(missing: list[tuple[str, str]], unmatched: list[tuple[str, str]]) -> str | None:
    """Leaves and tensors whose names look the same but are not (a Cyrillic `\\u0435` for `e`,
    a zero-width space), each pair with the code points that differ.

    `missing` holds (leaf path, name) of the leaves no tensor fills, `unmatched` (name,
    key) of the tensors no leaf took; names are compared, paths and keys shown.
    """
    by_look: dict[str, tuple[str, str]] = {}
    for name, key in unmatched:
        by_look.setdefault(_skeleton(name), (name, key))
    found = []
    for leaf, name in missing:
        twin = by_look.get(_skeleton(name))
        if twin is not None:
            found.append(_told_apart(leaf, name, *twin))
            if len(found) == _LOOK_ALIKES:
                break
    return "\n".join(found) or None


def _told_apart(leaf: str, name: str, other: str, key: str) -> str:
    """Where a leaf's name and a look-alike tensor's differ, by code point."""
    parts = []
    matcher = difflib.SequenceMatcher(None, name, other, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        mine, theirs = _code_points(name[i1:i2]), _code_points(other[j1:j2])
        if not mine:
            parts.append(f"at character {j1 + 1} the tensor has {theirs}, the leaf nothing")
        elif not theirs:
            parts.append(f"at character {i1 + 1} the leaf has {mine}, the tensor nothing")
        else:
            parts.append(f"at character {i1 + 1} the leaf has {mine}, the tensor {theirs}")
    return f"  leaf {leaf!r} and tensor {key!r} look alike but differ: " + "; ".join(parts)


def _code_points(text: str) -> str:
    return ", ".join(f"U+{ord(c):04X} {unicodedata.name(c, '(unnamed)')}" for c in text)


def skipped_event(events: EventLog, path: PathLike, skipped: list[str]) -> None:
    """One info event for the tensors `strict=False` left unread, if any."""
    if skipped and events.enabled("info"):
        events.emit(
            "info",
            "into_skipped",
            {
                "file": visible(path_text(path)),
                "count": len(skipped),
                "first": [visible(key) for key in skipped[:5]],
                "reason": "strict=False: tensors no leaf of the tree takes are not read",
            },
        )
