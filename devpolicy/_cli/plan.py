"""`devpolicy plan`: where every tensor of a safetensors checkpoint would go, on this
machine or one described by `--devices`, reading only headers; per device, whether it fits."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

import devpolicy

from .common import (
    EXIT_FINDINGS,
    EXIT_NOT_SHARDED,
    EXIT_OK,
    EXIT_USAGE,
    described_machine,
    lit,
    load,
    new_console,
    size_text,
    use_json,
)

#: The tensors a table lists without `--all`.
ROWS = 40


def command(args: argparse.Namespace) -> int:
    """Plan a checkpoint: exit 1 when it does not fit, 3 when it fits but shards nothing."""
    if args.devices and args.capacity:
        print(
            "devpolicy plan: --capacity and --devices both describe memory; give each "
            "device's memory in --devices (gpu=8x80GiB)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    machine = described_machine(args)
    if args.capacity:
        capacity = devpolicy.StaticCapacity(dict(args.capacity))
        # A stated device this machine lacks would silently never be judged: say so.
        here = devpolicy.inventory().available()
        unknown = [t for t in capacity.targets if t not in here]
        if unknown:
            print(
                f"devpolicy plan: --capacity names {lit(', '.join(unknown))}, which this "
                f"machine lacks (devices here: {', '.join(here)}); to plan for another "
                "machine, describe it with --devices gpu=8x80GiB",
                file=sys.stderr,
            )
            return EXIT_USAGE
        policy = devpolicy.load_policy(args.policy, capacity=capacity)
    else:
        policy = load(args.policy)
    from devpolicy._document.schema import separator_problem  # the policy's own rule, loaded here

    problem = None if args.separator is None else separator_problem(args.separator)
    if problem is not None:
        print(f"devpolicy plan: --separator takes {lit(problem)}", file=sys.stderr)
        return EXIT_USAGE
    axes = None
    if args.tree is not None:
        from devpolicy._policy.real_names import read_tree  # the form check --names reads

        axes = {name: names for name, (_, names) in read_tree(args.tree).items()}
    p = devpolicy.plan(
        args.file,
        prefix=args.prefix,
        policy=policy,
        machine=machine,
        separator=args.separator,
        axes=axes,
    )
    status = EXIT_OK if p.fits else EXIT_FINDINGS
    if status == EXIT_OK and p.sharded_nothing:
        status = EXIT_NOT_SHARDED
    if args.json:
        print(json.dumps(_plan_json(p), indent=2))
        return status
    console = new_console()
    shown = p.tensors if args.all else p.tensors[:ROWS]
    on = "" if machine is None else f" on {p.machine}"
    table = Table(
        title=lit(f"{p.file}: {len(p.tensors)} tensors{_of_files(p)}{on}"), title_justify="left"
    )
    for column in ("name", "dtype", "shape", "size", "where", "per device", "rule"):
        table.add_column(
            column, justify="right" if column in ("size", "per device") else "left", overflow="fold"
        )
    unplaced = _unplaced(p)
    note = {name: n for n, names in enumerate(unplaced.values(), 1) for name in names}
    for t in shown:
        device = lit(t.decision.described) if t.decision else Text("none", style="red")
        if t.decision is not None and t.decision.fallback_reason:
            device.append_text(lit(f" (asked {t.decision.requested})", "yellow"))
        # An unplaced tensor's reasons are said once, in its numbered note below the table.
        rule = lit(t.decision.origin) if t.decision else Text(f"no device [{note[t.name]}]", "red")
        share = t.decision.bytes_per_device() if t.decision else None
        table.add_row(
            lit(t.name),
            lit(t.dtype),
            "x".join(map(str, t.shape)) or "()",
            size_text(t.nbytes),
            device,
            size_text(share),
            rule,
        )
    console.print(table)
    if len(shown) < len(p.tensors):
        console.print(Text(f"... {len(p.tensors) - len(shown)} more tensors (--all lists them)"))
    # A folder's files load_file would not load: said here as its event says them.
    for file, why in p.left_out:
        console.print(lit(f"left out: {file}: {why}", "yellow"))
    # Why each fallback happened, once per reason (a whole layer of tensors shares one).
    reasons: dict[str, list[str]] = {}
    for t in shown:
        if t.decision is not None and t.decision.fallback_reason:
            reasons.setdefault(t.decision.fallback_reason, []).append(t.name)
    for reason, names in reasons.items():
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        line = lit(f"fallback for {', '.join(names[:3])}{more}: ", "yellow")
        line.append_text(lit(reason))
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
            lit(d.device),
            str(d.tensors),
            size_text(d.nbytes),
            size_text(d.file_backed) if d.file_backed else "-",
            lit(f"{size_text(d.free)} ({d.pool}, shared)" if shared else size_text(d.free)),
            used,
            bar,
            fits,
        )
    console.print(per_device)
    if machine is not None:
        count = f"each of {p.processes}" if p.processes > 1 else "the"
        console.print(
            lit(
                f"Per process: {count} process{'es' if p.processes > 1 else ''} holds "
                f"{devpolicy.sizes.format_size(p.bytes_per_process)} on {len(p.devices)} devices"
            )
        )
    for mesh in p.meshes:
        console.print(lit(f"Mesh {mesh.described}"))
    for f in p.fetches:
        cold = "; a first load, into the cache (later loads map it)" if f.cached else ""
        console.print(
            lit(
                f"Fetch: {f.file}: {devpolicy.sizes.format_size(f.nbytes)} in {f.requests} "
                f"request{'' if f.requests == 1 else 's'} from this process (it holds "
                f"{devpolicy.sizes.format_size(f.share)}){cold}"
            )
        )
    missing = sum(map(len, unplaced.values()))
    if missing:
        console.print(Text(f"{missing} tensor(s) have no device", style="red"))
    _plan_rules(console, p)
    return status


def _plan_rules(console: Console, p: devpolicy.types.Plan) -> None:
    """What each rule took, and what should not pass in silence (exit 3's reason too)."""
    from .._decide.rule_use import NEAR, NOTHING  # with the plan: `--help` stays light

    if len(p.rules) > 1:
        rules = Table(title="Per rule", title_justify="left")
        for column in ("rule", "pattern", "tensors", "bytes", "sharded", "why none"):
            rules.add_column(column, justify="right" if column in ("tensors", "bytes") else "left")
        for u in p.rules:
            # Yellow: a rule that took nothing and was meant to (see devpolicy's accounting).
            missed = not u.tensors and u.status in (NEAR, NOTHING) and u.label != "default"
            rules.add_row(
                lit(u.origin),
                lit(u.label),
                Text(str(u.tensors), style="yellow" if missed else ""),
                size_text(u.nbytes),
                f"{u.sharded}" if u.shards else "-",
                lit(u.note),
            )
        console.print(rules)
    for code, message in p.warnings:
        console.print(lit(f"warning: {message} [{code}]", "yellow"))
    if p.sharded_nothing:
        console.print(
            lit(
                f"the policy shards, but no tensor is sharded on {p.machine} (exit "
                f"{EXIT_NOT_SHARDED})",
                "bold yellow",
            )
        )


def _of_files(p: devpolicy.types.Plan) -> str:
    """` of model.safetensors` where a folder was planned as the one file `load_file` loads
    of it (its tensors named under the folder's name, as `load_file` names them)."""
    files = list(p.metadata)
    if len(files) == 1 and files[0] != p.file:
        return f" of {Path(files[0]).name}"
    return ""


def _unplaced(p: devpolicy.types.Plan) -> dict[str, list[str]]:
    """The tensors without a device, by reason (the error without the tensor's own name,
    so a layer of tensors that fail alike shares one), in order of first appearance."""
    found: dict[str, list[str]] = {}
    for t in p.tensors:
        if t.decision is None:
            reason = (t.error or "").replace(f" for name {t.name!r}", "", 1)
            found.setdefault(reason, []).append(t.name)
    return found


def _plan_notes(console: Console, p: devpolicy.types.Plan, unplaced: dict[str, list[str]]) -> None:
    """Why the tensors without a device have none, once per reason, numbered as their rows
    refer to them (every target tried, as `explain` says), and the rule to write for large
    tensors only the default placed."""
    from .._decide.advice import LARGE_BY_DEFAULT  # JAX is up by now: `--help` stays light

    for n, (reason, names) in enumerate(unplaced.items(), 1):
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        console.print(lit(f"[{n}] {', '.join(names[:3])}{more}:", "red"))
        # Not the devices this process has (`available:` on): the same for every tensor.
        lines = itertools.takewhile(lambda x: not x.startswith("  available:"), reason.splitlines())
        console.print(Text("\n").join(lit(f"  {line}") for line in lines))
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
            f"{first.name}{more}: {devpolicy.sizes.format_size(first.nbytes)} placed by the "
            f"default only ({first.decision.device_text if first.decision else ''}); to say "
            f'where it goes on every machine, add a rule:\n  - file: "{name}"\n    device: cpu'
        )
        console.print(Text("\n").join(lit(line, "yellow") for line in text.split("\n")))


def _plan_json(p: devpolicy.types.Plan) -> dict[str, Any]:
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
        "slices": p.slices,
        "rules": [use_json(u) for u in p.rules],
        "meshes": [
            {
                "name": m.name,
                "shape": m.shape,
                "dcn": m.dcn,
                "size": m.size,
                "first_devices": list(m.first),
                "given": m.given,
            }
            for m in p.meshes
        ],
        "fetch": [
            {
                "file": f.file,
                "nbytes": f.nbytes,
                "requests": f.requests,
                "share": f.share,
                "cached": f.cached,
            }
            for f in p.fetches
        ],
        "left_out": [{"file": file, "why": why} for file, why in p.left_out],
        "warnings": [{"code": code, "message": message} for code, message in p.warnings],
        "sharded_nothing": p.sharded_nothing,
    }


def _spec_json(spec: tuple[str | tuple[str, ...] | None, ...] | None) -> list[Any] | None:
    """A spec as JSON: an axis, a list of axes, or null per dimension."""
    if spec is None:
        return None
    return [list(e) if isinstance(e, tuple) else e for e in spec]
