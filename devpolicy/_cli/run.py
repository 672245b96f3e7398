"""`devpolicy run`: set the policy's runtime variables, then replace this process with a
command (or, with `--dry-run`, print them as shell assignments).

Reads the settings without building a Policy, so that it never imports JAX.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path

from .common import EXIT_OK, EXIT_USAGE, one_line


def command(args: argparse.Namespace) -> int:
    """Run `args.argv` with the policy's runtime variables set (or print them)."""
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
        # Every note, the policy's own too: a platform dropped says why here as well.
        for k in runtime.knobs:
            if k.note:
                print(f"# {one_line(f'{k.knob}: {k.note}')}", file=sys.stderr)
        for hidden in runtime.hidden:
            print(f"# warning: {one_line(hidden)}", file=sys.stderr)
        return EXIT_OK
    level = "warning" if runtime.conflicts or runtime.hidden else "info"
    events.emit(level, "runtime", runtime.applied_fields(settings.file, loaded.how))
    for conflict in (*runtime.conflicts, *runtime.hidden):
        print(f"devpolicy run: warning: {one_line(conflict)}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], argv, child)
    except FileNotFoundError:
        print(f"devpolicy run: command not found: {one_line(argv[0])}", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"devpolicy run: not executable: {one_line(argv[0])}", file=sys.stderr)
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
