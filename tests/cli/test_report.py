"""`devpolicy report`: this process's devices as bars, or as one HTML page."""

from __future__ import annotations

import html.parser
from pathlib import Path

import pytest

from devpolicy._cli.main import main
from tests.cli.test_main import run_cli


class _Text(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []

    def handle_data(self, data: str) -> None:
        self.text.append(data.strip())


class TestReport:
    def test_bars_show_each_device_and_its_capacity(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Every device, its bar of the width asked, its capacity and where it was read."""
        assert main(["report", "--width", "20", "--ascii"]) == 0
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert lines[0] == "devices (devpolicy.report, bars):"
        for target in ("cpu:0", "cpu:1", "cpu:2", "cpu:3"):
            assert any(line.startswith(f"{target} (host RAM): ") for line in lines)
        bars = [line for line in lines if line.startswith("  |")]
        assert len(bars) == 4
        assert all(len(line) == 2 + 20 + 2 for line in bars)
        assert "capacity " in out
        assert "free from host RAM: " in out

    def test_html_writes_one_page(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """`--html PATH` writes the page and says where, with how many devices."""
        page = tmp_path / "out.html"
        assert main(["report", "--html", str(page)]) == 0
        assert capsys.readouterr().out == f"wrote {page} (4 devices)\n"
        parser = _Text()
        parser.feed(page.read_text(encoding="utf-8"))
        assert {"cpu:0", "cpu:1", "cpu:2", "cpu:3"} <= set(parser.text)

    @pytest.mark.parametrize(
        ("where", "why"),
        [
            (".", "cannot write the report: it is a directory"),
            ("no/such/out.html", "cannot write the report: its folder 'no/such' does not exist"),
        ],
    )
    def test_a_path_that_cannot_be_written_is_one_line_naming_it(
        self, where: str, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Exit 2 and one line: the option, the path and why; nothing written."""
        assert main(["report", "--html", where]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == f"devpolicy report: --html {where}: {why}"
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize("width", ["7", "1001", "x", "٣٣", "12.5"])
    def test_a_bad_width_is_a_usage_error(
        self, width: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with pytest.raises(SystemExit) as caught:
            main(["report", "--width", width])
        assert caught.value.code == 2
        assert "argument --width: " in capsys.readouterr().err

    def test_a_missing_policy_is_a_usage_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["report", "--policy", str(tmp_path / "none.yaml")]) == 2
        assert "devpolicy report: " in capsys.readouterr().err

    @pytest.mark.slow
    def test_runs_as_a_command(self, tmp_path: Path) -> None:
        """`devpolicy report` in a process of its own: the bars, exit 0."""
        result = run_cli("report", "--ascii", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("devices (devpolicy.report, bars):\ncpu:0 (host RAM): ")
