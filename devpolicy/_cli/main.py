"""The `devpolicy` command line: the parser and the dispatch to one module per command.

Each command's module (`devices`, `check`, `explain`, `plan`, `run`, `schema`, `align`,
`report`)
holds its handler, `command(args) -> exit status`; `common` holds what they share. The
parser's argument types check their text here, so a bad value is a usage error before
any command runs. Nothing here imports JAX: `--help` and `--version` stay light, and each
command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import devpolicy
from devpolicy._base.visible import visible, visible_lines

from . import align, check, devices, explain, plan, report, run, schema
from .common import EXIT_OK, EXIT_USAGE

_MAX_PROCESSES = 65536
_DIGITS = re.compile("[0-9]+")
# Each command's handler, by the name the parser gives it.
_COMMANDS = {
    "devices": devices.command,
    "check": check.command,
    "explain": explain.command,
    "plan": plan.command,
    "schema": schema.command,
    "align": align.command,
    "run": run.command,
    "report": report.command,
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {visible(message)}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _capacity_item(text: str) -> tuple[str, int]:
    target, sep, size = text.partition("=")
    if not sep or not target.strip():
        raise argparse.ArgumentTypeError(f"expected TARGET=SIZE such as gpu:0=24GiB, got {text!r}")
    try:
        devpolicy.StaticCapacity({target.strip(): size.strip()})  # checks target and size
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    return target.strip(), devpolicy.sizes.parse_size(size.strip())


def _devices_item(text: str) -> str:
    try:
        devpolicy.VirtualMachine([text], option="--devices")  # checks the text
    except devpolicy.errors.MachineSpecError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--devices ")) from None
    return text


def _processes(text: str, what: str = "process") -> int:
    # ASCII digits only, as in --devices (`isdigit`/`int` would also take '٣', '²' and
    # ' 3'), and never more digits than `int` takes: a 5,000-digit count is out of range.
    digits = text.lstrip("0")
    if not _DIGITS.fullmatch(text) or len(digits) > len(str(_MAX_PROCESSES)):
        count = None
    else:
        count = int(digits or "0")
    if count is None or not 1 <= count <= _MAX_PROCESSES:
        shown = text if len(text) <= 20 else f"{text[:20]}... ({len(text):,} characters)"
        raise argparse.ArgumentTypeError(
            f"{shown!r} is not a {what} count; accepted: a whole number 1..{_MAX_PROCESSES}, "
            "in the digits 0-9"
        )
    return count


def _path_or_url(text: str) -> Any:
    """A file argument: a local `Path`, or a `URLPath` for `s3://`, `gs://`, `hf://` and
    `https://` (shown without its credentials wherever the command prints it)."""
    from .._base.locations import location

    return location(text)


def _width(text: str) -> int:
    if not _DIGITS.fullmatch(text) or len(text) > 4 or not 8 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError(
            f"{text[:20]!r} is not a width; accepted: a whole number 8..1000, in the digits 0-9"
        )
    return int(text)


def _size(text: str) -> int:
    try:
        return devpolicy.sizes.parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="devpolicy",
        description="Declared, overridable and logged device placement for JAX.",
    )
    parser.add_argument("--version", action="version", version=f"devpolicy {devpolicy.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    devices_parser = commands.add_parser(
        "devices", help="which backends and devices this process has, and why not"
    )
    devices_parser.add_argument("--json", action="store_true", help="print JSON")
    devices_parser.add_argument(
        "--policy", type=Path, default=None, help="policy whose runtime knobs to show"
    )

    check_parser = commands.add_parser("check", help="validate and lint a policy")
    check_parser.add_argument(
        "policy", nargs="?", type=Path, help="policy file (default: the one discovery finds)"
    )
    check_parser.add_argument(
        "--strict", action="store_true", help="exit 2 when there are warnings"
    )
    check_parser.add_argument(
        "--names",
        type=_path_or_url,
        default=None,
        metavar="CKPT|TREE.json",
        help="lint against real names: a safetensors file, checkpoint directory or index "
        "(header only; a path or an s3://, gs://, hf://, https:// URL), or a JSON list of "
        "names / object of name -> {shape, dtype}",
    )
    check_parser.add_argument(
        "--prefix", default=None, help="with a checkpoint: name prefix (default: its stem)"
    )
    check_parser.add_argument("--json", action="store_true", help="print JSON")
    _machine_options(check_parser, "check")

    explain_parser = commands.add_parser("explain", help="where a name goes, and why, rule by rule")
    explain_parser.add_argument("name", help="the name to decide, e.g. dataset/train")
    explain_parser.add_argument(
        "--bytes", type=_size, default=None, metavar="SIZE", help="its size: 4GiB, 1.5GB, 512"
    )
    explain_parser.add_argument(
        "--policy", type=Path, default=None, help="policy file (default: discovery)"
    )
    explain_parser.add_argument(
        "--shape",
        type=_shape,
        default=None,
        metavar="DIMS",
        help="its shape, e.g. 8,1024: whether it divides over a sharding rule's mesh",
    )
    explain_parser.add_argument(
        "--file",
        type=_path_or_url,
        default=None,
        metavar="PATH|URL",
        help="the file it is loaded from (a path or a URL): rules with `file:` match only with one",
    )
    _tree_option(explain_parser, "the name's")
    _machine_options(explain_parser, "decide")
    explain_parser.add_argument("--json", action="store_true", help="print JSON")

    plan_parser = commands.add_parser(
        "plan", help="where every tensor of a safetensors checkpoint would go"
    )
    plan_parser.add_argument(
        "file",
        type=_path_or_url,
        metavar="CKPT",
        help="a .safetensors file, a checkpoint directory or its index "
        "(model.safetensors.index.json), local or at an s3://, gs://, hf://, https:// URL; "
        "only headers are read",
    )
    plan_parser.add_argument(
        "--policy", type=Path, default=None, help="policy file (default: discovery)"
    )
    plan_parser.add_argument(
        "--prefix", default=None, help="name prefix (default: the file's stem)"
    )
    plan_parser.add_argument(
        "--separator",
        default=None,
        help="the character between the parts of the file's tensor keys ('.' for Hugging "
        "Face keys; default: the policy's names.separator)",
    )
    plan_parser.add_argument(
        "--capacity",
        action="append",
        default=[],
        type=_capacity_item,
        metavar="TARGET=SIZE",
        help="plan for another machine: free memory of a device (gpu:0=24GiB); repeatable",
    )
    _tree_option(plan_parser, "each tensor's")
    _machine_options(plan_parser, "plan")
    plan_parser.add_argument(
        "--all", action="store_true", help=f"list every tensor (default: the first {plan.ROWS})"
    )
    plan_parser.add_argument("--json", action="store_true", help="print JSON")

    commands.add_parser("schema", help="print the JSON Schema of the policy format")

    align_parser = commands.add_parser(
        "align", help="rewrite a safetensors file for zero-copy loading, or --check one"
    )
    align_parser.add_argument("source", type=Path, help="the file to read")
    align_parser.add_argument(
        "destination", type=Path, nargs="?", help="the file to write (replaced atomically)"
    )
    align_parser.add_argument(
        "--check", action="store_true", help="say which tensors would not map, write nothing"
    )
    align_parser.add_argument(
        "--align", type=int, default=64, help="byte alignment, a power of two (default 64)"
    )
    report_parser = commands.add_parser(
        "report",
        help="this process's devices, memory and ledger as bars, or as one HTML page",
        description="Start JAX under the policy's runtime knobs, as a program would, and show "
        "the ledger of this process (devpolicy.report()): each device's memory and where it "
        "was read. A program shows its own arrays with devpolicy.report().bars() or "
        ".write_html(path).",
    )
    report_parser.add_argument(
        "--policy", type=Path, default=None, help="policy file (default: discovery)"
    )
    report_parser.add_argument(
        "--html",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the picture as one self-contained HTML page to PATH (replaced whole)",
    )
    report_parser.add_argument(
        "--width",
        type=_width,
        default=40,
        metavar="N",
        help="the bars' width in characters, 8..1000 (default 40)",
    )
    report_parser.add_argument(
        "--ascii", action="store_true", help="draw the bars in ASCII characters only"
    )
    run_parser = commands.add_parser(
        "run",
        help="run a command with the policy's runtime settings in its environment",
        description="Set the policy's `runtime:` variables (and DEVPOLICY_FILE), then replace "
        "this process with COMMAND: devpolicy run --policy p.yaml -- python train.py",
    )
    run_parser.add_argument(
        "--policy", type=Path, default=None, help="policy file (default: discovery)"
    )
    run_parser.add_argument(
        "--dry-run", action="store_true", help="print the variables that would be set, run nothing"
    )
    run_parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    return parser


def _shape(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.replace("x", ",").split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"not a shape: {text!r}; accepted: dimensions separated by commas, e.g. 8,1024"
        )
    return tuple(int(p) for p in parts)


def _tree_option(parser: argparse.ArgumentParser, whose: str) -> None:
    """`--tree`: the model's names, for rules with `axes: attached` (`plan`, `explain`)."""
    parser.add_argument(
        "--tree",
        type=Path,
        default=None,
        metavar="TREE.json",
        help=f"the model's tree, for rules with `axes: attached`: {whose} axis names, "
        'from a JSON object of name -> {"shape": [...], "dtype": ..., "axes": [...]} '
        "(the form check --names takes)",
    )


def _machine_options(parser: argparse.ArgumentParser, verb: str) -> None:
    """`--devices`, `--processes` and `--slices`: a machine you do not have, for `plan`,
    `explain` and `check`."""
    parser.add_argument(
        "--devices",
        action="append",
        default=[],
        type=_devices_item,
        metavar="BACKEND=COUNTxSIZE",
        help=f"{verb} for a machine you do not have: its devices in each process, e.g. "
        "gpu=8x80GiB or cpu=1x512GiB (cpu=1 unless given); repeatable",
    )
    parser.add_argument(
        "--processes",
        type=_processes,
        default=None,
        metavar="N",
        help="with --devices: N identical processes, each with those devices (default 1)",
    )
    parser.add_argument(
        "--slices",
        type=lambda text: _processes(text, "slice"),
        default=None,
        metavar="N",
        help="with --devices tpu=...: the processes' TPUs are in N slices, the processes "
        "split evenly over them (default 1: one pod slice); off TPU each process is a slice",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit status.

    Exit status: 0 success; 1 findings (`check` errors, `explain` without a device,
    `plan` that does not fit, `align --check` of a tensor that would not map); 2 usage or
    input errors (and `check --strict` warnings); 3 a `plan` that fits but shards nothing
    although the policy has sharding rules.

    Example:
        >>> main(["schema"]) == 0  # doctest: +ELLIPSIS
        {...
        True
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return _COMMANDS[args.command](args)
    except (devpolicy.DevicePolicyError, ValueError) as e:
        print(f"devpolicy {args.command}: {visible_lines(e)}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`devpolicy plan --json | head`): not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        print(
            f"devpolicy {args.command}: {visible(e.strerror or e)}{visible(where)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
