"""`devpolicy align`: rewrite a safetensors file so its tensors start at aligned offsets
(zero-copy loading), and say how many do."""

from __future__ import annotations

import argparse

import devpolicy

from .common import EXIT_OK, lit, new_console


def command(args: argparse.Namespace) -> int:
    """Rewrite `args.source` as `args.destination` with aligned tensors."""
    devpolicy.align_file(args.source, args.destination, align=args.align)
    planned = devpolicy.plan(
        args.destination, policy=devpolicy.load_policy({"version": 1}, environ={})
    )
    aligned = [t for t in planned.tensors if t.offset % args.align == 0]
    share = sum(t.nbytes for t in aligned) / max(1, sum(t.nbytes for t in planned.tensors))
    new_console().print(
        lit(
            f"wrote {args.destination}: {len(aligned)} of {len(planned.tensors)} tensors "
            f"({share:.0%} of the bytes) start at {args.align}-byte offsets"
        )
    )
    return EXIT_OK
