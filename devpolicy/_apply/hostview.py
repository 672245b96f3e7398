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
import numpy as np

from .._base.errors import HostViewError
from .._base.events import EventLog
from .._machine.inventory import inventory

#: Arrays with more elements than this cannot be indexed by JAX with x64 disabled.
INDEX_LIMIT = 2**31

_HOST_PLATFORMS = frozenset({"cpu"})


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
            devices, is deleted or traced, or JAX would have copied it.
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
    view: np.ndarray[Any, Any] = np.asarray(array)
    if view.size and view.ctypes.data != array.unsafe_buffer_pointer():
        # Not seen on jax 0.10.2's CPU backend; refused rather than returned, so that
        # a view never silently holds a second copy of a huge array.
        raise HostViewError(
            described,
            "this JAX copied the array instead of aliasing its buffer",
            "report it to devpolicy; np.asarray(array) gives the copy",
        )
    if view.flags.writeable:
        view = view.view()
        view.flags.writeable = False  # JAX arrays are immutable: so is their view
    return view


_warned: list[bool] = []  # once per process (a list: tests can clear it)
_warned_lock = threading.Lock()


def warn_unindexable(
    events: EventLog, name: str, shape: tuple[int, ...], device: str, x64: bool
) -> None:
    """Warn, once per process, that a JAX array of more than 2**31 elements was made
    while x64 is off: JAX cannot index it past 2**31; say both ways out."""
    if x64 or math.prod(shape) <= INDEX_LIMIT:
        return
    with _warned_lock:
        if _warned:
            return
        _warned.append(True)
    events.emit(
        "warning",
        "huge_array_x64_off",
        {
            "name": name,
            "elements": math.prod(shape),
            "device": device,
            "limit": INDEX_LIMIT,
            "reason": "with x64 disabled JAX indexes with int32: x[-3:] or any index past "
            "2**31 raises OverflowError",
            "fix": "devpolicy.host_view(array) for a numpy view the host indexes with "
            "64-bit offsets (devpolicy.windows samples batches from it), or "
            "`runtime: {x64: true}` in the policy (every default dtype becomes 64-bit)",
        },
    )
