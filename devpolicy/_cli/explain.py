"""`devpolicy explain`: where one name goes, and why, rule by rule and fallback by fallback."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

import devpolicy

from .common import EXIT_FINDINGS, EXIT_OK, described_machine, lit, load, new_console


def command(args: argparse.Namespace) -> int:
    """Show every rule tried for `args.name` and the decision; exit 1 without a device."""
    policy = load(args.policy)
    machine = described_machine(args)
    nbytes, shape, axes = args.bytes, args.shape, None
    if args.tree is not None:
        from devpolicy._policy.real_names import read_tree  # the form check --names reads

        tree = read_tree(args.tree)
        if args.name not in tree:
            raise ValueError(
                f"--tree {args.tree}: no entry {args.name!r} ({len(tree)} names; the names "
                "are as load_file names the tensors)"
            )
        (_, known_bytes, known_shape, _), axes = tree[args.name]
        nbytes = nbytes if nbytes is not None else known_bytes
        shape = shape if shape is not None else known_shape
    e = policy.explain(
        args.name, nbytes=nbytes, shape=shape, machine=machine, file=args.file, axes=axes
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
            "transfers": {
                field: {"mode": s.value, "source": s.source, "origin": s.origin}
                for field, s in policy.settings.transfers.items()
            },
        }
        print(json.dumps(payload, indent=2))
        return EXIT_OK if e.decision is not None else EXIT_FINDINGS
    console = new_console()
    size = "size unknown" if e.nbytes is None else devpolicy.sizes.format_size(e.nbytes)
    how = f"; found by {policy.found}" if args.policy is None else ""
    source = "" if args.file is None else f" from {args.file}"
    console.print(lit(f"{e.name} ({size}){source} under {policy.file or 'no policy file'}{how}"))
    table = Table(title="Rules, in the order tried", title_justify="left")
    for column in ("#", "origin", "layer", "result"):
        table.add_column(column)
    for entry, step in e.steps:
        result = Text(
            "match: " if step.matched else "skip: ", style="green" if step.matched else "dim"
        )
        result.append_text(lit(step.reason))
        table.add_row(str(step.rule), lit(entry.origin), lit(entry.source), result)
    if e.steps:
        console.print(table)
    else:
        console.print(Text("no rules"))
    if matched is None:
        default = policy.settings.default
        console.print(
            lit(
                f"no rule matches: default {default.value!r} "
                f"from {default.origin} ({default.source})"
            )
        )
    for target, why in e.fallback:
        console.print(lit(f"fallback: {target} passed over: {why}"))
    if e.decision is None:
        console.print(Text("\n").join(lit(line, "red") for line in str(e.error).split("\n")))
        return EXIT_FINDINGS
    d = e.decision
    if d.resolved is not None:
        console.print(lit(f"resolved: {d.resolved}"))
    line = Text("decision: ")
    line.append_text(lit(d.device_text, "bold"))
    line.append_text(lit(f" (requested {d.requested}; source {d.source}; origin {d.origin}"))
    line.append_text(lit(f"; memory {d.memory_kind})" if d.memory_kind else ")"))
    console.print(line)
    if d.is_sharded:
        share = d.bytes_per_device()
        per = f"; {devpolicy.sizes.format_size(share)} per device" if share is not None else ""
        console.print(
            lit(f"sharded over mesh {d.mesh!r}: {d.shards} pieces on {d.mesh_devices} devices{per}")
        )
    _print_transfers(console, policy)
    return EXIT_OK


def _print_transfers(console: Console, policy: devpolicy.Policy) -> None:
    """What the policy does with JAX's implicit transfers, field by field, where it says."""
    for field, s in policy.settings.transfers.items():
        console.print(lit(f"transfers.{field}: {s.value} (source {s.source}; origin {s.origin})"))
