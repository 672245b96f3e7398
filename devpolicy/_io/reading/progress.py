"""What a load says when done (its progress bar is `_base.progress`'s): one event per
file (`load_file`: where its bytes went, by which rules; `mmap_refused`: why tensors to
be mapped were read; `checkpoint_file_left_out`: a directory's files not loaded).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..._base.events import EventLog
from ..._base.limits import ALIGN
from ..._base.sizes import format_size
from ..._decide.decision import Decision
from ..format.header import Header, TensorEntry
from ..format.layout import mapping_obstacles
from .checkpoints import Checkpoint
from .naming import PathLike

_TRIED_FIRST = {"code": 0, "env": 1, "policy": 2}


def mmap_refused_event(
    events: EventLog,
    header: Header,
    decisions: list[Decision],
    mmap: bool | None,
    x64: bool,
    local: bool,
) -> None:
    """Once per file: why tensors that were to be mapped were read instead, and the fix.
    `local`: whether the file's bytes come from a local file (one at a URL, unless read
    through the cache, cannot be mapped at all)."""
    elsewhere: list[TensorEntry] = []
    unaligned: list[TensorEntry] = []
    wide: list[TensorEntry] = []
    packed: list[TensorEntry] = []
    for entry, decision in zip(header.tensors, decisions, strict=True):
        if not (decision.mmap if mmap is None else mmap) or entry.nbytes == 0:
            continue
        obstacles = mapping_obstacles(entry, x64=x64)
        if not local:
            elsewhere.append(entry)
        elif obstacles:  # the first obstacle is the one said
            {"packed": packed, "narrowed": wide, "unaligned": unaligned}[obstacles[0]].append(entry)
    if not elsewhere and not unaligned and not wide and not packed:
        return
    reasons = []
    if elsewhere:
        reasons.append(
            f"{header.path} is not a local file, and only a local file maps; with a cache "
            "(`remote: {cache: DIR}` in the policy, or DEVPOLICY_REMOTE_CACHE=DIR) it is "
            "fetched once and the cached file mapped"
        )
    if unaligned:
        first = unaligned[0]
        aligned = header.path.with_name(header.path.stem + ".aligned.safetensors")
        reasons.append(
            f"{len(unaligned)} tensor{'s' if len(unaligned) > 1 else ''} at a file offset not "
            f"{ALIGN}-byte aligned (first: {first.key!r} at {first.offset}); rewrite the file "
            f"aligned with `devpolicy align {header.path} {aligned}` (or devpolicy.save_file)"
        )
    if wide:
        reasons.append(
            f"{len(wide)} 64-bit tensor{'s' if len(wide) > 1 else ''} narrowed to 32 bits "
            f"(first: {wide[0].key!r}); enable x64 to map them"
        )
    if packed:
        reasons.append(
            f"{len(packed)} F4 tensor{'s' if len(packed) > 1 else ''} unpacked from two values "
            f"a byte to one (first: {packed[0].key!r}); JAX holds F4 one value a byte"
        )
    events.emit(
        "warning",
        "mmap_refused",
        {
            "file": str(header.path),
            "tensors": len(elsewhere) + len(unaligned) + len(wide) + len(packed),
            "nbytes": sum(e.nbytes for e in (*elsewhere, *unaligned, *wide, *packed)),
            "reason": "; ".join(reasons),
        },
    )


def summary_event(
    events: EventLog,
    header: Header,
    decisions: list[Decision],
    seconds: float,
    mapped: int,
    narrowed: int,
    counted: tuple[int, int],
    fetched: Mapping[str, Any] | None = None,
) -> None:
    """One event per file: where its bytes went, by which rules, and what fell back; info,
    or a warning where a tensor fell back by the policy's chain rather than its rule's; for
    a file at a URL, what fetching it cost (`fetched`: requests, retries, bytes fetched,
    seconds; the file's URL is shown without credentials). `counted`: (bytes read, bytes
    mapped), each field one meaning as docs/logging.md says: `bytes_read` the bytes copied
    out of the file, `bytes_mapped` those left views of its map (never read here)."""
    bytes_read, bytes_mapped = counted
    per_device: dict[str, list[int]] = {}
    per_rule: dict[str, int] = {}
    rank: dict[str, tuple[int, int]] = {}  # rules in the order they are tried
    fallbacks = undeclared = 0
    for decision in decisions:
        tensors_bytes = per_device.setdefault(decision.device_text, [0, 0])
        tensors_bytes[0] += 1
        tensors_bytes[1] += decision.nbytes or 0
        per_rule[decision.origin] = per_rule.get(decision.origin, 0) + 1
        rank[decision.origin] = (_TRIED_FIRST.get(decision.source, 3), decision.rule or 0)
        if decision.fallback_reason is not None:
            fallbacks += 1
            undeclared += not decision.fallback_declared
    events.emit(
        "warning" if undeclared else "info",
        "load_file",
        {
            "file": str(header.path),
            "tensors": len(decisions),
            "nbytes": sum(n for _, n in per_device.values()),
            "devices": ", ".join(
                f"{d} {format_size(n)} ({count} tensor{'' if count == 1 else 's'})"
                for d, (count, n) in sorted(per_device.items())
            ),
            "rules": ", ".join(
                f"{origin} x{per_rule[origin]}" for origin in sorted(per_rule, key=rank.__getitem__)
            ),
            "fallbacks": fallbacks,
            "mapped": mapped,
            "file_backed": mapped > 0,
            "narrowed": narrowed,
            "bytes_read": bytes_read,
            "bytes_mapped": bytes_mapped,
            "seconds": round(seconds, 4),
            "metadata": dict(header.metadata or {}),
            **(fetched or {}),
        },
    )


def left_out_events(events: EventLog, path: PathLike, checkpoint: Checkpoint) -> None:
    """One info event per file of a checkpoint directory that is not loaded, and why."""
    for file, reason in checkpoint.left_out:
        events.emit(
            "info",
            "checkpoint_file_left_out",
            {"checkpoint": str(path), "file": str(file), "reason": reason},
        )
