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
    and a summary line: what a rewrite (`devpolicy align`) would map, exit 1; or, where a
    rewrite maps none of them, why not, exit 0 (nothing more to do)."""
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
    total = max(1, sum(t.nbytes for t in tensors))
    read = sum(t.nbytes for t in tensors if t.key in reasons)
    found = (
        f"{source}: {len(reasons)} of {len(tensors)} tensors ({read / total:.0%} of the bytes) "
        "would be read, not mapped"
    )
    # Here, not at the top: `devpolicy --help` starts without JAX, which the writer imports.
    from devpolicy._io.writing.mappable import mapped_once_aligned

    fixed = mapped_once_aligned(source)
    if fixed:
        mapped = sum(t.nbytes for t in tensors if t.key in fixed)
        console.print(
            lit(
                f"{found}; `devpolicy align {source} OUT` writes a copy where {len(fixed)} of "
                f"them ({mapped / total:.0%} of the bytes) map{'s' if len(fixed) == 1 else ''}"
            )
        )
        return EXIT_FINDINGS
    causes = []
    if any(t.key in reasons and t.offset % 64 for t in tensors):
        causes.append(
            "the format leaves no gap between tensors, so a tensor after one whose size is not "
            "a multiple of 64 bytes cannot start aligned (`devpolicy align` puts those last, "
            "largest first)"
        )
    if any("two values a byte" in r or "narrowed" in r for r in reasons.values()):
        causes.append("F4 and narrowed 64-bit tensors are new buffers wherever they start")
    console.print(
        lit(f"{found}, and no rewrite maps them: {'; '.join(causes)}; nothing more to do")
    )
    return EXIT_OK


def _planned(path: Path) -> devpolicy.types.Plan:
    """The file's tensors, planned by an empty policy (no discovery, no environment)."""
    return devpolicy.plan(path, policy=devpolicy.load_policy({"version": 1}, environ={}))


def _usage(problem: str) -> int:
    print(f"devpolicy align: {problem}", file=sys.stderr)
    return EXIT_USAGE
