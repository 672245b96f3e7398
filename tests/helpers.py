"""Small helpers shared by the tests."""

from __future__ import annotations

from pathlib import Path

import devpolicy


def write(path: Path, text: str) -> Path:
    """Write `text` (dedented by the caller) to `path` and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def policy_of(**fields: object) -> devpolicy.Policy:
    """A policy from keyword fields, version 1, no environment."""
    return devpolicy.load_policy({"version": 1, **fields}, environ={})
