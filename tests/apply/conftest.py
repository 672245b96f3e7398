"""Fixtures the tests of `windows` and of reading windows by position share."""

from __future__ import annotations

import pytest

from devpolicy._apply import windows as _windows


@pytest.fixture
def by_position(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows of a file mapping read from the file by position (not gathered from the
    mapping, `windows`' default)."""
    monkeypatch.setattr(_windows, "MAPPED_COPY", "file")
