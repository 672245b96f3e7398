"""Options: defaults, then DEVPOLICY_REMOTE_* (strictly read), then keywords."""

from __future__ import annotations

from pathlib import Path

import pytest

from devpolicy import DevicePolicyError
from devpolicy._base.errors import EnvOverrideError
from devpolicy._io.remote import RemoteOptionError, RemoteOptions, resolve_options


class TestResolve:
    def test_defaults_fit_the_in_flight_budget(self) -> None:
        """The defaults keep concurrency x chunk within the in-flight budget, at most 256 MiB."""
        options = resolve_options({})
        assert options == RemoteOptions()
        assert options.inflight_bytes <= 256 * 2**20
        assert options.concurrency * options.chunk_bytes <= options.inflight_bytes
        assert options.streams == options.concurrency

    def test_environment_then_keywords(self) -> None:
        """The environment overrides the defaults and keywords override the environment."""
        environ = {
            "DEVPOLICY_REMOTE_CONCURRENCY": "4",
            "DEVPOLICY_REMOTE_CHUNK": "16MiB",
            "DEVPOLICY_REMOTE_INFLIGHT": "64MiB",
            "DEVPOLICY_REMOTE_ATTEMPTS": "3",
            "DEVPOLICY_REMOTE_BACKOFF": "0.5",
            "DEVPOLICY_REMOTE_BACKOFF_CAP": "2",
            "DEVPOLICY_REMOTE_TOTAL_TIME": "30",
            "DEVPOLICY_REMOTE_TIMEOUT": "5",
            "DEVPOLICY_REMOTE_CACHE": "/var/cache/models",
        }
        options = resolve_options(environ, concurrency=2)
        assert options == RemoteOptions(
            concurrency=2, chunk_bytes=16 * 2**20, inflight_bytes=64 * 2**20, attempts=3,
            backoff_seconds=0.5, backoff_cap_seconds=2.0, total_seconds=30.0,
            timeout_seconds=5.0, cache_dir=Path("/var/cache/models"),
        )  # fmt: skip

    def test_the_budget_lowers_concurrency(self) -> None:
        """Concurrency used is lowered so that chunks in flight fit the budget."""
        options = resolve_options({}, chunk_bytes="64MiB", inflight_bytes="128MiB", concurrency=8)
        assert options.streams == 2

    def test_backoff_doubles_up_to_its_cap(self) -> None:
        """Each retry's backoff doubles from the first, up to the cap."""
        options = RemoteOptions(backoff_seconds=0.1, backoff_cap_seconds=0.5)
        assert [options.backoff(n) for n in range(1, 6)] == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])

    @pytest.mark.parametrize(
        ("variable", "value", "message"),
        [
            (
                "DEVPOLICY_REMOTE_CONCURRENCY",
                "eight",
                r"^DEVPOLICY_REMOTE_CONCURRENCY='eight': not a whole number; accepted: a whole number from 1 to 256$",
            ),
            (
                "DEVPOLICY_REMOTE_CONCURRENCY",
                "0",
                r"^DEVPOLICY_REMOTE_CONCURRENCY='0': out of range; accepted: a whole number from 1 to 256$",
            ),
            ("DEVPOLICY_REMOTE_CONCURRENCY", "4.0", r"not a whole number"),
            (
                "DEVPOLICY_REMOTE_CHUNK",
                "8 MeB",
                r"^DEVPOLICY_REMOTE_CHUNK='8 MeB': unknown size unit 'MeB'.*; accepted: a non-negative integer of bytes",
            ),
            (
                "DEVPOLICY_REMOTE_CHUNK",
                "1KiB",
                r"^DEVPOLICY_REMOTE_CHUNK='1KiB': out of range; accepted: .* from 65536 to 1073741824 bytes$",
            ),
            (
                "DEVPOLICY_REMOTE_BACKOFF",
                "1s",
                r"^DEVPOLICY_REMOTE_BACKOFF='1s': not a plain number of seconds; accepted: a number of seconds from 0 to 60$",
            ),
            ("DEVPOLICY_REMOTE_TIMEOUT", "-1", r"not a plain number of seconds"),
        ],
    )
    def test_bad_variable_is_named_with_valid_forms(
        self, variable: str, value: str, message: str
    ) -> None:
        """A variable that cannot be read is an error naming it, its value and the forms accepted."""
        with pytest.raises(EnvOverrideError, match=message):
            resolve_options({variable: value})

    @pytest.mark.parametrize(
        ("keywords", "message"),
        [
            (
                {"concurency": 4},
                r"^concurency=4: unknown option; accepted: attempts, backoff_cap_seconds, backoff_seconds, cache_dir, chunk_bytes, concurrency, inflight_bytes, timeout_seconds, total_seconds$",
            ),
            ({"concurrency": True}, r"^concurrency=True: expected a number, got bool"),
            ({"concurrency": 2.5}, r"^concurrency=2\.5: not a whole number"),
            (
                {"attempts": 0},
                r"^attempts=0: out of range; accepted: a whole number from 1 to 100$",
            ),
            ({"total_seconds": float("nan")}, r"^total_seconds=nan: out of range"),
            (
                {"chunk_bytes": "256MiB"},
                r"^inflight_bytes=134217728: smaller than chunk_bytes \(268435456\)",
            ),
        ],
    )
    def test_bad_keyword_is_named(self, keywords: dict[str, object], message: str) -> None:
        """A bad keyword is an error naming it and the forms accepted, and a DevicePolicyError."""
        with pytest.raises(RemoteOptionError, match=message) as caught:
            resolve_options({}, **keywords)
        assert isinstance(caught.value, DevicePolicyError)


class TestWithoutAPolicy:
    @pytest.mark.parametrize(
        ("variable", "value"),
        [
            ("DEVPOLICY_REMOTE_ATTEMPTS", "-3"),
            ("DEVPOLICY_REMOTE_TIMEOUT", "nan"),
            ("DEVPOLICY_REMOTE_CHUNK", "1e400"),
            ("DEVPOLICY_REMOTE_OFFLINE", "sometimes"),
        ],
    )
    def test_bad_values_are_refused_with_no_policy_given(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variable: str, value: str
    ) -> None:
        """With no policy (none given, none found), a bad DEVPOLICY_REMOTE_* is an error
        naming the variable and the accepted values, as with a policy file."""
        import numpy as np

        import devpolicy

        (tmp_path / ".git").mkdir()  # a project root of its own: no policy found above it
        monkeypatch.chdir(tmp_path)
        devpolicy.save_file({"w": np.zeros(2)}, tmp_path / "m.safetensors")
        monkeypatch.setenv(variable, value)
        with pytest.raises(EnvOverrideError, match=rf"^{variable}=.*accepted: "):
            devpolicy.load_file(tmp_path / "m.safetensors")
        with pytest.raises(EnvOverrideError, match=rf"^{variable}="):
            devpolicy.load_policy({"version": 1})
