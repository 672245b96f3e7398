"""Which arguments of a jit call JAX would move, predicted before the call.

JAX moves an argument of a jitted function when it is not already where the compiled
computation takes it: host data (numpy, Python scalars) always, an array whenever its
sharding differs from the computation's input sharding. Both sides are known without
running anything: the computation's input shardings come from lowering and compiling
the call for these arguments (as `step.lower(*args).compile()` does: JAX's own choice,
including the devices an uncommitted argument follows), the arguments' from the
arguments themselves. Each move is measured as the implicit transfer it would be
(`transfers.move_into`), so a prediction and the event of the real call agree.

No array is created or moved, and nothing is logged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from .._base.errors import DevicePolicyError
from .._machine.inventory import inventory
from .transfers import D2D, H2D, Watch, move_into


@dataclass(frozen=True, slots=True)
class PlannedArgument:
    """One array argument of a jit call, and what the call would do with it.

    Attributes:
        argument: Where it is in the call, as JAX writes a tree path
            (`args[0]['params']['w']`, `kwargs['batch']`).
        source: Where it is now: `numpy` for host data, the device texts of an array
            (`cpu:1`, `gpu:0,gpu:1`), or `unknown` for a `jax.ShapeDtypeStruct` without a
            sharding.
        devices: Where the computation takes it (device texts).
        direction: The transfer it would be (`host_to_device`, `device_to_device`), or
            None where it stays (already there, or its placement unknown).
        nbytes: The bytes that would cross, over every destination device (0 where none).
        shape: Its shape.
        dtype: Its dtype.
        scalar: A 0-d argument (a Python scalar, an index): not data, never refused.
        mode: What the policy's `transfers:` would do with the move: `allow`, `log` or
            `disallow` (`allow` for a policy without `transfers:`, and where it stays).
    """

    argument: str
    source: str
    devices: tuple[str, ...]
    direction: str | None
    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    scalar: bool
    mode: str


@dataclass(frozen=True, slots=True)
class TransferPlan:
    """What calling a jitted function with given arguments would move.

    Attributes:
        function: The function's name.
        arguments: Every array argument (each leaf of the call's trees), in call order.
    """

    function: str
    arguments: tuple[PlannedArgument, ...]

    @property
    def moved(self) -> tuple[PlannedArgument, ...]:
        """The arguments the call would move."""
        return tuple(a for a in self.arguments if a.direction is not None)

    @property
    def nbytes(self) -> int:
        """The bytes the call would move in all."""
        return sum(a.nbytes for a in self.arguments)

    @property
    def refused(self) -> tuple[PlannedArgument, ...]:
        """The moves the policy's `transfers:` would refuse (`TransferRefusedError`)."""
        return tuple(a for a in self.arguments if a.mode == "disallow" and not a.scalar)

    def __str__(self) -> str:
        moved = self.moved
        lines = [
            f"{self.function}: {len(moved)} of {len(self.arguments)} arguments moved, "
            f"{self.nbytes} bytes"
        ]
        for a in moved:
            refused = ", refused" if a in self.refused else ""
            lines.append(
                f"  {a.argument}: {a.dtype}{list(a.shape)} {a.source} -> "
                f"{','.join(a.devices)}, {a.direction}, {a.nbytes} bytes{refused}"
            )
        return "\n".join(lines)


def predict(
    step: Any, args: Sequence[Any], kwargs: Mapping[str, Any], watch: Watch | None
) -> TransferPlan:
    """What `step(*args, **kwargs)` would move, by `watch`'s modes (see `TransferPlan`).

    `step.lower(...)` raises what the call itself would raise (incompatible devices, a
    shape the in_shardings do not divide).

    Raises:
        DevicePolicyError: `step` is not a jitted function (it has no `lower`).
    """
    lower = getattr(step, "lower", None)
    name = getattr(step, "__qualname__", None) or getattr(step, "__name__", repr(step))
    if not callable(lower):
        raise DevicePolicyError(
            f"plan_transfers: {name} is not a jitted function (it has no .lower); "
            "wrap it in jax.jit: a plain function's operations each place their own "
            "arguments, which only running it shows (transfers: log)"
        )
    compiled = lower(*args, **kwargs).compile()
    wanted_args, wanted_kwargs = compiled.input_shardings
    static_positions = _static_positions(step, len(args))
    dynamic = [(i, a) for i, a in enumerate(args) if i not in static_positions]
    if len(dynamic) != len(wanted_args):  # a JAX whose jit keeps its statics elsewhere
        raise DevicePolicyError(
            f"plan_transfers: cannot tell which of {name}'s {len(args)} positional "
            f"arguments are static ({len(wanted_args)} are arrays); pass the static ones "
            "by keyword (static_argnames)"
        )
    pairs = [
        (f"args[{i}]", value, wanted)
        for (i, value), wanted in zip(dynamic, wanted_args, strict=True)
    ]
    pairs += [(f"kwargs[{k!r}]", kwargs[k], wanted_kwargs[k]) for k in wanted_kwargs]
    inv = inventory()
    planned: list[PlannedArgument] = []
    for root, value, wanted in pairs:
        leaves = jax.tree_util.tree_flatten_with_path(value)[0]
        shardings = jax.tree_util.tree_leaves(wanted)
        for (path, leaf), sharding in zip(leaves, shardings, strict=True):
            argument = root + jax.tree_util.keystr(path)
            planned.append(_planned(argument, leaf, sharding, watch, inv))
    return TransferPlan(str(name), tuple(planned))


def _static_positions(step: Any, count: int) -> set[int]:
    """The positions of `step`'s static arguments, which its input shardings leave out
    (static keyword arguments are left out by name, so the shardings' keys are enough)."""
    info = getattr(step, "_jit_info", None)  # JAX's own record of jit's arguments
    numbers = getattr(info, "static_argnums", ()) or ()
    return {n % count for n in numbers if count}


def _planned(
    argument: str, leaf: Any, sharding: Any, watch: Watch | None, inv: Any
) -> PlannedArgument:
    devices = tuple(inv.text(d) for d in sorted(sharding.addressable_devices, key=lambda d: d.id))
    placed = isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct))
    if not placed:
        # Host data goes as JAX sends it: its dtype canonical (float64 as float32 unless
        # x64 is on), a Python scalar as a 0-d array.
        value = leaf if hasattr(leaf, "dtype") else np.asarray(leaf)
        canonical = jax.dtypes.canonicalize_dtype(value.dtype)
        leaf = jax.ShapeDtypeStruct(np.shape(value), canonical)  # type: ignore[no-untyped-call]
    shape = tuple(int(n) for n in leaf.shape)
    dtype = str(np.dtype(leaf.dtype))
    if placed and getattr(leaf, "sharding", None) is None:  # a ShapeDtypeStruct, nowhere yet
        return PlannedArgument(
            argument, "unknown", devices, None, 0, shape, dtype, not shape, "allow"
        )
    move = move_into(leaf, sharding, not placed, D2D if placed else H2D, inv)
    if move is None:
        held = sorted(leaf.sharding.device_set, key=lambda d: d.id)
        source = ",".join(inv.text(d) for d in held)
        return PlannedArgument(argument, source, devices, None, 0, shape, dtype, not shape, "allow")
    mode = watch.mode_of(move) if watch is not None else "allow"
    return PlannedArgument(
        argument, move.source, devices, move.direction, move.nbytes, shape, dtype, move.scalar, mode
    )
