"""`WindowStream` (`devpolicy._apply.stream.owner`), the one owner of a stream from open to
close: one decision, one `stream_ended` event with the counts, the ledger's tally, and
nothing printed for a stream left open at exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from tests.apply.streams import TOKEN_RULES
from tests.helpers import policy_of


class TestOneOwnerFromOpenToClose:
    """What is the same for every batch is done once per stream: one decision, one event
    at the end with the counts, the ledger's tally."""

    def test_one_placement_and_one_stream_event_however_many_batches(self) -> None:
        """200 batches at debug level: one `placement` event (the decision), no repeats,
        and one `stream_ended` event with the count, bytes, device and rule."""
        policy = policy_of(rules=TOKEN_RULES, logging={"level": "debug"})
        tokens = np.arange(10_000, dtype=np.uint16)
        with capture_logs() as logs:
            for _ in devpolicy.windows(
                tokens, 64, 4, order="random", seed=0, steps=200, policy=policy
            ):
                pass
        batch_events = [e for e in logs if e.get("name") == "batch"]
        assert [e["event"] for e in batch_events] == ["placement", "stream_ended"]
        (ended,) = [e for e in logs if e["event"] == "stream_ended"]
        assert (ended["how"], ended["batches"], ended["dropped"]) == ("ended", 200, 0)
        assert (ended["nbytes"], ended["device"]) == (200 * 4 * 64 * 2, "cpu:1")
        assert ended["origin"].endswith("rules[1]")

    def test_closing_says_how_many_batches_were_used_and_dropped(self) -> None:
        """A stream closed early ends with one event: batches handed out, and those in
        flight dropped."""
        policy = policy_of(rules=TOKEN_RULES)
        stream = devpolicy.windows(np.arange(1000), 10, 2, order="random", policy=policy)
        with capture_logs() as logs:
            next(stream)
            next(stream)
            stream.close()
            stream.close()
        (ended,) = [e for e in logs if e["event"] == "stream_ended"]
        assert (ended["how"], ended["batches"]) == ("closed", 2)
        assert ended["dropped"] >= 1

    def test_the_ledger_counts_a_stream_and_names_its_recent_batches(self) -> None:
        """`streams.streams()` counts the batches a stream placed; `report` finds the
        batches still held under the stream's name."""
        from devpolicy._machine import streams

        policy = policy_of(rules=[{"match": "counted_batch", "device": "cpu:2"}])
        stream = devpolicy.windows(
            np.arange(100, dtype=np.float32), 5, 3, name="counted_batch", policy=policy
        )
        held = list(stream)
        (tally,) = [s for s in streams.streams() if s.name == "counted_batch"]
        assert (tally.batches, tally.device, tally.open) == (7, "cpu:2", False)
        assert tally.nbytes == 6 * 3 * 5 * 4 + 2 * 5 * 4  # the last batch holds two windows
        entries = devpolicy.report().by_device["cpu:2"].entries
        named = [e for e in entries if "counted_batch" in e.names]
        assert sum(e.arrays for e in named) == len(held) == 7

    def test_every_stream_logs_its_end_at_info(self) -> None:
        """A warm-up stream and the real one under the same name: each logs its own
        `stream_ended` at info with its own counts (the second is not demoted to debug)."""
        policy = policy_of(rules=TOKEN_RULES)
        tokens = np.arange(10_000, dtype=np.uint16)
        with capture_logs() as logs:
            for steps in (3, 20):
                for _ in devpolicy.windows(
                    tokens, 8, 2, order="random", seed=0, steps=steps, policy=policy
                ):
                    pass
        ended = [e for e in logs if e["event"] == "stream_ended"]
        assert [(e["log_level"], e["batches"]) for e in ended] == [("info", 3), ("info", 20)]

    @pytest.mark.slow
    def test_a_stream_left_open_at_exit_prints_nothing(self, tmp_path: Path) -> None:
        """A stream read from and left open when the interpreter exits (a script that
        breaks out of its loop) ends without an "Exception ignored" line on stderr."""
        script = tmp_path / "left_open.py"
        tokens_path = tmp_path / "tokens.bin"
        script.write_text(
            "import numpy as np, devpolicy\n"
            "p = devpolicy.load_policy({'version': 1, 'logging': {'level': 'warning'}}, "
            "environ={})\n"
            "stream = devpolicy.windows(np.arange(10_000), 16, 4, order='random', seed=0, "
            "policy=p)\n"
            "next(stream)\n"
            f"path = {str(tokens_path)!r}\n"
            "np.arange(100_000, dtype=np.uint16).tofile(path)\n"
            "mapped = np.memmap(path, np.uint16, mode='r')\n"
            "from_file = devpolicy.windows(mapped, 16, 4, order='random', seed=0, policy=p)\n"
            "next(from_file)\n"
        )
        result = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
        )
        assert result.returncode == 0, result.stderr
        assert "Exception ignored" not in result.stderr, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
