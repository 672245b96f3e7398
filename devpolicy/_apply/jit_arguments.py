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

from .._base.errors import TransferPlanError
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
        devices: The devices its move sends bytes to, as the call's `transfer` event lists
            them: a device that already holds all of it receives nothing. Where it stays,
            the devices the computation takes it on; unused, none.
        direction: The transfer it would be (`host_to_device`, `device_to_device`), or
            None where it stays (already there, unused, or its placement unknown).
        nbytes: The bytes that would cross, over every destination device (0 where none).
        shape: Its shape.
        dtype: Its dtype (`key<fry>` for a typed PRNG key).
        scalar: A 0-d argument (a Python scalar, an index): not data, never refused. A
            typed PRNG key is data (its key bits move), whatever its shape.
        mode: What the policy's `transfers:` would do with the move: `allow`, `log` or
            `disallow` (`allow` for a policy without `transfers:`, and where it stays).
        sharding_devices: Every device the computation takes it on (its input sharding's
            devices), those that already hold it included; none where it is unused.
        unused: The computation does not use it: JAX drops it before moving anything
            (jit's `keep_unused=False`), so it is never moved, whatever its placement.
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
    sharding_devices: tuple[str, ...] = ()
    unused: bool = False


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
    def unused(self) -> tuple[PlannedArgument, ...]:
        """The arguments the computation does not use (JAX drops them: never moved)."""
        return tuple(a for a in self.arguments if a.unused)

    @property
    def nbytes(self) -> int:
        """The bytes the call would move in all."""
        return sum(a.nbytes for a in self.arguments)

    @property
    def refused(self) -> tuple[PlannedArgument, ...]:
        """The moves the policy's `transfers:` would refuse (`TransferRefusedError`)."""
        return tuple(a for a in self.arguments if a.mode == "disallow" and not a.scalar)

    def __str__(self) -> str:
        moved, unused = self.moved, self.unused
        lines = [
            f"{self.function}: {len(moved)} of {len(self.arguments)} arguments moved, "
            f"{self.nbytes} bytes" + (f", {len(unused)} unused" if unused else "")
        ]
        for a in moved:
            refused = ", refused" if a.mode == "disallow" and not a.scalar else ""
            held = [d for d in a.sharding_devices if d not in a.devices]
            holding = f" ({','.join(held)} holds it already)" if held else ""
            lines.append(
                f"  {a.argument}: {a.dtype}{list(a.shape)} {a.source} -> "
                f"{','.join(a.devices)}, {a.direction}, {a.nbytes} bytes{refused}{holding}"
            )
        lines += [
            f"  {a.argument}: {a.dtype}{list(a.shape)} {a.source}, unused: JAX drops it, "
            "nothing moved"
            for a in unused
        ]
        return "\n".join(lines)


def predict(
    step: Any, args: Sequence[Any], kwargs: Mapping[str, Any], watch: Watch | None
) -> TransferPlan:
    """What `step(*args, **kwargs)` would move, by `watch`'s modes (see `TransferPlan`).

    Raises:
        TransferPlanError: `step` is not a jitted function, `args` not a tuple or list,
            `kwargs` not a mapping; or the call would fail: an argument it uses is deleted,
            or lowering it fails (arguments committed to incompatible devices, a shape its
            shardings do not divide), JAX's error chained.
    """
    name = function_name(step)
    lower = getattr(step, "lower", None)
    if not callable(step):
        raise TransferPlanError(
            name,
            None,
            f"a {_kind(step)} is not a function; pass the jitted function itself "
            "(jax.jit(f)), not its name or its result",
        )
    if not callable(lower):
        raise TransferPlanError(
            name,
            None,
            "not a jitted function (it has no .lower); wrap it in jax.jit: a plain "
            "function's operations each place their own arguments, which only running it "
            "shows (transfers: log)",
        )
    if not isinstance(args, (tuple, list)):
        raise TransferPlanError(
            name,
            "args",
            f"a {_kind(args)} is not a tuple of arguments (iterating it would split it "
            "into its rows); pass (x,) for one argument",
        )
    if not isinstance(kwargs, Mapping):
        raise TransferPlanError(
            name,
            "kwargs",
            f"a {_kind(kwargs)} is not a mapping of keyword names to arguments; pass "
            "{'name': x}, or args for positional arguments",
        )
    try:
        compiled = lower(*args, **kwargs).compile()
    except Exception as e:  # the call itself would raise this: the plan's finding
        raise TransferPlanError(name, None, f"the call would fail: {e}") from e
    wanted_args, wanted_kwargs = compiled.input_shardings
    static_positions = _static_positions(step, len(args))
    dynamic = [(i, a) for i, a in enumerate(args) if i not in static_positions]
    if len(dynamic) != len(wanted_args):  # a JAX whose jit keeps its statics elsewhere
        raise TransferPlanError(
            name,
            None,
            f"cannot tell which of its {len(args)} positional arguments are static "
            f"({len(wanted_args)} are arrays); pass the static ones by keyword "
            "(static_argnames)",
        )
    pairs = [
        (f"args[{i}]", value, wanted)
        for (i, value), wanted in zip(dynamic, wanted_args, strict=True)
    ]
    pairs += [(f"kwargs[{k!r}]", kwargs[k], wanted_kwargs[k]) for k in wanted_kwargs]
    inv = inventory()
    planned: list[PlannedArgument] = []
    for root, value, wanted in pairs:
        leaves, treedef = jax.tree_util.tree_flatten_with_path(value)
        try:
            # Up to the argument's own structure: an unused leaf's sharding is None, a leaf.
            shardings = treedef.flatten_up_to(wanted)  # type: ignore[attr-defined]  # not in jaxlib's stub
        except (ValueError, TypeError) as e:
            raise TransferPlanError(
                name,
                root,
                "the compiled call takes it in another structure than the one given (a "
                "wrapper such as flax's nnx.jit passes its arguments on rearranged); plan "
                "the jax.jit of the function it wraps, with its arguments as that takes them",
            ) from e
        for (path, leaf), sharding in zip(leaves, shardings, strict=True):
            argument = root + jax.tree_util.keystr(path)
            planned.append(_planned(name, argument, leaf, sharding, watch, inv))
    return TransferPlan(name, tuple(planned))


def function_name(step: Any) -> str:
    """How a plan names `step`: its qualified name, else its repr (`'step'` for a str)."""
    name = getattr(step, "__qualname__", None) or getattr(step, "__name__", None)
    return str(name) if isinstance(name, str) else repr(step)


def _kind(value: object) -> str:
    """`numpy.ndarray`, `dict`: a value's type as the messages name it."""
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _static_positions(step: Any, count: int) -> set[int]:
    """The positions of `step`'s static arguments, which its input shardings leave out
    (static keyword arguments are left out by name, so the shardings' keys are enough)."""
    info = getattr(step, "_jit_info", None)  # JAX's own record of jit's arguments
    numbers = getattr(info, "static_argnums", ()) or ()
    return {n % count for n in numbers if count}


def _planned(
    name: str, argument: str, leaf: Any, sharding: Any, watch: Watch | None, inv: Any
) -> PlannedArgument:
    placed = isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct))
    if not placed:
        # Host data goes as JAX sends it: its dtype canonical (float64 as float32 unless
        # x64 is on), a Python scalar as a 0-d array.
        value = leaf if hasattr(leaf, "dtype") else np.asarray(leaf)
        canonical = jax.dtypes.canonicalize_dtype(value.dtype)
        leaf = jax.ShapeDtypeStruct(np.shape(value), canonical)  # type: ignore[no-untyped-call]
    shape = tuple(int(n) for n in leaf.shape)
    dtype = str(leaf.dtype)
    # A typed PRNG key is data (its key bits move, jax.random.key_data), never a scalar.
    key = bool(jax.numpy.issubdtype(leaf.dtype, jax.dtypes.prng_key))
    held = getattr(leaf, "sharding", None) if placed else None
    source = (
        "numpy"
        if not placed
        else "unknown"
        if held is None
        else ",".join(_texts(held.device_set, inv))
    )

    def staying(devices: tuple[str, ...], unused: bool = False) -> PlannedArgument:
        scalar = not shape and not key
        return PlannedArgument(
            argument, source, devices, None, 0, shape, dtype, scalar, "allow", devices, unused
        )

    if sharding is None:  # unused: JAX drops it before looking at it, deleted or not
        return staying((), unused=True)
    if isinstance(leaf, jax.Array) and leaf.is_deleted():
        raise TransferPlanError(
            name,
            argument,
            f"a deleted array ({dtype}{list(shape)}): the call would raise JAX's 'Array has "
            "been deleted' (donated to an earlier call, or .delete()d); pass a live array",
        )
    everywhere = _texts(sharding.addressable_devices, inv)
    if placed and held is None:  # a ShapeDtypeStruct, nowhere yet
        return staying(everywhere)
    if key:  # measured as its bits: its itemsize in bytes per key
        leaf = _Bits(leaf.shape, np.dtype(f"V{leaf.dtype.itemsize}"), held)
    move = move_into(leaf, sharding, not placed, D2D if placed else H2D, inv)
    if move is None:
        return staying(everywhere)
    mode = watch.mode_of(move) if watch is not None else "allow"
    return PlannedArgument(
        argument,
        move.source,
        move.devices,
        move.direction,
        move.nbytes,
        shape,
        dtype,
        move.scalar and not key,
        mode,
        everywhere,
    )


@dataclass(frozen=True, slots=True)
class _Bits:
    """A typed key's bits as `move_into` measures an array: shape, a plain dtype of the
    key's size, and where they are."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    sharding: Any


def _texts(devices: Any, inv: Any) -> tuple[str, ...]:
    return tuple(inv.text(d) for d in sorted(devices, key=lambda d: d.id))
