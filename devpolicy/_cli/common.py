"""What every command shares: exit codes, output, untrusted text, the policy a command uses.

Every string that comes from a file, a policy, the environment or the command line is
shown through `lit` (rich output) or `visible`/`one_line` (plain output): never read as
markup, never as a terminal command. Imports no JAX: `devpolicy` loads its API on first
use, and `--help` uses none of it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

import devpolicy
from devpolicy._base.visible import visible

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
#: `plan`: the policy shards, but no tensor of the checkpoint is sharded on the machine.
EXIT_NOT_SHARDED = 3


class _Console(Console):
    def on_broken_pipe(self) -> None:
        # rich exits 1 here, which means "findings" for plan and explain; the reader going
        # away is not a finding. `main` handles the pipe like any other closed pipe.
        self.quiet = True
        raise BrokenPipeError


def new_console() -> Console:
    """The console a command prints its tables to: 160 columns when not a terminal."""
    shown = _Console(highlight=False, soft_wrap=True)
    if not shown.is_terminal:
        shown = _Console(highlight=False, soft_wrap=True, width=160)
    return shown


def lit(text: object, style: str = "") -> Text:
    """Data (names, paths, messages) as rich text shown literally: never read as markup.

    Every string that comes from a file, a policy, the environment or the command line
    goes through here (or `visible` where it is printed without rich).
    """
    return Text(visible(text), style=style)


def one_line(text: object) -> str:
    """`text` with control characters, newlines included, shown as escapes."""
    return visible(str(text).replace("\n", "\\n"))


def size_text(n: int | None) -> str:
    """A byte count as `format_size` writes it; `-` when unknown."""
    return "-" if n is None else devpolicy.sizes.format_size(n)


def load(path: Path | None) -> devpolicy.Policy:
    """The policy `--policy` names, or the one discovery finds when it names none."""
    return devpolicy.load_policy(path) if path is not None else devpolicy.load_policy()


def described_machine(args: argparse.Namespace) -> devpolicy.VirtualMachine | None:
    """The machine `--devices`/`--processes`/`--slices` describe, or None for this one.

    Raises:
        ValueError: `--processes` or `--slices` without `--devices` (main reports it as a
            usage error).
        MachineSpecError: `--slices` that does not split the processes evenly.
    """
    if args.devices:
        return devpolicy.VirtualMachine(
            args.devices,
            args.processes or 1,
            args.slices,
            option="--devices",
            slices_option="--slices",
        )
    for option, example in (("processes", "gpu=8x80GiB"), ("slices", "tpu=4x16GiB")):
        if getattr(args, option) is not None:
            raise ValueError(
                f"--{option} plans a machine described by --devices; add "
                f"--devices BACKEND=COUNTxSIZE (e.g. --devices {example})"
            )
    return None


def use_json(u: Any) -> dict[str, Any]:
    """What one rule took (a `RuleUse`), as `check --names --json` and `plan --json` print it."""
    return {
        "origin": u.origin,
        "pattern": u.label,
        "tensors": u.tensors,
        "nbytes": u.nbytes,
        "shards": u.shards,
        "sharded": u.sharded,
        "catch_all": u.catch_all,
        "status": u.status,
        "note": u.note,
    }


def under_policy_knobs(
    verb: str, args: argparse.Namespace, run: Callable[[devpolicy.Policy | None], int]
) -> int:
    """`run` with the policy's runtime knobs applied first, as a program would (the devices
    seen are those a program under this policy gets); where discovery found a policy whose
    knobs cannot be applied, `run(None)` after a line saying so (a `--policy` given is
    the user's: its error is raised)."""
    try:
        activation = devpolicy.bootstrap(args.policy)
    except (devpolicy.PolicyError, devpolicy.errors.EnvOverrideError) as e:
        if args.policy is not None:
            raise
        print(f"devpolicy {verb}: runtime knobs not applied: {e}", file=sys.stderr)
        return run(None)
    with activation as policy:
        return run(policy)
