"""`transfers:` and DEVPOLICY_TRANSFERS: read, layered, and every bad value named."""

from __future__ import annotations

from pathlib import Path

import pytest

import devpolicy
from devpolicy._document.schema import policy_schema


def written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


class TestPolicyField:
    def test_a_bare_mode_sets_every_direction_but_host_local(self, tmp_path: Path) -> None:
        """`transfers: log` is the three directions at log, each from the section's line."""
        p = devpolicy.load_policy(written(tmp_path, "version: 1\ntransfers: log\n"), environ={})
        directions = ("host_to_device", "device_to_device", "device_to_host")
        got = {k: (s.value, s.origin) for k, s in p.settings.transfers.items()}
        assert got == dict.fromkeys(directions, ("log", "p.yaml:2"))
        assert p.watch is not None
        assert p.watch.modes["host_local"] == "allow"

    def test_each_field_has_its_own_line(self, tmp_path: Path) -> None:
        text = "version: 1\ntransfers:\n  host_local: log\n  device_to_device: disallow\n"
        p = devpolicy.load_policy(written(tmp_path, text), environ={})
        assert p.settings.transfers["device_to_device"].origin == "p.yaml:4"
        assert p.settings.transfers["host_local"].value == "log"

    def test_no_section_sets_nothing(self) -> None:
        """Without `transfers:` no layer sets any field and nothing is watched."""
        p = devpolicy.load_policy({"version": 1}, environ={})
        assert p.settings.transfers == {}
        assert p.watch is None

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            (
                "transfers: lg\n",
                r"p\.yaml:2: transfers: unknown transfer mode 'lg' \(did you mean 'log'\?\); "
                r"accepted: allow, log, disallow",
            ),
            (
                "transfers:\n  host_to_device: nope\n",
                r"p\.yaml:3: transfers\.host_to_device: unknown transfer mode 'nope'; "
                r"accepted: allow, log, disallow",
            ),
            ("transfers:\n  host_to_dev: log\n", r"p\.yaml:3: transfers\.host_to_dev"),
        ],
    )
    def test_a_bad_value_is_named_by_file_line_and_field(
        self, tmp_path: Path, text: str, message: str
    ) -> None:
        with pytest.raises(devpolicy.PolicyError, match=message):
            devpolicy.load_policy(written(tmp_path, "version: 1\n" + text), environ={})

    def test_the_schema_offers_the_modes_and_fields(self) -> None:
        schema = policy_schema()["properties"]["transfers"]
        bare, fields = schema["anyOf"]
        assert bare["enum"] == ["allow", "log", "disallow"]
        assert sorted(fields["properties"]) == [
            "device_to_device", "device_to_host", "host_local", "host_to_device"
        ]  # fmt: skip


class TestEnvironment:
    def test_the_variable_overrides_the_file_field_by_field(self, tmp_path: Path) -> None:
        path = written(tmp_path, "version: 1\ntransfers: log\n")
        env = {"DEVPOLICY_TRANSFERS": "device_to_device=disallow, host_local=log"}
        p = devpolicy.load_policy(path, environ=env)
        got = {k: (s.value, s.origin) for k, s in p.settings.transfers.items()}
        assert got["device_to_device"] == ("disallow", "env:DEVPOLICY_TRANSFERS")
        assert got["host_local"] == ("log", "env:DEVPOLICY_TRANSFERS")
        assert got["host_to_device"] == ("log", "p.yaml:2")

    def test_a_bare_mode_sets_the_three_directions(self) -> None:
        p = devpolicy.load_policy({"version": 1}, environ={"DEVPOLICY_TRANSFERS": "log"})
        assert sorted(p.settings.transfers) == [
            "device_to_device", "device_to_host", "host_to_device"
        ]  # fmt: skip

    @pytest.mark.parametrize(
        ("value", "message"),
        [
            (
                "lg",
                r"DEVPOLICY_TRANSFERS='lg': unknown transfer mode 'lg' \(did you mean 'log'\?\)",
            ),
            ("host_to_devce=log", r"unknown field \(did you mean 'host_to_device'\?\)"),
            ("host_to_device=lots", r"unknown mode 'lots'"),
            ("host_local=log,host_local=allow", r"host_local is given twice"),
        ],
    )
    def test_a_malformed_value_names_the_variable(self, value: str, message: str) -> None:
        with pytest.raises(devpolicy.errors.EnvOverrideError, match=message) as caught:
            devpolicy.load_policy({"version": 1}, environ={"DEVPOLICY_TRANSFERS": value})
        assert caught.value.variable == "DEVPOLICY_TRANSFERS"
        assert "field=mode" in caught.value.accepted


class TestLint:
    def test_device_to_host_is_said_to_be_jaxs_own_guard(self) -> None:
        p = devpolicy.load_policy(
            {"version": 1, "transfers": {"device_to_host": "log"}}, environ={}
        )
        (finding,) = [f for f in devpolicy.lint(p) if f.code == "transfers-left-to-jax"]
        assert finding.severity == "warning"
        assert "JAX's own C++ log line" in finding.message

    def test_host_to_device_on_a_cpu_only_machine_watches_nothing(self) -> None:
        """Every device here is a CPU: host_to_device without host_local sees nothing."""
        p = devpolicy.load_policy({"version": 1, "transfers": "log"}, environ={})
        codes = [f.code for f in devpolicy.lint(p)]
        assert "transfers-watch-nothing" in codes
        p = devpolicy.load_policy(
            {"version": 1, "transfers": {"host_to_device": "log", "host_local": "log"}},
            environ={},
        )
        assert "transfers-watch-nothing" not in [f.code for f in devpolicy.lint(p)]

    def test_a_machine_with_a_gpu_is_watched(self) -> None:
        p = devpolicy.load_policy({"version": 1, "transfers": "log"}, environ={})
        machine = devpolicy.VirtualMachine("gpu=1x16GiB")
        codes = [f.code for f in devpolicy.lint(p, machine=machine)]
        assert "transfers-watch-nothing" not in codes
