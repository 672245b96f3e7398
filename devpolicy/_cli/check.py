"""`devpolicy check`: validate and lint a policy, optionally against real names
(`--names`: a checkpoint's tensors or a JSON list of names)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from rich.text import Text

import devpolicy

if TYPE_CHECKING:
    from .._document.discovery import Found
from .common import (
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    described_machine,
    lit,
    load,
    new_console,
    use_json,
)


def command(args: argparse.Namespace) -> int:
    """Validate and lint the policy (and, with `--names`, lint it against real names)."""
    label = str(args.policy) if args.policy is not None else "the discovered policy"
    try:
        policy = load(args.policy)
    except devpolicy.PolicyError as e:
        code = (
            "untrusted-policy"
            if isinstance(e, devpolicy.errors.UntrustedPolicyError)
            else "invalid"
        )
        findings = [
            {"severity": "error", "origin": _where(p), "code": code, "message": _what(p)}
            for p in e.problems
        ]
        return _report_check(args, label, findings, invalid=True)
    except devpolicy.errors.EnvOverrideError as e:
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
    found = devpolicy.lint(policy, machine=described_machine(args))
    if args.policy is None:
        from .._policy.loading import load_settings

        # Discovery again, without JAX: whether it found nothing (the load above said so
        # in a `no_policy` event, which a gate reading the findings does not see).
        nothing = load_settings().nothing_found
        if nothing is not None:
            found.insert(0, _no_policy(nothing))
    uses: tuple[Any, ...] = ()
    named = ""
    if args.names is not None:
        from .._policy.real_names import lint_names, read_names

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


def _no_policy(found: Found) -> devpolicy.types.Finding:
    """The `no-policy` warning: an empty policy passes every lint, and a gate (`check
    --strict`) must not pass a project that has none."""
    # Here, not at the top: `devpolicy --help` starts without pydantic, which it imports.
    from .._document.discovery import NO_POLICY_FIX

    return devpolicy.types.Finding(
        "warning",
        "discovery",
        "no-policy",
        f"no policy found (looked for {found.looked_text}): every name goes to JAX's "
        f"default device, unsharded; to fix: {NO_POLICY_FIX}",
    )


def _where(problem: devpolicy.types.Problem) -> str:
    return problem.file if problem.line is None else f"{problem.file}:{problem.line}"


def _what(problem: devpolicy.types.Problem) -> str:
    return f"{problem.field}: {problem.message}" if problem.field else problem.message


def _report_check(
    args: argparse.Namespace,
    label: str,
    findings: list[dict[str, str]],
    invalid: bool = False,
    uses: tuple[Any, ...] = (),
) -> int:
    errors = sum(f["severity"] == "error" for f in findings)
    notes = sum(f["severity"] == "note" for f in findings)
    # Notes are what the run says at info (a fallback the rule declared): never a failure.
    warnings = len(findings) - errors - notes
    status = EXIT_FINDINGS if errors else (EXIT_USAGE if warnings and args.strict else EXIT_OK)
    if args.json:
        report: dict[str, Any] = {
            "policy": label,
            "valid": not invalid,
            "findings": findings,
            "exit": status,
        }
        if uses:
            report["rules"] = [use_json(u) for u in uses]
        print(json.dumps(report, indent=2))
        return status
    console = new_console()
    console.print(lit(f"policy: {label}"))
    for u in uses:
        note = f" ({u.note})" if u.note else ""
        console.print(
            lit(f"  {u.origin} {u.label}: {u.tensors} name{'' if u.tensors == 1 else 's'}{note}")
        )
    for f in findings:
        style = {"error": "bold red", "warning": "yellow"}.get(f["severity"], "dim")
        line = lit(f"{f['origin']}: ")
        line.append(f["severity"], style=style)
        line.append_text(lit(f": {f['message']} [{f['code']}]"))
        console.print(line)
    summary = "valid, no findings" if not findings else f"{errors} error(s), {warnings} warning(s)"
    if notes:
        summary += f", {notes} note(s)"
    colour = "red" if errors else ("yellow" if warnings else "green")
    console.print(Text(summary, style=colour))
    return status
