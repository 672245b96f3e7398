"""Nothing silent: what each rule took, rules that took nothing, tensors left unsharded,
`check --names`, `plan`'s exit status and headroom, and events no one would see."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._cli.common import EXIT_NOT_SHARDED
from devpolicy._cli.main import main
from tests.conftest import REPO
from tests.helpers import policy_of, safetensors_bytes, write

MESH = {"m": {"axes": {"data": -1}, "devices": "cpu"}}


def _hf_checkpoint(tmp_path: Path) -> Path:
    """A Hugging Face-style checkpoint folder: `.` between the parts of each key."""
    folder = tmp_path / "llama-tiny"
    folder.mkdir(parents=True)
    devpolicy.save_file(
        {
            "model.embed_tokens.weight": np.zeros((32, 8), np.float32),
            "model.layers.0.mlp.up_proj.weight": np.zeros((16, 8), np.float32),
            "model.layers.0.input_layernorm.weight": np.zeros(8, np.float32),
            "lm_head.weight": np.zeros((32, 8), np.float32),
        },
        folder / "model.safetensors",
    )
    return folder


# The case: kernels and embeddings sharded by a flax-style regex; HF names differ.
FLAX_STYLE = [
    {"regex": ".*/(kernel|embedding)", "sharding": {"mesh": "m", "spec": ["data"]}},
    {"match": "dataset/*", "device": "cpu"},
]


class TestPlanCountsEveryRule:
    def test_each_rule_with_what_it_took_then_the_default(self, tmp_path: Path) -> None:
        policy = policy_of(
            meshes=MESH,
            names={"separator": "."},
            rules=[
                {
                    "search": "(up_proj|embed_tokens)/weight",
                    "sharding": {"mesh": "m", "spec": ["data"]},
                },
                {"match": "*", "ndim": 1, "device": "cpu"},
                {"match": "*", "device": "cpu"},
            ],
        )
        plan = devpolicy.plan(_hf_checkpoint(tmp_path), policy=policy)
        assert [(u.label, u.tensors, u.sharded) for u in plan.rules] == [
            ("search '(up_proj|embed_tokens)/weight'", 2, 2),
            ("'*' ndim 1", 1, 0),
            ("'*'", 1, 0),
            ("default", 0, 0),
        ]
        assert [u.catch_all for u in plan.rules] == [False, False, True, True]
        assert plan.rules[0].nbytes == 32 * 8 * 4 + 16 * 8 * 4
        text = str(plan)
        assert "rules:\n" in text
        assert "<mapping>:rules[0] search '(up_proj|embed_tokens)/weight': 2 tensors" in text

    def test_a_rule_that_took_nothing_while_the_default_took_all_is_a_warning(
        self, tmp_path: Path
    ) -> None:
        """The issue's HF case: no rule matches; the plan says which and how names look."""
        plan = devpolicy.plan(
            _hf_checkpoint(tmp_path), policy=policy_of(meshes=MESH, rules=FLAX_STYLE)
        )
        codes = [code for code, _ in plan.warnings]
        assert codes == ["rule-matched-nothing", "not-sharded"]
        nothing = plan.warnings[0][1]
        assert "rule <mapping>:rules[0] ('.*/(kernel|embedding)') took no tensor" in nothing
        assert "the default took 4" in nothing
        assert "names look like 'llama-tiny/lm_head.weight'" in nothing
        assert "4 tensors (2.5 KiB) placed whole by the default" in plan.warnings[1][1]
        assert plan.sharded_nothing

    def test_a_rule_for_other_names_is_not_blamed(self, tmp_path: Path) -> None:
        """`dataset/*` in a model's plan: no name holds `dataset`, so it was written for
        other names; it is counted, not warned about."""
        plan = devpolicy.plan(
            _hf_checkpoint(tmp_path), policy=policy_of(meshes=MESH, rules=FLAX_STYLE)
        )
        assert [u.applies for u in plan.rules] == [True, False, True]
        assert not any("dataset" in message for _, message in plan.warnings)

    def test_every_tensor_taken_by_its_own_rule_is_quiet(self, tmp_path: Path) -> None:
        policy = policy_of(
            meshes=MESH,
            names={"separator": "."},
            rules=[
                {"search": "weight$", "ndim": 2, "sharding": {"mesh": "m", "spec": ["data"]}},
                {"search": "norm", "device": "cpu"},
                {"match": "dataset/*", "device": "cpu"},
            ],
        )
        plan = devpolicy.plan(_hf_checkpoint(tmp_path), policy=policy)
        assert plan.warnings == []
        assert not plan.sharded_nothing

    def test_a_sharding_catch_all_is_not_reported_as_placed_whole(self, tmp_path: Path) -> None:
        """EasyLM's `.*` -> PS(None) replicates over the mesh: that is sharding, not whole."""
        policy = policy_of(
            meshes=MESH,
            rules=[
                {"search": "never-there", "sharding": {"mesh": "m", "spec": ["data"]}},
                {"search": ".*", "sharding": {"mesh": "m", "spec": []}},
            ],
        )
        plan = devpolicy.plan(_hf_checkpoint(tmp_path), policy=policy)
        assert [code for code, _ in plan.warnings] == ["rule-matched-nothing"]
        assert not plan.sharded_nothing


class TestPlanExitStatus:
    def test_plan_exits_3_when_the_policy_shards_but_nothing_is_sharded(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        policy = write(
            tmp_path / "p.yaml",
            "version: 1\nmeshes:\n  m: {axes: {data: -1}, devices: cpu}\nrules:\n"
            "  - regex: '.*/(kernel|embedding)'\n    sharding: {mesh: m, spec: [data]}\n",
        )
        checkpoint = _hf_checkpoint(tmp_path)
        assert main(["plan", str(checkpoint), "--policy", str(policy)]) == EXIT_NOT_SHARDED == 3
        out = capsys.readouterr().out
        assert "[rule-matched-nothing]" in out
        assert "no tensor is sharded on this process (exit 3)" in out
        assert main(["plan", str(checkpoint), "--policy", str(policy), "--json"]) == 3
        report = json.loads(capsys.readouterr().out)
        assert report["sharded_nothing"] is True
        assert [r["tensors"] for r in report["rules"]] == [0, 4]
        assert report["warnings"][0]["code"] == "rule-matched-nothing"

    def test_plan_exits_0_once_names_are_read_in_the_models_terms(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        policy = write(
            tmp_path / "p.yaml",
            "version: 1\nnames: {separator: '.'}\nmeshes:\n  m: {axes: {data: -1}, devices: cpu}\n"
            "rules:\n  - search: '/(weight)$'\n    ndim: 2\n    sharding: {mesh: m, spec: [data]}\n"
            "  - match: '*'\n    device: cpu\n",
        )
        assert main(["plan", str(_hf_checkpoint(tmp_path)), "--policy", str(policy)]) == 0

    def test_a_policy_without_sharding_rules_never_exits_3(self, tmp_path: Path) -> None:
        policy = write(tmp_path / "p.yaml", "version: 1\ndefault: cpu\n")
        assert main(["plan", str(_hf_checkpoint(tmp_path)), "--policy", str(policy)]) == 0


def _sparse_checkpoint(path: Path, nbytes: int) -> Path:
    """A one-tensor file of `nbytes` whose data is a hole: plan reads only the header."""
    header = {"w": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}
    with open(path, "wb") as f:
        f.write(safetensors_bytes(header))
        f.truncate(f.tell() + nbytes)
    return path


class TestPlanFitsKeepsHeadroom:
    @pytest.mark.parametrize(("headroom", "fits"), [("10%", False), (0.02, True), (0, True)])
    def test_1607_mib_on_a_1650_mib_device(
        self, tmp_path: Path, headroom: object, fits: bool
    ) -> None:
        """97% of the device: over the policy's 10% headroom, within 2%."""
        path = _sparse_checkpoint(tmp_path / "big.safetensors", 1607 * 2**20)
        machine = devpolicy.VirtualMachine(["gpu=1x1650MiB"])
        # `fits: false`: the rule takes gpu:0 whatever memory says; the plan still judges.
        policy = policy_of(
            headroom=headroom, rules=[{"match": "*", "device": "gpu:0", "fits": False}]
        )
        plan = devpolicy.plan(path, policy=policy, machine=machine)
        assert plan.tensors[0].decision is not None
        assert plan.devices[0].fits is fits
        assert plan.fits is fits


class TestLoadFileSays:
    def test_load_file_warns_about_rules_that_took_nothing_and_tensors_left_whole(
        self, tmp_path: Path
    ) -> None:
        policy = policy_of(meshes=MESH, rules=FLAX_STYLE)
        checkpoint = _hf_checkpoint(tmp_path)  # saved first: save_file's own events aside
        with capture_logs() as logs:
            policy.load_file(checkpoint)
        warnings = {e["event"]: e for e in logs if e["log_level"] == "warning"}
        assert set(warnings) == {"rule_matched_nothing", "not_sharded"}
        assert (
            "'.*/(kernel|embedding)') took no tensor" in warnings["rule_matched_nothing"]["message"]
        )
        assert warnings["not_sharded"]["checkpoint"].endswith("llama-tiny")

    def test_a_load_every_rule_names_warns_about_nothing(self, tmp_path: Path) -> None:
        policy = policy_of(
            meshes=MESH,
            names={"separator": "."},
            rules=[
                {"search": "weight$", "ndim": 2, "sharding": {"mesh": "m", "spec": ["data"]}},
                {"match": "*", "ndim": 1, "device": "cpu"},
            ],
        )
        checkpoint = _hf_checkpoint(tmp_path)  # saved first: save_file's own events aside
        with capture_logs() as logs:
            policy.load_file(checkpoint)
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == []


class TestCheckNames:
    def test_check_names_against_a_checkpoint(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        policy = write(
            tmp_path / "p.yaml",
            "version: 1\nmeshes:\n  m: {axes: {data: -1}, devices: cpu}\nrules:\n"
            "  - regex: 'model/layers/(0|1)/mlp/up_proj/weight'\n"
            "    sharding: {mesh: m, spec: [data]}\n  - match: 'llama-tiny/*'\n    device: cpu\n",
        )
        status = main(["check", str(policy), "--names", str(_hf_checkpoint(tmp_path)), "--json"])
        report = json.loads(capsys.readouterr().out)
        assert status == 0
        assert [(r["pattern"], r["tensors"]) for r in report["rules"]] == [
            ("'model/layers/(0|1)/mlp/up_proj/weight'", 0),
            ("'llama-tiny/*'", 4),
            ("default", 0),
        ]
        (finding,) = [f for f in report["findings"] if f["code"] == "rule-matched-nothing"]
        assert finding["origin"].endswith("p.yaml:5")
        assert (
            "matches none of the 4 names (e.g. 'llama-tiny/lm_head.weight')" in (finding["message"])
        )
        assert (
            main(["check", str(policy), "--names", str(tmp_path / "llama-tiny"), "--strict"]) == 2
        )

    def test_check_names_reads_the_policys_names_setting_and_prefix(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        policy = write(
            tmp_path / "p.yaml",
            "version: 1\nnames: {separator: '.'}\nrules:\n"
            "  - match: 'model/layers/*/mlp/up_proj/weight'\n    device: cpu\n",
        )
        checkpoint = str(_hf_checkpoint(tmp_path))
        assert main(["check", str(policy), "--names", checkpoint, "--prefix", "", "--strict"]) == 0
        out = capsys.readouterr().out
        assert "against 4 names" in out
        assert "'model/layers/*/mlp/up_proj/weight': 1 name" in out

    @pytest.mark.parametrize(
        "dump",
        [
            ["params/attention/wq/kernel", "params/lm_head/kernel"],
            {
                "params/attention/wq/kernel": {"shape": [8, 8], "dtype": "float32"},
                "params/lm_head/kernel": {"shape": [8, 32], "dtype": "BF16"},
            },
        ],
        ids=["list", "object"],
    )
    def test_check_names_against_a_dumped_tree(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], dump: object
    ) -> None:
        """A regex pasted from EasyLM matches none of the names; as search: it would."""
        policy = write(
            tmp_path / "p.yaml",
            "version: 1\nrules:\n  - regex: 'attention/(wq|wk|wv)/kernel'\n    device: cpu\n",
        )
        names = tmp_path / "tree.json"
        names.write_text(json.dumps(dump))
        assert main(["check", str(policy), "--names", str(names)]) == 0
        out = capsys.readouterr().out
        assert "matches none of the 2 names" in out
        assert "but was written for 1 of them (e.g. 'params/attention/wq/kernel')" in out
        assert "as `search: 'attention/(wq|wk|wv)/kernel'` it would find them" in out

    def test_check_names_says_which_rule_shadows_a_rule_and_is_quiet_about_it(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The demo's policy against its dataset file: `*/tokens` and `dataset/*` are
        shadowed by the `file:` rule; listed with that reason, no warning (27 item 1)."""
        data = tmp_path / "dataset.safetensors"
        devpolicy.save_file({"tokens": np.arange(64, dtype=np.uint16)}, data)
        demo = str(REPO / "policies" / "dataset-on-host.yaml")
        assert main(["check", demo, "--names", str(data)]) == 0
        out = capsys.readouterr().out
        assert "'*/tokens': 0 names (shadowed by rule 1 (" in out
        assert "file 'dataset*.safetensors'), which took its 1 name first)" in out
        assert "rule-matched-nothing" not in out
        assert main(["check", demo, "--names", str(data), "--json"]) == 0
        rules = json.loads(capsys.readouterr().out)["rules"]
        assert [r["status"] for r in rules][1:4] == ["took", "shadowed", "shadowed"]

    def test_check_names_suggests_the_name_a_misspelt_rule_meant(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`modle/*` against names `model/...`: did you mean `model/*` (27 item 7)."""
        policy = write(
            tmp_path / "p.yaml", "version: 1\nrules:\n  - match: 'modle/*'\n    device: cpu\n"
        )
        names = tmp_path / "tree.json"
        names.write_text(json.dumps(["model/embed", "model/out"]))
        assert main(["check", str(policy), "--names", str(names)]) == 0
        out = capsys.readouterr().out
        assert "rule 0 ('modle/*') matches none of the 2 names (e.g. 'model/embed'), but was" in out
        assert "did you mean 'model/*'? [rule-matched-nothing]" in out

    @pytest.mark.parametrize(
        ("dump", "message"),
        [
            ("{", r"tree\.json: not JSON"),
            ("[1, 2]", r"tree\.json: a list of names is not accepted"),
            (
                '{"w": {"shape": [2, -1]}}',
                r"entry 'w': shape \[2, -1\] is not a list of whole numbers",
            ),
            ('{"w": {"dtype": "float99"}}', r"entry 'w': unknown dtype 'float99'; accepted: numpy"),
            ('{"w": {"size": 3}}', r"entry 'w': \{'size': 3\} is not"),
        ],
    )
    def test_a_bad_dump_is_a_usage_error_naming_the_entry(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], dump: str, message: str
    ) -> None:
        import re

        policy = write(tmp_path / "p.yaml", "version: 1\n")
        names = tmp_path / "tree.json"
        names.write_text(dump)
        assert main(["check", str(policy), "--names", str(names)]) == 2
        assert re.search(message, capsys.readouterr().err)


class TestOverridesKeepHowARuleLoads:
    def test_devpolicy_rules_override_keeps_mmap(self, tmp_path: Path) -> None:
        """`DEVPOLICY_RULES='dataset/*=cpu'` over a rule with `mmap: true`: still mapped."""
        policy_path = write(
            tmp_path / "p.yaml",
            "version: 1\nrules:\n  - match: 'dataset/*'\n    device: cpu:1\n    mmap: true\n",
        )
        data = tmp_path / "dataset.safetensors"
        devpolicy.save_file({"tokens": np.arange(4096, dtype=np.int32)}, data)
        policy = devpolicy.load_policy(policy_path, environ={"DEVPOLICY_RULES": "dataset/*=cpu"})
        assert policy.rules[0].source == "env"
        assert policy.decide("dataset/tokens").mmap is True
        with capture_logs() as logs:
            policy.load_file(data)
        (summary,) = [e for e in logs if e["event"] == "load_file"]
        assert summary["mapped"] == 1

    def test_an_override_without_a_matching_rule_is_unchanged(self, tmp_path: Path) -> None:
        policy_path = write(
            tmp_path / "p.yaml",
            "version: 1\nrules:\n  - match: 'dataset/*'\n    device: cpu:1\n    mmap: true\n",
        )
        policy = devpolicy.load_policy(policy_path, environ={"DEVPOLICY_RULES": "data/*=cpu"})
        assert policy.decide("data/x").mmap is False


class TestPutSummary:
    def test_put_of_a_tree_is_one_info_event(self, cpus: list[jax.Device]) -> None:
        """One `put` event per call (info the first time); each leaf's decision is debug."""
        policy = policy_of(
            default="cpu:0",
            rules=[{"match": "model/w*", "device": "cpu:1"}],
            logging={"level": "debug"},
        )
        tree = {f"w{i}": np.zeros(4, np.float32) for i in range(5)} | {"b": np.zeros(4, np.float32)}
        with capture_logs() as logs:
            policy.put("model", tree)
            policy.put("model", tree)
        info = [e for e in logs if e["log_level"] == "info"]
        assert [e["event"] for e in info] == ["put"]
        assert info[0]["leaves"] == 6
        assert info[0]["devices"] == "cpu:0 16 B (1 leaf), cpu:1 80 B (5 leaves)"
        assert info[0]["rules"] == "<mapping>:default x1, <mapping>:rules[0] x5"
        debug = [e["event"] for e in logs if e["log_level"] == "debug"]
        assert debug.count("placement") == 12
        assert debug.count("put") == 1

    def test_put_of_one_array_logs_its_placement(self) -> None:
        policy = policy_of(default="cpu:1")
        with capture_logs() as logs:
            policy.put("x", np.zeros(2, np.float32))
        assert [(e["event"], e["log_level"]) for e in logs] == [("placement", "info")]
