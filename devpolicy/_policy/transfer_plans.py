"""`devpolicy.plan_transfers`: the implicit transfers of a jit call, predicted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._apply.jit_arguments import TransferPlan, function_name, predict
from .._base.errors import TransferPlanError
from .active import active_policy
from .policy import Policy


def plan_transfers(
    step: Any,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    policy: Policy | None = None,
) -> TransferPlan:
    """Which arguments `step(*args, **kwargs)` would have JAX move, and how many bytes.

    `step` is a `jax.jit` function. Its arguments may be arrays, numpy arrays, Python
    scalars, or `jax.ShapeDtypeStruct`s with a `sharding` standing for arrays placed
    there: the tree `devpolicy.shardings(name, tree)` gives says where the policy would
    put a tree, so a call can be planned before anything is loaded. The computation's
    own input shardings come from compiling the call for these arguments, as the call
    would (nothing runs, nothing is moved, nothing is logged). Each argument's `mode`
    says what the policy's `transfers:` (`policy`, else the active one) would do with
    its move; `TransferPlan.refused` lists the moves it would refuse.

    Host data into a CPU device counts as `host_to_device`, as JAX calls it (the
    policy's `host_local` field decides its mode). A `ShapeDtypeStruct` without a
    sharding has no placement to compare: its `source` is `unknown`, never a move. A
    move's `devices` are those its `transfer` event lists (a device already holding all
    of the array receives nothing); `sharding_devices` all the computation takes it on.
    An argument the computation does not use is `unused`, never moved: JAX drops it
    (jit's `keep_unused=False`). A typed PRNG key is planned as its dtype (`key<fry>`)
    with the bytes of its key data.

    Raises:
        TransferPlanError: `step` is not a jitted function, `args` is not a tuple or
            list, `kwargs` not a mapping, `policy` not a `Policy`; or the call would
            fail (an argument it uses deleted; arguments committed to devices one
            computation cannot span, or any failure lowering it), its error chained.

    Example:
        >>> import devpolicy, jax, numpy as np
        >>> cpu0, cpu1 = jax.devices("cpu")[:2]
        >>> on_cpu0 = jax.sharding.NamedSharding(
        ...     jax.make_mesh((1,), ("x",), devices=[cpu0]), jax.sharding.PartitionSpec()
        ... )
        >>> step = jax.jit(lambda w, x: w @ x, in_shardings=on_cpu0)
        >>> w = jax.device_put(np.ones((64, 64), np.float32), cpu1)  # on the wrong device
        >>> batch = np.ones((64, 8), np.float32)
        >>> p = devpolicy.load_policy({"version": 1, "transfers": {"device_to_device": "disallow"}})
        >>> print(devpolicy.plan_transfers(step, (w, batch), policy=p))
        <lambda>: 2 of 2 arguments moved, 18432 bytes
          args[0]: float32[64, 64] cpu:1 -> cpu:0, device_to_device, 16384 bytes, refused
          args[1]: float32[64, 8] numpy -> cpu:0, host_to_device, 2048 bytes
    """
    if policy is not None and not isinstance(policy, Policy):
        raise TransferPlanError(
            function_name(step),
            "policy",
            f"a {type(policy).__name__} is not a Policy; pass devpolicy.load_policy(...) of "
            "it, or leave policy= out for the active policy",
        )
    chosen = policy if policy is not None else active_policy()
    return predict(step, args, {} if kwargs is None else kwargs, chosen.watch)
