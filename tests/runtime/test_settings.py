"""`runtime:`: JAX's process settings, applied before JAX starts (subprocesses: a fresh JAX each)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import devpolicy
from devpolicy._cli.main import main
from devpolicy._runtime import knobs as _runtime
from devpolicy._runtime import platforms as _platforms
from devpolicy._runtime import settings as _settings
from tests.conftest import REPO
from tests.helpers import write

TIMEOUT = 180
PY = (sys.executable, "-c")
# Variables that steer JAX: none of the test process's own may leak into a child.
_STEERING = ("JAX_", "XLA_", "TF_", "DEVPOLICY_", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_STEERING)}
    env["PYTHONPATH"] = str(REPO)
    return env | extra


def run_command(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `argv` with a clean environment (plus `env`), its output captured as text."""
    return subprocess.run(
        argv,
        cwd=cwd,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter (JAX not started), with a clean environment."""
    return run_command([sys.executable, "-c", textwrap.dedent(code)], cwd, **env)


def last_json(stdout: str) -> Any:
    return json.loads(stdout.strip().splitlines()[-1])


def runtime_event(stderr: str) -> dict[str, Any]:
    events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    (event,) = [e for e in events if e["event"] == "runtime"]
    return event


def policy_file(tmp_path: Path, runtime: str) -> Path:
    body = textwrap.indent(textwrap.dedent(runtime).strip(), "  ")
    return write(tmp_path / "p.yaml", f"version: 1\nlogging:\n  format: json\nruntime:\n{body}\n")


REPORT = """
    import json, os, jax
    devices = jax.devices()
    print(json.dumps({
        "devices": [d.platform for d in devices],
        "env": {k: v for k, v in os.environ.items() if k.startswith(("JAX_", "XLA_"))},
    }))
"""


class TestBootstrap:
    @pytest.mark.slow
    def test_cpu_policy_gives_four_cpu_devices_with_each_variable_set_once(
        self, tmp_path: Path
    ) -> None:
        """platforms [cpu], cpu_devices 4, preallocate false: 4 CPU devices; one spelling each."""
        policy_file(
            tmp_path, "platforms: [cpu]\ncpu_devices: 4\npreallocate: false\nmemory_fraction: 0.5"
        )
        result = python(
            "import devpolicy; devpolicy.bootstrap('p.yaml')\n" + textwrap.dedent(REPORT), tmp_path
        )
        assert result.returncode == 0, result.stderr
        out = last_json(result.stdout)
        assert out["devices"] == ["cpu"] * 4
        fraction = _settings.memory_fraction_variable()
        assert out["env"] == {
            "JAX_PLATFORMS": "cpu",
            "JAX_NUM_CPU_DEVICES": "4",
            "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
            fraction: "0.5",
        }

    def test_the_installed_jaxlib_reads_the_new_memory_fraction_spelling(self) -> None:
        """jaxlib 0.10 reads XLA_CLIENT_MEM_FRACTION (and refuses it with the old one)."""
        assert _settings.memory_fraction_variable() == "XLA_CLIENT_MEM_FRACTION"

    @pytest.mark.slow
    def test_one_runtime_event_gives_each_knob_value_and_source(self, tmp_path: Path) -> None:
        """The event has every knob's effective value and `_source`."""
        policy_file(tmp_path, "platforms: [cpu]\ncpu_devices: 2\nx64: true")
        result = python("import devpolicy; devpolicy.bootstrap('p.yaml')", tmp_path)
        assert result.returncode == 0, result.stderr
        event = runtime_event(result.stderr)
        assert (event["platforms"], event["platforms_source"]) == ("cpu", "policy")
        assert (event["cpu_devices"], event["cpu_devices_source"]) == (2, "policy")
        assert (event["x64"], event["x64_source"]) == (True, "policy")
        assert event["policy"] == "p.yaml"

    @pytest.mark.slow
    def test_the_runtime_event_reports_transfers_with_each_fields_layer(
        self, tmp_path: Path
    ) -> None:
        """`transfers:` and DEVPOLICY_TRANSFERS show in the runtime event as they take effect."""
        write(tmp_path / "p.yaml", "version: 1\nlogging:\n  format: json\ntransfers: log\n")
        result = python(
            "import devpolicy; devpolicy.bootstrap('p.yaml')",
            tmp_path,
            DEVPOLICY_TRANSFERS="host_to_device=disallow",
        )
        assert result.returncode == 0, result.stderr
        event = runtime_event(result.stderr)
        assert "host_to_device=disallow (env: env:DEVPOLICY_TRANSFERS)" in event["transfers"]
        assert "device_to_device=log (policy: p.yaml:4)" in event["transfers"]

    @pytest.mark.slow
    def test_a_user_variable_beats_the_policy_and_is_reported_as_env(self, tmp_path: Path) -> None:
        """JAX_NUM_CPU_DEVICES=2 and PREALLOCATE=true set by the user win, with source=env."""
        policy_file(tmp_path, "cpu_devices: 4\npreallocate: false")
        result = python(
            "import devpolicy; devpolicy.bootstrap('p.yaml')\n" + textwrap.dedent(REPORT),
            tmp_path,
            JAX_NUM_CPU_DEVICES="2",
            XLA_PYTHON_CLIENT_PREALLOCATE="true",
        )
        assert result.returncode == 0, result.stderr
        out = last_json(result.stdout)
        assert out["devices"] == ["cpu"] * 2
        assert out["env"]["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
        event = runtime_event(result.stderr)
        assert (event["cpu_devices"], event["cpu_devices_source"]) == ("2", "env")
        assert event["preallocate_source"] == "env"
        assert "overridden by XLA_PYTHON_CLIENT_PREALLOCATE" in event["preallocate_note"]

    @pytest.mark.slow
    def test_gpu_in_platforms_becomes_the_installed_gpu_plugins(self, tmp_path: Path) -> None:
        """[gpu, cpu] is translated (JAX_PLATFORMS=gpu,cpu fails without a GPU) and starts."""
        policy_file(tmp_path, "platforms: [gpu, cpu]")
        result = python(
            "import devpolicy; devpolicy.bootstrap('p.yaml')\n" + textwrap.dedent(REPORT), tmp_path
        )
        assert result.returncode == 0, result.stderr
        wanted = ",".join([*_platforms.startable().gpus, "cpu"])
        assert last_json(result.stdout)["env"]["JAX_PLATFORMS"] == wanted

    @pytest.mark.slow
    def test_env_section_reaches_jax_config_options_read_at_import(self, tmp_path: Path) -> None:
        """env: JAX_* options are applied through jax.config (jax is already imported)."""
        policy_file(
            tmp_path,
            "allow: [JAX_DEFAULT_PRNG_IMPL]\nenv:\n  JAX_DEFAULT_PRNG_IMPL: rbg\n"
            "  TF_CPP_MIN_LOG_LEVEL: 3",
        )
        code = """
            import os, devpolicy, jax
            devpolicy.bootstrap('p.yaml')
            print(jax.config.jax_default_prng_impl, os.environ['TF_CPP_MIN_LOG_LEVEL'])
        """
        result = python(code, tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["rbg", "3"]


class TestRefusedValues:
    @pytest.mark.slow
    def test_a_value_jax_refuses_is_a_policy_error_and_changes_nothing(
        self, tmp_path: Path
    ) -> None:
        """Before or after the backend starts: a PolicyError at the field's line, the
        environment and jax.config as they were."""
        policy = policy_file(
            tmp_path,
            "env:\n  JAX_DEFAULT_MATMUL_PRECISION: bogus\nallow: [JAX_DEFAULT_MATMUL_PRECISION]",
        )
        result = python(
            f"""
            import json, os, jax, devpolicy
            seen = []
            for start in (False, True):
                if start:
                    jax.numpy.zeros(1)
                try:
                    devpolicy.bootstrap({str(policy)!r})
                    seen.append("no error")
                except devpolicy.PolicyError as e:
                    seen.append(str(e))
                seen.append(os.environ.get("JAX_DEFAULT_MATMUL_PRECISION"))
                seen.append(jax.config.jax_default_matmul_precision)
            print(json.dumps(seen))
            """,
            tmp_path,
        )
        assert result.returncode == 0, result.stderr
        first, env_before, config_before, second, env_after, config_after = last_json(result.stdout)
        for message in (first, second):
            assert message.startswith(
                "p.yaml:6: runtime.env.JAX_DEFAULT_MATMUL_PRECISION: JAX refuses 'bogus'"
            )
        assert (env_before, config_before, env_after, config_after) == (None, None, None, None)


class TestTooLate:
    @pytest.mark.slow
    def test_a_differing_knob_after_start_raises_naming_it_and_changes_nothing(
        self, tmp_path: Path
    ) -> None:
        """cpu_devices 4 after jax.devices() started 1: RuntimeTooLateError, env untouched."""
        policy_file(tmp_path, "cpu_devices: 4\nx64: true")
        code = """
            import os, jax, devpolicy
            jax.devices()
            try:
                devpolicy.bootstrap('p.yaml')
            except devpolicy.errors.RuntimeTooLateError as e:
                print(e)
                print(os.environ.get('JAX_NUM_CPU_DEVICES'), jax.config.jax_enable_x64)
        """
        result = python(code, tmp_path)
        assert result.returncode == 0, result.stderr
        assert "cpu_devices (p.yaml:5): wanted 4, running 1" in result.stdout
        assert "call devpolicy.bootstrap() before the first JAX computation" in result.stdout
        assert "`devpolicy run`" in result.stdout
        assert result.stdout.splitlines()[-1] == "None False"

    @pytest.mark.slow
    def test_identical_knobs_after_start_pass(self, tmp_path: Path) -> None:
        """The backend already has them: no error; GPU-only knobs are inert on a CPU."""
        policy_file(tmp_path, "platforms: [cpu]\ncpu_devices: 4\npreallocate: false")
        code = """
            import json, jax, devpolicy
            jax.config.update('jax_num_cpu_devices', 4)
            jax.devices()
            with devpolicy.bootstrap('p.yaml') as policy:
                states = {k.knob: k.state for k in devpolicy.runtime_settings(policy).knobs}
            print(json.dumps(states))
        """
        result = python(code, tmp_path)
        assert result.returncode == 0, result.stderr
        states = last_json(result.stdout)
        assert states["cpu_devices"] == "in effect"
        assert states["preallocate"].startswith("inert")
        if not _platforms.startable().gpus:
            assert states["platforms"] == "in effect"

    @pytest.mark.slow
    def test_a_platform_list_the_running_process_excluded_is_too_late(self, tmp_path: Path) -> None:
        """Started with jax_platforms=cpu, a policy asking [tpu, cpu] is named as differing
        (planned for a machine where JAX would start a TPU)."""
        policy_file(tmp_path, "platforms: [tpu, cpu]")
        code = """
            import os, jax, devpolicy
            from devpolicy._runtime.settings import apply_runtime, plan_runtime
            jax.config.update('jax_platforms', 'cpu')
            jax.devices()
            wanted = devpolicy.load_policy('p.yaml').settings.runtime
            try:
                apply_runtime(plan_runtime(wanted, os.environ, tpu=True), os.environ)
            except devpolicy.errors.RuntimeTooLateError as e:
                print(e.knobs[0][:3])
        """
        result = python(code, tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "('platforms', 'tpu,cpu', 'cpu (default cpu)')"

    @pytest.mark.slow
    def test_x64_can_still_change_after_start_and_is_applied(self, tmp_path: Path) -> None:
        """x64 is live: applied after the backend started, no error."""
        policy_file(tmp_path, "x64: true")
        code = """
            import jax, jax.numpy as jnp, devpolicy
            jax.devices()
            devpolicy.bootstrap('p.yaml')
            print(jnp.zeros(1, dtype=jnp.float64).dtype)
        """
        result = python(code, tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "float64"


class TestRunCommand:
    @pytest.mark.slow
    def test_child_gets_the_settings_and_policy_file_and_its_exit_code_is_ours(
        self, tmp_path: Path
    ) -> None:
        """`devpolicy run --policy p.yaml -- python -c ...`: env, DEVPOLICY_FILE, exit code 3."""
        policy = policy_file(tmp_path, "platforms: [cpu]\ncpu_devices: 3\npreallocate: false")
        child = textwrap.dedent(
            """
            import json, os, sys, jax, devpolicy
            with devpolicy.bootstrap() as policy:
                knobs = devpolicy.runtime_settings(policy).knobs
            print(json.dumps({
                "file": os.environ["DEVPOLICY_FILE"],
                "devices": len(jax.devices("cpu")),
                "preallocate": os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"],
                "sources": sorted({k.source for k in knobs}),
            }))
            sys.exit(3)
            """
        )
        result = subprocess.run(
            [sys.executable, "-m", "devpolicy", "run", "--policy", "p.yaml", "--", *PY, child],
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert result.returncode == 3, result.stderr
        out = last_json(result.stdout)
        assert out == {
            "file": str(policy.resolve()),
            "devices": 3,
            "preallocate": "false",
            "sources": ["policy"],
        }

    def test_without_a_command_is_a_usage_error(self, tmp_path: Path) -> None:
        """Nothing after --: exit 2, saying how to call it."""
        policy_file(tmp_path, "x64: false")
        assert main(["run", "--policy", str(tmp_path / "p.yaml")]) == 2

    def test_an_unknown_command_exits_127(self, tmp_path: Path, capsys: Any) -> None:
        """The shell's convention for a command not found."""
        policy_file(tmp_path, "x64: false")
        argv = ["run", "--policy", str(tmp_path / "p.yaml"), "--", "no-such-command-xyz"]
        assert main(argv) == 127
        assert "command not found: no-such-command-xyz" in capsys.readouterr().err

    def test_dry_run_prints_the_variables(self, tmp_path: Path, capsys: Any) -> None:
        """--dry-run lists what would be set, runs nothing."""
        policy_file(tmp_path, "allocator: platform")
        assert main(["run", "--policy", "p.yaml", "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "XLA_PYTHON_CLIENT_ALLOCATOR=platform" in out
        assert f"DEVPOLICY_FILE={(tmp_path / 'p.yaml').resolve()}" in out


class TestVisibility:
    @pytest.mark.slow
    def test_devices_shows_each_knob_with_its_origin_and_state(self, tmp_path: Path) -> None:
        """`devpolicy devices --json` applies the runtime first and lists each knob."""
        policy_file(tmp_path, "platforms: [cpu]\ncpu_devices: 2")
        result = subprocess.run(
            [sys.executable, "-m", "devpolicy", "devices", "--json", "--policy", "p.yaml"],
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        payload = json.loads(result.stdout)
        assert len(payload["devices"]) == 2
        rows = {r["knob"]: r for r in payload["runtime"]}
        assert rows["cpu_devices"]["origin"] == "p.yaml:6"
        assert rows["cpu_devices"]["state"] == "in effect"
        assert rows["platforms"]["variable"] == "JAX_PLATFORMS"

    def test_check_warns_when_both_memory_fraction_spellings_are_set(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
    ) -> None:
        """jaxlib refuses both spellings: check says so, and that the environment wins."""
        policy_file(tmp_path, "memory_fraction: 0.5")
        monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", "0.3")
        monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.2")
        assert main(["check", "p.yaml", "--json"]) == 0
        findings = json.loads(capsys.readouterr().out)["findings"]
        codes = {f["code"]: f for f in findings}
        assert "unset XLA_PYTHON_CLIENT_MEM_FRACTION" in codes["runtime-conflict"]["message"]
        assert codes["runtime-env-wins"]["origin"] == "env:XLA_CLIENT_MEM_FRACTION"

    def test_runtime_settings_changes_nothing(self) -> None:
        """Reading the knobs sets no variable."""
        policy = devpolicy.load_policy({"version": 1, "runtime": {"preallocate": False}})
        environ: dict[str, str] = {}
        devpolicy.runtime_settings(policy, environ=environ)
        assert environ == {}


class TestValidation:
    @pytest.mark.parametrize(
        ("line", "expected"),
        [
            (
                "memory_fraction: 1.5",
                r"p\.yaml:3: runtime\.memory_fraction: expected a fraction in \(0, 1\]",
            ),
            (
                "allocator: fast",
                # The installed jaxlib's list (longer on newer jaxlib; see test_compat).
                r"p\.yaml:3: runtime\.allocator: unknown allocator 'fast'; accepted: "
                + re.escape(", ".join(_runtime.ALLOCATORS)),
            ),
            (
                "platforms: [gpux]",
                r"p\.yaml:3: runtime\.platforms\[0\]: unknown platform 'gpux' \(did you mean 'gpu'\?\); accepted: cpu, gpu, cuda, rocm, tpu",
            ),
            ("platforms: []", r"p\.yaml:3: runtime\.platforms: an empty list"),
            (
                "cpu_devices: 0",
                r"p\.yaml:3: runtime\.cpu_devices: expected a whole number >= 1, got 0",
            ),
            (
                "visible_devices: [0, 0]",
                r"p\.yaml:3: runtime\.visible_devices: device index listed more than once: 0",
            ),
            (
                "host_memory_limit: 1.5GiB",
                r"p\.yaml:3: runtime\.host_memory_limit: .*whole GiB.*write 1GiB or 2GiB",
            ),
            ("preallocate: 'no'", r"p\.yaml:3: runtime\.preallocate: expected true or false"),
            (
                "env: {foo: 1}",
                r"p\.yaml:3: runtime\.env\.foo: not a variable runtime\.env may set: 'foo'; accepted: XLA_FLAGS, TF_CPP_MIN_LOG_LEVEL, .*; or another upper-case XLA_\*, JAX_\* or TF_\* variable listed in `runtime\.allow`",
            ),
            (
                "env: {XLA_PYTHON_CLIENT_PREALLOCATE: 'false'}",
                r"p\.yaml:3: runtime\.env\.XLA_PYTHON_CLIENT_PREALLOCATE: .*write `preallocate:` instead",
            ),
            (
                "prealocate: false",
                r"p\.yaml:3: runtime\.prealocate: unknown field 'prealocate' \(did you mean 'preallocate'\?\)",
            ),
        ],
    )
    def test_bad_values_are_policy_errors_with_file_line_and_choices(
        self, tmp_path: Path, line: str, expected: str
    ) -> None:
        """Each bad value names the file:line, the field, the value and what is accepted."""
        path = write(tmp_path / "p.yaml", f"version: 1\nruntime:\n  {line}\n")
        with pytest.raises(devpolicy.PolicyError, match=expected):
            devpolicy.load_policy(path, environ={})

    def test_gpu_alone_without_a_gpu_plugin_is_a_policy_error(self, tmp_path: Path) -> None:
        """platforms [gpu] where no GPU plugin is installed cannot start anything: say so."""
        path = write(tmp_path / "p.yaml", "version: 1\nruntime:\n  platforms: [gpu]\n")
        policy = devpolicy.load_policy(path, environ={})
        with pytest.raises(
            devpolicy.PolicyError,
            match=r"p\.yaml:3: runtime\.platforms: gpu dropped: no GPU plugin",
        ):
            _settings.plan_runtime(policy.settings.runtime, {}, gpu_platforms=())

    @given(st.floats(allow_nan=False, allow_infinity=False))
    def test_memory_fraction_accepts_exactly_the_unit_interval_open_at_zero(
        self, value: float
    ) -> None:
        """0 < f <= 1 validates; anything else is a PolicyError."""
        doc = {"version": 1, "runtime": {"memory_fraction": value}}
        if 0 < value <= 1:
            assert (
                devpolicy.load_policy(doc, environ={}).settings.runtime["memory_fraction"].value
                == value
            )
        else:
            with pytest.raises(devpolicy.PolicyError, match=r"runtime\.memory_fraction"):
                devpolicy.load_policy(doc, environ={})


class TestControlCharacters:
    @pytest.mark.parametrize(
        ("char", "shown"),
        [("\x85", "U+0085"), ("\x9b", "U+009B"), ("\x80", "U+0080"), ("\x7f", "U+007F")],
    )
    def test_c1_controls_and_del_in_an_env_value_are_refused_naming_variable_and_character(
        self, tmp_path: Path, char: str, shown: str
    ) -> None:
        """C1 controls (NEL, CSI...) and DEL are control characters too: a PolicyError at the
        entry's line naming the variable and the character, as for newline (`run --dry-run`
        would otherwise print `$'\\x85'`, and `eval` of it sets other bytes)."""
        path = write(
            tmp_path / "p.yaml",
            "version: 1\nruntime:\n  env:\n    JAX_LOGGING_LEVEL: "
            + json.dumps(f"INFO{char}")
            + "\n",
        )
        with pytest.raises(
            devpolicy.PolicyError,
            match=rf"^p\.yaml:4: runtime\.env\.JAX_LOGGING_LEVEL: contains a control character, "
            rf"{re.escape(shown)} at position 4 of 'INFO\\x[0-9a-f]{{2}}'",
        ):
            devpolicy.load_policy(path, environ={})

    @pytest.mark.slow
    @given(st.characters(codec="utf-8"))
    def test_exactly_c0_del_and_c1_are_refused(self, char: str) -> None:
        """Every character of Unicode category Cc (C0, DEL, C1), and no other, makes a
        value unholdable."""
        import unicodedata

        problem = _runtime.holdable_problem(f"a{char}b")
        assert (problem is not None) == (unicodedata.category(char) == "Cc")


class TestInstalledJax:
    """The knob table agrees with the installed jax/jaxlib source (catches drift on upgrade)."""

    def _source(self, module: str) -> str:
        import importlib.util

        spec = importlib.util.find_spec(module)
        assert spec is not None
        assert spec.origin is not None
        return Path(spec.origin).read_text(encoding="utf-8")

    def test_allocators_are_those_jaxlib_accepts(self) -> None:
        """ALLOCATORS is the installed jaxlib's own list."""
        source = self._source("jaxlib.xla_client")
        # `if allocator not in (...)` up to jaxlib 0.10, `allowed_allocators = (...)` from 0.11.
        m = re.search(r"(?:allocator not in|allowed_allocators =) \(([^)]*)\)", source)
        assert m is not None
        assert tuple(re.findall(r"'([a-z_]+)'", m.group(1))) == _runtime.ALLOCATORS

    def test_variable_names_are_read_by_jaxlib(self) -> None:
        """Each XLA_PYTHON_CLIENT_* and memory-fraction name appears in jaxlib's reader."""
        source = self._source("jaxlib.xla_client")
        for name in (
            "XLA_PYTHON_CLIENT_PREALLOCATE",
            "XLA_CLIENT_MEM_FRACTION",
            "XLA_PYTHON_CLIENT_MEM_FRACTION",
            "XLA_PYTHON_CLIENT_ALLOCATOR",
        ):
            assert f"'{name}'" in source

    def test_config_options_exist(self) -> None:
        """platforms, cpu_devices and x64 map to real jax.config options."""
        import jax

        for knob in _runtime.KNOBS:
            if knob.config is not None:
                assert knob.config in jax.config._value_holders


def planned(runtime: dict[str, Any], gpus: tuple[str, ...], tpu: bool) -> _settings.RuntimeSettings:
    """The runtime plan of a policy with `runtime` on a machine where `gpus` and (if
    `tpu`) libtpu are installed, with nothing set in the environment."""
    policy = devpolicy.load_policy({"version": 1, "runtime": runtime}, environ={})
    return _settings.plan_runtime(policy.settings.runtime, {}, gpu_platforms=gpus, tpu=tpu)


class TestPlatformsInstalled:
    @pytest.mark.parametrize(
        ("gpus", "tpu", "started"),
        [
            ((), False, "cpu"),
            (("cuda",), False, "cuda,cpu"),
            ((), True, "tpu,cpu"),
            (("rocm",), False, "rocm,cpu"),
        ],
    )
    def test_accelerator_is_the_plugin_installed_then_the_cpu(
        self, gpus: tuple[str, ...], tpu: bool, started: str
    ) -> None:
        """`[accelerator, cpu]`: a laptop, a GPU box and a TPU VM each start what they have."""
        plan = planned({"platforms": ["accelerator", "cpu"]}, gpus, tpu)
        assert plan.assignments()["JAX_PLATFORMS"] == started
        assert plan.hidden == ()

    def test_tpu_without_libtpu_is_dropped_with_a_note(self) -> None:
        """`[tpu, cpu]` where libtpu is not installed starts the CPU (JAX_PLATFORMS is
        strict: `tpu,cpu` would start no backend at all)."""
        plan = planned({"platforms": ["tpu", "cpu"]}, (), False)
        assert plan.assignments()["JAX_PLATFORMS"] == "cpu"
        assert plan.knobs[0].note.startswith("tpu dropped: no TPU runtime installed (libtpu")

    def test_every_platform_of_the_list_not_installed_is_dropped(self) -> None:
        """`[tpu, gpu, cpu]` on a CPU machine is `cpu`, each drop noted."""
        plan = planned({"platforms": ["tpu", "gpu", "cpu"]}, (), False)
        assert plan.assignments()["JAX_PLATFORMS"] == "cpu"
        assert "tpu dropped" in plan.knobs[0].note
        assert "gpu dropped" in plan.knobs[0].note

    def test_accelerator_alone_where_there_is_none_is_a_policy_error(self) -> None:
        """Nothing to start: said at the field, with the fix."""
        with pytest.raises(devpolicy.PolicyError, match=r"accelerator dropped.*add cpu"):
            planned({"platforms": ["accelerator"]}, (), False)

    @pytest.mark.parametrize(
        ("platforms", "gpus", "tpu", "hidden"),
        [
            (["gpu", "cpu"], (), True, "tpu"),
            (["cpu"], ("cuda",), False, "cuda"),
            (["cpu"], (), True, "tpu"),
        ],
    )
    def test_a_list_that_hides_an_installed_accelerator_says_so_once(
        self, platforms: list[str], gpus: tuple[str, ...], tpu: bool, hidden: str
    ) -> None:
        """One line naming the platform and the policy's field, and the fix."""
        plan = planned({"platforms": platforms}, gpus, tpu)
        (line,) = plan.hidden
        assert line.startswith("<mapping>:runtime.platforms: runtime.platforms [")
        assert f"hides {hidden}, installed here" in line
        assert "accelerator" in line

    def test_hiding_is_a_warning_of_the_runtime_event_and_of_check(self, tmp_path: Path) -> None:
        """The plan's `hidden` becomes a field of the `runtime` event and a lint finding."""
        plan = planned({"platforms": ["cpu"]}, (), True)
        assert plan.event_fields()["hidden"] == list(plan.hidden)

    @pytest.mark.parametrize(
        ("platforms", "gpus", "tpu", "using"),
        [
            (["accelerator", "cpu"], (), True, "tpu"),
            (["accelerator", "cpu"], (), False, "cpu"),
            (None, (), True, "tpu"),
            (None, (), False, "cpu"),
        ],
    )
    def test_gpu_only_knobs_say_they_do_not_apply_off_a_gpu(
        self, platforms: list[str] | None, gpus: tuple[str, ...], tpu: bool, using: str
    ) -> None:
        """preallocate, the memory fraction, the allocator: noted as not applying where JAX
        will use a TPU or the CPU, naming the platform."""
        runtime: dict[str, Any] = {"preallocate": False, "memory_fraction": 0.5}
        if platforms is not None:
            runtime["platforms"] = platforms
        plan = planned(runtime, gpus, tpu)
        notes = {k.knob: k.note for k in plan.knobs}
        for knob in ("preallocate", "memory_fraction"):
            assert notes[knob].startswith("does not apply: only a GPU backend reads")
            assert notes[knob].endswith(f"JAX will use {using} here")

    def test_gpu_only_knobs_apply_silently_on_a_gpu(self) -> None:
        """With a GPU plugin first, preallocate has no note."""
        plan = planned(
            {"platforms": ["accelerator", "cpu"], "preallocate": False}, ("cuda",), False
        )
        assert {k.knob: k.note for k in plan.knobs}["preallocate"] == ""

    def test_libtpu_is_found_without_starting_jax(self, tmp_path: Path) -> None:
        """TPU_LIBRARY_PATH naming a shared library counts as libtpu installed, as JAX reads
        it; finding out imports no JAX."""
        code = """
            import sys
            from devpolicy._runtime.platforms import tpu_installed
            print(tpu_installed(), "jax" in sys.modules)
        """
        library = tmp_path / "runtime" / "the-tpu-library.so"
        library.parent.mkdir()
        library.write_bytes(b"\x7fELF" + bytes(60))
        assert python(code, tmp_path, TPU_LIBRARY_PATH=str(library)).stdout.split() == [
            "True",
            "False",
        ]
        assert python(code, tmp_path).stdout.split() == ["False", "False"]

    def test_check_warns_of_a_hidden_accelerator_at_the_policy_line(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`platforms: [cpu]` where JAX would start a TPU (libtpu and a chip): lint's
        `runtime-hides-accelerator`."""
        library = tmp_path / "runtime" / "the-tpu-library.so"
        library.parent.mkdir()
        library.write_bytes(b"\x7fELF" + bytes(60))
        chip = tmp_path / "machine" / "sys/bus/pci/devices/0000:00:04.0"
        write(chip / "vendor", "0x1ae0\n")
        write(chip / "device", "0x0063\n")
        monkeypatch.setenv("TPU_LIBRARY_PATH", str(library))
        monkeypatch.setattr(_platforms, "ROOT", tmp_path / "machine")
        path = write(tmp_path / "p.yaml", "version: 1\nruntime:\n  platforms: [cpu]\n")
        found = devpolicy.lint(devpolicy.load_policy(path, environ={}))
        (finding,) = [f for f in found if f.code == "runtime-hides-accelerator"]
        assert finding.origin.endswith("p.yaml:3")
        assert finding.message.startswith("runtime.platforms [cpu] hides tpu, installed here")
