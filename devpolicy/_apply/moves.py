"""Arrays moved to where a decision says, and arrays found elsewhere reported.

`move_inputs` (the arguments of `@place(inputs="move")`), `move_to` (`devpolicy.to`) and
`commit_sharded` (any array onto a sharded decision's sharding) copy what is on another
device; what cannot go (a shape that does not divide over the mesh, a result left on
another device) is a `placement_mismatch` event (`report_mismatch`).
"""

from __future__ import annotations

from typing import Any, TypeVar

import jax

from .._base.events import EventLog
from .._decide.decider import Decider
from .._decide.decision import Decision
from .._machine.inventory import inventory
from .._machine.ledger import record, record_all

T = TypeVar("T")


def move_inputs(
    args: tuple[Any, ...], kwargs: dict[str, Any], decision: Decision, events: EventLog
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`args` and `kwargs` with each committed single-device `jax.Array` leaf that sits on
    another device moved to the decided one, in one `device_put`.

    Uncommitted arrays are left alone (JAX moves them itself), and so are sharded arrays
    and tracers. Each move is a debug `input_moved` event; each call that moves anything
    one `inputs_moved` event (info the first time for a name and its source devices).
    """
    if decision.mesh is not None:
        # A sharded rule: arguments go to its sharding, as results are committed to it
        # (what does not divide over the mesh stays, reported as a placement_mismatch).
        moved: tuple[tuple[Any, ...], dict[str, Any]] = commit_sharded(
            (args, kwargs), decision, events
        )
        return moved
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    indices = [i for i, leaf in enumerate(leaves) if _elsewhere(leaf, decision.device)]
    if not indices:
        return args, kwargs
    moving = [leaves[i] for i in indices]
    placed = jax.device_put(moving, decision.destination)
    for i, leaf in zip(indices, placed, strict=True):
        leaves[i] = leaf
    record_all(placed, decision.name, decision.origin, decision.rule)
    _report_moves(events, decision, moving, indices, (args, kwargs), arguments=True)
    moved_args, moved_kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
    return moved_args, moved_kwargs


def _elsewhere(leaf: Any, device: jax.Device) -> bool:
    if not isinstance(leaf, jax.Array) or isinstance(leaf, jax.core.Tracer):
        return False
    if not leaf.committed:
        return False
    devices = leaf.devices()
    return len(devices) == 1 and device not in devices


def _report_moves(
    events: EventLog,
    decision: Decision,
    moving: list[jax.Array],
    indices: list[int],
    tree: Any,
    *,
    arguments: bool = False,
) -> None:
    """Log moved leaves; `arguments`: `tree` is (args, kwargs), named `0/...` or `key/...`."""
    inv = inventory()
    sources = sorted({inv.text(next(iter(leaf.devices()))) for leaf in moving})
    nbytes = sum(leaf.nbytes for leaf in moving)
    if events.enabled("debug"):
        for leaf, index in zip(moving, indices, strict=True):
            events.emit(
                "debug",
                "input_moved",
                {
                    "name": decision.name,
                    "leaf": leaf_path(tree, index).split("/", 1)[1]
                    if arguments
                    else leaf_path(tree, index),
                    "from_device": inv.text(next(iter(leaf.devices()))),
                    "device": decision.device_text,
                    "nbytes": leaf.nbytes,
                },
            )
    first = events.first_time(("inputs_moved", decision.name, *sources))
    events.emit(
        "info" if first else "debug",
        "inputs_moved",
        {
            "name": decision.name,
            "device": decision.device_text,
            "from_devices": ", ".join(sources),
            "count": len(moving),
            "nbytes": nbytes,
            "origin": decision.origin,
        },
    )


def move_to(decider: Decider, x: T, name: str) -> T:
    """Every `jax.Array` leaf of `x` on the device decided for `name`, committed there."""
    if not isinstance(name, str):
        raise TypeError(f"to() takes a name (str) second, got {type(name).__name__} {name!r}")
    decision = decider.resolve(name)
    if decision.mesh is not None:
        return commit_sharded(x, decision, decider.events)
    leaves, treedef = jax.tree_util.tree_flatten(x)
    indices = [
        i
        for i, leaf in enumerate(leaves)
        if isinstance(leaf, jax.Array)
        and not isinstance(leaf, jax.core.Tracer)
        and (
            not leaf.committed
            or leaf.devices() != {decision.device}
            or (
                decision.memory_kind is not None
                and leaf.sharding.memory_kind != decision.memory_kind
            )
        )
    ]
    if not indices:
        return x
    moving = [leaves[i] for i in indices]
    placed = jax.device_put(moving, decision.destination)
    for i, leaf in zip(indices, placed, strict=True):
        leaves[i] = leaf
    record_all(placed, decision.name, decision.origin, decision.rule)
    committed = [(j, leaf) for j, leaf in zip(indices, moving, strict=True) if leaf.committed]
    if committed:
        _report_moves(
            decider.events, decision, [leaf for _, leaf in committed], [j for j, _ in committed], x
        )
    out: T = jax.tree_util.tree_unflatten(treedef, leaves)
    return out


def commit_sharded(result: T, decision: Decision, events: EventLog) -> T:
    sharding = decision.sharding
    assert sharding is not None
    leaves, treedef = jax.tree_util.tree_flatten(result)
    changed = False
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, jax.Array) or isinstance(leaf, jax.core.Tracer):
            continue
        if leaf.committed and leaf.sharding.is_equivalent_to(sharding, leaf.ndim):
            continue
        try:
            leaves[i] = jax.device_put(leaf, sharding)
        except ValueError as e:  # a shape that does not divide over the mesh: say so
            report_mismatch(events, decision, None, leaf, leaf_path(result, i), str(e))
            continue
        record(leaves[i], decision.name, decision.origin, decision.rule)
        changed = True
    if not changed:
        return result
    out: T = jax.tree_util.tree_unflatten(treedef, leaves)
    return out


def leaf_path(tree: Any, index: int) -> str:
    # Paths are only worked out when a mismatch is reported: flattening with paths is slower.
    path, _ = jax.tree_util.tree_flatten_with_path(tree)[0][index]
    return jax.tree_util.keystr(path, simple=True, separator="/")


def report_mismatch(
    events: EventLog,
    decision: Decision,
    device: jax.Device | None,
    leaf: jax.Array,
    path: str,
    reason: str | None = None,
) -> None:
    actual = "sharded" if device is None else inventory().text(device)
    level = (
        "warning" if events.first_time(("placement_mismatch", decision.name, actual)) else "debug"
    )
    fields = {
        "name": decision.name,
        "leaf": path,
        "device": decision.device_text,
        "actual_device": actual,
        "shape": tuple(leaf.shape),
        "dtype": str(leaf.dtype),
        "origin": decision.origin,
        "process_index": decision.device.process_index,
    }
    events.emit(
        level, "placement_mismatch", fields if reason is None else {**fields, "reason": reason}
    )
