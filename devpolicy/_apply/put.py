"""Whole trees placed by name: `put` (every leaf decided as one placement, then moved in
one batch) and `shardings` (the same decisions, nothing moved).

A tree is one placement: one summary event (`put` or `shardings`), each leaf's decision
at debug.
"""

from __future__ import annotations

from typing import Any, TypeVar

import jax
import numpy as np

from .._base.events import EventLog
from .._base.sizes import format_size
from .._decide.decider import Decider
from .._decide.decision import Decision
from .._decide.items import Item
from .._decide.routing import NEVER_MAPPED
from .._machine.ledger import record
from .leaves import ARRAY_LIKE, leaf_names_and_axes, leaf_shape_dtype
from .narrowing import Narrow, check_mode, narrow_leaves

T = TypeVar("T")


def put(decider: Decider, name: str, x: T, narrow: Narrow = "exact", *, local: bool = False) -> T:
    """Place each leaf of `x` by `decider`, every decision made before anything moves.

    With x64 disabled, 64-bit host leaves are narrowed first, all or none (see
    `narrowing.narrow_leaves`), so the sizes decided by are what JAX will hold.
    `local`: each process holds only its own part of the data (a data-parallel batch): a
    sharded leaf becomes a global array made of every process's part
    (`jax.make_array_from_process_local_data`), its size judged by the local part.
    """
    if not isinstance(name, str):
        raise TypeError(f"put() takes a name (str) first, got {type(name).__name__} {name!r}")
    check_mode(narrow)
    leaves, treedef = jax.tree_util.tree_flatten(x)
    names, axes = leaf_names_and_axes(name, x)
    for leaf_name, leaf in zip(names, leaves, strict=True):
        if not isinstance(leaf, ARRAY_LIKE):
            raise TypeError(
                f"put({name!r}): leaf {leaf_name!r} is a {type(leaf).__name__}, not an array "
                "or number; JAX cannot place it (keep such values out of the tree)"
            )
    if not jax.config.jax_enable_x64:  # type: ignore[attr-defined]
        leaves = narrow_leaves(names, leaves, narrow, decider.events)
    # A process-local part's shape says nothing of the global one across processes.
    shapes = local and jax.process_count() > 1
    # A tree is one placement with one summary event; each leaf's decision is debug.
    many = len(leaves) > 1
    decisions = decider.resolve_many(
        [
            (n, _nbytes(leaf), None if shapes else np.shape(leaf), NEVER_MAPPED, None, attached)
            for n, leaf, attached in zip(names, leaves, axes, strict=True)
        ],
        summarised=many,
    )
    if many:
        _put_summary(decider.events, name, decisions)
    # Disabled: what JAX does without devpolicy (the default device, uncommitted).
    placed = jax.device_put(leaves) if decider.disabled else _place_leaves(leaves, decisions, local)
    for array, decision in zip(placed, decisions, strict=True):
        record(array, decision.name, decision.origin, decision.rule)
    out: T = jax.tree_util.tree_unflatten(treedef, placed)
    return out


def _put_summary(
    events: EventLog, name: str, decisions: list[Decision], event: str = "put"
) -> None:
    """One `put` (or `shardings`) event per call: info the first time a tree is placed
    this way, debug after (a training loop's batches do not flood the log)."""
    per_device: dict[str, list[int]] = {}
    per_rule: dict[str, int] = {}
    for decision in decisions:
        totals = per_device.setdefault(decision.device_text, [0, 0])
        totals[0] += 1
        totals[1] += decision.nbytes or 0
        per_rule[decision.origin] = per_rule.get(decision.origin, 0) + 1
    devices = ", ".join(
        f"{d} {format_size(n)} ({count} lea{'f' if count == 1 else 'ves'})"
        for d, (count, n) in sorted(per_device.items())
    )
    rules = ", ".join(f"{origin} x{count}" for origin, count in per_rule.items())
    first = events.first_time((event, name, devices, rules))
    if not events.enabled("info" if first else "debug"):
        return
    events.emit(
        "info" if first else "debug",
        event,
        {
            "name": name,
            "leaves": len(decisions),
            "nbytes": sum(n for _, n in per_device.values()),
            "devices": devices,
            "rules": rules,
            "fallbacks": sum(d.fallback_reason is not None for d in decisions),
        },
    )


def shardings(decider: Decider, name: str, tree: T) -> T:
    """The sharding each leaf of `tree` would be placed with by `put(name, tree)`: its
    leaves arrays or `jax.ShapeDtypeStruct`s (shape and dtype are all that is read), all
    decided as one placement. Nothing moves and nothing is created. The axis names a
    framework attached to a leaf (`leaf_axes`) go with it, for rules with `axes: attached`."""
    if not isinstance(name, str):
        raise TypeError(f"shardings() takes a name (str) first, got {type(name).__name__} {name!r}")
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    names, axes = leaf_names_and_axes(name, tree)
    items: list[Item] = []
    for leaf_name, leaf, attached in zip(names, leaves, axes, strict=True):
        shape, dtype = leaf_shape_dtype(leaf, f"shardings({name!r})", leaf_name)
        # What JAX will hold: 64-bit types narrowed when x64 is off.
        itemsize = np.dtype(jax.dtypes.canonicalize_dtype(dtype)).itemsize
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        items.append((leaf_name, nbytes, shape, NEVER_MAPPED, None, attached))
    # As `put`: a tree is one summary event, each leaf's decision debug.
    many = len(items) > 1
    decisions = decider.resolve_many(items, summarised=many)
    if many:
        _put_summary(decider.events, name, decisions, "shardings")
    found: list[Any] = []
    for decision in decisions:
        if decision.sharding is None:
            raise ValueError(
                f"shardings({name!r}): {decision.name!r} has no sharding on this machine "
                f"({decision.device_text})"
            )
        found.append(decision.sharding)
    out: T = jax.tree_util.tree_unflatten(treedef, found)
    return out


def _nbytes(leaf: Any) -> int:
    nbytes = getattr(leaf, "nbytes", None)
    return nbytes if isinstance(nbytes, int) else int(np.asarray(leaf).nbytes)


def _place_leaves(leaves: list[Any], decisions: list[Decision], local: bool) -> list[Any]:
    """Single-device leaves in one batched `device_put`; sharded host data built from the
    slices each device holds, so no process ever sends (or all-gathers) the whole array."""
    placed: list[Any] = [None] * len(leaves)
    batch = [
        i for i, d in enumerate(decisions) if d.mesh is None or isinstance(leaves[i], jax.Array)
    ]
    if batch:
        moved = jax.device_put(
            [leaves[i] for i in batch], [decisions[i].destination for i in batch]
        )
        for i, array in zip(batch, moved, strict=True):
            placed[i] = array
    for i, decision in enumerate(decisions):
        if placed[i] is None and local:
            placed[i] = jax.make_array_from_process_local_data(  # type: ignore[no-untyped-call]
                decision.sharding, leaves[i]
            )
        elif placed[i] is None:
            placed[i] = sharded_from_host(np.asarray(leaves[i]), decision)
    return placed


def sharded_from_host(array: np.ndarray[Any, Any], decision: Decision) -> jax.Array:
    """A global array sharded by `decision` from a host array every process holds whole.

    Each addressable device gets its slice, read once even when several devices share it.
    """
    assert decision.sharding is not None
    slices: dict[tuple[tuple[int | None, int | None, int | None], ...], Any] = {}

    def piece(index: Any) -> Any:
        key = tuple((s.start, s.stop, s.step) for s in index)
        found = slices.get(key)
        if found is None:
            found = slices[key] = array[index]
        return found

    return jax.make_array_from_callback(array.shape, decision.sharding, piece)
