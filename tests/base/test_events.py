"""Events: one `placement` event per decision, info the first time, debug after; formats."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

import devpolicy
from tests.helpers import policy_of


class TestPlacementEvents:
    def test_event_has_every_flat_field(self) -> None:
        """The placement event carries name, device, rule, origin, source, reason and size."""
        policy = policy_of(rules=[{"match": "dataset/*", "device": "cpu:2"}])
        with capture_logs() as logs:
            policy.resolve("dataset/train", nbytes=64)
        assert logs == [
            {
                "event": "placement",
                "log_level": "info",
                "name": "dataset/train",
                "device": "cpu:2",
                "device_id": 2,
                "requested": "cpu:2",
                "rule": 0,
                "origin": "<mapping>:rules[0]",
                "source": "policy",
                "fallback_reason": None,
                "nbytes": 64,
                "memory_kind": None,
                "process_index": 0,
            }
        ]

    def test_first_decision_is_info_and_repeats_are_debug(self) -> None:
        """A training loop logs each (name, device, rule) once at info, repeats at debug."""
        policy = policy_of(default="cpu:1", logging={"level": "debug"})
        with capture_logs() as logs:
            for _ in range(3):
                policy.resolve("batch")
            policy.resolve("other")
        assert [(e["name"], e["log_level"]) for e in logs] == [
            ("batch", "info"),
            ("batch", "debug"),
            ("batch", "debug"),
            ("other", "info"),
        ]

    def test_repeats_below_the_level_reach_no_renderer(self) -> None:
        """At devpolicy's default level (info) a repeat reaches nobody, even the app's structlog."""
        policy = policy_of(default="cpu:1")
        with capture_logs() as logs:
            for _ in range(3):
                policy.resolve("batch")
                policy.resolve("batch", nbytes=8)
        assert [(e["name"], e["nbytes"], e["log_level"]) for e in logs] == [("batch", None, "info")]

    def test_fallback_reason_is_logged(self) -> None:
        """The reason a target was passed over appears in the event."""
        policy = policy_of(fallback=["cpu:1"], rules=[{"match": "*", "device": "cpu:9"}])
        with capture_logs() as logs:
            policy.resolve("x")
        assert logs[0]["requested"] == "cpu:9"
        assert logs[0]["device"] == "cpu:1"
        assert logs[0]["fallback_reason"].startswith("cpu:9: index 9 out of range")

    def test_disabled_decisions_are_logged_with_source_disabled(self) -> None:
        """DEVPOLICY_DISABLE still leaves a record of what would have happened."""
        policy = devpolicy.load_policy(
            {"version": 1, "default": "cpu:3"}, environ={"DEVPOLICY_DISABLE": "1"}
        )
        with capture_logs() as logs, policy.scope("x"):
            pass
        assert (logs[0]["source"], logs[0]["requested"], logs[0]["device"]) == (
            "disabled",
            "cpu:3",
            "cpu:0",
        )


class TestOwnOutput:
    """When the application has not configured structlog, devpolicy renders by its settings."""

    def test_console_goes_to_stderr_and_hides_empty_fields(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The default with no logging set up anywhere: a readable line on stderr."""
        monkeypatch.setattr(logging.root, "handlers", [])  # pytest's own capture handlers
        assert not structlog.is_configured()
        policy_of(default="cpu:1").resolve("dataset/train")
        out, err = capsys.readouterr()
        assert out == ""
        assert "placement" in err
        assert "name=dataset/train" in err
        assert "device=cpu:1" in err
        assert "fallback_reason" not in err

    def test_json_lines_on_stderr(self, capsys: pytest.CaptureFixture[str]) -> None:
        """format json: one JSON object per event with every field."""
        policy = devpolicy.load_policy(
            {"version": 1, "default": "cpu:1", "logging": {"format": "json"}}, environ={}
        )
        policy.resolve("x")
        event = json.loads(capsys.readouterr().err)
        assert (event["event"], event["device"], event["level"], event["fallback_reason"]) == (
            "placement",
            "cpu:1",
            "info",
            None,
        )
        assert "timestamp" in event

    def test_stdlib_goes_to_the_devpolicy_logger(self, caplog: pytest.LogCaptureFixture) -> None:
        """format stdlib: records on logging.getLogger('devpolicy')."""
        policy = devpolicy.load_policy(
            {"version": 1, "default": "cpu:1"}, environ={"DEVPOLICY_LOG_FORMAT": "stdlib"}
        )
        with caplog.at_level(logging.INFO, logger="devpolicy"):
            policy.resolve("x")
        assert [r.name for r in caplog.records] == ["devpolicy"]
        assert caplog.records[0].getMessage().startswith("event=placement ")

    def test_level_filters_events(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """level warning hides placement events; debug shows repeats."""
        monkeypatch.setattr(logging.root, "handlers", [])
        quiet = devpolicy.load_policy({"version": 1}, environ={"DEVPOLICY_LOG_LEVEL": "warning"})
        quiet.resolve("x")
        assert capsys.readouterr().err == ""
        loud = devpolicy.load_policy({"version": 1}, environ={"DEVPOLICY_LOG_LEVEL": "debug"})
        loud.resolve("x")
        loud.resolve("x")
        assert capsys.readouterr().err.count("placement") == 2

    def test_devpolicy_does_not_configure_structlog(self) -> None:
        """Emitting events leaves structlog's global configuration untouched."""
        before = structlog.get_config()
        policy_of(default="cpu:1").resolve("x")
        assert not structlog.is_configured()
        assert structlog.get_config() == before


class TestAutoFormat:
    """`auto` (the default): the application's structlog, else its stdlib logging, else stderr."""

    def test_an_app_logging_to_a_file_gets_the_events_in_its_file(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`logging.basicConfig(filename="app.log", level=INFO)`: events in app.log, not stderr."""
        handler = logging.FileHandler(tmp_path / "app.log")
        monkeypatch.setattr(logging.root, "handlers", [handler])
        level = logging.root.level
        logging.root.setLevel(logging.INFO)  # as basicConfig(level=...) does
        try:
            policy_of(default="cpu:1").resolve("dataset/train")
        finally:
            handler.close()
            logging.root.setLevel(level)
        text = (tmp_path / "app.log").read_text()
        assert "event=placement" in text
        assert "name=dataset/train" in text
        assert "placement" not in capsys.readouterr().err

    def test_stdlib_with_no_handler_says_so_and_writes_to_stderr(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """format stdlib with no handler anywhere: not dropped silently."""
        monkeypatch.setattr(logging.root, "handlers", [])
        monkeypatch.setattr(devpolicy._base.events, "_noted", set())
        policy = devpolicy.load_policy(
            {"version": 1, "default": "cpu:1"}, environ={"DEVPOLICY_LOG_FORMAT": "stdlib"}
        )
        policy.resolve("x")
        policy.resolve("y")
        err = capsys.readouterr().err
        assert err.count("logging.format is 'stdlib' but stdlib logging has no handler") == 1
        assert err.count("placement") == 2

    def test_stdlib_renders_nothing_stdlib_would_drop(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The app sets devpolicy's logger to WARNING: its info events are not even rendered
        (a level only inherited from the root sends them to stderr instead: see
        test_no_silent_rules)."""
        rendered: list[object] = []
        original = structlog.processors.LogfmtRenderer.__call__

        def counting(self: object, *args: object) -> object:
            rendered.append(args)
            return original(self, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(structlog.processors.LogfmtRenderer, "__call__", counting)
        console = structlog.dev.ConsoleRenderer.__call__

        def counting_console(self: object, *args: object) -> object:
            rendered.append(args)
            return console(self, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(structlog.dev.ConsoleRenderer, "__call__", counting_console)
        monkeypatch.setattr(logging.getLogger("devpolicy"), "level", logging.WARNING)
        handler = logging.FileHandler(tmp_path / "app.log")
        monkeypatch.setattr(logging.root, "handlers", [handler])
        level = logging.root.level
        logging.root.setLevel(logging.WARNING)  # as basicConfig(level=...) does
        try:
            policy = policy_of(default="cpu:1", fallback=["cpu:2"])
            policy.resolve("x")
            assert rendered == []
            policy_of(default="cpu:9", fallback=["cpu:2"]).resolve("y")  # a fallback: warning
        finally:
            handler.close()
            logging.root.setLevel(level)
        assert len(rendered) == 1
        assert "fallback_reason" in (tmp_path / "app.log").read_text()


class TestEventsAreNeverDroppedSilently:
    def test_a_bare_basicconfig_sends_info_events_to_stderr_without_a_note(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """absl's `logging.basicConfig()`: a root handler, the root's WARNING inherited.
        Info events go to stderr, and nothing is lost, so no note is printed at info."""
        stream = io.StringIO()
        monkeypatch.setattr(logging.root, "handlers", [logging.StreamHandler(stream)])
        monkeypatch.setattr(logging.root, "level", logging.WARNING)
        monkeypatch.setattr(devpolicy._base.events, "_noted", set())
        policy = policy_of(default="cpu:1")
        policy.resolve("a")
        policy.resolve("b")
        err = capsys.readouterr().err
        assert err.count("placement") == 2
        assert "root logger" not in err
        assert "logging_rerouted" not in err
        assert stream.getvalue() == ""

    def test_at_debug_the_rerouting_is_told_once_as_an_event(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With devpolicy's level at debug, one `logging_rerouted` event says why its
        events are on stderr and how to route or drop them."""
        monkeypatch.setattr(logging.root, "handlers", [logging.StreamHandler(io.StringIO())])
        monkeypatch.setattr(logging.root, "level", logging.WARNING)
        monkeypatch.setattr(devpolicy._base.events, "_noted", set())
        policy = policy_of(default="cpu:1", logging={"level": "debug"})
        policy.resolve("a")
        policy.resolve("b")
        err = capsys.readouterr().err
        assert err.count("logging_rerouted") == 1
        assert "the root logger's level (WARNING) would drop devpolicy's" in err
        assert "logging.getLogger('devpolicy').setLevel(logging.INFO)" in err

    def test_stdlib_format_whose_root_level_drops_events_says_so_once(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`logging.format: stdlib` and only the root's inherited WARNING: info events are
        really dropped, so one note on stderr says so (at any devpolicy level)."""
        stream = io.StringIO()
        monkeypatch.setattr(logging.root, "handlers", [logging.StreamHandler(stream)])
        monkeypatch.setattr(logging.root, "level", logging.WARNING)
        monkeypatch.setattr(devpolicy._base.events, "_noted", set())
        policy = policy_of(default="cpu:1", logging={"format": "stdlib"})
        policy.resolve("a")
        policy.resolve("b")
        err = capsys.readouterr().err
        assert err.count("the root logger's level (WARNING) drops devpolicy's info events") == 1
        assert "placement" not in err
        assert stream.getvalue() == ""

    def test_a_level_the_application_set_for_devpolicy_is_obeyed(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The application set WARNING on the `devpolicy` logger: info events are dropped,
        without a note (its choice)."""
        stream = io.StringIO()
        monkeypatch.setattr(logging.root, "handlers", [logging.StreamHandler(stream)])
        monkeypatch.setattr(logging.getLogger("devpolicy"), "level", logging.WARNING)
        monkeypatch.setattr(devpolicy._base.events, "_noted", set())
        for fmt in ("auto", "stdlib"):
            policy_of(default="cpu:1", logging={"format": fmt}).resolve("a")
        assert capsys.readouterr().err == ""
        assert stream.getvalue() == ""


class TestApplicationConfiguration:
    def test_events_go_through_the_applications_structlog(self) -> None:
        """If the application configured structlog, its processors receive devpolicy's events."""
        seen: list[dict[str, object]] = []

        def grab(_: object, __: str, event: dict[str, object]) -> dict[str, object]:
            seen.append(dict(event))
            raise structlog.DropEvent

        structlog.configure(processors=[grab])
        policy_of(default="cpu:1").resolve("x")
        assert [(e["event"], e["device"]) for e in seen] == [("placement", "cpu:1")]

    def test_reconfiguration_is_picked_up(self) -> None:
        """A logger cached by devpolicy follows a later structlog.configure."""
        first: list[object] = []
        second: list[object] = []
        policy = policy_of(default="cpu:1")
        structlog.configure(
            processors=[
                lambda _l, _m, e: first.append(e) or (_ for _ in ()).throw(structlog.DropEvent())
            ]
        )
        policy.resolve("a")
        structlog.configure(
            processors=[
                lambda _l, _m, e: second.append(e) or (_ for _ in ()).throw(structlog.DropEvent())
            ]
        )
        policy.resolve("b")
        assert (len(first), len(second)) == (1, 1)


class TestRobustness:
    def test_a_logging_setup_that_rejects_events_does_not_break_placement(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """stdlib's `extra` refuses a field called `name`; placement goes on and says so once."""
        structlog.configure(
            processors=[structlog.stdlib.render_to_log_kwargs],
            logger_factory=structlog.stdlib.LoggerFactory(),
            wrapper_class=structlog.stdlib.BoundLogger,
        )
        logging.getLogger("devpolicy").setLevel(logging.INFO)
        try:
            policy = policy_of(default="cpu:1")
            assert policy.resolve("x").device_text == "cpu:1"
            assert policy.resolve("y").device_text == "cpu:1"
        finally:
            logging.getLogger("devpolicy").setLevel(logging.NOTSET)
        err = capsys.readouterr().err
        assert (
            err.count(
                "devpolicy: the logging configuration could not take a 'placement' event (KeyError"
            )
            == 1
        )


HOSTILE = "w\x1b[2J\x1b[31mred\rforged\nnext=line\u202etxt"
# Nothing a renderer would quote for its own reasons (space, =, quotes, \r, \n).
BARE = "w\x1b[2J\x1b[31mred\u202etxt"


class TestEveryEventCarriesProcessIndex:
    def test_load_file_and_narrowing_events_carry_process_index(self, tmp_path: Path) -> None:
        """Not only `placement`: every event says which process of a job emitted it."""
        import numpy as np

        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"w": np.zeros(4, np.float32)}, path)
        policy = policy_of(default="cpu:1", logging={"level": "debug"})
        with capture_logs() as logs:
            policy.load_file(path)
        events = {e["event"] for e in logs}
        assert "load_file" in events
        assert all(e["process_index"] == 0 for e in logs), logs

    def test_an_event_without_the_field_gets_it(self) -> None:
        """EventLog adds it; fields that carry their own (a device's) keep theirs."""
        from devpolicy._base.events import EventLog

        with capture_logs() as logs:
            EventLog("info", "console").emit("info", "anything", {"a": 1})
            EventLog("info", "console").emit("info", "placed", {"process_index": 3})
        assert [e["process_index"] for e in logs] == [0, 3]

    def test_the_index_is_asked_of_jax_once(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Once a backend runs the index cannot change: it is read once, not per event."""
        import jax

        from devpolicy._base import events as _logging
        from devpolicy._base.events import EventLog

        jax.devices()  # a backend runs
        calls: list[int] = []

        def counted() -> int:
            calls.append(1)
            return 0

        monkeypatch.setattr(_logging, "_started_index", None)
        monkeypatch.setattr(jax, "process_index", counted)
        events = EventLog("info", "console")
        with capture_logs() as logs:
            for i in range(5):
                events.emit("info", "anything", {"i": i})
        assert [e["process_index"] for e in logs] == [0] * 5
        assert len(calls) == 1


class TestOwnOutputIsVisibleSafe:
    """A name from a file someone else wrote cannot rewrite the terminal or forge a line."""

    @pytest.mark.parametrize("name", [HOSTILE, BARE], ids=["with-newline", "bare"])
    @pytest.mark.parametrize("fmt", ["console", "stdlib"])
    def test_control_characters_in_fields_are_escaped(
        self,
        fmt: str,
        name: str,
        capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """ESC, `\\r`, newline and bidi overrides in a name reach the log as escapes."""
        if fmt == "console":
            monkeypatch.setattr(logging.root, "handlers", [])
        policy = devpolicy.load_policy(
            {"version": 1, "default": "cpu:1", "logging": {"format": fmt}}, environ={}
        )
        with caplog.at_level(logging.INFO, logger="devpolicy"):
            policy.resolve(name)
        out = capsys.readouterr().err if fmt == "console" else caplog.records[0].getMessage()
        for raw in ("\x1b", "\r", "\u202e"):
            assert raw not in out
        assert out.count("\n") <= 1
        # Escaped once by devpolicy; a renderer that quotes the value escapes the backslashes.
        shown = name.encode("unicode_escape").decode("ascii")
        assert shown in out or shown.replace("\\", "\\\\") in out

    def test_json_stays_exact_and_carries_no_raw_control_characters(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """json: one line, its encoder's own escapes (\\u001b), the name intact when parsed."""
        policy = devpolicy.load_policy(
            {"version": 1, "default": "cpu:1", "logging": {"format": "json"}}, environ={}
        )
        policy.resolve(HOSTILE)
        err = capsys.readouterr().err
        for raw in ("\x1b", "\r", "\u202e"):
            assert raw not in err
        assert err.count("\n") == 1
        assert json.loads(err)["name"] == HOSTILE
