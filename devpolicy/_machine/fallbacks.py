"""Fallbacks taken: decisions whose rule's target could not be had (or hold the bytes).

The decider counts each decision it makes with a `fallback_reason` here, by the rule that
decided, the target it asked for and what was used instead; `report` gives the counts
(`Ledger.fallbacks`). A decision is counted when it is made: a name decided again from
the decider's cache is not counted again, so the counts are decisions (names, and sizes
where memory judged them), not placements. Plans (`VirtualMachine`) count nothing. The
table is bounded by the rules and devices (a few rows); past `_LIMIT` rows the rest are
counted under one row. No JAX here.
"""

from __future__ import annotations

from dataclasses import dataclass

_LIMIT = 1024
# (origin, rule, requested, used, declared, short) -> [decisions, nbytes, latest reason]
_counts: dict[tuple[str, int | None, str, str, bool, bool], list[int | str]] = {}


@dataclass(frozen=True, slots=True)
class FallbackCount:
    """The decisions that took one way down a fallback chain, counted.

    Attributes:
        origin: Where the deciding rule (or default) was written (`policy.yaml:9`).
        rule: The rule's index in its layer, or None (the default).
        requested: The target it asked for (`gpu:0`, `accelerator`).
        used: The device (or mesh) used instead.
        declared: Whether the rule's own `fallback:` wrote that way and no accelerator
            was too small (planned: logged at info; else a warning).
        short: Whether a target was passed over because the bytes did not fit its free
            memory (rather than because it was not there).
        decisions: How many decisions went so (a name decided again from the cache
            counts once).
        nbytes: Their bytes, of those whose size was known.
        reason: The latest such decision's `fallback_reason`.
    """

    origin: str
    rule: int | None
    requested: str
    used: str
    declared: bool
    short: bool
    decisions: int
    nbytes: int
    reason: str


def count_fallback(
    origin: str,
    rule: int | None,
    requested: str,
    used: str,
    declared: bool,
    short: bool,
    nbytes: int | None,
    reason: str,
) -> None:
    """Count one decision that took a fallback (the decider calls it as it decides).

    Example:
        >>> forget_fallbacks()
        >>> count_fallback("p.yaml:3", 0, "gpu:0", "cpu:0", False, False, 16, "no gpu")
        >>> count_fallback("p.yaml:3", 0, "gpu:0", "cpu:0", False, False, None, "no gpu")
        >>> [(f.origin, f.used, f.decisions, f.nbytes) for f in fallbacks()]
        [('p.yaml:3', 'cpu:0', 2, 16)]
    """
    key = (origin, rule, requested, used, declared, short)
    row = _counts.get(key)
    if row is None:
        if len(_counts) >= _LIMIT:
            key = ("<other rules>", None, "", "", False, False)
            row = _counts.get(key)
        if row is None:
            row = _counts[key] = [0, 0, reason]
    row[0] = int(row[0]) + 1
    row[1] = int(row[1]) + (nbytes or 0)
    row[2] = reason


def fallbacks() -> tuple[FallbackCount, ...]:
    """Every fallback counted so far in this process, most decisions first."""
    rows = [
        FallbackCount(*key, int(row[0]), int(row[1]), str(row[2]))
        for key, row in list(_counts.items())
    ]
    return tuple(sorted(rows, key=lambda f: (-f.decisions, -f.nbytes, f.origin, f.used)))


def forget_fallbacks() -> None:
    """Start counting fallbacks afresh (tests, or a job between phases)."""
    _counts.clear()
