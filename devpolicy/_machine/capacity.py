"""How much memory a device has free: what memory-aware placement (`fits`, sized `auto`) asks."""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping
from typing import Protocol, runtime_checkable

import jax
from typing_extensions import TypeVar

from .._base.sizes import parse_size
from .._document.targets import parse_target
from .inventory import inventory

#: The devices a capacity judges: JAX's, unless it is a planned machine's.
DeviceT_contra = TypeVar("DeviceT_contra", contravariant=True, default=jax.Device)


@runtime_checkable
class Capacity(Protocol[DeviceT_contra]):
    """Anything that can say how many bytes a device has free (None: unknown)."""

    def free_bytes(self, device: DeviceT_contra) -> int | None:
        """Bytes free on `device` now, or None when not known."""
        ...


_MEMINFO: list[int] = []  # /proc/meminfo, opened once: a `pread` of it costs a third of an open


def _meminfo_fd() -> int:
    if not _MEMINFO:
        _MEMINFO.append(os.open("/proc/meminfo", os.O_RDONLY | os.O_CLOEXEC))
    return _MEMINFO[0]


#: Where each figure of memory is read, as a report says it.
FROM_MEMINFO = "host RAM: MemAvailable of /proc/meminfo"
FROM_AVPHYS = "host RAM: sysconf SC_AVPHYS_PAGES x SC_PAGE_SIZE"
FROM_PHYS = "host RAM: sysconf SC_PHYS_PAGES x SC_PAGE_SIZE"
FROM_STATS_FREE = "jax memory_stats: bytes_limit - bytes_in_use"
FROM_STATS_TOTAL = "jax memory_stats: bytes_limit"


def host_available_bytes() -> int | None:
    """RAM the host can still give without swapping (Linux MemAvailable), or None.

    Asked for every sized decision on a host device, so it reads one kept-open
    `/proc/meminfo` (about 13 us) instead of opening it each time (about 40 us).
    """
    return host_available()[0]


def host_available() -> tuple[int | None, str | None]:
    """`host_available_bytes` and where it was read (`FROM_MEMINFO`, else `FROM_AVPHYS`;
    None where neither says).

    Example:
        >>> host_available()[1] in (FROM_MEMINFO, FROM_AVPHYS, None)
        True
    """
    try:
        text = os.pread(_meminfo_fd(), 8192, 0)
        start = text.index(b"MemAvailable:") + len(b"MemAvailable:")
        return int(text[start : text.index(b"kB", start)]) * 1024, FROM_MEMINFO
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), FROM_AVPHYS
    except (OSError, ValueError, AttributeError):
        return None, None


def _memory_cgroup() -> tuple[str, bool] | None:
    """The folder of this process's memory cgroup and whether it is cgroup v2, or None
    where there is none to read (its own group's folder, or in a container, whose mount
    is its group, the mount's root)."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            root, v2, probe = "/sys/fs/cgroup", True, "memory.max"
        elif "memory" in controllers.split(","):
            root, v2, probe = "/sys/fs/cgroup/memory", False, "memory.limit_in_bytes"
        else:
            continue
        for where in (f"{root}{path.rstrip()}".rstrip("/"), root):
            if os.path.exists(f"{where}/{probe}"):
                return where, v2
    return None


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def _cgroup_headroom() -> int | None:
    """What this process's memory cgroup still allows, or None where it sets no limit."""
    found = _memory_cgroup()
    if found is None:
        return None
    where, v2 = found
    limit, usage = (
        ("memory.max", "memory.current")
        if v2
        else (
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
        )
    )
    return cgroup_room(
        _read_text(f"{where}/{limit}"),
        _read_text(f"{where}/{usage}"),
        _read_text(f"{where}/memory.stat"),
    )


def cgroup_room(limit: str | None, usage: str | None, stat: str | None) -> int | None:
    """A memory cgroup's room from its files' texts: the limit less the usage, its page
    cache counted as reclaimable (as MemAvailable counts it: `file` in v2's memory.stat,
    `cache` in v1's); None where it sets no limit (v2's "max", v1's number near 2**63) or
    a text is missing or not a number.

    Example:
        >>> cgroup_room("1000", "600", "file 100")
        500
        >>> cgroup_room("max", "600", None) is None
        True
    """
    if limit is None or usage is None:
        return None
    try:
        ceiling, used = int(limit), int(usage)
    except ValueError:
        return None
    if ceiling >= 2**62:
        return None
    cache = 0
    for line in (stat or "").splitlines():
        key, _, value = line.partition(" ")
        if key in ("file", "cache"):
            try:
                cache = int(value)
            except ValueError:
                cache = 0
            break
    return max(0, ceiling - used + cache)


def memory_headroom() -> int | None:
    """Memory this process can still use without swapping or passing its memory cgroup's
    limit, page cache counted as reclaimable: the lesser of the host's MemAvailable and
    the cgroup's room; None where neither is known.

    Reads several small files (a few hundred microseconds; more under gVisor): for a
    decision made once, or rarely, not for every batch.

    Example:
        >>> room = memory_headroom()
        >>> room is None or room >= 0
        True
    """
    known = [n for n in (host_available_bytes(), _cgroup_headroom()) if n is not None]
    return min(known) if known else None


def host_total_bytes() -> int | None:
    """The host's RAM in all, or None where it is not known."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


#: The pool of devices that share the process's host RAM (every CPU device).
HOST_POOL = "host RAM"


def pool_of(capacity: Capacity[DeviceT_contra], device: DeviceT_contra) -> Hashable:
    """The memory `device` draws on, by `capacity`: bytes given to one device of a pool
    count against every device of it. A capacity without a `pool` method gives each
    device its own.

    Example:
        >>> import devpolicy
        >>> cpu1, cpu2 = devpolicy.get_device("cpu:1"), devpolicy.get_device("cpu:2")
        >>> pool_of(DeviceMemory(), cpu1) == pool_of(DeviceMemory(), cpu2)
        True
        >>> pool_of(StaticCapacity({"cpu:1": "1GiB"}), cpu1) is cpu1
        True
    """
    pool = getattr(capacity, "pool", None)
    found: Hashable = device if pool is None else pool(device)
    return found


def pool_text(pool: Hashable) -> str:
    """A pool as a user reads it: `host RAM`, or the device's target text."""
    if isinstance(pool, tuple):
        return HOST_POOL
    return inventory().text(pool) if isinstance(pool, jax.Device) else str(pool)


class DeviceMemory:
    """Free memory as the backend reports it; host RAM for devices that report none.

    Accelerators report `bytes_limit` and `bytes_in_use` in `device.memory_stats()`;
    CPU devices report nothing and live in host RAM, so available RAM stands in, and all
    of them share it: one pool (see `pool`). No platform name is consulted: what a
    device reports decides.

    Example:
        >>> import devpolicy
        >>> DeviceMemory().free_bytes(devpolicy.get_device("cpu")) > 0
        True
    """

    def __init__(self) -> None:
        self._pools: dict[jax.Device, Hashable] = {}

    def free_bytes(self, device: jax.Device) -> int | None:
        """Bytes free on `device`, from its memory stats or else from host RAM."""
        return self.usage(device)[0]

    def usage(self, device: jax.Device) -> tuple[int | None, int | None]:
        """Free and total bytes of `device`; total is None where only host RAM stands in.

        Example:
            >>> import devpolicy
            >>> DeviceMemory().usage(devpolicy.get_device("cpu"))[1] is None
            True
        """
        try:
            stats = device.memory_stats()
        except Exception:  # a backend without stats may raise instead of returning None
            stats = None
        if stats:
            limit = stats.get("bytes_limit")
            used = stats.get("bytes_in_use", 0)
            if isinstance(limit, int):
                return max(0, limit - int(used)), limit
        return host_available_bytes(), None

    def pool(self, device: jax.Device) -> Hashable:
        """The memory `device` draws on: its own where it reports memory stats, else the
        host RAM of its process, shared by every such device."""
        pool = self._pools.get(device)
        if pool is None:
            # Whether a device reports its own memory does not change: asked once.
            shared = self.usage(device)[1] is None
            pool = (HOST_POOL, device.process_index) if shared else device
            self._pools[device] = pool
        return pool


class StaticCapacity:
    """Stated capacities by target text, for tests and for planning another machine.

    Devices not listed are unknown (never judged too small).

    Example:
        >>> import devpolicy
        >>> caps = StaticCapacity({"cpu:1": "2GiB"})
        >>> [caps.free_bytes(devpolicy.get_device(t)) for t in ("cpu:1", "cpu:0")]
        [2147483648, None]
    """

    def __init__(self, free: Mapping[str, int | str]) -> None:
        self._free: dict[str, int] = {}
        for target, size in free.items():
            parsed = parse_target(target)
            if parsed.is_accelerator:  # this process's accelerator, if it has one
                parsed = parsed.on(inventory().accelerator or parsed.platform)
            text = f"{parsed.platform}:{parsed.index or 0}"
            self._free[text] = parse_size(size)

    @property
    def targets(self) -> tuple[str, ...]:
        """The stated devices, as target text (`gpu` reads as `gpu:0`, `cuda:1` as `gpu:1`).

        Example:
            >>> StaticCapacity({"cuda": "1GiB", "cpu:2": 10}).targets
            ('gpu:0', 'cpu:2')
        """
        return tuple(self._free)

    def free_bytes(self, device: jax.Device) -> int | None:
        """The stated free bytes of `device`, or None if not stated."""
        return self._free.get(inventory().text(device))


def measured(
    capacity: Capacity, device: jax.Device, kind: str | None = None
) -> tuple[int | None, str | None, int | None, str | None, str]:
    """What a report says of `device`'s memory (`kind`: a memory kind other than its
    default): free bytes and where they were read, its memory in all and where that was
    read (None where nothing measures it), and the pool it draws on.

    `DeviceMemory` reads the device's `memory_stats`, or host RAM for a device without
    them; any other capacity says only free bytes, as it was given.

    Example:
        >>> import devpolicy
        >>> free, free_from, total, total_from, pool = measured(
        ...     DeviceMemory(), devpolicy.get_device("cpu:1"))
        >>> free_from in (FROM_MEMINFO, FROM_AVPHYS), total_from, pool
        (True, 'host RAM: sysconf SC_PHYS_PAGES x SC_PAGE_SIZE', 'host RAM')
        >>> measured(StaticCapacity({"cpu:1": 10}), devpolicy.get_device("cpu:1"))[:4]
        (10, 'StaticCapacity.free_bytes (the capacity given to report)', None, None)
    """
    host_total = host_total_bytes()
    on_host = host_total, FROM_PHYS if host_total is not None else None
    if kind is not None and kind.endswith("host"):
        return *host_available(), *on_host, HOST_POOL
    pool = pool_text(pool_of(capacity, device))
    if isinstance(capacity, DeviceMemory):
        free, total = capacity.usage(device)
        if total is not None:
            return free, FROM_STATS_FREE, total, FROM_STATS_TOTAL, pool
        return *host_available(), *on_host, pool
    free = capacity.free_bytes(device)
    said = f"{type(capacity).__name__}.free_bytes (the capacity given to report)"
    return free, said if free is not None else None, None, None, pool
