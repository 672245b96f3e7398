"""The plan: where every tensor of a file or checkpoint would go, and whether each device
has room, reading only headers (`devpolicy.plan`); for a file at a URL, what loading it
would fetch in this process, in bytes and requests.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..._base.locations import URLPath
from ..._base.sizes import format_size
from ..._base.visible import visible
from ..._decide.decider import Decider, virtual_decider
from ..._decide.decision import Decision, DeviceT
from ..._decide.items import maps_from_file
from ..._decide.routing import UNKNOWN_NAMES
from ..._decide.rule_use import RuleUse, sharded_nothing, silent_rules, uses_of_decisions
from ..._document.axes import Attached
from ..._document.schema import NamesSpec
from ..._machine.capacity import pool_of, pool_text
from ..._machine.machine import VirtualMachine
from ..._machine.meshes import MeshLayout, layout
from ..format.header import Header, TensorEntry
from ..reading.buffers import MAP_THRESHOLD
from ..reading.checkpoint_sources import Files, Where, can_map
from ..reading.fill_tree import fit_into
from ..reading.map_or_read import map_hint, x64_enabled
from ..reading.naming import (
    PathLike,
    call_naming,
    check_mmap,
    name_prefix,
    source_files,
    tensor_names,
)
from ..reading.ranges import slice_bounds, slice_ranges
from ..reading.readahead import small_run
from ..reading.tensor_reads import remote_groups
from ..remote import RemoteOptions, options_of
from ..remote.source import HEAD_BYTES, planned_requests


@dataclass(frozen=True, slots=True)
class PlannedTensor:
    """Where one tensor of a file would go.

    Attributes:
        name: The name it is resolved under (`train/tokens`).
        key: Its key in the file.
        dtype: safetensors dtype name.
        shape: Its shape.
        nbytes: Its size as an array (F4, two values a byte in the file, one in memory).
        offset: Its absolute file offset (64-aligned ones can be mapped zero-copy).
        decision: The decision, or None when no device could be had (its device a
            `VirtualDevice` in a plan for a `VirtualMachine`).
        error: Why no device could be had, or None.
        file: The file holding it, for a checkpoint of several files; else "".
    """

    name: str
    key: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    offset: int
    decision: Decision[Any] | None
    error: str | None
    file: str = ""


@dataclass(frozen=True, slots=True)
class DeviceLoad:
    """Planned bytes for one device against its free memory.

    Attributes:
        device: Target text (`gpu:0`), process-local.
        nbytes: Bytes planned for it (a sharded tensor's share on it).
        tensors: How many tensors (or shards of them) it holds.
        free: Free bytes now, or None when unknown (for a shared pool, the pool's); for a
            `VirtualMachine`, the device's stated memory.
        fits: False when the bytes that take memory (`nbytes` less `file_backed`, summed
            over every device of its pool) exceed `free` less the policy's `headroom`.
        file_backed: Bytes that will be mapped from the file (host devices, `mmap`,
            64-byte-aligned offset): they take no anonymous memory.
        pool: The memory it draws on: `host RAM` (shared by every CPU device of the
            process) or its own target text.
        pool_nbytes: Bytes that take memory in the whole pool.
    """

    device: str
    nbytes: int
    tensors: int
    free: int | None
    fits: bool
    file_backed: int = 0
    pool: str = ""
    pool_nbytes: int = 0


@dataclass(frozen=True, slots=True)
class PlannedFetch:
    """What loading one file at a URL would fetch in this process, predicted from its
    header: the requests `load_file` sends and the bytes they bring, with no fault retried.

    Attributes:
        file: The file's URL, as shown.
        nbytes: Bytes fetched: the header's small read, this process's share of the
            tensors, and the small gaps between near ranges joined into one request.
        requests: Requests sent: the metadata request, the header's read, the data's.
        share: Bytes of the file's tensors this process holds (each distinct slice once).
        cached: Whether the load goes through a cache directory (`remote: cache`): then
            the counts are of a first load, which fetches the whole file; later loads
            fetch nothing and map the cached file.
    """

    file: str
    nbytes: int
    requests: int
    share: int
    cached: bool = False


@dataclass(frozen=True, slots=True)
class Plan:
    """Every tensor of a file with its decision, and totals per device and per process.

    Attributes:
        file: The file.
        tensors: One entry per tensor, in header order.
        devices: One entry per device of the deciding process, by target text.
        machine: The machine planned for: `this process`, or a `VirtualMachine`'s
            description (`cpu=1 (memory unknown), gpu=8x80GiB; 2 processes`).
        processes: How many processes load it, each alike (a `VirtualMachine`'s
            `processes`; 1 for this process).
        slices: How many slices those processes are in, as a hybrid mesh spans them (a
            `VirtualMachine`'s `slices`: its TPU slices, or off TPU one per process; 1 for
            this process).
        metadata: Each file's `__metadata__` (`{}` when it has none), keyed by the
            file's path as the `load_file` event's `file` gives it.
        left_out: For a checkpoint directory, each of its `*.safetensors` files that is
            not part of the checkpoint, as (file, why); see `devpolicy.load_file`.
        rules: What each rule of the policy took, in order, then the default
            (`RuleUse`: tensors, bytes, how many sharded, and for a rule that took none,
            why); see `warnings`.
        meshes: Each mesh a tensor is sharded over, as built on the machine planned for
            (`MeshLayout`: its shape, its split across slices for a hybrid mesh, its first
            devices in mesh order).
        fetches: For each file at a URL, what loading it would fetch in this process
            (`PlannedFetch`); empty for local files.
    """

    file: str
    tensors: tuple[PlannedTensor, ...]
    devices: tuple[DeviceLoad, ...]
    machine: str = "this process"
    processes: int = 1
    slices: int = 1
    metadata: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    left_out: tuple[tuple[str, str], ...] = ()
    rules: tuple[RuleUse, ...] = ()
    meshes: tuple[MeshLayout, ...] = ()
    fetches: tuple[PlannedFetch, ...] = ()

    @property
    def fetch_bytes(self) -> int:
        """Bytes `load_file` would fetch in this process over every file at a URL."""
        return sum(f.nbytes for f in self.fetches)

    @property
    def fetch_requests(self) -> int:
        """Requests `load_file` would send from this process over every file at a URL."""
        return sum(f.requests for f in self.fetches)

    @property
    def warnings(self) -> list[tuple[str, str]]:
        """What the plan should not pass over in silence (see `silent_rules`), as (code,
        message): a rule that took no tensor but would have but for a slip (named, with its
        fix), or while the default or a catch-all took some; a policy that shards, with
        tensors placed whole by the default or a catch-all. A rule shadowed by an earlier
        one, or whose conditions take none of these tensors, is not a warning: its
        `RuleUse.status` and `note` say why it took nothing."""
        return silent_rules(self.rules)

    @property
    def sharded_nothing(self) -> bool:
        """Whether the policy has sharding rules and no tensor of this plan is sharded,
        although some asked for it (a sharding rule's tensors fell back to a device) or
        fell through to the default or a catch-all, or were placed whole by another rule
        where a sharding rule would have taken them but for a slip (`devpolicy plan` exits
        3; see `sharded_nothing`)."""
        return sharded_nothing(self.rules)

    @property
    def bytes_per_process(self) -> int:
        """The bytes each process holds: the sum over its devices (every process alike)."""
        return sum(d.nbytes for d in self.devices)

    def __str__(self) -> str:
        """The plan as text: each tensor's device, then each device against its memory.

        Example:
            >>> import devpolicy, numpy as np, tempfile, os
            >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
            >>> devpolicy.save_file({"w": np.zeros(256, np.float32)}, path)
            >>> policy = devpolicy.load_policy({"version": 1, "default": "cpu:2"},
            ...     capacity=devpolicy.StaticCapacity({"cpu:2": "1MiB"}))
            >>> text = str(devpolicy.plan(path, policy=policy))
            >>> print(text[text.index("m.safetensors"):])
            m.safetensors: 1 tensor, fits
              m/w  F32 256  1.0 KiB  -> cpu:2 by <mapping>:default (default)
            cpu:2: 1 tensor, 1.0 KiB, 1.0 MiB free (0%): fits
        """
        count = len(self.tensors)
        lines = [
            f"{self.file}: {count} tensor{'' if count == 1 else 's'}, "
            + ("fits" if self.fits else "DOES NOT FIT")
        ]
        if self.machine != "this process":
            lines[0] += f" on {self.machine}"
        for t in self.tensors:
            shape = "x".join(map(str, t.shape)) or "()"
            reasons: list[str] = []
            if t.decision is not None:
                where = f"-> {t.decision.described} by {t.decision.origin} ({t.decision.source})"
                if t.decision.is_sharded:
                    share = format_size(t.decision.bytes_per_device() or 0)
                    where += f", {share} on each of {t.decision.mesh_devices} devices"
                if t.decision.fallback_reason is not None:
                    where += f"; asked {t.decision.requested}: {t.decision.fallback_reason}"
            else:
                error = (t.error or "").splitlines() or [""]
                # A tensor a rule with `axes: attached` takes, its names unknown here.
                undecided = error[0].startswith("not decided")
                where = f"-> {error[0]}" if undecided else f"-> no device: {error[0]}"
                # Why each target was passed over (a sharding that does not divide, a device
                # too small), not the devices this process has: that list is the same for all.
                tried = itertools.takewhile(lambda s: not s.startswith("  available:"), error[1:])
                reasons = [f"    {reason.strip()}" for reason in tried]
            lines.append(f"  {t.name}  {t.dtype} {shape}  {format_size(t.nbytes)}  {where}")
            lines += reasons
        for d in self.devices:
            size = format_size(d.nbytes)
            backed = f" ({format_size(d.file_backed)} file-backed)" if d.file_backed else ""
            if d.free is None:
                free = "free memory unknown"
            else:
                shared = f" {d.pool}" if d.pool and d.pool != d.device else ""
                free = f"{format_size(d.free)} free{shared} ({d.pool_nbytes / max(d.free, 1):.0%})"
            tensors = f"{d.tensors} tensor{'' if d.tensors == 1 else 's'}"
            verdict = "fits" if d.fits else "DOES NOT FIT"
            lines.append(f"{d.device}: {tensors}, {size}{backed}, {free}: {verdict}")
        if self.processes > 1:
            lines.append(
                f"each of {self.processes} processes: {format_size(self.bytes_per_process)}"
            )
        lines += [f"mesh {m.described}" for m in self.meshes]
        for f in self.fetches:
            cold = " (a first load, into the cache; later loads map it)" if f.cached else ""
            lines.append(
                f"fetch {f.file}: {format_size(f.nbytes)} in {f.requests} request"
                f"{'' if f.requests == 1 else 's'} (this process holds "
                f"{format_size(f.share)}){cold}"
            )
        if len(self.rules) > 1:  # the default alone says nothing the tensors do not
            lines.append("rules:")
            for u in self.rules:
                took = f"{u.tensors} tensor{'' if u.tensors == 1 else 's'}"
                note = f" ({u.note})" if u.note else ""
                lines.append(f"  {u.origin} {u.label}: {took}, {format_size(u.nbytes)}{note}")
        lines += [f"warning: {message} [{code}]" for code, message in self.warnings]
        if self.sharded_nothing:
            lines.append(
                "warning: the policy shards, but no tensor is sharded on "
                f"{self.machine} [sharded-nothing]"
            )
        lines += [f"left out: {file}: {why}" for file, why in self.left_out]
        return "\n".join(visible(line) for line in lines)

    def __rich__(self) -> Any:
        """`rich.print(plan)`: the same text (visible-safe), never read as markup."""
        from rich.text import Text

        return Text(str(self))

    @property
    def fits(self) -> bool:
        """Whether every tensor has a device and every device has room."""
        return all(t.decision is not None for t in self.tensors) and all(
            d.fits for d in self.devices
        )


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """What one `plan` call asks: every keyword of the verb but `policy`, the one
    definition the module-level verb, `Policy.plan` and the plan share. See
    `devpolicy.plan` for each."""

    prefix: str | None = None
    mmap: bool | None = None
    machine: VirtualMachine | None = None
    separator: str | None = None
    into: Any = None
    axes: Mapping[str, Sequence[str | None]] | None = None
    strict: bool = True
    remote: Mapping[str, object] | None = None


def plan(path: PathLike, decider: Decider, options: PlanOptions) -> Plan:
    """Where every tensor of a file or checkpoint would go by `decider`, or by its settings
    on `options.machine` (which is then also the capacity judged by); the model's names for
    rules with `axes: attached` from `options.into` (its tree) or `options.axes` (by tensor
    name). See `devpolicy.plan`."""
    check_mmap("plan", options.mmap)
    naming = call_naming(decider.settings.names, options.separator)
    names = _ModelNames(options.into, _checked_axes(options.axes), options.strict)
    remote = options_of(decider.settings.remote_values, options.remote)
    prefix, mmap, machine = options.prefix, options.mmap, options.machine
    if machine is not None:
        virtual = virtual_decider(decider.settings, machine, "plan")
        described = (str(machine), machine.processes, machine.slices)
        return _plan(path, virtual, prefix, mmap, described, naming, names, remote)
    return _plan(path, decider, prefix, mmap, ("this process", 1, 1), naming, names, remote)


@dataclass(frozen=True, slots=True)
class _ModelNames:
    """Where a plan learns the axis names each tensor's leaf carries (`axes: attached`
    rules): the model's tree (`into`), names by tensor name (`axes`), or nowhere."""

    into: Any
    axes: Mapping[str, Attached] | None
    strict: bool


def _checked_axes(
    axes: Mapping[str, Sequence[str | None]] | None,
) -> Mapping[str, Attached] | None:
    """`plan(axes=...)` as the walk reads names: each a tuple of names and Nones."""
    if axes is None:
        return None
    if not isinstance(axes, Mapping):
        raise TypeError(
            f"plan(axes=...) takes a mapping of tensor name -> axis names, got "
            f"{type(axes).__name__}"
        )
    checked = {}
    for name, names in axes.items():
        if isinstance(names, str) or not all(n is None or isinstance(n, str) for n in names):
            raise TypeError(
                f"plan(axes=...): {name!r} -> {names!r} is not a list of axis names (or None)"
            )
        checked[name] = Attached(tuple(names))
    return checked


def _names_of(
    model: _ModelNames, by_key: Mapping[str, Attached | None], name: str, entry: TensorEntry
) -> Attached | None:
    """The axis names a tensor's leaf carries, as a plan knows them: from the tree, from
    `axes` by name, else not known here (a rule with `axes: attached` cannot decide)."""
    if model.into is not None:
        return by_key.get(entry.key)
    if model.axes is not None and name in model.axes:
        return model.axes[name]
    return UNKNOWN_NAMES


def _plan(
    path: PathLike,
    decider: Decider[DeviceT],
    prefix: str | None,
    mmap: bool | None,
    described: tuple[str, int, int],
    naming: NamesSpec,
    model: _ModelNames,
    options: RemoteOptions,
) -> Plan:
    machine, processes, slices = described
    # Headers only: never through the cache (it would fetch whole files to plan them).
    where = Where.of(path)  # parsed once: nothing below parses the path again
    with Files(replace(options, cache_dir=None)) as files:
        checkpoint = files.checkpoint(where)
        headers = [files.header(file) for file in checkpoint.files]
    checkpoint.check(headers)
    path = where.place  # a URL from here on as shown, never with its credentials
    by_key: Mapping[str, Attached | None] = {}
    if model.into is not None:
        # Matched to the tree as `load_file(into=)` matches it: the same errors, the
        # same tensors, each with its leaf's names.
        pairs = list(zip(checkpoint.files, headers, strict=True))
        fitted = fit_into(model.into, pairs, naming, model.strict, path)
        headers = [header for _, header in fitted.headers]
        by_key = fitted.attached
    stem = name_prefix(checkpoint.stem, prefix, naming)
    entries = [(header, entry) for header in headers for entry in header.tensors]
    names = [n for header in headers for n in tensor_names(header, stem, naming)]
    by_file = dict(zip(checkpoint.files, source_files(checkpoint.files, path), strict=True))
    x64 = x64_enabled()
    hints = [map_hint(e, mmap if can_map(h.path, options) else False, x64) for h, e in entries]
    outcomes = decider.decide_many(
        [
            (n, e.array_nbytes, e.shape, hint, by_file[header.path], _names_of(model, by_key, n, e))
            for n, (header, e), hint in zip(names, entries, hints, strict=True)
        ]
    )
    tensors = []
    # Per device: [bytes, tensors or shards, file-backed bytes].
    loads: dict[DeviceT, list[int]] = {}
    for name, (header, entry), outcome, hint in zip(names, entries, outcomes, hints, strict=True):
        decision, error = (outcome, None) if isinstance(outcome, Decision) else (None, str(outcome))
        if decision is not None:
            share = decision.bytes_per_device() or 0
            mapped = maps_from_file(decision, hint)
            for device in decision.local_devices:
                totals = loads.setdefault(device, [0, 0, 0])
                totals[0] += share
                totals[1] += 1
                totals[2] += share if mapped else 0
        tensors.append(
            PlannedTensor(
                name,
                entry.key,
                entry.dtype_name,
                entry.shape,
                entry.array_nbytes,
                entry.offset,
                decision,
                error,
                str(header.path) if len(headers) > 1 else "",
            )
        )
    # Devices sharing one memory (every CPU device) are judged together.
    capacity = decider.capacity
    pools = {device: pool_of(capacity, device) for device in loads}
    in_pool: dict[object, int] = {}
    for device, (nbytes, _, backed) in loads.items():
        in_pool[pools[device]] = in_pool.get(pools[device], 0) + nbytes - backed
    text = decider.machine.text
    # The policy's headroom is kept free, as memory-aware placement keeps it.
    headroom: float = decider.settings.headroom.value
    devices = []
    for device, (nbytes, count, backed) in sorted(
        loads.items(), key=lambda kv: _in_order(text(kv[0]))
    ):
        free = capacity.free_bytes(device)
        taken = in_pool[pools[device]]
        devices.append(
            DeviceLoad(
                text(device),
                nbytes,
                count,
                free,
                free is None or taken <= int(free * (1 - headroom)),
                backed,
                pool_text(pools[device]),
                taken,
            )
        )
    uses = uses_of_decisions(
        decider.settings,
        decider.conditions,
        [
            (n, e.array_nbytes, e.shape, by_file[header.path])
            for n, (header, e) in zip(names, entries, strict=True)
        ],
        [t.decision for t in tensors],
        by_file.values(),
    )
    used = dict.fromkeys(t.decision.mesh for t in tensors if t.decision and t.decision.mesh)
    built = [decider.meshes.build(name) for name in used]
    fetches = []
    first = 0
    for header in headers:
        decided = [t.decision for t in tensors[first : first + len(header.tensors)]]
        first += len(header.tensors)
        if isinstance(header.path, URLPath):
            fetches.append(predicted_fetch(header, decided, options, x64))
    return Plan(
        str(path),
        tuple(tensors),
        tuple(devices),
        machine,
        processes,
        slices,
        metadata={str(header.path): dict(header.metadata or {}) for header in headers},
        left_out=tuple((str(file), why) for file, why in checkpoint.left_out),
        rules=uses,
        meshes=tuple(layout(b, text) for b in built if not isinstance(b, str)),
        fetches=tuple(fetches),
    )


def predicted_fetch(
    header: Header, decisions: list[Decision[Any] | None], options: RemoteOptions, x64: bool
) -> PlannedFetch:
    """What `load_file` fetches of the file at a URL whose header is `header`, in this
    process: the reads the loader asks of a remote source, in its order (runs of small
    tensors, large tensors in groups, each sharded tensor's slices in one batch), each
    counted as the source sends it (`planned_requests`). On a `VirtualMachine` (decisions
    without a sharding) a sharded tensor's share is counted as one range of its bytes per
    device times the process's devices. With a tensor that has no device, the load stops
    after the headers: only they are counted."""
    chunk = options.chunk_bytes
    head = min(HEAD_BYTES, header.file_size)
    requests, nbytes = 2, head  # the metadata request; the header's first small read
    length = header.data_start - 8
    if not (8 + length <= head and length < HEAD_BYTES):
        more, fetched = planned_requests([(8, length)], chunk)
        requests, nbytes = requests + more, nbytes + fetched
    if options.cache_dir is not None:
        more, fetched = planned_requests([(0, header.file_size)], chunk)
        share = sum(t.nbytes for t in header.tensors)
        return PlannedFetch(str(header.path), fetched, 1 + more, share, cached=True)
    if any(d is None for d in decisions):
        # A tensor without a device: the load raises once every header is read, and
        # fetches no data.
        return PlannedFetch(str(header.path), nbytes, requests, 0)
    placed = [d for d in decisions if d is not None]
    calls: list[list[tuple[int, int]]] = []
    share = 0
    order = sorted(range(len(header.tensors)), key=lambda i: header.tensors[i].offset)
    position = 0
    while position < len(order):
        i = order[position]
        entry, decision = header.tensors[i], placed[i]
        if entry.packed or (decision.mesh is None and entry.nbytes >= MAP_THRESHOLD):
            calls += [[group] for group in remote_groups(entry)]
            share += entry.nbytes
        elif decision.mesh is not None:
            ranges = _held_ranges(entry, decision)
            calls.append(ranges)
            share += sum(length for _, length in ranges)
        else:
            run = small_run(header, placed, order, position, False, x64)
            calls.append([(header.tensors[j].offset, header.tensors[j].nbytes) for j in run])
            share += sum(header.tensors[j].nbytes for j in run)
            position += len(run)
            continue
        position += 1
    for call in calls:
        more, fetched = planned_requests(call, chunk)
        requests, nbytes = requests + more, nbytes + fetched
    return PlannedFetch(str(header.path), nbytes, requests, share)


def _held_ranges(entry: TensorEntry, decision: Decision[Any]) -> list[tuple[int, int]]:
    """The file ranges of the slices of `entry` this process's devices hold (each distinct
    slice once), as the shard-local reader reads them."""
    if decision.sharding is None:  # a VirtualMachine: its devices do not exist here
        per_device = decision.bytes_per_device() or 0
        return [(entry.offset, min(entry.nbytes, per_device * len(decision.local_devices)))]
    held = decision.sharding.addressable_devices_indices_map(entry.shape).values()
    bounds = dict.fromkeys(slice_bounds(entry, index) for index in held)
    return [
        run
        for b in bounds
        if all(stop > start for start, stop in b)
        for run in slice_ranges(entry, b)
    ]


def _in_order(text: str) -> tuple[str, int]:
    """`gpu:2` before `gpu:10`."""
    platform, _, index = text.partition(":")
    return platform, int(index) if index.isdigit() else -1
