"""A stream's tokens: one array, a list of shards (their concatenation: `shards`), or a
mixture's named sources with their weights, each a host view of numbers (zero-copy: a file
mapping stays a mapping), checked before anything is opened. No device is touched here.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import repeat
from operator import attrgetter
from typing import Any

import numpy as np

from ..._base.errors import HostViewError
from ..hostview import host_view
from .shards import Shards, shards_of

#: A stream's source: one host view, or shards as one.
TokenView = np.ndarray[Any, Any] | Shards


def token_sources(
    tokens: Any, weights: Mapping[str, float] | None
) -> tuple[list[tuple[str, TokenView]] | None, list[float] | None]:
    """A mixture's sources and weights, checked (None, None for one array)."""
    if not isinstance(tokens, Mapping):
        if weights is not None:
            raise ValueError(
                "windows weights= mixes several token arrays: pass tokens as a mapping of "
                f"names to arrays ({{'web': a, 'code': b}}), got one {type(tokens).__name__}"
            )
        return None, None
    if not tokens:
        raise ValueError("windows tokens is an empty mapping: a mixture needs a source")
    names = list(tokens)
    for key in names:
        if not isinstance(key, str) or not key:
            raise TypeError(f"windows tokens' names must be non-empty strs, got {key!r}")
    if not isinstance(weights, Mapping):
        one = (
            f"; a mapping of one array (a loaded file's tensors?): pass "
            f"tokens[{names[0]!r}] itself for a stream of it"
            if len(names) == 1
            else ""
        )
        raise ValueError(
            f"windows of a mixture ({', '.join(names)}) need weights=, a mapping of the "
            f"same names to weights, got {weights!r}{one}"
        )
    missing = [n for n in names if n not in weights]
    unknown = [str(n) for n in weights if n not in tokens]
    if missing or unknown:
        raise ValueError(
            "windows weights must name the sources of tokens, each once: "
            + "; ".join(
                part
                for part in (
                    f"no weight for {', '.join(map(repr, missing))}" if missing else "",
                    f"no source {', '.join(map(repr, unknown))} in tokens" if unknown else "",
                )
                if part
            )
            + f" (sources: {', '.join(map(repr, names))})"
        )
    numbers = []
    for key in names:
        weight = weights[key]
        if (
            isinstance(weight, bool)
            or not isinstance(weight, (int, float, np.integer, np.floating))
            or not 0 < float(weight) < float("inf")
        ):
            raise ValueError(
                f"windows weights[{key!r}] must be a finite number > 0 (a source never "
                f"drawn from is a source left out), got {weight!r}"
            )
        numbers.append(float(weight))
    views = [(key, source_view(key, tokens[key])) for key in names]
    _, first = views[0]
    for key, view in views[1:]:
        if view.dtype != first.dtype or view.shape[1:] != first.shape[1:]:
            raise ValueError(
                f"windows sources of one mixture share a dtype and row shape: "
                f"{names[0]!r} is {first.dtype} {first.shape[1:]}, {key!r} is "
                f"{view.dtype} {view.shape[1:]}"
            )
    return views, numbers


def source_view(key: str | None, source: Any) -> TokenView:
    """Tokens (a mixture's source `key`) as a host view of numbers, or a list of shards
    as one (`Shards`), an error naming them (the shard) where they are none."""
    what = "windows tokens" if key is None else f"windows tokens[{key!r}]"
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError(
                f"{what} is an empty {type(source).__name__}: a list of shards (1-D token "
                "arrays, their concatenation the source) needs at least one"
            )
        if np.isscalar(source[0]):  # token ids, not shards
            raise TypeError(
                f"{what} must be a jax.Array on a host device or a numpy array (a memmap is "
                "fine), or a list of them (shards: their concatenation), got a "
                f"{type(source).__name__} of {type(source[0]).__name__}: pass np.asarray(...) "
                "of token ids"
            )
        first = _one_view(f"{what}[0]", source[0], shard=True)
        rest = source[1:]
        # A thousand 1-D memmaps of the first one's dtype: each is its own host view and a
        # shard, known so in passes of C-level maps (a third of a loop's time: 0.2 against
        # 0.6 ms), each asked once (`shards_of` asks again only of a list it may refuse).
        if (
            all(map(isinstance, rest, repeat(np.ndarray)))
            and {first.dtype}.issuperset(map(attrgetter("dtype"), rest))
            and first.ndim == 1
            and {1}.issuperset(map(attrgetter("ndim"), rest))
        ):
            return Shards([first, *rest])
        views = [first]
        for i, shard in enumerate(rest, 1):
            same = isinstance(shard, np.ndarray) and shard.dtype == first.dtype
            views.append(shard if same else _one_view(f"{what}[{i}]", shard, shard=True))
        return shards_of(what, views)
    return _one_view(what, source, mixture=key is None)


def _one_view(
    what: str, source: Any, *, mixture: bool = False, shard: bool = False
) -> np.ndarray[Any, Any]:
    """One array (`what`) as a host view of numbers, an error naming it where it is none
    (`mixture`: a mapping of them was possible; `shard`: an item of a list of shards)."""
    takes = f"{what} must be a jax.Array on a host device or a numpy array (a memmap is fine)"
    if isinstance(source, (list, tuple)) or np.isscalar(source):
        fix = (
            "a list is shards, each an array: pass np.asarray(...) of a list of token ids"
            if shard
            else "pass np.asarray(...) of it"
        )
        raise TypeError(f"{takes}, got a {type(source).__name__}: {fix}")
    try:
        view = host_view(source)
    except HostViewError as e:
        raise HostViewError(f"{what}, {e.array}", e.problem, e.fix) from None
    except TypeError:
        more = (
            ", a list of them (shards), or a mapping of names to them (a mixture)"
            if mixture
            else ""
        )
        raise TypeError(f"{takes}{more}, got {type(source).__name__}") from None
    dtype = view.dtype
    # numpy's bool, integers, floats and complex, and ml_dtypes' (bfloat16, float8, int4:
    # kind "V" with a scalar type of their own); not objects, strings, dates or records.
    if not (
        dtype.kind in "biufc"
        or (dtype.kind == "V" and dtype.fields is None and dtype.type is not np.void)
    ):
        raise TypeError(
            f"{what} are {dtype}: a stream's tokens must be numbers (integer token ids, "
            "or bool, float, complex, bfloat16 rows), not objects, strings, dates or records"
        )
    return view
