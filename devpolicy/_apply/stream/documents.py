"""Document boundaries in a batch of windows: segment ids and positions from a separator
token, so that a model can keep attention within a document.

A window cut from concatenated documents holds the end of one, whole ones, the start of
another. Given the token that separates them (an EOS ends a document, a BOS starts one),
each window's tokens get a segment id, 1 for the first document in the window, 2 for the
next, ... (0 is never used: grain's and MaxText's padding id), and a position, 0 at each
document's first token.

Worked out on the device from the tokens already there (`on_device`): only the tokens
cross to it, a fifth of the bytes of tokens, ids and positions (uint16 tokens), and one
jitted call works out 8 batches of a group. Where one process places whole batches, the 8
go over in one transfer, stacked, and the call hands each batch's tokens back beside its
ids and positions (`on_device_stacked`): on a TPU a transfer's and an output's fixed
costs, not the arithmetic, are what a batch with segments pays.

A scan over every token is what XLA does worst on a CPU (a cumulative sum over rows of
1,025 cost tens of times a comparison), so a row is cut into blocks of 32 tokens, each
block's separators one 32-bit mask (a reduction), the blocks scanned (a thirty-second of
the tokens), and each token's id and position read from its block's mask by a population
count and a count of leading zeros: two passes over the tokens, no scan over them.
`segments` is the same on the host (numpy: the separators found, then each segment's id and
first position repeated over its tokens), the reference, and what runs where the device
cannot (`groups.place_documents` says where).
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

#: Which side of a document the separator token sits on.
SeparatorIs = Literal["eos", "bos"]
SEPARATOR_KINDS = ("eos", "bos")
#: A batch's keys with segments, in the order they are placed: `windows(fields=...)`
#: renames them to a model's own (flax's lm1b: inputs, inputs_segmentation, ...).
FIELDS = ("tokens", "segment_ids", "positions")
#: The bytes a token's segment id and position add to a batch (two int32).
SEGMENT_BYTES = 8


def segments(
    windows: np.ndarray[Any, Any],
    separator: int,
    separator_is: SeparatorIs,
    out: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None = None,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The segment ids and positions (int32) of every token of `windows` (..., length),
    written into `out` where given (two C-contiguous int32 arrays of the windows' shape).

    The documents' starts found (`starts`); where they are few (documents longer than
    rows: `FEW` starts or fewer), every row written as one document and each start then
    patching its row's tail (`patched`), else every segment worked out (`runs`).

    Example:
        >>> w = np.array([[5, 0, 6, 7, 0, 8]])
        >>> [a.tolist() for a in segments(w, 0, "eos")]
        [[[1, 1, 2, 2, 2, 3]], [[0, 1, 0, 1, 2, 0]]]
        >>> [a.tolist() for a in segments(w, 0, "bos")]
        [[[1, 2, 2, 2, 3, 3]], [[0, 0, 1, 2, 0, 1]]]
    """
    if out is None:
        out = (np.empty(windows.shape, np.int32), np.empty(windows.shape, np.int32))
    if windows.size == 0:
        return out
    found = starts(windows, separator, separator_is)
    if found.size > FEW:
        runs(found, *out)
    else:
        patched(found, *out, None)
    return out


#: Starts in a group at most for which its rows are patched start by start (`patched`):
#: on a 2-core CPU, a group of 8 batches of 32 x 1,025 (x 2,048) from cold memory, a
#: start cost 3-5 us (5-15), working every segment out (`runs`) 450-550 us (1.1-1.5 ms);
#: even at 64 starts patching cost 0.65-0.85 of that.
FEW = 64


def starts(
    windows: np.ndarray[Any, Any],
    separator: int,
    separator_is: SeparatorIs,
    scratch: np.ndarray[Any, Any] | None = None,
) -> np.ndarray[Any, Any]:
    """Where documents start in `windows` (..., length), as flat indices (int64, sorted):
    none at a row's first token (a row's first document is there anyway) nor past the
    last token (an EOS at the very end). One comparison and one search over the tokens,
    the comparison into `scratch` where given (bools, at least the windows' size: memory
    used again each group, where fresh memory cost a third of the search)."""
    length = windows.shape[-1]
    flat = windows.reshape(-1)
    if scratch is None:
        scratch = flat == separator
    else:
        np.equal(flat, separator, out=scratch[: flat.size])
    found = np.flatnonzero(scratch[: flat.size])
    if separator_is == "eos":
        found += 1  # the token after an EOS starts the next document
    inside: np.ndarray[Any, Any] = found[found % length != 0]  # past the end is a multiple too
    return inside


def runs(
    found: np.ndarray[Any, Any],
    ids: np.ndarray[Any, Any],
    positions: np.ndarray[Any, Any],
) -> None:
    """`ids` and `positions` ((..., length) int32, C-contiguous) made those of rows whose
    documents start at `found` (`starts`): the segments found, then each one's id and
    first column repeated over its tokens. (Done a few rows at a time, so that the
    repeats' temporaries stay in cache, it cost more in calls than it saved.)"""
    length = ids.shape[-1]
    total = ids.size
    rows = total // length
    firsts = np.concatenate([np.arange(0, total, length, dtype=np.int64), found])
    firsts.sort()  # distinct: a start is never a row's first token
    lengths = np.diff(firsts, append=total)
    columns = firsts % length
    row_of_first = np.searchsorted(firsts, firsts - columns)
    segment = (np.arange(1, firsts.size + 1) - row_of_first).astype(np.int32)
    np.copyto(ids.reshape(-1), np.repeat(segment, lengths))
    first_columns = np.repeat(columns.astype(np.int32), lengths).reshape(rows, length)
    np.subtract(_columns(length), first_columns, out=positions.reshape(rows, length))


def patched(
    found: np.ndarray[Any, Any],
    ids: np.ndarray[Any, Any],
    positions: np.ndarray[Any, Any],
    differing: list[int] | None,
) -> list[int]:
    """`ids` and `positions` ((..., length) int32, C-contiguous) made those of rows whose
    documents start at `found` (`starts`), by rows: each row written as one document (ids
    1, positions its columns), then each start adding 1 to its row's ids from it on and
    writing its row's positions anew from it. Where `differing` is given, the arrays hold
    that already but for those rows (a reused buffer: only those are written again, so
    a group with few documents costs its starts, not its size). Returns the rows that
    now differ from one document a row, for the next use of the same arrays."""
    length = ids.shape[-1]
    rows = ids.size // length
    ids = ids.reshape(rows, length)
    positions = positions.reshape(rows, length)
    columns = _columns(length)
    if differing is None:
        ids.fill(1)
        np.copyto(positions, columns)
    elif differing:
        ids[differing] = 1
        positions[differing] = columns
    touched: list[int] = []
    for start in found.tolist():  # ascending: a later start rewrites the tail after it
        row, column = divmod(start, length)
        ids[row, column:] += 1
        positions[row, column:] = columns[: length - column]
        if not touched or touched[-1] != row:
            touched.append(row)
    return touched


@functools.lru_cache(maxsize=4)
def _columns(length: int) -> np.ndarray[Any, Any]:
    """0 .. length - 1 (int32, read-only): each token's column in its row."""
    columns = np.arange(length, dtype=np.int32)
    columns.flags.writeable = False
    return columns


@functools.lru_cache(maxsize=16)
def on_device(separator: int, separator_is: SeparatorIs, sharding: Any) -> Any:
    """The jitted function that takes a group's tokens (a tuple of batches on the device)
    and gives their segment ids and positions (two tuples of int32 arrays), each sharded
    exactly as its tokens are (`sharding`; None for tokens not committed to a device, as
    `jax.device_put` without one leaves them: the outputs then follow the tokens). Made
    once per separator and sharding, compiled by JAX once per shape and dtype (every
    call `CALL_BATCHES` batches); across processes it runs on the global arrays, every
    process calling it in the same order. A call's fixed cost is paid once for all its
    batches."""

    def group(tokens: tuple[jax.Array, ...]) -> tuple[tuple[jax.Array, ...], ...]:
        ids, positions = device_segments(jnp.stack(tokens), separator, separator_is)
        count = len(tokens)
        return tuple(ids[i] for i in range(count)), tuple(positions[i] for i in range(count))

    if sharding is None:
        return jax.jit(group)
    return jax.jit(group, out_shardings=sharding)


@functools.lru_cache(maxsize=16)
def on_device_stacked(separator: int, separator_is: SeparatorIs, sharding: Any) -> Any:
    """The jitted function that takes `CALL_BATCHES` batches of tokens stacked in one
    array (sent in one transfer: on a TPU a transfer costs about as much to start as to
    carry a batch) and gives each batch's tokens, segment ids and positions (three tuples
    of arrays), each sharded as a batch alone is placed (`sharding`, committed). Made
    once per separator and sharding, compiled once per shape."""

    def group(stacked: jax.Array) -> tuple[tuple[jax.Array, ...], ...]:
        ids, positions = device_segments(stacked, separator, separator_is)
        count = stacked.shape[0]
        return tuple(tuple(part[i] for i in range(count)) for part in (stacked, ids, positions))

    return jax.jit(group, out_shardings=sharding)


@functools.lru_cache(maxsize=16)
def on_device_packed(sharding: Any) -> Any:
    """The jitted function that takes a group of packed batches, their tokens stacked in
    one array (count, rows, length) and their rows' document starts in another (uint32,
    (count, rows, blocks + 1): `packed.start_words`, each row's starts a bit a token, its
    last word the tokens of documents in it, the rest padding), and gives each batch's
    tokens, segment ids and positions (three tuples of arrays), sharded as a batch alone
    is placed (`sharding`, committed); the padding's ids and positions 0. The starts
    cross as a sixteenth of uint16 tokens' bytes, where the host's ids and positions
    were four times them. Made once per sharding, compiled once per shape."""

    def group(stacked: jax.Array, words: jax.Array) -> tuple[tuple[jax.Array, ...], ...]:
        length = stacked.shape[-1]
        ids, positions = masked_segments(words[..., :-1], length)
        used = words[..., -1:].astype(jnp.int32)
        real = lax.broadcasted_iota(jnp.int32, stacked.shape, stacked.ndim - 1) < used
        ids = jnp.where(real, ids, 0)
        positions = jnp.where(real, positions, 0)
        count = stacked.shape[0]
        return tuple(tuple(part[i] for i in range(count)) for part in (stacked, ids, positions))

    return jax.jit(group, out_shardings=sharding)


@functools.lru_cache(maxsize=32)
def placed_as_given(sharding: Any, count: int) -> Any:
    """The jitted function that takes `count` host arrays and gives them back placed,
    each sharded by `sharding` (donated: each output is its input's device copy, nothing
    computed, nothing copied twice). For a device that adopts host memory (the CPU's),
    where a `device_put` costs about 60 us an array in Python, so that a batch's 3
    arrays cost 3 times its tokens' 1: one call places a group's tokens, ids and
    positions for less than the `device_put` of its tokens alone
    (`groups.place_documents`). Made once per sharding and count, compiled once per
    shape and dtype."""

    def given(*arrays: jax.Array) -> tuple[jax.Array, ...]:
        return arrays

    donated = tuple(range(count))
    return jax.jit(given, in_shardings=sharding, out_shardings=sharding, donate_argnums=donated)


#: Batches one device call works out (a group's last call filled up to it, so that a
#: batch shape compiles once: `groups.place_documents`); one call a batch cost 1.8x.
CALL_BATCHES = 8
#: Tokens a block: a block's separators are one uint32 mask.
BLOCK = 32


def device_segments(
    windows: jax.Array, separator: int, separator_is: SeparatorIs
) -> tuple[jax.Array, jax.Array]:
    """What `segments` gives, in JAX (traced under `on_device`): the rows (the last axis)
    cut into blocks of `BLOCK`, each block's document starts a bit mask
    (`_separator_masks`), the ids and positions read from the masks (`masked_segments`).
    Column 0 starts a row's first document but counts no id."""
    return masked_segments(_separator_masks(windows, separator, separator_is), windows.shape[-1])


def _separator_masks(windows: jax.Array, separator: int, separator_is: SeparatorIs) -> jax.Array:
    """Each `BLOCK` tokens' document starts as one uint32 (bit i: the block's token i
    starts a document), column 0's bit clear (uint32, (..., blocks))."""
    *lead, length = windows.shape
    blocks = -(-length // BLOCK)
    edges = [(0, 0)] * len(lead)
    found = jnp.pad(windows == separator, [*edges, (0, blocks * BLOCK - length)])
    found = found.reshape(*lead, blocks, BLOCK)
    bit = jnp.uint32(1) << lax.iota(jnp.uint32, BLOCK)
    masks = jnp.sum(jnp.where(found, bit, jnp.uint32(0)), axis=-1, dtype=jnp.uint32)
    if separator_is == "eos":  # the token after an EOS starts the next document
        carried = jnp.pad(masks[..., :-1] >> (BLOCK - 1), [*edges, (1, 0)])
        masks = (masks << 1) | carried
    block = lax.broadcasted_iota(jnp.int32, masks.shape, len(lead))
    return jnp.where(block == 0, masks & jnp.uint32(0xFFFFFFFE), masks)  # column 0


def masked_segments(masks: jax.Array, length: int) -> tuple[jax.Array, jax.Array]:
    """The segment ids and positions (int32, (..., length)) of rows whose document starts
    are `masks` (uint32, (..., blocks): bit i of block b, column b * `BLOCK` + i starts a
    document; column 0's bit clear, as it starts the row's first). A token's id is 1 + the
    starts before its block + those in its block up to it (a population count), its
    position its column less the last start up to it (in its block: the mask's highest
    bit up to it; else the last start of the blocks before, a scan over blocks): no scan
    over the tokens."""
    *lead, blocks = masks.shape
    edges = [(0, 0)] * len(lead)
    axis = len(lead)
    block = lax.broadcasted_iota(jnp.int32, masks.shape, axis)
    counts = lax.population_count(masks).astype(jnp.int32)
    before = jnp.cumsum(counts, axis=axis) - counts
    highest = BLOCK - 1 - lax.clz(masks).astype(jnp.int32)
    last = lax.cummax(jnp.where(masks != 0, block * BLOCK + highest, 0), axis=axis)
    last_before = jnp.pad(last[..., :-1], [*edges, (1, 0)])
    shape = (*lead, blocks, BLOCK)
    within = lax.broadcasted_iota(jnp.uint32, shape, axis + 1)
    upto = masks[..., None] & (jnp.uint32(0xFFFFFFFF) >> (BLOCK - 1 - within))
    ids = 1 + before[..., None] + lax.population_count(upto).astype(jnp.int32)
    first = lax.broadcasted_iota(jnp.int32, shape, axis) * BLOCK  # the block's column 0
    column = first + within.astype(jnp.int32)
    start = jnp.where(
        upto != 0, first + (BLOCK - 1) - lax.clz(upto).astype(jnp.int32), last_before[..., None]
    )
    positions = column - start
    flat = (*lead, blocks * BLOCK)
    return ids.reshape(flat)[..., :length], positions.reshape(flat)[..., :length]
