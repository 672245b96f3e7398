"""`devpolicy align`: rewrite a safetensors file so its tensors start at aligned offsets
(zero-copy loading), and say how many do; `--check`: say which tensors would not map, and
why, writing nothing."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import devpolicy

from .common import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, lit, new_console


def command(args: argparse.Namespace) -> int:
    """Rewrite `args.source` as `args.destination` with aligned tensors, or `--check` it."""
    if args.check:
        if args.destination is not None:
            return _usage("--check takes one file and writes nothing: leave out the destination")
        return check(args)
    if args.destination is None:
        return _usage("needs a destination (devpolicy align IN OUT), or --check IN")
    devpolicy.align_file(args.source, args.destination, align=args.align)
    planned = _planned(args.destination)
    aligned = [t for t in planned.tensors if t.offset % args.align == 0]
    share = sum(t.nbytes for t in aligned) / max(1, sum(t.nbytes for t in planned.tensors))
    new_console().print(
        lit(
            f"wrote {args.destination}: {len(aligned)} of {len(planned.tensors)} tensors "
            f"({share:.0%} of the bytes) start at {args.align}-byte offsets"
        )
    )
    return EXIT_OK


def check(args: argparse.Namespace) -> int:
    """Print each tensor of `args.source` that a load would read instead of map, with why,
    and a summary line; exit 1 when there is one."""
    source = args.source
    reasons = devpolicy.unmappable(source)
    tensors = _planned(source).tensors
    console = new_console()
    if not reasons:
        console.print(
            lit(f"{source}: {len(tensors)} of {len(tensors)} tensors map (64-byte aligned)")
        )
        return EXIT_OK
    for key, why in reasons.items():
        console.print(lit(f"{source}: tensor {key!r}: {why}"))
    read = sum(t.nbytes for t in tensors if t.key in reasons)
    share = read / max(1, sum(t.nbytes for t in tensors))
    console.print(
        lit(
            f"{source}: {len(reasons)} of {len(tensors)} tensors ({share:.0%} of the bytes) "
            f"would be read, not mapped; `devpolicy align {source} OUT` writes a copy whose "
            "largest tensors start aligned"
        )
    )
    return EXIT_FINDINGS


def _planned(path: Path) -> devpolicy.types.Plan:
    """The file's tensors, planned by an empty policy (no discovery, no environment)."""
    return devpolicy.plan(path, policy=devpolicy.load_policy({"version": 1}, environ={}))


def _usage(problem: str) -> int:
    print(f"devpolicy align: {problem}", file=sys.stderr)
    return EXIT_USAGE
