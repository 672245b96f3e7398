"""The `devpolicy` command line. Uses only the public API, like any user."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

import devpolicy

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits 2 on usage errors; keep that, say why
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="devpolicy",
        description="Declared, overridable and logged device placement for JAX.",
    )
    parser.add_argument("--version", action="version", version=f"devpolicy {devpolicy.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    devices = commands.add_parser(
        "devices", help="list every known backend, its devices, and why absent ones are absent"
    )
    devices.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    Example:
        >>> main(["devices", "--json"]) == 0  # doctest: +ELLIPSIS
        {...
        True
    """
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return EXIT_USAGE
    try:
        if args.command == "devices":
            return _devices(args.json)
    except devpolicy.DevicePolicyError as e:
        print(f"devpolicy: {e}", file=sys.stderr)
        return EXIT_USAGE
    raise AssertionError(f"unhandled command {args.command}")  # pragma: no cover


def _device_rows() -> list[dict[str, Any]]:
    inv = devpolicy.inventory()
    rows = []
    for platform, devices in inv.devices.items():
        for device in devices:
            stats = _memory(device)
            rows.append(
                {
                    "target": inv.text(device),
                    "platform": platform,
                    "id": device.id,
                    "kind": device.device_kind,
                    "process_index": device.process_index,
                    "memory_kinds": [m.kind for m in device.addressable_memories()],
                    "bytes_free": stats[0],
                    "bytes_total": stats[1],
                    "default": device == devpolicy.get_device("auto"),
                }
            )
    return rows


def _memory(device: Any) -> tuple[int | None, int | None]:
    try:
        stats = device.memory_stats()
    except Exception:
        stats = None
    if not stats:
        return None, None
    total = stats.get("bytes_limit")
    used = stats.get("bytes_in_use")
    free = total - used if total is not None and used is not None else None
    return free, total


def _devices(as_json: bool) -> int:
    inv = devpolicy.inventory()
    rows = _device_rows()
    if as_json:
        payload = {
            "process_index": inv.process_index,
            "default_platform": inv.default_platform,
            "backends": {
                **{p: {"available": True, "reason": None} for p in inv.devices},
                **{p: {"available": False, "reason": why} for p, why in inv.missing.items()},
            },
            "devices": rows,
        }
        print(json.dumps(payload, indent=2))
        return EXIT_OK
    console = Console()
    backends = Table(title="Backends", title_justify="left")
    backends.add_column("platform")
    backends.add_column("available")
    backends.add_column("devices / reason", overflow="fold")
    for platform, devices in inv.devices.items():
        backends.add_row(platform, "[green]yes[/]", str(len(devices)))
    for platform, why in inv.missing.items():
        backends.add_row(platform, "[red]no[/]", why)
    console.print(backends)
    table = Table(title=f"Devices (process {inv.process_index})", title_justify="left")
    for column in ("target", "id", "kind", "process", "memory kinds", "free", "total"):
        table.add_column(column, justify="right" if column in ("id", "free", "total") else "left")
    for row in rows:
        table.add_row(
            row["target"] + (" (default)" if row["default"] else ""),
            str(row["id"]),
            row["kind"],
            str(row["process_index"]),
            ", ".join(row["memory_kinds"]),
            "-" if row["bytes_free"] is None else devpolicy.format_size(row["bytes_free"]),
            "-" if row["bytes_total"] is None else devpolicy.format_size(row["bytes_total"]),
        )
    console.print(table)
    return EXIT_OK
