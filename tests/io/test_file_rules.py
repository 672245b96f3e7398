"""Rules by file: `file:` selects tensors by the file they come from, so a rule cannot miss
a file whatever the default prefix names its tensors; the README's first policy keeps the
story's 19.09 GiB token file on the host of a 24 GiB GPU machine."""

from __future__ import annotations

import fnmatch
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

import devpolicy
from devpolicy._cli.main import main
from devpolicy._names.matching import SourceFile, compile_file_glob
from tests.conftest import REPO
from tests.helpers import policy_of, schema_form, sparse_tensor_file, write

README = REPO / "README.md"
#: The story: the `train` split of a token dataset, one uint16 tensor of 19.09 GiB.
STORY_TOKENS = 10_248_871_837
GiB = 2**30


def readme_first_policy() -> str:
    """The first YAML block of the README, as written there."""
    found = re.search(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert found is not None
    return found.group(1)


def exit_status(argv: list[str]) -> int | str | None:
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


GPU_MACHINE = ["gpu=1x24GiB"]


class TestTheStory:
    @pytest.fixture
    def readme_policy(self, tmp_path: Path) -> Path:
        return write(tmp_path / "devpolicy.yaml", readme_first_policy())

    @pytest.fixture
    def story_file(self, tmp_path: Path) -> Path:
        return sparse_tensor_file(tmp_path / "train.safetensors", STORY_TOKENS)

    def test_readme_policy_keeps_the_tokens_on_the_host_of_a_24gib_gpu_machine(
        self, readme_policy: Path, story_file: Path
    ) -> None:
        """`load_file("train.safetensors")` names the tensor `train/tokens` (the default
        prefix): the README's file rule still takes it, on the host, file-backed."""
        policy = devpolicy.load_policy(readme_policy, environ={})
        plan = devpolicy.plan(
            story_file, policy=policy, machine=devpolicy.VirtualMachine(GPU_MACHINE)
        )
        (tensor,) = plan.tensors
        assert (tensor.name, tensor.shape) == ("train/tokens", (STORY_TOKENS,))
        assert f"{tensor.nbytes / GiB:.2f}" == "19.09"
        assert tensor.decision is not None
        assert tensor.decision.device_text == "cpu:0"
        assert tensor.decision.source == "policy"
        assert policy.rules[tensor.decision.rule or 0].spec.file is not None
        assert [(d.device, d.file_backed) for d in plan.devices] == [("cpu:0", 2 * STORY_TOKENS)]
        assert plan.fits

    def test_readme_policy_keeps_a_3gib_token_file_off_the_gpu(
        self, readme_policy: Path, tmp_path: Path
    ) -> None:
        """A 3 GiB file fits the GPU, and `default: auto` would put it there: the file rule
        keeps it on the host (the trap of the issue: `train/tokens` missed `dataset/*`)."""
        path = sparse_tensor_file(tmp_path / "train.safetensors", 3 * GiB // 2)
        policy = devpolicy.load_policy(readme_policy, environ={})
        plan = policy.plan(path, machine=devpolicy.VirtualMachine(GPU_MACHINE))
        assert plan.tensors[0].decision is not None
        assert plan.tensors[0].decision.device_text == "cpu:0"

    def test_the_plan_command_keeps_the_tokens_on_the_host(
        self,
        readme_policy: Path,
        story_file: Path,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """`devpolicy plan train.safetensors --devices gpu=1x24GiB`: cpu:0, exit 0."""
        status = exit_status(
            [
                "plan",
                str(story_file),
                "--policy",
                str(readme_policy),
                "--json",
                "--devices",
                *GPU_MACHINE,
            ]
        )
        payload = json.loads(capsys.readouterr().out)
        assert status == 0
        assert [(t["name"], t["device"]) for t in payload["tensors"]] == [("train/tokens", "cpu:0")]

    def test_explain_with_the_file_says_which_rule_took_it(
        self, readme_policy: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`devpolicy explain train/tokens --file train.safetensors`: the file rule matches."""
        status = exit_status(
            [
                "explain",
                "train/tokens",
                "--bytes",
                str(2 * STORY_TOKENS),
                "--file",
                "train.safetensors",
                "--policy",
                str(readme_policy),
                "--devices",
                *GPU_MACHINE,
            ]
        )
        out = capsys.readouterr().out
        assert status == 0
        assert "file 'train*.safetensors' matches train.safetensors" in out
        assert "decision: cpu:0" in out

    def test_loading_with_the_readme_policy_decides_by_the_file_rule(
        self, readme_policy: Path, tmp_path: Path
    ) -> None:
        """The README's first `load_file` call, on this machine: decided by the file rule
        (the `load_file` event names it), mapped, on the host."""
        path = tmp_path / "train.safetensors"
        devpolicy.save_file({"tokens": np.arange(4096, dtype=np.uint16)}, path)
        policy = devpolicy.load_policy(readme_policy, environ={})
        with capture_logs() as logs:
            tokens = policy.load_file(path)["tokens"]
        assert tokens.devices() == {devpolicy.get_device("cpu")}
        (summary,) = [e for e in logs if e["event"] == "load_file"]
        file_rule = next(r for r in policy.rules if r.spec.file is not None)
        assert summary["rules"] == f"{file_rule.origin} x1"
        assert summary["mapped"] == 1


class TestThePlanCommandNamesTheRuleToWrite:
    def test_a_large_tensor_only_the_default_placed_gets_the_rule(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`plan` of a 19 GiB file no rule names: the rule that would keep it on the host."""
        path = sparse_tensor_file(tmp_path / "tokens.safetensors", STORY_TOKENS)
        policy = write(tmp_path / "p.yaml", "version: 1\ndefault: auto\nfallback: [gpu, cpu]\n")
        status = exit_status(
            ["plan", str(path), "--policy", str(policy), "--devices", *GPU_MACHINE]
        )
        out = capsys.readouterr().out
        assert status == 0
        assert (
            "tokens/tokens: 19.1 GiB placed by the default only (gpu:0); to say where it goes "
            'on every machine, add a rule:\n  - file: "tokens.safetensors"\n    device: cpu\n'
        ) in out


class TestFileConditions:
    def test_a_file_rule_never_matches_a_name_placed_without_a_file(self) -> None:
        """No file given: the rule is passed over, and explain says why."""
        policy = policy_of(rules=[{"file": "train.safetensors", "device": "cpu:1"}])
        assert policy.resolve("train/tokens").device_text == "cpu:0"
        e = policy.explain("train/tokens")
        ((_, step),) = e.steps
        assert not step.matched
        assert step.reason.startswith("file 'train.safetensors': no file given")
        assert policy.resolve("train/tokens", file="train.safetensors").device_text == "cpu:1"

    def test_a_file_rule_with_a_pattern_needs_both(self) -> None:
        """`match` and `file` together: the name and the file must both match."""
        policy = policy_of(
            rules=[{"match": "*/w", "file": "model*.safetensors", "device": "cpu:1"}]
        )
        assert policy.resolve("m/w", file="model.safetensors").device_text == "cpu:1"
        assert policy.resolve("m/b", file="model.safetensors").device_text == "cpu:0"
        assert policy.resolve("m/w", file="other.safetensors").device_text == "cpu:0"
        step = policy.explain("m/w", file="other.safetensors").steps[0][1]
        assert step.reason == (
            "glob '*/w' matches but file 'model*.safetensors' does not match other.safetensors"
        )

    def test_a_file_rule_with_a_size_needs_both(self) -> None:
        """`file` and `min_bytes`: a small tensor of the file is not taken."""
        policy = policy_of(
            rules=[{"file": "t.safetensors", "min_bytes": "1KiB", "device": "cpu:1"}]
        )
        assert policy.resolve("t/x", nbytes=4096, file="t.safetensors").device_text == "cpu:1"
        assert policy.resolve("t/x", nbytes=16, file="t.safetensors").device_text == "cpu:0"

    @pytest.mark.parametrize(
        ("glob", "path", "matches"),
        [
            ("train*.safetensors", "/data/train.safetensors", True),
            ("train*.safetensors", "train-00001.safetensors", True),
            ("train*.safetensors", "/data/train/val.safetensors", False),  # the name only
            ("data/*.safetensors", "/home/me/data/x.safetensors", True),  # a tail
            ("data/*.safetensors", "/home/me/mydata/x.safetensors", False),  # whole components
            ("data/*.safetensors", "data/x.safetensors", True),
            ("/data/*.safetensors", "/data/x.safetensors", True),
            ("/data/*.safetensors", "/home/data/x.safetensors", False),  # absolute: whole path
            ("*/x.safetensors", "x.safetensors", True),  # as resolved: under some directory
            ("x.SAFETENSORS", "x.safetensors", False),  # case-sensitive
        ],
    )
    def test_globs_match_names_or_path_tails(self, glob: str, path: str, matches: bool) -> None:
        """Without `/`, the file's name; with `/`, the path or a tail after a `/`."""
        assert compile_file_glob(glob)(SourceFile.of(path)) is matches

    def test_a_link_matches_by_what_it_points_at_too(self, tmp_path: Path) -> None:
        """`file:` is tried on the path as written and as resolved."""
        (tmp_path / "real").mkdir()
        target = tmp_path / "real" / "train.safetensors"
        devpolicy.save_file({"tokens": np.zeros(8, np.uint16)}, target)
        link = tmp_path / "current.safetensors"
        link.symlink_to(target)
        policy = policy_of(rules=[{"file": "train.safetensors", "device": "cpu:1"}])
        assert policy.plan(link).tensors[0].decision.device_text == "cpu:1"  # type: ignore[union-attr]
        by_link = policy_of(rules=[{"file": "current.safetensors", "device": "cpu:2"}])
        assert by_link.plan(link).tensors[0].decision.device_text == "cpu:2"  # type: ignore[union-attr]

    def test_a_checkpoint_matches_by_member_file_and_by_its_directory(self, tmp_path: Path) -> None:
        """A checkpoint's tensor is tried on its member file and on the checkpoint's path."""
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        devpolicy.save_file({"a": np.zeros(4, np.float32)}, ckpt / "part-1.safetensors")
        devpolicy.save_file({"b": np.zeros(4, np.float32)}, ckpt / "part-2.safetensors")
        by_member = policy_of(rules=[{"file": "part-1.safetensors", "device": "cpu:1"}])
        loaded = by_member.load_file(ckpt)
        assert [loaded[k].devices() for k in ("a", "b")] == [
            {devpolicy.get_device("cpu:1")},
            {devpolicy.get_device("cpu:0")},
        ]
        by_directory = policy_of(rules=[{"file": "ckpt", "device": "cpu:2"}])
        plan = by_directory.plan(ckpt)
        assert [t.decision.device_text for t in plan.tensors] == ["cpu:2", "cpu:2"]  # type: ignore[union-attr]

    def test_decisions_are_cached_per_file(self) -> None:
        """The same name from two files is decided twice: the cache key holds the file."""
        policy = policy_of(rules=[{"file": "a.safetensors", "device": "cpu:1"}])
        assert policy.resolve("x", file="a.safetensors").device_text == "cpu:1"
        assert policy.resolve("x", file="b.safetensors").device_text == "cpu:0"
        assert policy.resolve("x").device_text == "cpu:0"
        assert policy.resolve("x", file="a.safetensors").device_text == "cpu:1"

    def test_module_level_resolve_and_explain_take_a_file(self) -> None:
        """`devpolicy.resolve(..., file=)` and `devpolicy.explain(..., file=)`."""
        policy = policy_of(rules=[{"file": "a.safetensors", "device": "cpu:3"}])
        with devpolicy.activate(policy):
            assert devpolicy.resolve("x", file=Path("d/a.safetensors")).device_text == "cpu:3"
            e = devpolicy.explain("x", file="a.safetensors")
        assert e.decision is not None
        assert e.decision.device_text == "cpu:3"

    def test_a_bad_file_argument_is_a_type_error(self) -> None:
        """`file=` takes a path."""
        with pytest.raises(
            TypeError, match=r"^file must be a path \(str or os\.PathLike\), got int 3$"
        ):
            policy_of().resolve("x", file=3)  # type: ignore[arg-type]


class TestSchema:
    def test_a_rule_may_have_file_alone(self) -> None:
        """`file` alone takes every name of the file."""
        policy = policy_of(rules=[{"file": "x.safetensors", "device": "cpu:1"}])
        assert policy.rules[0].spec.name_pattern == ("*", False)

    @pytest.mark.parametrize(
        ("rule", "message"),
        [
            (
                {"device": "cpu"},
                r"rules\[0\]: give exactly one of `match` \(a glob\), `regex` or `search` for names, "
                r"or `file` \(a glob\) for the file tensors come from$",
            ),
            ({"file": "", "device": "cpu"}, r"rules\[0\]\.file: empty file glob matches no file"),
            ({"file": 3, "device": "cpu"}, r"rules\[0\]\.file: Input should be a valid string"),
        ],
    )
    def test_bad_file_rules_are_policy_errors(self, rule: dict[str, object], message: str) -> None:
        """No pattern and no file, an empty glob, a glob that is not text: PolicyError."""
        with pytest.raises(devpolicy.PolicyError, match=rf"^<mapping>: {message}"):
            policy_of(rules=[rule])

    def test_the_json_schema_has_file(self) -> None:
        """`devpolicy schema` lists `file` for rules, and the shipped schema is current."""
        schema = devpolicy.policy_schema()
        assert schema["$defs"]["RuleSpec"]["properties"]["file"]["anyOf"][0] == {"type": "string"}
        shipped = REPO / "policies" / "devpolicy.schema.json"
        assert schema_form(json.loads(shipped.read_text(encoding="utf-8"))) == schema_form(schema)


class TestLint:
    def test_a_file_glob_no_normalised_path_holds_is_an_error(self) -> None:
        """`./x`, `a//b`, `dir/`: file-never-matches, naming the rule and the fix."""
        policy = policy_of(
            rules=[
                {"file": "./train.safetensors", "device": "cpu"},
                {"file": "data//x.safetensors", "device": "cpu"},
                {"file": "data/", "device": "cpu"},
                {"file": "data/x.safetensors", "device": "cpu"},
            ]
        )
        found = [f for f in devpolicy.lint(policy) if f.code == "file-never-matches"]
        assert [f.message for f in found] == [
            "rule 0 (file './train.safetensors') can never match a file: it starts with `./`, "
            "but paths are matched normalised; drop the `./`",
            "rule 1 (file 'data//x.safetensors') can never match a file: it holds `//`, which a "
            "normalised path never does; write one `/`",
            "rule 2 (file 'data/') can never match a file: it ends in `/`, but paths are "
            "matched without a trailing `/`; drop it",
        ]

    def test_an_earlier_file_rule_does_not_shadow_a_name_rule(self) -> None:
        """A catch-all for one file leaves other files' names to later rules."""
        policy = policy_of(
            rules=[{"file": "a.safetensors", "device": "cpu"}, {"match": "*", "device": "cpu"}]
        )
        assert [f.code for f in devpolicy.lint(policy)] == []

    def test_a_rule_after_a_file_rule_for_the_same_file_is_unreachable(self) -> None:
        """`file: a` alone takes every name of `a`: a later `match: x, file: a` never matches."""
        policy = policy_of(
            rules=[
                {"file": "a.safetensors", "device": "cpu"},
                {"match": "x/*", "file": "a.safetensors", "device": "cpu"},
            ]
        )
        (finding,) = devpolicy.lint(policy)
        assert finding.code == "unreachable-rule"
        assert finding.message.startswith(
            "rule 1 ('x/*' file 'a.safetensors') can never match: rule 0"
        )


class TestNames:
    def test_a_hugging_face_snapshot_names_tensors_after_the_repository(
        self, tmp_path: Path
    ) -> None:
        """`models--ORG--NAME/snapshots/<commit>`: tensors are `NAME/...`, not the hash."""
        snapshot = tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / ("0a1b" * 10)
        snapshot.mkdir(parents=True)
        devpolicy.save_file({"w": np.zeros(4, np.float32)}, snapshot / "model-1.safetensors")
        devpolicy.save_file({"b": np.zeros(4, np.float32)}, snapshot / "model-2.safetensors")
        index = {"weight_map": {"w": "model-1.safetensors", "b": "model-2.safetensors"}}
        (snapshot / "model.safetensors.index.json").write_text(json.dumps(index))
        policy = policy_of()
        assert [t.name for t in policy.plan(snapshot).tensors] == ["tiny-llama/w", "tiny-llama/b"]
        by_index = policy.plan(snapshot / "model.safetensors.index.json")
        assert [t.name for t in by_index.tensors] == ["tiny-llama/w", "tiny-llama/b"]
        # A directory under some other `snapshots` keeps its own name.
        other = tmp_path / "runs" / "snapshots" / "step-100"
        other.mkdir(parents=True)
        devpolicy.save_file({"w": np.zeros(4, np.float32)}, other / "m.safetensors")
        assert [t.name for t in policy.plan(other).tensors] == ["step-100/w"]


class TestLargeByDefault:
    def test_a_large_tensor_decided_by_the_default_gets_a_warning_naming_the_rule(
        self,
    ) -> None:
        """1 GiB or more, no rule: a `large_by_default` warning with the rule to write, once
        per file."""
        policy = policy_of(rules=[{"match": "model/*", "device": "cpu:1"}])
        with capture_logs() as logs:
            policy.resolve("model/w", nbytes=2 * GiB, file="/d/m.safetensors")  # a rule's
            policy.resolve("train/ids", nbytes=GiB - 1, file="/d/ids.safetensors")  # small
            policy.resolve("train/tokens", nbytes=GiB, file="/d/train.safetensors")
            policy.resolve("train/labels", nbytes=2 * GiB, file="/d/train.safetensors")
        (warning,) = [e for e in logs if e["event"] == "large_by_default"]
        assert warning["log_level"] == "warning"
        assert warning["suggested_rule"] == '- {file: "train.safetensors", device: cpu}'
        assert (warning["name"], warning["file"], warning["device"]) == (
            "train/tokens",
            "/d/train.safetensors",
            "cpu:0",
        )

    def test_without_a_file_the_rule_names_the_tensor(self) -> None:
        """For `put` (no file) the rule to write matches the name."""
        with capture_logs() as logs:
            policy_of().resolve("cache/kv", nbytes=3 * GiB)
        (warning,) = [e for e in logs if e["event"] == "large_by_default"]
        assert warning["suggested_rule"] == '- {match: "cache/kv", device: cpu}'


_SEGMENT = st.text(
    st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=8
).filter(lambda s: s not in (".", ".."))
_PATHS = st.lists(_SEGMENT, min_size=1, max_size=5).map(
    lambda parts: "/nonexistent/" + "/".join(parts)
)
_GLOBS = st.text(st.sampled_from("ab*?[]!./-"), min_size=1, max_size=10)


class TestFileGlobProperties:
    @given(_GLOBS.filter(lambda g: "/" not in g), _PATHS)
    def test_a_glob_without_a_slash_is_fnmatch_on_the_name(self, glob: str, path: str) -> None:
        """Without `/`, a glob matches exactly when fnmatch matches the file's name."""
        expected = fnmatch.fnmatchcase(os.path.basename(path), glob)
        assert compile_file_glob(glob)(SourceFile.of(path)) is expected

    @given(_PATHS, st.lists(_SEGMENT, min_size=0, max_size=3))
    def test_a_relative_tail_matches_wherever_the_tree_is(
        self, path: str, parents: list[str]
    ) -> None:
        """A literal tail of a path (from a `/` on) matches it under any parent directory."""
        tail = path.removeprefix("/nonexistent/")
        glob = re.sub(r"([*?\[])", r"[\1]", tail)  # escape the tail's own wildcards
        moved = "/" + "/".join([*parents, tail])
        assert compile_file_glob(glob)(SourceFile.of(moved))

    @given(st.text(max_size=20), st.text(max_size=20).filter(lambda p: "\x00" not in p))
    def test_any_glob_and_path_give_a_verdict(self, glob: str, path: str) -> None:
        """No glob or path makes the matcher raise."""
        if path:
            assert compile_file_glob(glob or "*")(SourceFile.of(path)) in (True, False)
