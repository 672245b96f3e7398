"""Small helpers shared by the tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
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


def run_threads(*targets: Callable[[], object], timeout: float = 120) -> None:
    """Start one thread per target, then wait for all of them."""
    threads = [threading.Thread(target=target) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a test thread did not finish"
