"""`devpolicy devices`: the backends and devices this process has (and why not), each
device's memory, and the runtime knobs a policy sets."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

import devpolicy

from .common import EXIT_OK, lit, new_console, size_text, under_policy_knobs


def _memory(device: Any) -> tuple[int | None, int | None, str]:
    """Free and total bytes as memory-aware placement sees them, and where they come from."""
    free, total = devpolicy.types.DeviceMemory().usage(device)
    return free, total, "host RAM" if total is None else "memory_stats"


def command(args: argparse.Namespace) -> int:
    """List backends, devices and memory, and the runtime knobs the policy sets."""
    return under_policy_knobs("devices", args, lambda policy: _list_devices(args, policy))


def _list_devices(args: argparse.Namespace, policy: devpolicy.Policy | None) -> int:
    inv = devpolicy.inventory()
    runtime = devpolicy.runtime_settings(policy) if policy is not None else None
    try:
        default = devpolicy.get_device("auto")
    except devpolicy.DeviceUnavailableError:  # no backend started: the table says why
        default = None
    rows = []
    for platform, devices in inv.devices.items():
        for device in devices:
            free, total, source = _memory(device)
            rows.append(
                {
                    "target": inv.text(device),
                    "platform": platform,
                    "id": device.id,
                    "kind": device.device_kind,
                    "process_index": device.process_index,
                    "memory_kinds": list(inv.memory_kinds(device)),
                    "bytes_free": free,
                    "bytes_total": total,
                    "free_from": source,
                    "default": device == default,
                }
            )
    accelerator = _accelerator_line(inv)
    if args.json:
        backends: dict[str, dict[str, Any]] = {
            p: {"available": True, "reason": None} for p in inv.devices
        }
        backends |= {p: {"available": False, "reason": why} for p, why in inv.missing.items()}
        payload = {
            "process_index": inv.process_index,
            "default_platform": inv.default_platform,
            "accelerator": f"accelerator:0 -> {inv.accelerator}:0" if inv.accelerator else None,
            "backends": backends,
            "devices": rows,
            "runtime": [_knob_row(k) for k in runtime.knobs] if runtime else [],
            "runtime_conflicts": list(runtime.conflicts) if runtime else [],
            "runtime_hidden": list(runtime.hidden) if runtime else [],
        }
        print(json.dumps(payload, indent=2))
        return EXIT_OK
    console = new_console()
    backends_table = Table(title="Backends", title_justify="left")
    for column in ("platform", "available", "devices, or why not"):
        backends_table.add_column(column, overflow="fold")
    for platform, devices in inv.devices.items():
        backends_table.add_row(lit(platform), Text("yes", style="green"), str(len(devices)))
    for platform, why in inv.missing.items():
        backends_table.add_row(lit(platform), Text("no", style="red"), lit(why))
    console.print(backends_table)
    table = Table(title=f"Devices of process {inv.process_index}", title_justify="left")
    for column in ("target", "id", "kind", "process", "memory kinds", "free", "total", "from"):
        table.add_column(column, justify="right" if column in ("id", "free", "total") else "left")
    for row in rows:
        table.add_row(
            lit(row["target"] + (" (default)" if row["default"] else "")),
            str(row["id"]),
            lit(row["kind"]),
            str(row["process_index"]),
            lit(", ".join(row["memory_kinds"])),
            size_text(row["bytes_free"]),
            size_text(row["bytes_total"]),
            row["free_from"],
        )
    console.print(table)
    console.print(lit(accelerator))
    if runtime is not None:
        _print_runtime(console, runtime)
    return EXIT_OK


def _accelerator_line(inv: devpolicy.types.Inventory) -> str:
    """What the target `accelerator` resolves to in this process, or why it names nothing."""
    if inv.accelerator is None:
        why = "; ".join(f"{p}: {inv.missing[p]}" for p in ("tpu", "gpu") if p in inv.missing)
        return f"accelerator: none in this process (a TPU, else a GPU; {why})"
    return f"accelerator: accelerator:0 -> {inv.accelerator}:0 (a TPU, else a GPU)"


def _knob_row(knob: devpolicy.types.RuntimeKnob) -> dict[str, Any]:
    return {
        "knob": knob.knob,
        "value": knob.text,
        "source": knob.source,
        "origin": knob.origin,
        "variable": knob.variable,
        "config": knob.config,
        "note": knob.note or None,
        "state": knob.state,
    }


def _print_runtime(console: Console, runtime: devpolicy.types.RuntimeSettings) -> None:
    if not runtime.knobs:
        console.print(Text("runtime: the policy sets no runtime knobs"))
    else:
        table = Table(title="Runtime knobs (policy runtime:)", title_justify="left")
        for column in ("knob", "value", "source", "from", "variable", "state"):
            table.add_column(column, overflow="fold")
        for k in runtime.knobs:
            value = lit(k.text)
            if k.note:
                value.append_text(lit(f" ({k.note})", "dim"))
            state = lit(k.state, "red" if k.state.startswith("differs") else "")
            table.add_row(k.knob, value, k.source, lit(k.origin), k.variable, state)
        console.print(table)
    for conflict in runtime.conflicts:
        console.print(lit(f"runtime conflict: {conflict}", "yellow"))
    for hidden in runtime.hidden:
        console.print(lit(f"runtime warning: {hidden}", "yellow"))
