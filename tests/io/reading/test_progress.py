"""The load's progress bar shows a file's name as text (issue 28, D3): rich markup and
terminal escapes in it are shown, never obeyed."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest

import devpolicy


class _Terminal(io.StringIO):
    """What the bar writes, on a stream that says it is a terminal (so the bar shows)."""

    def isatty(self) -> bool:
        return True


def _shown_for(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """What a load of a file so named writes to a terminal."""
    path = tmp_path / name
    devpolicy.save_file({"w": np.ones(1024, np.float32)}, path)
    policy = devpolicy.load_policy({"version": 1, "logging": {"level": "error"}}, environ={})
    for variable in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "200")
    terminal = _Terminal()
    # Here, not in a fixture: pytest's output capture sets sys.stderr again after set-up.
    with monkeypatch.context() as patched:
        patched.setattr(sys, "stderr", terminal)
        devpolicy.load_file(path, policy=policy, progress=True)
    return terminal.getvalue()


class TestTheBarShowsNamesLiterally:
    def test_markup_in_a_file_name_is_shown_not_obeyed(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`[white on white]` and `[link=...]` in a name appear as written: no hidden
        text, no hyperlink."""
        out = _shown_for("[white on white]hidden[link=https:x]y.safetensors", tmp_path, monkeypatch)
        assert "[white on white]hidden[link=https:x]y.safetensors" in out
        assert "\x1b]8;" not in out  # rich writes a hyperlink as OSC 8
        assert "\x1b[37;47m" not in out  # white on white

    def test_terminal_escapes_in_a_file_name_are_shown_as_escapes(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A title-setting OSC and a clear-screen in a name reach the terminal as text."""
        out = _shown_for("a\x1b]0;owned\x07\x1b[2Jb.safetensors", tmp_path, monkeypatch)
        assert "a\\x1b]0;owned\\x07\\x1b[2Jb.safetensors" in out
        assert "\x1b]0;owned" not in out
        assert "\x1b[2Jb" not in out
