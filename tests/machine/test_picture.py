"""The ledger's picture: bars in a terminal, one self-contained HTML page, written whole."""

from __future__ import annotations

import html.parser
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import devpolicy
from devpolicy._machine import picture
from devpolicy._machine.capacity import FROM_PHYS, FROM_STATS_TOTAL, host_total_bytes
from devpolicy._machine.fallbacks import FallbackCount
from devpolicy._machine.streams import LedgerStream
from devpolicy.types import Ledger, LedgerDevice, LedgerEntry

#: A name with markup in it: it must show as text on the page, never as markup.
MARKUP = "data/<script>alert('x')</script>&\"<b>"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class _Page(html.parser.HTMLParser):
    """Every tag with its attributes, and the text, of a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.style: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        (self.style if self._in_style else self.text).append(data)


def parsed(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    parser.close()
    return parser


@pytest.fixture
def placed() -> Any:
    """Arrays placed by three rules on three devices (one with markup in its name), one a
    fallback, and a stream run to its end; kept alive while the test reads the ledger."""
    policy = devpolicy.load_policy(
        {
            "version": 1,
            "fallback": ["cpu:0"],
            "logging": {"level": "error"},
            "rules": [
                {"match": "picture/model/*", "device": "cpu:1"},
                {"match": "data/*", "device": "cpu:2"},
                {"match": "picture/gpu", "device": "gpu:0"},
            ],
        }
    )
    held = [
        policy.put("picture/model/w", np.zeros((64, 64), np.float32)),
        policy.put(MARKUP, np.zeros(4096, np.uint8)),
        policy.put("picture/gpu", np.zeros(16, np.float32)),
    ]
    held += list(devpolicy.windows(np.arange(64), 4, 2, name="picture<s>", policy=policy))
    return held


def hand_made(**fields: Any) -> Ledger:
    """A ledger of one device with two rules, built by hand (figures known exactly)."""
    entries = (
        LedgerEntry("p.yaml:3", 0, ("model/w",), 2, 3000, 0),
        LedgerEntry("unplaced", None, (), 1, 1000, 0),
    )
    device = LedgerDevice(
        "gpu:0",
        3,
        4000,
        0,
        fields.pop("free", 6000),
        "gpu:0",
        entries,
        total=fields.pop("total", 10_000),
        free_from="jax memory_stats: bytes_limit - bytes_in_use",
        total_from=FROM_STATS_TOTAL,
    )
    return Ledger((device,), 3, **fields)


class TestPage:
    def test_every_device_and_every_rule_origin_is_on_the_page(self, placed: Any) -> None:
        """Each device of the ledger has a heading and each rule origin a row."""
        ledger = devpolicy.report()
        page = parsed(ledger.to_html())
        headings = [t.strip() for t in page.text if t.strip()]
        for device in ledger.devices:
            assert device.device in headings
        text = "\n".join(page.text)
        for origin in {e.origin for d in ledger.devices for e in d.entries}:
            assert origin in text
        assert "<mapping>:rules[0]" in text
        assert "<mapping>:rules[1]" in text

    def test_the_page_fetches_nothing(self, placed: Any) -> None:
        """No script, no link, no @import, no src or href to anywhere: one file that opens
        offline."""
        source = devpolicy.report().to_html()
        page = parsed(source)
        assert not [t for t, _ in page.tags if t in ("script", "link", "img", "iframe", "object")]
        for _, attrs in page.tags:
            for key in ("src", "href", "srcset", "action", "data"):
                value = attrs.get(key) or ""
                assert not value.lower().startswith(("http:", "https:", "//")), (key, value)
                assert key not in attrs, (key, value)
        assert "@import" not in source
        assert "url(" not in "".join(page.style)
        assert "http://" not in source
        assert "https://" not in source

    def test_a_name_with_markup_shows_as_text(self, placed: Any) -> None:
        """A name holding `<script>`, `&` and quotes is text on the page, never a tag."""
        source = devpolicy.report().to_html()
        page = parsed(source)
        assert "script" not in [t for t, _ in page.tags]
        assert "b" not in [t for t, _ in page.tags]
        assert any(MARKUP in t for t in page.text)
        assert "picture<s>" in "".join(page.text)

    def test_a_title_with_markup_is_escaped(self) -> None:
        """The page's title is a caller's text too."""
        page = parsed(hand_made().to_html(title="<i>run & 'x'</i>"))
        assert "i" not in [t for t, _ in page.tags]
        assert "<i>run & 'x'</i>" in page.text

    def test_each_bar_is_its_devices_memory_split_by_rule_other_use_and_free(self) -> None:
        """A device of 10,000 bytes, 6,000 free, 3,000 by a rule and 1,000 unplaced: the
        segments are 30%, 10% and 60% free (none in use otherwise), with where each was
        read."""
        source = hand_made().to_html()
        page = parsed(source)
        widths = [
            (attrs.get("class"), attrs.get("style", "") or "")
            for t, attrs in page.tags
            if t == "div" and (attrs.get("class") or "").startswith("seg")
        ]
        assert [w.split(";")[0] for _, w in widths] == [
            "width:30.0000%",
            "width:10.0000%",
            "width:60.0000%",
        ]
        assert [c for c, _ in widths] == ["seg", "seg", "seg free"]
        text = " ".join(page.text)
        assert "capacity 9.8 KiB (jax memory_stats: bytes_limit)" in text
        assert "free from jax memory_stats: bytes_limit - bytes_in_use" in text

    def test_unknown_capacity_is_said_and_the_bar_is_the_bytes_alone(self) -> None:
        """Without a measured total the page says `capacity unknown` and the bar splits
        the device's arrays only."""
        page = parsed(hand_made(total=None, free=None).to_html())
        styles = [
            (a.get("style") or "").split(";")[0]
            for t, a in page.tags
            if t == "div" and (a.get("class") or "").startswith("seg")
        ]
        assert styles == ["width:75.0000%", "width:25.0000%"]
        assert "capacity unknown" in " ".join(page.text)

    def test_the_figures_say_where_they_come_from(self, placed: Any) -> None:
        """Host devices: free from /proc/meminfo's MemAvailable, capacity from sysconf; the
        ledger holds the same."""
        ledger = devpolicy.report()
        cpu1 = ledger.by_device["cpu:1"]
        assert cpu1.total == host_total_bytes()
        assert cpu1.total_from == FROM_PHYS
        assert cpu1.free_from is not None
        assert cpu1.free_from.startswith("host RAM: ")
        text = " ".join(parsed(ledger.to_html()).text)
        assert f"({FROM_PHYS})" in text
        assert f"free from {cpu1.free_from}" in text
        assert "jax.live_arrays()" in text

    def test_a_stated_capacity_is_named_and_its_total_unknown(self, placed: Any) -> None:
        """With `report(capacity=StaticCapacity(...))` the free figure is the stated one
        and no total is invented."""
        ledger = devpolicy.report(capacity=devpolicy.StaticCapacity({"cpu:1": "1GiB"}))
        cpu1 = ledger.by_device["cpu:1"]
        assert (cpu1.free, cpu1.total, cpu1.total_from) == (2**30, None, None)
        assert cpu1.free_from == "StaticCapacity.free_bytes (the capacity given to report)"
        assert ledger.by_device["cpu:2"].free_from is None
        assert "capacity unknown" in ledger.to_html()

    def test_streams_show_their_counts_and_unmeasured_fields_say_so(self) -> None:
        """A stream's name, batches, bytes and state, and `not measured yet` for a reading,
        rate and share that are None."""
        stream = LedgerStream("tok<x>", "default", "cpu:0", 3, 96, True)
        text = " ".join(parsed(hand_made(streams=(stream,)).to_html()).text)
        assert "tok<x>" in text
        assert text.count("not measured yet") == 4  # reads, why, rate, waited
        timed = LedgerStream(
            "t", "default", "cpu:0", 4, 64, False, None, "memory", "why<>", 4, 1.0, 3.0, 2.0
        )
        text = " ".join(parsed(hand_made(streams=(timed,)).to_html()).text)
        assert "2.0 batches/s" in text
        assert "25.0%" in text
        assert "why<>" in text

    def test_a_real_stream_is_on_the_page(self, placed: Any) -> None:
        """`windows` run to its end shows as ended, with its batches."""
        ledger = devpolicy.report()
        stream = [s for s in ledger.streams if s.name == "picture<s>"][-1]
        text = " ".join(parsed(ledger.to_html()).text)
        assert "picture<s>" in text
        assert "ended" in text
        assert stream.batches == 8

    def test_fallbacks_are_listed(self, placed: Any) -> None:
        """The rule asked for gpu:0 that this machine lacks: a row saying what was used."""
        ledger = devpolicy.report()
        rows = [f for f in ledger.fallbacks if f.requested == "gpu:0" and f.used == "cpu:0"]
        assert rows
        assert rows[0].decisions >= 1
        assert not rows[0].short
        text = " ".join(parsed(ledger.to_html()).text)
        assert "Fallbacks taken" in text
        assert "gpu:0" in text

    def test_a_ledger_of_no_devices_is_a_page_saying_so(self) -> None:
        """`Ledger(())` is no error: the page says there are no devices."""
        text = " ".join(parsed(Ledger(()).to_html()).text)
        assert "No devices in this ledger." in text
        assert "None counted in this process." in text
        assert Ledger(()).bars().splitlines()[1] == "  no devices in this ledger"


class TestBars:
    def test_one_bar_per_device_of_the_width_asked(self, placed: Any) -> None:
        """Each device has one bar line, `width` cells between its edges."""
        ledger = devpolicy.report()
        lines = ledger.bars(width=30, ascii_only=False).splitlines()
        drawn = [line for line in lines if line.startswith("  │")]
        assert len(drawn) == len(ledger.devices)
        assert all(len(line) == 2 + 30 + 2 for line in drawn)

    def test_bytes_by_rule_and_capacity(self) -> None:
        """The hand-made device: 12 of 40 cells its rule's, 4 unplaced, 24 free."""
        text = hand_made().bars(width=40, ascii_only=True)
        lines = text.splitlines()
        assert lines[1] == "gpu:0 (gpu:0): 3 arrays, 3.9 KiB; 5.9 KiB free"
        assert lines[2] == "  |" + "#" * 12 + "." * 4 + " " * 24 + "|"
        assert "  # 2.9 KiB  p.yaml:3 (2 arrays): model/w" in lines
        assert "  .  1000 B  unplaced (1 array)" in lines
        assert not [line for line in lines if "in use, not by" in line]  # none: 0 B
        assert lines[-1] == "fallbacks taken: none counted in this process"

    def test_a_tiny_rule_still_takes_one_cell(self) -> None:
        """1 byte of a rule on a device of a gigabyte shows as one cell, not none."""
        device = LedgerDevice(
            "gpu:0",
            1,
            1,
            0,
            2**30,
            "gpu:0",
            (LedgerEntry("r", 0, ("x",), 1, 1, 0),),
            total=2**30 + 1,
        )
        bar = Ledger((device,)).bars(width=10, ascii_only=True).splitlines()[2]
        assert bar == "  |#         |"

    def test_ascii_when_stdout_cannot_encode_the_blocks(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With an ASCII stdout the default draws in ASCII; with UTF-8 in blocks."""
        monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="ascii"))
        text = hand_made().bars()
        text.encode("ascii")
        assert "|####" in text
        monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="utf-8"))
        assert "│████" in hand_made().bars()

    def test_streams_with_their_waited_share(self) -> None:
        """A stream's line says its rate and waited share, with a bar of 20 cells."""
        timed = LedgerStream(
            "t", "default", "cpu:0", 4, 64, False, None, "memory", None, 4, 1.0, 3.0, 2.0
        )
        lines = hand_made(streams=(timed,)).bars(ascii_only=True).splitlines()
        (line,) = [line for line in lines if line.startswith("  t (")]
        assert line == (
            "  t (ended, on cpu:0): 4 batches, 64 B; reads memory; 2.0 batches/s; "
            "waited 25.0%  |" + "#" * 5 + "." * 15 + "|"
        )
        fresh = LedgerStream("u", "default", "cpu:0", 0, 0, True)
        lines = hand_made(streams=(fresh,)).bars(ascii_only=True).splitlines()
        assert (
            "  u (open, on cpu:0): 0 batches, 0 B; reads not measured yet; not measured yet; "
            "waited not measured yet"
        ) in lines

    def test_fallbacks_are_listed(self) -> None:
        """A fallback counted: its rule, what it asked, what it used and how many."""
        counted = FallbackCount("p.yaml:3", 0, "gpu:0", "cpu:0", False, True, 2, 2048, "why")
        lines = hand_made(fallbacks=(counted,)).bars(ascii_only=True).splitlines()
        assert lines[-1] == (
            "  p.yaml:3: asked gpu:0 (too small), used cpu:0 by the policy's chain: "
            "2 decisions, 2.0 KiB"
        )

    def test_str_is_unchanged(self, placed: Any) -> None:
        """`str(ledger)` keeps its table; the bars are a format of their own."""
        text = str(devpolicy.report())
        assert text.splitlines()[0] == "live arrays by device (devpolicy.report):"
        assert "│" not in text
        assert "bars" not in text

    @pytest.mark.parametrize("width", [7, 1001, 0, -1, 12.5, True, "40"])
    def test_a_bad_width_is_refused(self, width: Any) -> None:
        """The width is a whole number 8..1000; the message says so and shows the value."""
        with pytest.raises(
            ValueError, match=r"^width is the bar's cells, a whole number 8\.\.1000"
        ):
            hand_made().bars(width=width)


class TestCells:
    @pytest.mark.parametrize(
        ("amounts", "whole", "width", "expected"),
        [
            ([3000, 1000, 0, 6000], 10_000, 40, [12, 4, 0, 24]),
            ([1, 0, 999], 1000, 10, [1, 0, 9]),
            ([1, 1, 1], 3, 10, [4, 3, 3]),
            ([5], 0, 10, [0]),
        ],
    )
    def test_cells_share_the_width_by_largest_remainder(
        self, amounts: list[int], whole: int, width: int, expected: list[int]
    ) -> None:
        """The cells add up to the width; a rule's non-zero share keeps one cell."""
        least = [True] * (len(amounts) - 1) + [False]
        assert picture._cells(amounts, whole, width, least) == expected


class TestWrite:
    def test_writes_the_page_and_returns_its_path(self, tmp_path: Path) -> None:
        """The file holds exactly `to_html()`, readable by others, no temporary left."""
        ledger = hand_made()
        path = ledger.write_html(tmp_path / "r.html")
        assert path == tmp_path / "r.html"
        assert path.read_text(encoding="utf-8") == ledger.to_html()
        assert os.stat(path).st_mode & 0o777 == 0o644
        assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]

    def test_a_directory_is_refused_naming_it(self, tmp_path: Path) -> None:
        with pytest.raises(IsADirectoryError, match="it is a directory") as caught:
            hand_made().write_html(tmp_path)
        assert caught.value.filename == str(tmp_path)

    def test_a_missing_folder_is_refused_naming_it(self, tmp_path: Path) -> None:
        target = tmp_path / "no" / "r.html"
        with pytest.raises(FileNotFoundError, match=r"its folder '.*/no' does not exist") as caught:
            hand_made().write_html(target)
        assert caught.value.filename == str(target)

    def test_a_file_as_folder_is_refused(self, tmp_path: Path) -> None:
        (tmp_path / "f").write_text("x", encoding="utf-8")
        with pytest.raises(NotADirectoryError, match="is not a folder"):
            hand_made().write_html(tmp_path / "f" / "r.html")

    @pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
    def test_a_folder_without_permission_is_refused(self, tmp_path: Path) -> None:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o500)
        try:
            with pytest.raises(PermissionError, match="cannot write the report in") as caught:
                hand_made().write_html(folder / "r.html")
            assert caught.value.filename == str(folder / "r.html")
        finally:
            folder.chmod(0o700)

    def test_a_refused_temporary_file_names_the_folder_and_the_path(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Where the folder refuses a new file (as for a user without write permission;
        root is never refused), the error says so, naming both."""

        def refused(**kwargs: Any) -> None:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(picture.tempfile, "mkstemp", refused)
        with pytest.raises(
            PermissionError,
            match=r"^\[Errno 13\] cannot write the report in '.*': Permission denied",
        ) as caught:
            hand_made().write_html(tmp_path / "r.html")
        assert caught.value.filename == str(tmp_path / "r.html")

    def test_nothing_is_written_partly(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A write that fails half-way leaves the old page as it was and no temporary."""
        target = tmp_path / "r.html"
        target.write_text("old page", encoding="utf-8")

        def broken(*args: Any) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(picture.os, "replace", broken)
        with pytest.raises(OSError, match="No space left"):
            hand_made().write_html(target)
        assert target.read_text(encoding="utf-8") == "old page"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


@pytest.mark.slow
def test_a_headless_browser_draws_the_page(tmp_path: Path, placed: Any) -> None:
    """Chromium opens the page from a file and draws it (a PNG of some size comes out)."""
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        pytest.skip(f"no headless browser on PATH (looked for {', '.join(BROWSERS)})")
    page = devpolicy.report().write_html(tmp_path / "report.html")
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--screenshot={shot}",
            "--window-size=1200,900",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert shot.exists(), "the browser wrote no screenshot"
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000
