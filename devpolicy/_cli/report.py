"""`devpolicy report`: the picture of this process's devices (`devpolicy.report()`), as bars
in the terminal or as one self-contained HTML page (`--html PATH`).

It runs nothing of the user's: it starts JAX under the policy's runtime knobs, as a
program under that policy would, and shows each device with its memory and where each
figure was read. Arrays appear only in the process that made them: a program shows its
own with `devpolicy.report().bars()` or `.write_html(path)` at its end.
"""

from __future__ import annotations

import argparse
import sys

import devpolicy
from devpolicy._base.visible import visible

from .common import EXIT_OK, EXIT_USAGE, under_policy_knobs


def command(args: argparse.Namespace) -> int:
    """Show the ledger of this process after discovery; write the page with `--html`."""
    return under_policy_knobs("report", args, lambda _policy: _show(args))


def _show(args: argparse.Namespace) -> int:
    ledger = devpolicy.report()
    if args.html is None:
        print(ledger.bars(args.width, ascii_only=True if args.ascii else None))
        return EXIT_OK
    try:
        written = ledger.write_html(args.html)
    except OSError as e:
        print(
            f"devpolicy report: --html {visible(str(args.html))}: {visible(e.strerror or e)}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    count = len(ledger.devices)
    print(f"wrote {visible(str(written))} ({count} device{'' if count == 1 else 's'})")
    return EXIT_OK
