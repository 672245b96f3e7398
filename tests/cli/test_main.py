"""The command line: each command run as a subprocess and as a function call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import devpolicy
from devpolicy._cli.main import main
from tests.conftest import REPO
from tests.helpers import schema_form, write

NO_GPU = "gpu" not in devpolicy.inventory().devices


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEVPOLICY_")}
    environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    environ |= env or {}
    return subprocess.run(
        [sys.executable, "-m", "devpolicy", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=environ,
        cwd=cwd,
        check=False,
    )


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    return write(
        tmp_path / "devpolicy.yaml",
        "version: 1\nfallback: [cpu]\nrules:\n  - match: 'dataset/*'\n    device: cpu:1\n  - match: 'model/*'\n    device: cpu:2\n",
    )


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "train.safetensors"
    devpolicy.save_file({"tokens": np.zeros(1024, np.uint16), "w": np.zeros(16, np.float32)}, path)
    return path


class TestVersionAndUsage:
    def test_version_prints_the_package_version(self) -> None:
        """`devpolicy --version` prints the installed version."""
        result = run_cli("--version")
        assert (result.returncode, result.stdout.strip()) == (
            0,
            f"devpolicy {devpolicy.__version__}",
        )

    def test_console_script_is_installed(self) -> None:
        """The `devpolicy` command exists next to the interpreter and runs."""
        script = Path(sys.executable).parent / "devpolicy"
        if not script.exists():
            pytest.skip("devpolicy is not installed as a console script here")
        result = subprocess.run(
            [str(script), "--version"], capture_output=True, text=True, timeout=120, check=False
        )
        assert result.stdout.strip() == f"devpolicy {devpolicy.__version__}"

    def test_unknown_command_is_a_usage_error(self) -> None:
        """A typo exits 2 listing the valid commands."""
        result = run_cli("devcies")
        assert result.returncode == 2
        assert "invalid choice: 'devcies'" in result.stderr

    def test_no_command_prints_help_and_exits_2(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Bare `devpolicy` shows the help."""
        assert main([]) == 2
        assert "devices" in capsys.readouterr().out

    def test_bad_size_is_a_usage_error(self) -> None:
        """--bytes is parsed like policy sizes; a bad one exits 2 naming the forms."""
        with pytest.raises(SystemExit) as exit_info:
            main(["explain", "x", "--bytes", "lots"])
        assert exit_info.value.code == 2

    def test_bad_environment_is_an_input_error(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A malformed DEVPOLICY_* variable exits 2 with the library's message."""
        monkeypatch.setenv("DEVPOLICY_STRICT", "maybe")
        assert main(["explain", "x"]) == 2
        assert "DEVPOLICY_STRICT='maybe': not a boolean" in capsys.readouterr().err


class TestStartsLight:
    @pytest.mark.parametrize(
        "code",
        [
            "import devpolicy; devpolicy.__version__",
            "import sys; from devpolicy._cli.main import main; sys.argv = ['devpolicy', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass",
            "import sys; from devpolicy._cli.main import main; sys.argv = ['devpolicy', '--version']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass",
        ],
        ids=["import", "--help", "--version"],
    )
    def test_import_help_and_version_load_no_jax(self, code: str) -> None:
        """`import devpolicy`, `--help` and `--version` import neither JAX nor pydantic."""
        probe = (
            code
            + "\nimport sys; print(sorted({'jax', 'pydantic', 'structlog'} & set(sys.modules)))"
        )
        result = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
        )
        assert result.stdout.strip().splitlines()[-1] == "[]"

    def test_public_names_load_on_first_use(self) -> None:
        """Every name in __all__ resolves, and dir() lists them."""
        for name in devpolicy.__all__:
            assert getattr(devpolicy, name) is not None
        assert set(devpolicy.__all__) <= set(dir(devpolicy))
        with pytest.raises(AttributeError, match=r"has no attribute 'plaec'"):
            devpolicy.plaec  # type: ignore[attr-defined]  # noqa: B018


class TestDevices:
    @pytest.mark.slow
    def test_json_lists_every_device_and_why_backends_are_absent(self) -> None:
        """`devices --json` has each device's target text and each absent backend's reason."""
        result = run_cli("devices", "--json")
        assert result.returncode == 0, result.stderr
        payload = json.loads(result.stdout)
        assert [d["target"] for d in payload["devices"] if d["platform"] == "cpu"] == [
            "cpu:0",
            "cpu:1",
            "cpu:2",
            "cpu:3",
        ]
        assert payload["backends"]["cpu"] == {"available": True, "reason": None}
        assert set(payload["devices"][0]) >= {
            "id",
            "kind",
            "process_index",
            "memory_kinds",
            "bytes_free",
            "bytes_total",
        }
        if NO_GPU:
            assert payload["backends"]["gpu"]["available"] is False
            assert payload["backends"]["gpu"]["reason"].startswith(
                ("no CUDA or ROCm plugin is installed: pip install", "the GPU plugin (")
            )

    def test_table_shows_targets_and_memory_kinds(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The table names devices by target text and marks the default."""
        assert main(["devices"]) == 0
        out = capsys.readouterr().out
        assert "cpu:0 (default)" in out
        assert "cpu:3" in out
        assert "pinned_host" in out

    def test_says_what_the_accelerator_target_resolves_to(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A line (and a JSON field) for `accelerator`: here, none, with each reason."""
        assert main(["devices"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        if devpolicy.inventory().accelerator is None:
            assert "accelerator: none in this process (a TPU, else a GPU; tpu: " in out
        else:
            assert f"accelerator: accelerator:0 -> {devpolicy.inventory().accelerator}:0" in out
        assert main(["devices", "--json"]) == 0
        payload = json.loads(capsys.readouterr().out)
        accelerator = devpolicy.inventory().accelerator
        assert payload["accelerator"] == (accelerator and f"accelerator:0 -> {accelerator}:0")


class TestCheck:
    def test_clean_policy_exits_0(
        self, policy_file: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A valid policy whose targets exist has no findings."""
        assert main(["check", str(policy_file)]) == 0
        assert "valid, no findings" in capsys.readouterr().out

    @pytest.mark.slow
    def test_discovered_policy_is_checked_by_default(self, policy_file: Path) -> None:
        """Without an argument, check finds devpolicy.yaml like the library does."""
        result = run_cli("check", cwd=policy_file.parent)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "found by devpolicy.yaml" in result.stdout

    @pytest.mark.slow
    def test_invalid_policy_lists_each_problem_with_its_line_and_exits_1(
        self, tmp_path: Path
    ) -> None:
        """Validation errors are findings with file:line."""
        bad = write(
            tmp_path / "bad.yaml",
            "version: 1\ndefault: gpuu\nrules:\n  - {match: a, devise: cpu}\n",
        )
        result = run_cli("check", str(bad), "--json")
        assert result.returncode == 1
        payload = json.loads(result.stdout)
        assert payload["valid"] is False
        assert [(f["origin"], f["severity"]) for f in payload["findings"]] == [
            ("bad.yaml:2", "error"),
            ("bad.yaml:4", "error"),
        ]

    def test_unreachable_rules_are_errors_with_lines(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A rule after a catch-all is reported at its own line."""
        path = write(
            tmp_path / "p.yaml",
            "version: 1\nrules:\n  - {match: '*', device: cpu}\n  - {match: 'model/*', device: cpu:1}\n",
        )
        assert main(["check", str(path)]) == 1
        out = capsys.readouterr().out
        assert (
            "p.yaml:4: error: rule 1 ('model/*') can never match: rule 0 at p.yaml:3 ('*') matches every name"
            in out
        )

    @pytest.mark.slow
    @pytest.mark.skipif(not NO_GPU, reason="needs a machine without a GPU")
    def test_missing_devices_are_warnings_and_strict_exits_2(self, tmp_path: Path) -> None:
        """A GPU target on a CPU host warns (exit 0), and exits 2 under --strict."""
        path = write(
            tmp_path / "p.yaml",
            "version: 1\nfallback: [cpu]\nrules:\n  - {match: 'model/*', device: gpu:0}\n",
        )
        assert run_cli("check", str(path)).returncode == 0
        result = run_cli("check", str(path), "--strict", "--json")
        assert result.returncode == 2
        (finding,) = json.loads(result.stdout)["findings"]
        assert (finding["code"], finding["origin"]) == ("missing-device", "p.yaml:4")

    def test_a_chain_is_judged_on_the_machine_described_by_devices(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A GPU-mesh sharding with nothing after it: on 8 GPUs an indivisible array ends
        nowhere (`no-safe-end`); with `replicate` after it, check is clean there."""
        text = (
            "version: 1\nmeshes:\n  g: {axes: {data: 8}, devices: gpu}\n"
            "rules:\n  - {match: 'w', sharding: {mesh: g, spec: [data]}%s}\n"
        )
        bare = write(tmp_path / "bare.yaml", text % "")
        assert main(["check", str(bare), "--devices", "gpu=8x80GiB", "--json"]) == 0
        (finding,) = json.loads(capsys.readouterr().out)["findings"]
        assert (finding["code"], finding["origin"]) == ("no-safe-end", "bare.yaml:5")
        safe = write(tmp_path / "safe.yaml", text % ", fallback: [replicate]")
        assert main(["check", str(safe), "--devices", "gpu=8x80GiB"]) == 0
        assert "valid, no findings" in capsys.readouterr().out

    @pytest.mark.slow
    def test_env_rules_are_checked_too(self, policy_file: Path) -> None:
        """Rules from DEVPOLICY_RULES are linted with their origin."""
        result = run_cli("check", str(policy_file), "--json", env={"DEVPOLICY_RULES": "*=cpu"})
        payload = json.loads(result.stdout)
        assert result.returncode == 1
        assert {f["code"] for f in payload["findings"]} == {"unreachable-rule"}


class TestExplain:
    def test_explain_shows_each_rule_and_the_decision(
        self, policy_file: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Each rule tried with its origin and the final device."""
        assert main(["explain", "model/w", "--policy", str(policy_file)]) == 0
        out = capsys.readouterr().out
        assert "skip: glob 'dataset/*' does not match" in out
        assert "match: glob 'model/*' matches" in out
        assert "decision: cpu:2" in out

    @pytest.mark.slow
    def test_explain_json_includes_fallback_steps_and_layers(self, policy_file: Path) -> None:
        """JSON lists rules with layers, fallback steps and the decision's fields."""
        result = run_cli(
            "explain",
            "model/w",
            "--bytes",
            "1GiB",
            "--policy",
            str(policy_file),
            "--json",
            env={"DEVPOLICY_RULES": "model/*=cpu:9"},
        )
        assert result.returncode == 0, result.stderr
        payload = json.loads(result.stdout)
        assert [(r["layer"], r["matched"]) for r in payload["rules"]] == [("env", True)]
        assert payload["fallback"][0]["target"] == "cpu:9"
        assert payload["decision"]["device"] == "cpu:0"
        assert payload["nbytes"] == 2**30

    def test_explain_shows_the_transfers_setting_with_its_layer(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`transfers:` and DEVPOLICY_TRANSFERS show in explain, each field with its layer;
        a policy without them shows no transfers line."""
        policy = write(tmp_path / "p.yaml", "version: 1\ntransfers: log\n")
        monkeypatch.setenv("DEVPOLICY_TRANSFERS", "device_to_device=disallow")
        assert main(["explain", "model/w", "--policy", str(policy)]) == 0
        out = capsys.readouterr().out
        assert (
            "transfers.device_to_device: disallow (source env; origin env:DEVPOLICY_TRANSFERS)"
            in out
        )
        assert "transfers.host_to_device: log (source policy; origin " in out
        monkeypatch.delenv("DEVPOLICY_TRANSFERS")
        plain = write(tmp_path / "plain.yaml", "version: 1\n")
        assert main(["explain", "model/w", "--policy", str(plain), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["transfers"] == {}

    def test_explain_shape_shows_the_spec_or_why_it_does_not_divide(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--shape decides a sharding rule for that shape: its spec and share, or the reason."""
        policy = write(
            tmp_path / "p.yaml",
            "version: 1\nfallback: [cpu]\nmeshes:\n  grid: {axes: {data: 2, model: 2}, devices: cpu}\n"
            "rules:\n  - match: 'm/*'\n    sharding: {mesh: grid, spec: [data, model]}\n",
        )
        args = ["explain", "m/w", "--bytes", "4KiB", "--policy", str(policy)]
        assert main([*args, "--shape", "32,32"]) == 0
        out = capsys.readouterr().out
        assert "decision: grid[data,model]" in out
        assert "sharded over mesh 'grid': 4 pieces on 4 devices; 1.0 KiB per device" in out
        assert main([*args, "--shape", "33x32"]) == 0
        out = capsys.readouterr().out
        assert "dim 0 of 33 does not divide by axis 'data' (2)" in out
        assert "decision: cpu:0" in out

    def test_explain_on_a_described_machine(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--devices/--processes decide on a machine you do not have, through the same walk."""
        policy = write(
            tmp_path / "p.yaml",
            "version: 1\nfallback: [cpu]\nmeshes:\n  m: {axes: {data: -1}, devices: gpu}\n"
            "rules:\n  - match: 'w'\n    sharding: {mesh: m, spec: [data]}\n",
        )
        args = ["explain", "w", "--bytes", "64MiB", "--shape", "4096,4096", "--policy", str(policy)]
        assert main([*args, "--devices", "gpu=8x80GiB", "--processes", "2"]) == 0
        out = capsys.readouterr().out
        assert "decision: m[data]" in out
        assert "16 pieces on 16 devices; 4.0 MiB per device" in out
        assert main([*args, "--processes", "2"]) == 2
        assert "add --devices" in capsys.readouterr().err

    def test_a_bad_shape_is_a_usage_error(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--shape takes whole dimensions; anything else exits 2 naming the form."""
        with pytest.raises(SystemExit) as exit_info:
            main(["explain", "x", "--shape", "8,a"])
        assert exit_info.value.code == 2
        assert (
            "not a shape: '8,a'; accepted: dimensions separated by commas"
            in capsys.readouterr().err
        )

    def test_explain_without_a_device_exits_1(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A strict miss is explained and exits 1."""
        path = write(tmp_path / "p.yaml", "version: 1\nstrict: true\ndefault: cpu:9\n")
        assert main(["explain", "x", "--policy", str(path)]) == 1
        assert "no device for 'cpu:9'" in capsys.readouterr().out


class TestPlan:
    def test_plan_table_and_device_totals(
        self, checkpoint: Path, policy_file: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Each tensor's device and each device's planned bytes against free memory."""
        policy = write(
            policy_file.parent / "p.yaml",
            "version: 1\nrules:\n  - {match: '*/tokens', device: cpu:1}\n  - {match: '*', device: cpu:2}\n",
        )
        assert main(["plan", str(checkpoint), "--policy", str(policy)]) == 0
        out = capsys.readouterr().out
        assert "train/tokens" in out
        assert "cpu:1" in out
        assert "2.0 KiB" in out
        assert "Per device" in out

    def test_plan_separator_names_dotted_keys_in_parts(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`--separator .` reads `model.layers.0.w` as `<prefix>/model/layers/0/w`."""
        path = tmp_path / "llama.safetensors"
        devpolicy.save_file({"model.layers.0.w": np.zeros(4, np.float32)}, path)
        policy = write(
            tmp_path / "p.yaml", "version: 1\nrules:\n  - {match: '*/layers/*', device: cpu:3}\n"
        )
        args = ["plan", str(path), "--policy", str(policy), "--json"]
        assert main([*args, "--separator", "."]) == 0
        (tensor,) = json.loads(capsys.readouterr().out)["tensors"]
        assert (tensor["name"], tensor["device"]) == ("llama/model/layers/0/w", "cpu:3")
        assert main([*args, "--separator", "::"]) == 2
        assert "--separator takes one character" in capsys.readouterr().err

    @pytest.mark.slow
    def test_plan_json_flags_what_does_not_fit(self, checkpoint: Path, tmp_path: Path) -> None:
        """JSON has per-tensor decisions and per-device fit; an unplaceable tensor exits 1."""
        policy = write(
            tmp_path / "p.yaml",
            "version: 1\nstrict: true\nrules:\n  - {match: '*/w', device: cpu:9}\n  - {match: '*', device: cpu:1}\n",
        )
        result = run_cli("plan", str(checkpoint), "--policy", str(policy), "--json")
        assert result.returncode == 1
        payload = json.loads(result.stdout)
        by_name = {t["name"]: t for t in payload["tensors"]}
        assert by_name["train/tokens"]["device"] == "cpu:1"
        assert by_name["train/w"]["device"] is None
        assert by_name["train/w"]["error"].startswith("no device for 'cpu:9'")

    def test_plan_of_a_corrupt_file_is_an_input_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A bad file exits 2 with the loader's message."""
        (tmp_path / "bad.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{}")
        assert main(["plan", str(tmp_path / "bad.safetensors")]) == 2
        assert "header length 5 is larger than the rest of the file" in capsys.readouterr().err


class TestSchemaAndAlign:
    @pytest.mark.slow
    def test_schema_is_the_models_json_schema(self) -> None:
        """`devpolicy schema` prints the JSON Schema, matching policies/devpolicy.schema.json."""
        result = run_cli("schema")
        assert result.returncode == 0
        assert json.loads(result.stdout) == devpolicy.policy_schema()
        assert schema_form(
            json.loads((REPO / "policies" / "devpolicy.schema.json").read_text())
        ) == schema_form(devpolicy.policy_schema())

    def test_schema_as_a_function_call(self, capsys: pytest.CaptureFixture[str]) -> None:
        """main(["schema"]) prints the same schema."""
        assert main(["schema"]) == 0
        assert json.loads(capsys.readouterr().out)["title"] == "devpolicy policy"

    @pytest.mark.slow
    def test_align_rewrites_for_zero_copy(self, tmp_path: Path) -> None:
        """`devpolicy align IN OUT` writes a copy whose tensors start aligned."""
        from safetensors.numpy import save_file as plain

        plain({"tokens": np.arange(4096, dtype=np.uint16)}, str(tmp_path / "in.safetensors"))
        result = run_cli(
            "align", str(tmp_path / "in.safetensors"), str(tmp_path / "out.safetensors")
        )
        assert result.returncode == 0, result.stderr
        assert "1 of 1 tensors (100% of the bytes) start at 64-byte offsets" in result.stdout
        assert devpolicy.plan(tmp_path / "out.safetensors").tensors[0].offset % 64 == 0

    def test_align_of_a_missing_file_exits_2(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A missing input is an input error."""
        assert (
            main(["align", str(tmp_path / "nope.safetensors"), str(tmp_path / "out.safetensors")])
            == 2
        )
        assert "no such file" in capsys.readouterr().err


class TestOsErrors:
    def test_align_into_a_missing_directory_exits_2(
        self, checkpoint: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A destination that cannot be written is an input error with the path."""
        assert (
            main(
                [
                    "align",
                    str(checkpoint),
                    str(checkpoint.parent / "no" / "such" / "out.safetensors"),
                ]
            )
            == 2
        )
        err = capsys.readouterr().err
        assert "out.safetensors: cannot write: the directory" in err
        assert "does not exist" in err
        assert ".tmp" not in err

    @pytest.mark.slow
    def test_closed_pipe_is_not_a_crash(self, checkpoint: Path) -> None:
        """`devpolicy plan --json | head -1` ends quietly."""
        result = subprocess.run(
            f"{sys.executable} -m devpolicy plan --all --json {checkpoint} | head -c 10",
            shell=True,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert "Traceback" not in result.stderr


MARKUP_NAMES = [
    "[/]",
    "a[/b]c",
    "[bold]x",
    "[link=https://example.invalid]click[/link]",
    "e\x1b[31mred",
]


class TestDataIsShownLiterally:
    """Strings from files, policies and the command line are shown as written, never obeyed."""

    @pytest.fixture
    def marked(self, tmp_path: Path) -> Path:
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({name: np.zeros(2, np.float32) for name in MARKUP_NAMES}, path)
        return path

    @pytest.fixture
    def marked_policy(self, tmp_path: Path) -> Path:
        (tmp_path / "pol[").mkdir()
        return write(
            tmp_path / "pol[" / "b]c.yaml",
            "version: 1\nrules:\n  - match: '[[]bold]*'\n    device: cpu:1\n",
        )

    @pytest.mark.slow
    def test_plan_shows_markup_in_tensor_names_and_prefix_literally(
        self, marked: Path, marked_policy: Path
    ) -> None:
        """`plan` on names like `[/]` and with `--prefix '[/x]'` prints them; it used to crash."""
        result = run_cli(
            "plan", str(marked), "--prefix", "[/x]", "--policy", "pol[/b]c.yaml", cwd=marked.parent
        )
        assert result.returncode == 0, result.stderr
        for name in [
            "[/x]/[/]",
            "[/x]/a[/b]c",
            "[/x]/[bold]x",
            "[link=https://example.invalid]click[/link]",
        ]:
            assert name in result.stdout
        assert "\x1b" not in result.stdout
        assert r"e\x1b[31mred" in result.stdout
        assert "Traceback" not in result.stderr

    @pytest.mark.slow
    def test_explain_and_check_show_a_markup_policy_path_literally(
        self, marked_policy: Path
    ) -> None:
        """`explain --policy 'pol[/b]c.yaml'` and `check` print the path and name as written."""
        cwd = marked_policy.parent.parent
        explained = run_cli("explain", "[bold]x", "--policy", "pol[/b]c.yaml", cwd=cwd)
        assert explained.returncode == 0, explained.stderr
        assert "[bold]x (size unknown) under pol[/b]c.yaml" in explained.stdout
        checked = run_cli("check", "pol[/b]c.yaml", cwd=cwd)
        assert checked.returncode == 0, checked.stderr
        assert "policy: pol[/b]c.yaml" in checked.stdout

    @pytest.mark.slow
    def test_control_characters_in_errors_are_made_visible(self, tmp_path: Path) -> None:
        """An escape sequence in a path reaches the terminal as text, not as a command."""
        result = run_cli("check", "p\x1b[2Jq.yaml", cwd=tmp_path)
        assert result.returncode == 1
        assert "\x1b" not in result.stdout + result.stderr
        assert r"p\x1b[2Jq.yaml" in result.stdout

    def test_visible_escapes_control_and_bidi_characters(self) -> None:
        """The CLI's one display helper escapes C0, DEL, C1 and bidi overrides, keeping the rest."""
        from devpolicy._base.visible import visible as _visible
        from devpolicy._cli.common import lit as _lit

        assert _visible("a\x1b[1m\x07\x7f\x9b\u202eb[/]é") == r"a\x1b[1m\x07\x7f\x9b\u202eb[/]é"
        assert _lit("[bold]x").plain == "[bold]x"


class TestClosedPipes:
    @pytest.mark.slow
    @pytest.mark.parametrize("command", ["plan", "explain"])
    def test_table_output_closed_early_exits_0(self, command: str, tmp_path: Path) -> None:
        """`devpolicy plan --all FILE | head -1` exits 0, not 1 ("findings"), and prints no traceback."""
        path = tmp_path / "many.safetensors"
        devpolicy.save_file({f"t{i}": np.zeros(1, np.uint8) for i in range(3000)}, path)
        rules = "".join(f"  - match: 'nomatch{i}'\n    device: cpu\n" for i in range(3000))
        write(tmp_path / "p.yaml", "version: 1\nrules:\n" + rules)
        args = f"plan --all {path}" if command == "plan" else "explain x --policy p.yaml"
        environ = {k: v for k, v in os.environ.items() if not k.startswith("DEVPOLICY_")}
        result = subprocess.run(
            [
                "bash",
                "-c",
                f'{sys.executable} -m devpolicy {args} | head -c 1 >/dev/null; echo "rc=${{PIPESTATUS[0]}}"',
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            cwd=tmp_path,
            env=environ,
        )
        assert result.stdout.strip() == "rc=0", result.stderr
        assert "Traceback" not in result.stderr


class TestAlignArguments:
    @pytest.mark.slow
    @pytest.mark.parametrize("align", ["1099511627776", "3", "0"])
    def test_bad_align_is_an_input_error_before_any_allocation(
        self, checkpoint: Path, align: str
    ) -> None:
        """`align --align 1099511627776` exits 2 with the accepted range (it used to MemoryError)."""
        result = run_cli(
            "align", str(checkpoint), str(checkpoint.parent / "o.safetensors"), "--align", align
        )
        assert result.returncode == 2
        assert "align must be a power of two from 1 to 16777216" in result.stderr
        assert "Traceback" not in result.stderr
        assert not (checkpoint.parent / "o.safetensors").exists()


class TestPlanCapacity:
    @pytest.fixture
    def tokens(self, tmp_path: Path) -> Path:
        path = tmp_path / "train.safetensors"
        devpolicy.save_file({"tokens": np.zeros(4096, np.uint16)}, path)
        return path

    def test_capacity_plans_for_another_machine(
        self, tokens: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`--capacity cpu:0=2KiB`: 8 KiB read into memory does not fit, exit 1 (taken
        unjudged by `fits: false`: the device's row says it does not fit)."""
        policy = write(
            tmp_path / "p.yaml",
            "version: 1\nrules:\n  - {match: '*', device: cpu:0, fits: false}\n",
        )
        args = ["plan", str(tokens), "--policy", str(policy), "--capacity", "cpu:0=2KiB"]
        assert main([*args, "--json"]) == 1
        (device,) = json.loads(capsys.readouterr().out)["devices"]
        assert (device["free"], device["fits"], device["file_backed"]) == (2048, False, 0)

    def test_mapped_file_fits_under_an_mmap_rule(
        self, tokens: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The same file under `mmap: true` (dataset-on-host) is file-backed: it fits, exit 0."""
        policy = write(
            tmp_path / "p.yaml",
            "version: 1\nrules:\n  - {match: '*/tokens', device: cpu:0, mmap: true}\n",
        )
        args = ["plan", str(tokens), "--policy", str(policy), "--capacity", "cpu:0=2KiB"]
        assert main(args) == 0
        out = capsys.readouterr().out
        assert "8.0 KiB" in out
        assert "yes" in out

    @pytest.mark.parametrize("bad", ["gpu0", "gpu:0=lots", "=1GiB", "bogus:0=1GiB"])
    def test_bad_capacity_is_a_usage_error(
        self, tokens: Path, bad: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A malformed --capacity exits 2 with a message, no traceback."""
        with pytest.raises(SystemExit) as info:
            main(["plan", str(tokens), "--capacity", bad])
        err = capsys.readouterr().err
        assert info.value.code == 2
        assert "--capacity" in err
        assert "Traceback" not in err

    def test_capacity_for_a_device_this_machine_lacks_is_a_usage_error(
        self, tokens: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A stated device that is not here would never be judged: exit 2, saying so."""
        assert main(["plan", str(tokens), "--capacity", "cpu:9=1GiB"]) == 2
        err = capsys.readouterr().err
        assert "--capacity names cpu:9, which this machine lacks (devices here: cpu:0" in err


NOT_COUNTS = ["٣", "²", "+3", " 3", "3 ", "-1", "0", "9" * 5000]


class TestMachineCounts:
    """`--devices` and `--processes` read counts alike: ASCII digits, nothing around them."""

    @pytest.mark.parametrize("count", NOT_COUNTS)
    def test_processes_takes_ascii_digits_only(
        self, count: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """'٣', '²', '+3', ' 3' and a 5,000-digit count are usage errors naming the form."""
        with pytest.raises(SystemExit) as exit_info:
            main(["explain", "x", "--devices", "gpu=1", "--processes", count])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "is not a process count; accepted: a whole number 1..65536, in the digits 0-9" in err
        assert len(err) < 1000

    @pytest.mark.parametrize("count", NOT_COUNTS)
    def test_devices_takes_ascii_digits_only(
        self, count: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The same counts in `--devices gpu=COUNT` are usage errors too."""
        with pytest.raises(SystemExit) as exit_info:
            main(["explain", "x", "--devices", f"gpu={count}x8GiB"])
        assert exit_info.value.code == 2
        assert "accepted: BACKEND=COUNTxSIZE" in capsys.readouterr().err

    @pytest.mark.parametrize("count", NOT_COUNTS)
    def test_virtual_machine_raises_machine_spec_error_for_each(self, count: str) -> None:
        """The Python API parses the same text the same way, never with a raw ValueError."""
        with pytest.raises(
            devpolicy.errors.MachineSpecError,
            match=r"^devices 'gpu=.*': .*(COUNT: the digits 0-9, nothing else|a count of .*devices \(1\.\.65536\))",
        ) as info:
            devpolicy.VirtualMachine([f"gpu={count}"])
        assert type(info.value) is devpolicy.errors.MachineSpecError

    def test_a_5000_digit_count_names_its_length(self) -> None:
        """A count too long for `int` is out of range, said in a line a person can read."""
        with pytest.raises(
            devpolicy.errors.MachineSpecError,
            match=r"a count of 5,000 digits of devices \(1\.\.65536\)",
        ):
            devpolicy.VirtualMachine(["gpu=" + "9" * 5000])


class TestPlanSaysWhatAndWhy:
    def test_plan_help_names_directories_and_index_files(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`plan --help` says it takes a checkpoint directory or an index, not only a file."""
        with pytest.raises(SystemExit):
            main(["plan", "--help"])
        out = " ".join(capsys.readouterr().out.split())
        assert "CKPT a .safetensors file, a checkpoint directory or its index" in out
        assert "(model.safetensors.index.json)" in out

    def test_a_sharding_passed_over_without_fallback_says_why_in_its_note(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The row points to a note that says what `explain` says: dim 0 of 10 does not
        divide by 'data' (8)."""
        path = tmp_path / "c.safetensors"
        devpolicy.save_file({"w": np.zeros((10, 4), np.float32)}, path)
        policy = write(
            tmp_path / "p.yaml",
            "version: 1\nmeshes:\n  pod: {axes: {data: 8}, devices: cpu}\n"
            "rules:\n  - match: c/w\n    sharding: {mesh: pod, spec: [data]}\n",
        )
        assert main(["plan", str(path), "--policy", str(policy), "--devices", "cpu=8"]) == 1
        out = capsys.readouterr().out
        assert "no device [1]" in out
        assert "[1] c/w:\n  no device for 'pod[data]' (rule " in out
        assert "(no fallback given)" in out
        assert "pod[data]: dim 0 of 10 does not divide by axis 'data' (8)" in out
        assert "available:" not in out

    def test_tensors_that_fail_alike_share_one_note_and_keep_their_rows_short(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """50 of 100 tensors that no mesh divides: each reason once, in a numbered note
        naming a few of them; each of their rows one line, pointing to it."""
        path = tmp_path / "c.safetensors"
        rows = {
            f"layers.{i:03d}.w": np.zeros((10 if i % 2 else 16, 4), np.float32) for i in range(100)
        }
        rows["odd"] = np.zeros((3,), np.float32)
        devpolicy.save_file(rows, path)
        policy = write(
            tmp_path / "p.yaml",
            "version: 1\nstrict: true\nmeshes:\n  pod: {axes: {data: 8}, devices: cpu}\n"
            "rules:\n  - match: '*'\n    sharding: {mesh: pod, spec: [data]}\n",
        )
        argv = ["plan", str(path), "--policy", str(policy), "--devices", "cpu=8", "--all"]
        assert main(argv) == 1
        out = capsys.readouterr().out
        assert out.count("dim 0 of 10 does not divide by axis 'data' (8)") == 1
        assert out.count("dim 0 of 3 does not divide by axis 'data' (8)") == 1
        assert "[1] c/layers.001.w, c/layers.003.w, c/layers.005.w and 47 more:\n" in out
        assert "[2] c/odd:\n" in out
        assert out.count("no device [1]") == 50
        assert out.count("no device [2]") == 1
        assert "for name" not in out


class TestAcceleratorOnDescribedMachines:
    @pytest.mark.parametrize(
        ("devices", "resolved"),
        [("tpu=1x16GiB", "accelerator:0 -> tpu:0"), ("gpu=2x80GiB", "accelerator:0 -> gpu:0")],
    )
    def test_explain_prints_the_resolution(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], devices: str, resolved: str
    ) -> None:
        """`explain --devices tpu=...` resolves `accelerator` there and says to what."""
        path = write(
            tmp_path / "p.yaml",
            "version: 1\nrules:\n  - match: 'model/*'\n    device: accelerator\n    fallback: [cpu]\n",
        )
        assert main(["explain", "model/w", "--policy", str(path), "--devices", devices]) == 0
        out = capsys.readouterr().out
        assert f"resolved: {resolved}" in out
        assert f"decision: {resolved.split(' -> ')[1]} (requested accelerator" in out

    def test_check_of_a_tpu_list_without_libtpu_is_valid(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`platforms: [tpu, gpu, cpu]` here: nothing but the CPU is installed, so JAX would
        start the CPU, and check finds nothing to say about it."""
        path = write(tmp_path / "p.yaml", "version: 1\nruntime:\n  platforms: [tpu, gpu, cpu]\n")
        assert main(["check", str(path)]) == 0
        assert "valid, no findings" in capsys.readouterr().out
