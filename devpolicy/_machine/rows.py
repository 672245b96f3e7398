"""The rows of a ledger: one rule's live arrays on one device, one device, and one line of
code where JAX made implicit transfers. Values only: `ledger` fills them, `picture` draws
them. No JAX here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """The live arrays one rule (or nothing: `unplaced`) put on one device.

    Attributes:
        origin: Where the rule was written (`policy.yaml:9`, `env:DEVPOLICY_RULES`,
            `default`), or `unplaced` for arrays devpolicy did not place.
        rule: The rule's index in its layer, or None (the default, or `unplaced`).
        names: The distinct names the arrays were placed as, sorted.
        arrays: How many arrays have bytes here (an array sharded over several devices
            counts on each device it has a shard on).
        nbytes: Their bytes on this device.
        file_backed: Of those, bytes mapped from a file (they take no anonymous memory).
        sharded: Of the arrays, how many are here as a shard of an array spread over
            several devices.
    """

    origin: str
    rule: int | None
    names: tuple[str, ...]
    arrays: int
    nbytes: int
    file_backed: int
    sharded: int = 0


@dataclass(frozen=True, slots=True)
class LedgerDevice:
    """One device's live arrays and free memory.

    Attributes:
        device: Target text (`gpu:0`; `cpu:0 [pinned_host]` for a memory kind other than
            the device's default).
        arrays: How many live arrays have bytes on it (whole, or a shard).
        nbytes: Their bytes.
        file_backed: Of those, bytes mapped from a file.
        free: Free bytes now (for a device that reports no memory, the host RAM it
            shares), or None when unknown.
        pool: The memory it draws on: `host RAM` (shared by every CPU device) or itself.
        entries: The bytes split by the rule that placed them, largest first, `unplaced`
            last.
        sharded: Of the arrays, how many are here as a shard of an array spread over
            several devices.
        total: The memory it draws on in all, where measured (`memory_stats`'
            `bytes_limit`; the host's RAM for `host RAM`), else None.
        free_from: Where `free` was read (`jax memory_stats: bytes_limit -
            bytes_in_use`, `host RAM: MemAvailable of /proc/meminfo`), or None.
        total_from: Where `total` was read, or None.
    """

    device: str
    arrays: int
    nbytes: int
    file_backed: int
    free: int | None
    pool: str
    entries: tuple[LedgerEntry, ...]
    sharded: int = 0
    total: int | None = None
    free_from: str | None = None
    total_from: str | None = None


@dataclass(frozen=True, slots=True)
class TransferSite:
    """The implicit transfers JAX made at one line of code, in one direction.

    Attributes:
        site: `path/file.py:LINE` of the user's code.
        direction: `host_to_device`, `device_to_device`, `device_to_host` or `host_local`.
        count: How many transfers (one per array moved).
        nbytes: The bytes moved in all (each destination's share once).
        devices: The destination devices seen, as texts.
        function: The function the line is in.
    """

    site: str
    direction: str
    count: int
    nbytes: int
    devices: tuple[str, ...]
    function: str
