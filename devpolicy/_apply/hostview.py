"""Huge host arrays: a host-resident JAX array as a zero-copy numpy view, and the warning
for a JAX array that JAX itself cannot index (more than 2**31 elements, x64 off).

With x64 disabled JAX passes indices to its compiled gather as int32, so `x[-3:]` of an
array of 10.2e9 elements raises OverflowError. numpy indexes with 64-bit offsets, and on
the CPU backend `np.asarray` of a JAX array aliases its buffer (measured on jax 0.10.2:
also for arrays adopted from a mapped file): the view costs nothing and reads the
mapped file or aligned buffer the array was made from.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import jax
import ml_dtypes
import numpy as np

from .._base.errors import HostViewError
from .._base.events import EventLog
from .._base.sizes import format_size
from .._decide.decision import Decision
from .._machine.inventory import inventory

#: Arrays with more elements than this cannot be indexed by JAX with x64 disabled.
INDEX_LIMIT = 2**31

_HOST_PLATFORMS = frozenset({"cpu"})
#: Platforms whose devices adopt a 64-byte-aligned host buffer rather than copy it.
ADOPTING = frozenset({"cpu"})
#: Memory kinds that are host memory: a buffer placed there may be adopted too.
HOST_KINDS = frozenset({"pinned_host", "unpinned_host"})


def copies_host_memory(decision: Decision[Any]) -> bool:
    """Whether placing a host array by `decision` copies it into device memory (every
    device an accelerator's, its memory kind not a host one), so that the host array
    is read once and may then change or go: a ring buffer reused, a file's mapping
    read unaligned. False where the device may adopt the buffer (the CPU's)."""
    if decision.memory_kind in HOST_KINDS:
        return False
    sharding = decision.sharding
    devices = sharding.device_set if sharding is not None else {decision.device}
    return all(getattr(d, "platform", "cpu") not in ADOPTING for d in devices)


def _described(array: jax.Array) -> str:
    shape = ",".join(map(str, array.shape))
    try:
        devices = array.devices()
    except Exception:  # a deleted array may not say
        devices = set()
    if len(devices) == 1:
        where = f" on {inventory().text(next(iter(devices)))}"
    elif devices:
        where = f" over {len(devices)} devices"
    else:
        where = ""
    return f"{array.dtype}[{shape}]{where}"


def _sub_byte_bits(dtype: np.dtype[Any]) -> int | None:
    """The bits of a sub-byte dtype (int2, int4, uint4, float4_e2m1fn...), else None."""
    if dtype.itemsize != 1 or dtype.kind != "V":  # ml_dtypes' types are kind "V"
        return None
    for info in (ml_dtypes.iinfo, ml_dtypes.finfo):
        try:
            bits = int(info(dtype).bits)
        except ValueError:
            continue
        return bits if bits < 8 else None
    return None


def host_view(array: Any) -> np.ndarray[Any, Any]:
    """A read-only numpy view of a host-resident array's memory, without copying it.

    For a `jax.Array` on one CPU device (as `load_file` puts a host-bound tensor: mapped
    from its file, or read into an aligned buffer), the view aliases the array's buffer,
    so it shares the mapped file pages or the buffer and costs nothing. numpy indexes
    with 64-bit offsets, so the view can be sliced anywhere in an array of more than
    2**31 elements, which JAX cannot do with x64 disabled. The view keeps the memory
    alive while it exists (the array stays in `jax.live_arrays()` and in `report()`).
    A numpy array is returned as it is.

    Args:
        array: A `jax.Array` on a single host (CPU) device, or a numpy array.

    Returns:
        The view: same shape and dtype, not writeable.

    Raises:
        HostViewError: the array is not on a host device, is sharded over several
            devices, is deleted or traced, has a sub-byte dtype (`int4`: JAX gives
            numpy only a copy of those), or JAX would have copied it.
        TypeError: `array` is not an array.

    Example:
        >>> import devpolicy, jax, numpy as np
        >>> x = jax.device_put(np.arange(6, dtype=np.uint16), devpolicy.get_device("cpu:1"))
        >>> view = devpolicy.host_view(x)
        >>> view[-3:], view.flags.writeable
        (array([3, 4, 5], dtype=uint16), False)
    """
    if isinstance(array, np.ndarray):
        return array
    if not isinstance(array, jax.Array):
        raise TypeError(
            f"host_view() takes a jax.Array on a host device (or a numpy array), "
            f"got {type(array).__name__}"
        )
    if isinstance(array, jax.core.Tracer):
        raise HostViewError(
            f"traced {array.dtype}[{','.join(map(str, array.shape))}]",
            "a value inside jax.jit or a transformation has no host memory",
            "call host_view outside jitted code, on the array itself",
        )
    if array.is_deleted():
        raise HostViewError(
            f"{array.dtype}[{','.join(map(str, array.shape))}]",
            "the array is deleted (donated, or .delete() was called)",
            "view it before it is donated or deleted",
        )
    described = _described(array)
    devices = array.devices()
    if len(devices) != 1 or not array.is_fully_addressable:
        raise HostViewError(
            described,
            f"sharded over {len(devices)} devices, so its memory is not one buffer",
            "view each shard (array.addressable_shards[i].data), or place it on one host "
            "device (a rule with `device: cpu`)",
        )
    (device,) = devices
    if device.platform not in _HOST_PLATFORMS:
        raise HostViewError(
            described,
            f"not on a host device: a view would first copy {array.nbytes} bytes to the host",
            "place it on the host (a rule with `device: cpu`, and `mmap: true` to map it "
            "from its file), or copy it on purpose with np.asarray(array)",
        )
    bits = _sub_byte_bits(array.dtype)
    if bits is not None:
        # Asked before np.asarray: it would copy the whole array only to be refused.
        raise HostViewError(
            described,
            f"host_view does not support {bits}-bit types: JAX gives numpy a sub-byte "
            "array only as a copy, never its own buffer, so no view of it is zero-copy",
            f"np.asarray(array) makes that copy ({format_size(array.size)}, a byte a "
            "value); data to be viewed in place is best kept as int8/uint8",
        )
    view: np.ndarray[Any, Any] = np.asarray(array)
    if view.size and view.ctypes.data != array.unsafe_buffer_pointer():
        # Not seen on jax 0.10.2's CPU backend for any dtype of a byte or more; refused
        # rather than returned, so that a view never silently holds a second copy.
        raise HostViewError(
            described,
            f"this JAX ({jax.__version__}) gave numpy a copy of the array, not its buffer, "
            "so there is no zero-copy view of it",
            "np.asarray(array) gives the copy, if the host has room for it",
        )
    if view.flags.writeable:
        view = view.view()
        view.flags.writeable = False  # JAX arrays are immutable: so is their view
    return view


_warned: list[str] = []  # the levels given, once per process (a list: tests can clear it)
_warned_lock = threading.Lock()


def warn_unindexable(
    events: EventLog, name: str, shape: tuple[int, ...], device: str, x64: bool
) -> None:
    """Say, once per process, that a JAX array of more than 2**31 elements was made while
    x64 is off: JAX cannot index it past 2**31; say both ways out.

    On one host device (`device` is `cpu:N`) `host_view` and `windows` index it with
    64-bit offsets, the way the docs take it, so the event is info: it explains the
    OverflowError of `x[-3:]` to whoever tries, without warning a script that does it
    right. Anywhere else (an accelerator, a sharding) no view reaches it: a warning.
    """
    if x64 or math.prod(shape) <= INDEX_LIMIT:
        return
    platform, colon, index = device.partition(":")
    level = "info" if colon and platform in _HOST_PLATFORMS and index.isdigit() else "warning"
    with _warned_lock:
        if level in _warned:
            return
        _warned.append(level)
    if level == "info":
        fix = (
            "devpolicy.host_view(array) (a numpy view indexed with 64-bit offsets) or "
            "devpolicy.windows(array, ...) (batches cut from it), or `runtime: {x64: true}` "
            "in the policy (every default dtype becomes 64-bit)"
        )
    else:
        fix = (
            "place it on a host device (a rule with `device: cpu`, `mmap: true` to map it) "
            "and index it there with devpolicy.host_view or devpolicy.windows, or "
            "`runtime: {x64: true}` in the policy (every default dtype becomes 64-bit)"
        )
    events.emit(
        level,
        "huge_array_x64_off",
        {
            "name": name,
            "elements": math.prod(shape),
            "device": device,
            "limit": INDEX_LIMIT,
            "reason": "with x64 disabled JAX indexes with int32: x[-3:] or any index past "
            "2**31 raises OverflowError",
            "fix": fix,
        },
    )
