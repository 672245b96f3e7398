"""64-bit data under JAX's default 32-bit mode: narrowed only when every value survives.

With x64 disabled JAX holds int64, uint64, float64 and complex128 in 32 bits and says
nothing (`jax.device_put(np.array([2**40]))` is `int32 [0]`). Every devpolicy path that
makes an array from host data (`put`, `prefetch`, `load_file`) narrows here, so they all
refuse a change the same way, with the same `narrow=` choice and the same `narrowed` event.
A leaf module: numpy and the errors only; the caller says whether x64 is on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np

from .._base.errors import NarrowingError
from .._base.events import EventLog

Narrow = Literal["exact", "lossy"]

#: What JAX holds each 64-bit dtype in when x64 is disabled.
NARROWER: dict[np.dtype[Any], np.dtype[Any]] = {
    np.dtype(np.int64): np.dtype(np.int32),
    np.dtype(np.uint64): np.dtype(np.uint32),
    np.dtype(np.float64): np.dtype(np.float32),
    np.dtype(np.complex128): np.dtype(np.complex64),
}

_INT32 = np.iinfo(np.int32)
_INT64 = np.iinfo(np.int64)


def check_mode(narrow: object) -> None:
    """Raise ValueError unless `narrow` is 'exact' or 'lossy'."""
    if narrow not in ("exact", "lossy"):
        raise ValueError(f"narrow must be 'exact' or 'lossy', got {narrow!r}")


def loss(original: np.ndarray[Any, Any], narrowed: np.ndarray[Any, Any]) -> str | None:
    """Which values of `original` did not survive in `narrowed`, in words; None if all did."""
    tally = _Loss(narrowed.dtype)
    tally.add(original, narrowed)
    return tally.words()


def loss_in_pieces(pieces: Iterable[np.ndarray[Any, Any]], target: np.dtype[Any]) -> str | None:
    """`loss` of a whole array given as consecutive flat pieces, narrowed to `target`.

    Counts, ranges and flat indices are the whole array's, so a tensor read piece by piece
    (or slice by slice, for its shards) is described as one.

    Example:
        >>> pieces = [np.array([0.5, 0.1]), np.array([1e-50, 2.0])]
        >>> loss_in_pieces(pieces, np.dtype(np.float32))
        '2 values lose precision in float32 (first at flat index 1: 0.1 -> 0.10000000149011612)'
    """
    tally = _Loss(target)
    for piece in pieces:
        flat = piece.reshape(-1)
        narrowed = np.empty(flat.shape, target)
        with np.errstate(over="ignore", invalid="ignore"):
            np.copyto(narrowed, flat, casting="unsafe")
        tally.add(flat, narrowed)
    return tally.words()


class _Loss:
    """What narrowing lost so far, over consecutive pieces of one array."""

    def __init__(self, target: np.dtype[Any]) -> None:
        self._target = target
        self._seen = 0  # items before the next piece
        self._low: Any = None
        self._high: Any = None
        self._changed = 0
        self._first: tuple[int, Any, Any] | None = None  # flat index, before, after

    def add(self, original: np.ndarray[Any, Any], narrowed: np.ndarray[Any, Any]) -> None:
        seen, self._seen = self._seen, self._seen + original.size
        if original.size == 0:
            return
        if original.dtype.kind in "iu":
            low, high = original.min().item(), original.max().item()
            self._low = low if self._low is None else min(self._low, low)
            self._high = high if self._high is None else max(self._high, high)
            return
        with np.errstate(over="ignore", invalid="ignore"):
            widened = narrowed.astype(original.dtype)
        same = (widened == original) | (np.isnan(widened) & np.isnan(original))
        if bool(same.all()):
            return
        self._changed += int((~same).sum())
        if self._first is None:
            index = int(np.argmin(same.reshape(-1)))
            before = original.reshape(-1)[index].item()
            self._first = (seen + index, before, widened.reshape(-1)[index].item())

    def words(self) -> str | None:
        if self._low is not None:
            info = np.iinfo(self._target)
            if self._low < info.min or self._high > info.max:
                return (
                    f"values {self._low}..{self._high} do not fit {self._target} "
                    f"({info.min}..{info.max})"
                )
            return None
        if self._first is None:
            return None
        index, before, after = self._first
        first = f"first at flat index {index}: {before!r} -> {after!r}"
        return f"{self._changed} values lose precision in {self._target} ({first})"


def narrow_into(
    array: np.ndarray[Any, Any], result: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], str | None]:
    """Copy `array` into the 32-bit `result` (same shape); returns it and what was lost."""
    with np.errstate(over="ignore", invalid="ignore"):  # loss is judged below, not warned
        np.copyto(result, array, casting="unsafe")
    return result, loss(array, result)


def narrowed_event(
    events: EventLog,
    name: str,
    array: np.ndarray[Any, Any],
    to_dtype: np.dtype[Any],
    exact: bool,
    *,
    from_dtype: str | None = None,
    file: str | None = None,
) -> None:
    """The `narrowed` event: info when every value survived, warning when some changed."""
    fields: dict[str, Any] = {"name": name}
    if file is not None:
        fields["file"] = file
    fields |= {
        "from_dtype": from_dtype or str(array.dtype),
        "to_dtype": str(to_dtype),
        "exact": exact,
    }
    if array.size:
        fields |= {"min": array.min().item(), "max": array.max().item()}
    events.emit("info" if exact else "warning", "narrowed", fields)


def narrow_leaves(
    names: Sequence[str], leaves: list[Any], narrow: Narrow, events: EventLog
) -> list[Any]:
    """Narrow the 64-bit host leaves of a `put` (x64 disabled), all or none.

    numpy arrays and scalars of a 64-bit dtype are narrowed to what JAX would hold them
    in, and Python ints beyond int32 (which JAX refuses with a bare OverflowError) are
    judged the same way. With `narrow="exact"` every leaf whose values would change is
    listed in one `NarrowingError` before anything is placed.

    Example:
        >>> import numpy as np
        >>> from devpolicy._base.events import EventLog
        >>> out = narrow_leaves(["ids"], [np.arange(3)], "exact", EventLog("error", "console"))
        >>> out[0].dtype
        dtype('int32')
    """
    out = list(leaves)
    problems: list[tuple[str, str]] = []
    for i, (name, leaf) in enumerate(zip(names, leaves, strict=True)):
        if type(leaf) is int:
            if _INT32.min <= leaf <= _INT32.max:
                continue  # JAX takes it as a weakly typed int32: nothing to change
            if not _INT64.min <= leaf <= _INT64.max:
                problems.append((name, f"value {leaf} does not fit int64, let alone int32"))
                continue
            leaf = np.asarray(leaf, np.int64)
        elif not isinstance(leaf, np.ndarray | np.generic):
            continue
        target = NARROWER.get(leaf.dtype)
        if target is None:
            continue
        array = np.asarray(leaf)
        result, problem = narrow_into(array, np.empty(array.shape, target))
        if problem is not None and narrow == "exact":
            problems.append((name, problem))
            continue
        narrowed_event(events, name, array, target, problem is None)
        out[i] = result if isinstance(leaf, np.ndarray) else result[()]
    if problems:
        raise NarrowingError(problems)
    return out
