"""The `devpolicy` command line. Uses only the public API, as any user would, except `run`,
which reads the settings without building a Policy so that it never imports JAX, and the
leaf that every output shows untrusted text through."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

import devpolicy
from devpolicy._base.visible import visible as _visible
from devpolicy._base.visible import visible_lines as _visible_lines

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
#: `plan`: the policy shards, but no tensor of the checkpoint is sharded on the machine.
EXIT_NOT_SHARDED = 3
_PLAN_ROWS = 40
_MAX_PROCESSES = 65536
_DIGITS = re.compile("[0-9]+")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {_visible(message)}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _capacity_item(text: str) -> tuple[str, int]:
    target, sep, size = text.partition("=")
    if not sep or not target.strip():
        raise argparse.ArgumentTypeError(f"expected TARGET=SIZE such as gpu:0=24GiB, got {text!r}")
    try:
        devpolicy.StaticCapacity({target.strip(): size.strip()})  # checks target and size
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    return target.strip(), devpolicy.parse_size(size.strip())


def _devices_item(text: str) -> str:
    try:
        devpolicy.VirtualMachine([text], option="--devices")  # checks the text
    except devpolicy.MachineSpecError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--devices ")) from None
    return text


def _processes(text: str) -> int:
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
            f"{shown!r} is not a process count; accepted: a whole number 1..{_MAX_PROCESSES}, "
            "in the digits 0-9"
        )
    return count


def _size(text: str) -> int:
    try:
        return devpolicy.parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="devpolicy",
        description="Declared, overridable and logged device placement for JAX.",
    )
    parser.add_argument("--version", action="version", version=f"devpolicy {devpolicy.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    devices = commands.add_parser(
        "devices", help="which backends and devices this process has, and why not"
    )
    devices.add_argument("--json", action="store_true", help="print JSON")
    devices.add_argument(
        "--policy", type=Path, default=None, help="policy whose runtime knobs to show"
    )

    check = commands.add_parser("check", help="validate and lint a policy")
    check.add_argument(
        "policy", nargs="?", type=Path, help="policy file (default: the one discovery finds)"
    )
    check.add_argument("--strict", action="store_true", help="exit 2 when there are warnings")
    check.add_argument(
        "--names",
        type=Path,
        default=None,
        metavar="CKPT|TREE.json",
        help="lint against real names: a safetensors file, checkpoint directory or index "
        "(header only), or a JSON list of names / object of name -> {shape, dtype}",
    )
    check.add_argument(
        "--prefix", default=None, help="with a checkpoint: name prefix (default: its stem)"
    )
    check.add_argument("--json", action="store_true", help="print JSON")

    explain = commands.add_parser("explain", help="where a name goes, and why, rule by rule")
    explain.add_argument("name", help="the name to decide, e.g. dataset/train")
    explain.add_argument(
        "--bytes", type=_size, default=None, metavar="SIZE", help="its size: 4GiB, 1.5GB, 512"
    )
    explain.add_argument(
        "--policy", type=Path, default=None, help="policy file (default: discovery)"
    )
    explain.add_argument(
        "--shape",
        type=_shape,
        default=None,
        metavar="DIMS",
        help="its shape, e.g. 8,1024: whether it divides over a sharding rule's mesh",
    )
    explain.add_argument(
        "--file",
        type=Path,
        default=None,
        metavar="PATH",
        help="the file it is loaded from: rules with `file:` match only with one",
    )
    _machine_options(explain, "decide")
    explain.add_argument("--json", action="store_true", help="print JSON")

    plan = commands.add_parser(
        "plan", help="where every tensor of a safetensors checkpoint would go"
    )
    plan.add_argument(
        "file",
        type=Path,
        metavar="CKPT",
        help="a .safetensors file, a checkpoint directory or its index "
        "(model.safetensors.index.json); only headers are read",
    )
    plan.add_argument("--policy", type=Path, default=None, help="policy file (default: discovery)")
    plan.add_argument("--prefix", default=None, help="name prefix (default: the file's stem)")
    plan.add_argument(
        "--separator",
        default=None,
        help="the character between the parts of the file's tensor keys ('.' for Hugging "
        "Face keys; default: the policy's names.separator)",
    )
    plan.add_argument(
        "--capacity",
        action="append",
        default=[],
        type=_capacity_item,
        metavar="TARGET=SIZE",
        help="plan for another machine: free memory of a device (gpu:0=24GiB); repeatable",
    )
    _machine_options(plan, "plan")
    plan.add_argument(
        "--all", action="store_true", help=f"list every tensor (default: the first {_PLAN_ROWS})"
    )
    plan.add_argument("--json", action="store_true", help="print JSON")

    commands.add_parser("schema", help="print the JSON Schema of the policy format")

    align = commands.add_parser("align", help="rewrite a safetensors file for zero-copy loading")
    align.add_argument("source", type=Path, help="the file to read")
    align.add_argument("destination", type=Path, help="the file to write (replaced atomically)")
    align.add_argument(
        "--align", type=int, default=64, help="byte alignment, a power of two (default 64)"
    )
    run = commands.add_parser(
        "run",
        help="run a command with the policy's runtime settings in its environment",
        description="Set the policy's `runtime:` variables (and DEVPOLICY_FILE), then replace "
        "this process with COMMAND: devpolicy run --policy p.yaml -- python train.py",
    )
    run.add_argument("--policy", type=Path, default=None, help="policy file (default: discovery)")
    run.add_argument(
        "--dry-run", action="store_true", help="print the variables that would be set, run nothing"
    )
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return its exit status.

    Exit status: 0 success; 1 findings (`check` errors, `explain` without a device,
    `plan` that does not fit); 2 usage or input errors (and `check --strict` warnings);
    3 a `plan` that fits but shards nothing although the policy has sharding rules.

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
    handlers = {
        "devices": _devices,
        "check": _check,
        "explain": _explain,
        "plan": _plan,
        "schema": _schema,
        "align": _align,
        "run": _run,
    }
    try:
        return handlers[args.command](args)
    except (devpolicy.DevicePolicyError, ValueError) as e:
        print(f"devpolicy {args.command}: {_visible_lines(e)}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader went away (`devpolicy plan --json | head`): not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except OSError as e:
        where = f": {e.filename}" if e.filename else ""
        print(
            f"devpolicy {args.command}: {_visible(e.strerror or e)}{_visible(where)}",
            file=sys.stderr,
        )
        return EXIT_USAGE


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich exits 1 here, which means "findings" for plan and explain; the reader going
        # away is not a finding. `main` handles the pipe like any other closed pipe.
        self.quiet = True
        raise BrokenPipeError


def _console() -> Console:
    console = _Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console = _Console(highlight=False, soft_wrap=True, width=160)
    return console


def _lit(text: object, style: str = "") -> Text:
    """Data (names, paths, messages) as rich text shown literally: never read as markup.

    Every string that comes from a file, a policy, the environment or the command line
    goes through here (or `_visible` where it is printed without rich).
    """
    return Text(_visible(text), style=style)


def _load(path: Path | None) -> devpolicy.Policy:
    return devpolicy.load_policy(path) if path is not None else devpolicy.load_policy()


def _shape(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.replace("x", ",").split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"not a shape: {text!r}; accepted: dimensions separated by commas, e.g. 8,1024"
        )
    return tuple(int(p) for p in parts)


def _size_text(n: int | None) -> str:
    return "-" if n is None else devpolicy.format_size(n)


# devices ---------------------------------------------------------------------------------


def _memory(device: Any) -> tuple[int | None, int | None, str]:
    """Free and total bytes as memory-aware placement sees them, and where they come from."""
    free, total = devpolicy.DeviceMemory().usage(device)
    return free, total, "host RAM" if total is None else "memory_stats"


def _devices(args: argparse.Namespace) -> int:
    # Apply the policy's runtime knobs first, as a program would: the devices listed are
    # those a program under this policy gets.
    try:
        activation = devpolicy.bootstrap(args.policy)
    except (devpolicy.PolicyError, devpolicy.EnvOverrideError) as e:
        if args.policy is not None:
            raise
        print(f"devpolicy devices: runtime knobs not applied: {e}", file=sys.stderr)
        return _list_devices(args, None)
    with activation as policy:
        return _list_devices(args, policy)


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
    if args.json:
        backends: dict[str, dict[str, Any]] = {
            p: {"available": True, "reason": None} for p in inv.devices
        }
        backends |= {p: {"available": False, "reason": why} for p, why in inv.missing.items()}
        payload = {
            "process_index": inv.process_index,
            "default_platform": inv.default_platform,
            "backends": backends,
            "devices": rows,
            "runtime": [_knob_row(k) for k in runtime.knobs] if runtime else [],
            "runtime_conflicts": list(runtime.conflicts) if runtime else [],
        }
        print(json.dumps(payload, indent=2))
        return EXIT_OK
    console = _console()
    backends_table = Table(title="Backends", title_justify="left")
    for column in ("platform", "available", "devices, or why not"):
        backends_table.add_column(column, overflow="fold")
    for platform, devices in inv.devices.items():
        backends_table.add_row(_lit(platform), Text("yes", style="green"), str(len(devices)))
    for platform, why in inv.missing.items():
        backends_table.add_row(_lit(platform), Text("no", style="red"), _lit(why))
    console.print(backends_table)
    table = Table(title=f"Devices of process {inv.process_index}", title_justify="left")
    for column in ("target", "id", "kind", "process", "memory kinds", "free", "total", "from"):
        table.add_column(column, justify="right" if column in ("id", "free", "total") else "left")
    for row in rows:
        table.add_row(
            _lit(row["target"] + (" (default)" if row["default"] else "")),
            str(row["id"]),
            _lit(row["kind"]),
            str(row["process_index"]),
            _lit(", ".join(row["memory_kinds"])),
            _size_text(row["bytes_free"]),
            _size_text(row["bytes_total"]),
            row["free_from"],
        )
    console.print(table)
    if runtime is not None:
        _print_runtime(console, runtime)
    return EXIT_OK


def _knob_row(knob: devpolicy.RuntimeKnob) -> dict[str, Any]:
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


def _print_runtime(console: Console, runtime: devpolicy.RuntimeSettings) -> None:
    if not runtime.knobs:
        console.print(Text("runtime: the policy sets no runtime knobs"))
    else:
        table = Table(title="Runtime knobs (policy runtime:)", title_justify="left")
        for column in ("knob", "value", "source", "from", "variable", "state"):
            table.add_column(column, overflow="fold")
        for k in runtime.knobs:
            value = _lit(k.text)
            if k.note:
                value.append_text(_lit(f" ({k.note})", "dim"))
            state = _lit(k.state, "red" if k.state.startswith("differs") else "")
            table.add_row(k.knob, value, k.source, _lit(k.origin), k.variable, state)
        console.print(table)
    for conflict in runtime.conflicts:
        console.print(_lit(f"runtime conflict: {conflict}", "yellow"))


# check -----------------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> int:
    label = str(args.policy) if args.policy is not None else "the discovered policy"
    try:
        policy = _load(args.policy)
    except devpolicy.PolicyError as e:
        code = "untrusted-policy" if isinstance(e, devpolicy.UntrustedPolicyError) else "invalid"
        findings = [
            {"severity": "error", "origin": _where(p), "code": code, "message": _what(p)}
            for p in e.problems
        ]
        return _report_check(args, label, findings, invalid=True)
    except devpolicy.EnvOverrideError as e:
        findings = [
            {
                "severity": "error",
                "origin": f"env:{e.variable}",
                "code": "invalid-env",
                "message": str(e),
            }
        ]
        return _report_check(args, label, findings, invalid=True)
    label = policy.file or label
    found = devpolicy.lint(policy)
    uses: tuple[Any, ...] = ()
    named = ""
    if args.names is not None:
        from .._policy.lint import lint_names, read_names

        names = read_names(args.names, policy, args.prefix)
        by_names, uses = lint_names(policy, names)
        found += by_names
        named = f"; against {len(names)} names of {args.names}"
    findings = [
        {"severity": f.severity, "origin": f.origin, "code": f.code, "message": f.message}
        for f in found
    ]
    how = f"; found by {policy.found}" if args.policy is None else ""
    return _report_check(
        args, f"{label} ({len(policy.rules)} rules{how}{named})", findings, uses=uses
    )


def _where(problem: devpolicy.Problem) -> str:
    return problem.file if problem.line is None else f"{problem.file}:{problem.line}"


def _what(problem: devpolicy.Problem) -> str:
    return f"{problem.field}: {problem.message}" if problem.field else problem.message


def _report_check(
    args: argparse.Namespace,
    label: str,
    findings: list[dict[str, str]],
    invalid: bool = False,
    uses: tuple[Any, ...] = (),
) -> int:
    errors = sum(f["severity"] == "error" for f in findings)
    warnings = len(findings) - errors
    status = EXIT_FINDINGS if errors else (EXIT_USAGE if warnings and args.strict else EXIT_OK)
    if args.json:
        report: dict[str, Any] = {
            "policy": label,
            "valid": not invalid,
            "findings": findings,
            "exit": status,
        }
        if uses:
            report["rules"] = [_use_json(u) for u in uses]
        print(json.dumps(report, indent=2))
        return status
    console = _console()
    console.print(_lit(f"policy: {label}"))
    for u in uses:
        console.print(
            _lit(f"  {u.origin} {u.label}: {u.tensors} name{'' if u.tensors == 1 else 's'}")
        )
    for f in findings:
        style = "bold red" if f["severity"] == "error" else "yellow"
        line = _lit(f"{f['origin']}: ")
        line.append(f["severity"], style=style)
        line.append_text(_lit(f": {f['message']} [{f['code']}]"))
        console.print(line)
    summary = "valid, no findings" if not findings else f"{errors} error(s), {warnings} warning(s)"
    console.print(Text(summary, style="green" if not findings else ("red" if errors else "yellow")))
    return status


# explain ---------------------------------------------------------------------------------


def _explain(args: argparse.Namespace) -> int:
    policy = _load(args.policy)
    machine = _described_machine(args)
    e = policy.explain(
        args.name, nbytes=args.bytes, shape=args.shape, machine=machine, file=args.file
    )
    matched = next((entry for entry, step in e.steps if step.matched), None)
    if args.json:
        payload = {
            "name": e.name,
            "nbytes": e.nbytes,
            "file": None if args.file is None else str(args.file),
            "policy": policy.file,
            "rules": [
                {
                    "rule": step.rule,
                    "origin": entry.origin,
                    "layer": entry.source,
                    "matched": step.matched,
                    "reason": step.reason,
                }
                for entry, step in e.steps
            ],
            "default": None
            if matched
            else {
                "target": policy.settings.default.value,
                "origin": policy.settings.default.origin,
            },
            "fallback": [{"target": t, "reason": why} for t, why in e.fallback],
            "decision": None if e.decision is None else e.decision.event_fields(),
            "error": e.error,
        }
        print(json.dumps(payload, indent=2))
        return EXIT_OK if e.decision is not None else EXIT_FINDINGS
    console = _console()
    size = "size unknown" if e.nbytes is None else devpolicy.format_size(e.nbytes)
    how = f"; found by {policy.found}" if args.policy is None else ""
    source = "" if args.file is None else f" from {args.file}"
    console.print(_lit(f"{e.name} ({size}){source} under {policy.file or 'no policy file'}{how}"))
    table = Table(title="Rules, in the order tried", title_justify="left")
    for column in ("#", "origin", "layer", "result"):
        table.add_column(column)
    for entry, step in e.steps:
        result = Text(
            "match: " if step.matched else "skip: ", style="green" if step.matched else "dim"
        )
        result.append_text(_lit(step.reason))
        table.add_row(str(step.rule), _lit(entry.origin), _lit(entry.source), result)
    if e.steps:
        console.print(table)
    else:
        console.print(Text("no rules"))
    if matched is None:
        default = policy.settings.default
        console.print(
            _lit(
                f"no rule matches: default {default.value!r} "
                f"from {default.origin} ({default.source})"
            )
        )
    for target, why in e.fallback:
        console.print(_lit(f"fallback: {target} passed over: {why}"))
    if e.decision is None:
        console.print(Text("\n").join(_lit(line, "red") for line in str(e.error).split("\n")))
        return EXIT_FINDINGS
    d = e.decision
    line = Text("decision: ")
    line.append_text(_lit(d.device_text, "bold"))
    line.append_text(_lit(f" (requested {d.requested}; source {d.source}; origin {d.origin}"))
    line.append_text(_lit(f"; memory {d.memory_kind})" if d.memory_kind else ")"))
    console.print(line)
    if d.is_sharded:
        share = d.bytes_per_device()
        per = f"; {devpolicy.format_size(share)} per device" if share is not None else ""
        console.print(
            _lit(
                f"sharded over mesh {d.mesh!r}: {d.shards} pieces on {d.mesh_devices} devices{per}"
            )
        )
    return EXIT_OK


# plan ------------------------------------------------------------------------------------


def _machine_options(parser: argparse.ArgumentParser, verb: str) -> None:
    """`--devices` and `--processes`: a machine you do not have, for `plan` and `explain`."""
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


def _described_machine(args: argparse.Namespace) -> devpolicy.VirtualMachine | None:
    """The machine `--devices`/`--processes` describe, or None for this one.

    Raises:
        ValueError: `--processes` without `--devices` (main reports it as a usage error).
    """
    if args.devices:
        return devpolicy.VirtualMachine(args.devices, args.processes or 1, option="--devices")
    if args.processes is not None:
        raise ValueError(
            "--processes plans a machine described by --devices; add "
            "--devices BACKEND=COUNTxSIZE (e.g. --devices gpu=8x80GiB)"
        )
    return None


def _plan(args: argparse.Namespace) -> int:
    if args.devices and args.capacity:
        print(
            "devpolicy plan: --capacity and --devices both describe memory; give each "
            "device's memory in --devices (gpu=8x80GiB)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    machine = _described_machine(args)
    if args.capacity:
        capacity = devpolicy.StaticCapacity(dict(args.capacity))
        # A stated device this machine lacks would silently never be judged: say so.
        here = devpolicy.inventory().available()
        unknown = [t for t in capacity.targets if t not in here]
        if unknown:
            print(
                f"devpolicy plan: --capacity names {_lit(', '.join(unknown))}, which this "
                f"machine lacks (devices here: {', '.join(here)}); to plan for another "
                "machine, describe it with --devices gpu=8x80GiB",
                file=sys.stderr,
            )
            return EXIT_USAGE
        policy = devpolicy.load_policy(args.policy, capacity=capacity)
    else:
        policy = _load(args.policy)
    from devpolicy._document.schema import separator_problem  # the policy's own rule, loaded here

    problem = None if args.separator is None else separator_problem(args.separator)
    if problem is not None:
        print(f"devpolicy plan: --separator takes {_lit(problem)}", file=sys.stderr)
        return EXIT_USAGE
    p = devpolicy.plan(
        args.file, prefix=args.prefix, policy=policy, machine=machine, separator=args.separator
    )
    status = EXIT_OK if p.fits else EXIT_FINDINGS
    if status == EXIT_OK and p.sharded_nothing:
        status = EXIT_NOT_SHARDED
    if args.json:
        print(json.dumps(_plan_json(p), indent=2))
        return status
    console = _console()
    shown = p.tensors if args.all else p.tensors[:_PLAN_ROWS]
    on = "" if machine is None else f" on {p.machine}"
    table = Table(title=_lit(f"{p.file}: {len(p.tensors)} tensors{on}"), title_justify="left")
    for column in ("name", "dtype", "shape", "size", "where", "per device", "rule"):
        table.add_column(
            column, justify="right" if column in ("size", "per device") else "left", overflow="fold"
        )
    unplaced = _unplaced(p)
    note = {name: n for n, names in enumerate(unplaced.values(), 1) for name in names}
    for t in shown:
        device = _lit(t.decision.described) if t.decision else Text("none", style="red")
        if t.decision is not None and t.decision.fallback_reason:
            device.append_text(_lit(f" (asked {t.decision.requested})", "yellow"))
        # An unplaced tensor's reasons are said once, in its numbered note below the table.
        rule = _lit(t.decision.origin) if t.decision else Text(f"no device [{note[t.name]}]", "red")
        share = t.decision.bytes_per_device() if t.decision else None
        table.add_row(
            _lit(t.name),
            _lit(t.dtype),
            "x".join(map(str, t.shape)) or "()",
            _size_text(t.nbytes),
            device,
            _size_text(share),
            rule,
        )
    console.print(table)
    if len(shown) < len(p.tensors):
        console.print(Text(f"... {len(p.tensors) - len(shown)} more tensors (--all lists them)"))
    # Why each fallback happened, once per reason (a whole layer of tensors shares one).
    reasons: dict[str, list[str]] = {}
    for t in shown:
        if t.decision is not None and t.decision.fallback_reason:
            reasons.setdefault(t.decision.fallback_reason, []).append(t.name)
    for reason, names in reasons.items():
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        line = _lit(f"fallback for {', '.join(names[:3])}{more}: ", "yellow")
        line.append_text(_lit(reason))
        console.print(line)
    _plan_notes(console, p, unplaced)
    memory = "free" if machine is None else "memory"
    per_device = Table(
        title=f"Per device{'' if machine is None else ' (of each process)'}: planned against "
        f"{'free memory' if machine is None else 'its memory'}",
        title_justify="left",
    )
    for column in ("device", "tensors", "planned", "file-backed", memory, "used", "", "fits"):
        per_device.add_column(
            column, justify="left" if column in ("device", "", "fits") else "right"
        )
    for d in p.devices:
        # What takes memory: this device's share of its pool, less what is mapped.
        taken = d.pool_nbytes
        total = max(d.free or taken, 1)
        bar = ProgressBar(
            total=total,
            completed=min(taken, total),
            width=30,
            complete_style="red" if not d.fits else "green",
        )
        fits = Text("yes", style="green") if d.fits else Text("NO", style="bold red")
        used = "-" if d.free is None else f"{taken / max(d.free, 1):.0%}"
        shared = d.pool != d.device and sum(o.pool == d.pool for o in p.devices) > 1
        per_device.add_row(
            _lit(d.device),
            str(d.tensors),
            _size_text(d.nbytes),
            _size_text(d.file_backed) if d.file_backed else "-",
            _lit(f"{_size_text(d.free)} ({d.pool}, shared)" if shared else _size_text(d.free)),
            used,
            bar,
            fits,
        )
    console.print(per_device)
    if machine is not None:
        count = f"each of {p.processes}" if p.processes > 1 else "the"
        console.print(
            _lit(
                f"Per process: {count} process{'es' if p.processes > 1 else ''} holds "
                f"{devpolicy.format_size(p.bytes_per_process)} on {len(p.devices)} devices"
            )
        )
    missing = sum(map(len, unplaced.values()))
    if missing:
        console.print(Text(f"{missing} tensor(s) have no device", style="red"))
    _plan_rules(console, p)
    return status


def _plan_rules(console: Console, p: devpolicy.Plan) -> None:
    """What each rule took, and what should not pass in silence (exit 3's reason too)."""
    if len(p.rules) > 1:
        rules = Table(title="Per rule", title_justify="left")
        for column in ("rule", "pattern", "tensors", "bytes", "sharded"):
            rules.add_column(column, justify="right" if column in ("tensors", "bytes") else "left")
        for u in p.rules:
            rules.add_row(
                _lit(u.origin),
                _lit(u.label),
                Text(str(u.tensors), style="yellow" if not u.tensors and u.applies else ""),
                _size_text(u.nbytes),
                f"{u.sharded}" if u.shards else "-",
            )
        console.print(rules)
    for code, message in p.warnings:
        console.print(_lit(f"warning: {message} [{code}]", "yellow"))
    if p.sharded_nothing:
        console.print(
            _lit(
                f"the policy shards, but no tensor is sharded on {p.machine} (exit "
                f"{EXIT_NOT_SHARDED})",
                "bold yellow",
            )
        )


def _unplaced(p: devpolicy.Plan) -> dict[str, list[str]]:
    """The tensors without a device, by reason (the error without the tensor's own name,
    so a layer of tensors that fail alike shares one), in order of first appearance."""
    found: dict[str, list[str]] = {}
    for t in p.tensors:
        if t.decision is None:
            reason = (t.error or "").replace(f" for name {t.name!r}", "", 1)
            found.setdefault(reason, []).append(t.name)
    return found


def _plan_notes(console: Console, p: devpolicy.Plan, unplaced: dict[str, list[str]]) -> None:
    """Why the tensors without a device have none, once per reason, numbered as their rows
    refer to them (every target tried, as `explain` says), and the rule to write for large
    tensors only the default placed."""
    from .._decide.decider import LARGE_BY_DEFAULT  # JAX is up by now: `--help` stays light

    for n, (reason, names) in enumerate(unplaced.items(), 1):
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        console.print(_lit(f"[{n}] {', '.join(names[:3])}{more}:", "red"))
        # Not the devices this process has (`available:` on): the same for every tensor.
        lines = itertools.takewhile(lambda x: not x.startswith("  available:"), reason.splitlines())
        console.print(Text("\n").join(_lit(f"  {line}") for line in lines))
    large = [
        t
        for t in p.tensors
        if t.decision is not None
        and t.decision.rule is None
        and t.decision.source == "default"
        and t.nbytes >= LARGE_BY_DEFAULT
    ]
    if large:
        first = large[0]
        name = Path(first.file or p.file).name
        more = f" and {len(large) - 1} more" if len(large) > 1 else ""
        text = (
            f"{first.name}{more}: {devpolicy.format_size(first.nbytes)} placed by the "
            f"default only ({first.decision.device_text if first.decision else ''}); to say "
            f'where it goes on every machine, add a rule:\n  - file: "{name}"\n    device: cpu'
        )
        console.print(Text("\n").join(_lit(line, "yellow") for line in text.split("\n")))


def _plan_json(p: devpolicy.Plan) -> dict[str, Any]:
    return {
        "file": p.file,
        "machine": p.machine,
        "fits": p.fits,
        "tensors": [
            {
                "name": t.name,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "nbytes": t.nbytes,
                "aligned": t.offset % 64 == 0,
                "device": t.decision.device_text if t.decision else None,
                "mesh": t.decision.mesh if t.decision else None,
                "spec": _spec_json(t.decision.spec) if t.decision else None,
                "axes": list(t.decision.axes) if t.decision and t.decision.axes else None,
                "shards": t.decision.shards if t.decision else None,
                "mesh_devices": t.decision.mesh_devices if t.decision else None,
                "bytes_per_device": t.decision.bytes_per_device() if t.decision else None,
                "rule": t.decision.rule if t.decision else None,
                "origin": t.decision.origin if t.decision else None,
                "requested": t.decision.requested if t.decision else None,
                "fallback_reason": t.decision.fallback_reason if t.decision else None,
                "error": t.error,
            }
            for t in p.tensors
        ],
        "devices": [
            {
                "device": d.device,
                "nbytes": d.nbytes,
                "tensors": d.tensors,
                "free": d.free,
                "file_backed": d.file_backed,
                "pool": d.pool,
                "fits": d.fits,
            }
            for d in p.devices
        ],
        "processes": [{"process": i, "nbytes": p.bytes_per_process} for i in range(p.processes)],
        "rules": [_use_json(u) for u in p.rules],
        "warnings": [{"code": code, "message": message} for code, message in p.warnings],
        "sharded_nothing": p.sharded_nothing,
    }


def _use_json(u: Any) -> dict[str, Any]:
    return {
        "origin": u.origin,
        "pattern": u.label,
        "tensors": u.tensors,
        "nbytes": u.nbytes,
        "shards": u.shards,
        "sharded": u.sharded,
        "catch_all": u.catch_all,
    }


def _spec_json(spec: tuple[str | tuple[str, ...] | None, ...] | None) -> list[Any] | None:
    """A spec as JSON: an axis, a list of axes, or null per dimension."""
    if spec is None:
        return None
    return [list(e) if isinstance(e, tuple) else e for e in spec]


# run -------------------------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv and not args.dry_run:
        print(
            "devpolicy run: give the command after --: devpolicy run -- python train.py",
            file=sys.stderr,
        )
        return EXIT_USAGE
    # Settings only, not a Policy: a Policy needs JAX, and importing JAX would cost 2 s and
    # change this environment (it sets TF_CPP_MIN_LOG_LEVEL...), which the child inherits.
    from .._base.events import EventLog
    from .._policy.loading import load_settings
    from .._runtime.settings import plan_runtime

    parent = dict(os.environ)
    loaded = load_settings(args.policy)
    settings = loaded.settings
    runtime = plan_runtime(settings.runtime, parent)
    child = runtime.environment(parent)
    if settings.file is not None:
        path = args.policy if args.policy is not None else Path(settings.file)
        child["DEVPOLICY_FILE"] = str(path.resolve())
    events = EventLog(settings.log_level.value, settings.log_format.value)
    if loaded.untrusted is not None:
        events.emit("warning", "untrusted_policy", loaded.untrusted_fields())
    if args.dry_run:
        # Every variable the child gets that this process does not have, as shell
        # assignments: `eval "$(devpolicy run --dry-run)"` sets exactly these.
        for name in sorted(n for n in child if child[n] != parent.get(n)):
            print(f"export {name}={_shell_word(child[name])}")
        for k in runtime.knobs:
            if k.source == "env":
                print(f"# {_one_line(f'{k.knob}: {k.note}')}", file=sys.stderr)
        return EXIT_OK
    level = "warning" if runtime.conflicts else "info"
    events.emit(level, "runtime", runtime.applied_fields(settings.file, loaded.how))
    for conflict in runtime.conflicts:
        print(f"devpolicy run: warning: {_one_line(conflict)}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], argv, child)
    except FileNotFoundError:
        print(f"devpolicy run: command not found: {_one_line(argv[0])}", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"devpolicy run: not executable: {_one_line(argv[0])}", file=sys.stderr)
        return 126
    raise AssertionError("unreachable")  # pragma: no cover - execvpe does not return


# Printable characters other than these are quoted by shlex.quote; anything not printable
# (a newline, an escape) is written as a $'...' escape, so one value stays one line.
_UNPRINTABLE = re.compile(
    r"[^\x20-\x7e\u00a0-\ud7ff\ue000-\U0010ffff]|[\u202a-\u202e\u2066-\u2069]"
)


def _shell_word(value: str) -> str:
    """`value` as one shell word on one line: `shlex.quote`, or `$'...'` (bash, zsh, ksh,
    busybox sh, POSIX.1-2024) when it holds a newline or another control character."""
    if not _UNPRINTABLE.search(value):
        return shlex.quote(value)
    out = []
    for char in value:
        if char in "\\'":
            out.append("\\" + char)
        elif _UNPRINTABLE.match(char):
            code = ord(char)
            if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8 (os.fsdecode's escape)
                code -= 0xDC00
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(char)
    return "$'" + "".join(out) + "'"


def _one_line(text: object) -> str:
    """`text` with control characters, newlines included, shown as escapes."""
    return _visible(str(text).replace("\n", "\\n"))


# schema and align ------------------------------------------------------------------------


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(devpolicy.policy_schema(), indent=2))
    return EXIT_OK


def _align(args: argparse.Namespace) -> int:
    devpolicy.align_file(args.source, args.destination, align=args.align)
    planned = devpolicy.plan(
        args.destination, policy=devpolicy.load_policy({"version": 1}, environ={})
    )
    aligned = [t for t in planned.tensors if t.offset % args.align == 0]
    share = sum(t.nbytes for t in aligned) / max(1, sum(t.nbytes for t in planned.tensors))
    _console().print(
        _lit(
            f"wrote {args.destination}: {len(aligned)} of {len(planned.tensors)} tensors "
            f"({share:.0%} of the bytes) start at {args.align}-byte offsets"
        )
    )
    return EXIT_OK
