"""Policy documents: every mistake is a PolicyError naming file, line, field path and valid choices."""

from __future__ import annotations

import contextlib
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import devpolicy
from tests.helpers import within, write

GOOD = """\
version: 1
default: auto
fallback: [gpu, cpu]
strict: false
rules:
  - match: "dataset/*"
    device: cpu
  - match: "model/*"
    device: gpu:0
  - match: "*"
    min_bytes: 4GiB
    device: cpu
"""


def load_text(tmp_path: Path, text: str) -> devpolicy.Policy:
    return devpolicy.load_policy(write(tmp_path / "policy.yaml", textwrap.dedent(text)), environ={})


class TestValidPolicies:
    def test_the_readme_policy_loads_with_rules_in_order(self, tmp_path: Path) -> None:
        """The policy from the README loads; each rule keeps its file:line origin."""
        policy = load_text(tmp_path, GOOD)
        assert [r.origin for r in policy.rules] == [
            "policy.yaml:6",
            "policy.yaml:8",
            "policy.yaml:10",
        ]
        assert policy.rules[2].spec.min_bytes == 4 * 2**30

    def test_every_optional_rule_field_is_accepted(self, tmp_path: Path) -> None:
        """fallback, max_bytes, memory and commit are rule fields."""
        policy = load_text(
            tmp_path,
            """\
            version: 1
            rules:
              - regex: "layer[0-9]+/w"
                device: gpu:1
                fallback: [cpu:1]
                min_bytes: 1
                max_bytes: 1.5GB
                memory: pinned_host
                commit: false
            logging: {level: debug, format: json}
            """,
        )
        rule = policy.rules[0].spec
        assert (rule.regex, rule.fallback, rule.max_bytes, rule.memory, rule.commit) == (
            "layer[0-9]+/w",
            ["cpu:1"],
            1_500_000_000,
            "pinned_host",
            False,
        )
        assert policy.events.level == "debug"

    def test_a_mapping_is_a_policy_too(self) -> None:
        """load_policy takes a mapping; its origins name the field since there are no lines."""
        policy = devpolicy.load_policy(
            {"version": 1, "rules": [{"match": "a", "device": "cpu"}]}, environ={}
        )
        assert policy.rules[0].origin == "<mapping>:rules[0]"

    def test_yaml_anchors_and_merge_keys_work(self, tmp_path: Path) -> None:
        """Plain YAML features a team may use to share rule settings."""
        policy = load_text(
            tmp_path,
            """\
            version: 1
            rules:
              - &host {match: "a/*", device: cpu:1, min_bytes: 1}
              - <<: *host
                match: "b/*"
            """,
        )
        assert policy.rules[1].spec.device == "cpu:1"
        assert policy.rules[1].spec.match == "b/*"


BAD_DOCUMENTS = [
    # (document, error pattern anchored at the start)
    (
        "version: 1\nrules:\n  - match: a\n    device: gpuu\n",
        r"^policy\.yaml:4: rules\[0\]\.device: unknown platform 'gpuu'.*did you mean 'gpu'\?.*accepted: auto",
    ),
    (
        "version: 1\nrules:\n  - match: a\n    devise: cpu\n",
        r"^policy\.yaml:4: rules\[0\]\.devise: unknown field 'devise' \(did you mean 'device'\?\); valid fields: match, regex, file, device, sharding, fallback, min_bytes, max_bytes, memory, commit, fits, mmap, inputs, search, ndim, min_elements, max_elements$",
    ),
    (
        "version: 1\nrules:\n  - device: cpu\n",
        r"^policy\.yaml:3: rules\[0\]: give exactly one of `match` \(a glob\), `regex` or `search`",
    ),
    (
        "version: 1\nrules:\n  - {match: a, regex: b, device: cpu}\n",
        r"^policy\.yaml:3: rules\[0\]: give exactly one of `match`",
    ),
    (
        "version: 1\nrules:\n  - {regex: '(', device: cpu}\n",
        r"^policy\.yaml:3: rules\[0\]\.regex: invalid regular expression '\(': missing \), unterminated subpattern",
    ),
    (
        "version: 1\nrules:\n  - {match: a, device: cpu, min_bytes: 4 gigs}\n",
        r"^policy\.yaml:3: rules\[0\]\.min_bytes: unknown size unit 'gigs'",
    ),
    (
        "version: 1\nrules:\n  - {match: a, device: cpu, min_bytes: 2GB, max_bytes: 1GB}\n",
        r"^policy\.yaml:3: rules\[0\]: min_bytes \(2000000000\) is larger than max_bytes \(1000000000\)",
    ),
    (
        "version: 1\nrules:\n  - {match: a, device: cpu, memory: pinned}\n",
        r"^policy\.yaml:3: rules\[0\]\.memory: unknown memory kind 'pinned' \(did you mean 'pinned_host'\?\); accepted: device, pinned_host, unpinned_host",
    ),
    (
        "version: 1\nrules:\n  - {match: a, device: cpu, commit: yes please}\n",
        r"^policy\.yaml:3: rules\[0\]\.commit: expected true or false, got string 'yes please'",
    ),
    (
        "version: 1\nrules:\n  - {match: '', device: cpu}\n",
        r"^policy\.yaml:3: rules\[0\]\.match: empty pattern matches only the empty name",
    ),
    (
        "version: 1\nrules: {match: a}\n",
        r"^policy\.yaml:2: rules: Input should be a valid list, got mapping",
    ),
    (
        "version: 1\nrules:\n  - cpu\n",
        r"^policy\.yaml:3: rules\[0\]: expected a mapping with fields match, regex, file, device",
    ),
    ("version: 2\n", r"^policy\.yaml:1: version: unsupported policy version 2; accepted: 1"),
    ("default: cpu\n", r"^policy\.yaml:1: version: missing required field 'version'"),
    (
        "version: 1\ndefualt: cpu\n",
        r"^policy\.yaml:2: defualt: unknown field 'defualt' \(did you mean 'default'\?\); valid fields: version, default",
    ),
    (
        "version: 1\nfallback: gpu\n",
        r"^policy\.yaml:2: fallback: Input should be a valid list, got string 'gpu'",
    ),
    (
        "version: 1\nfallback: [gpu, cpu:x]\n",
        r"^policy\.yaml:2: fallback\[1\]: not a target: 'cpu:x'",
    ),
    (
        "version: 1\nstrict: maybe\n",
        r"^policy\.yaml:2: strict: expected true or false, got string 'maybe'",
    ),
    (
        "version: 1\nlogging: {level: verbose}\n",
        r"^policy\.yaml:2: logging\.level: unknown log level 'verbose'; accepted: debug, info, warning, error, critical",
    ),
    ("version: 1\nlogging: {format: jsn}\n", r"did you mean 'json'\?"),
    (
        "version: 1\nversion: 1\n",
        r"^policy\.yaml:2: version: duplicate key 'version' \(first given on line 1\)",
    ),
    ("version: 1\nrules: [\n", r"^policy\.yaml:\d+: invalid YAML: "),
    (
        "version: 1\n  bad: indent\n",
        r"^policy\.yaml:2: invalid YAML: mapping values are not allowed here",
    ),
    ("", r"^policy\.yaml:1: empty policy; a policy needs at least `version: 1`"),
    ("# only a comment\n", r"^policy\.yaml:1: empty policy"),
    ("- version: 1\n", r"^policy\.yaml:1: a policy must be a mapping of fields, got a list"),
    ("just text\n", r"^policy\.yaml:1: a policy must be a mapping of fields, got a string"),
    (
        "version: 1\n---\nversion: 1\n",
        r"^policy\.yaml:\d+: invalid YAML: expected a single document",
    ),
    (
        "!!python/object:os.system {}\n",
        r"^policy\.yaml:1: unsupported YAML tag 'tag:yaml.org,2002:python/object:os.system'",
    ),
    (
        "version: !!python/name:os.system ''\n",
        r"^policy\.yaml:1: invalid YAML: could not determine a constructor",
    ),
    ("version: 1\n\x1f\n", r"^policy\.yaml:2: invalid YAML: special characters are not allowed"),
    ("version: 1\nrules: &a [*a]\n", r"^policy\.yaml:2: rules\[0\]: recursive alias"),
    ("version: 1\n? [a, b]\n: 1\n", r"^policy\.yaml:2: mapping keys must be plain scalars"),
]


class TestIndentationSlips:
    """Issue 51, N12: PyYAML's words for an indentation slip ("expected <block end>, but
    found '<block mapping start>'") come with what to look at: the indentation near the
    line, and where the mapping or list it breaks opens."""

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            (
                "version: 1\nrules:\n  - match: 'model/*'\n     device: cpu\n",
                r"^policy\.yaml:4: invalid YAML: while parsing a block mapping expected "
                r"<block end>, but found '<block mapping start>'; check the indentation near "
                r"line 4 \(it starts at column 6\): the keys of one mapping start in one column, "
                r"and the mapping it breaks opens at line 3, column 5$",
            ),
            (
                "version: 1\nrules:\n  - match: 'model/*'\n    device: cpu\n"
                "   - match: 'data/*'\n    device: cpu\n",
                r"^policy\.yaml:5: invalid YAML: .*; check the indentation near line 5 \(it "
                r"starts at column 4\): the dashes of one list start in one column, and the list "
                r"it breaks opens at line 3, column 3$",
            ),
            (
                "version: 1\n  bad: indent\n",
                r"^policy\.yaml:2: invalid YAML: mapping values are not allowed here; check "
                r"the indentation near line 2 \(it starts at column 3\), or quote a value "
                r"that holds ': '$",
            ),
            (
                "version: 1\nrules:\n\t- match: 'model/*'\n    device: cpu\n",
                r"^policy\.yaml:3: invalid YAML: while scanning for the next token found "
                r"character '\\t' that cannot start any token; line 3 has a tab at column 1: "
                r"YAML indents with spaces only \(replace each tab with spaces",
            ),
            (
                "version: 1\nrules:\n  - match: 'model/*'\n  \tdevice: cpu\n",
                r"^policy\.yaml:4: invalid YAML: .*; line 4 has a tab at column 3: YAML "
                r"indents with spaces only",
            ),
        ],
        ids=["mapping", "list", "mapping-value", "tab", "tab-after-spaces"],
    )
    def test_an_indentation_slip_says_where_to_look(
        self, tmp_path: Path, text: str, message: str
    ) -> None:
        write(tmp_path / "policy.yaml", text)
        with pytest.raises(devpolicy.PolicyError, match=message):
            devpolicy.load_policy(tmp_path / "policy.yaml", environ={})


class TestInvalidPolicies:
    @pytest.mark.parametrize(("text", "message"), BAD_DOCUMENTS)
    def test_mistakes_raise_policy_error_with_file_line_and_field(
        self, tmp_path: Path, text: str, message: str
    ) -> None:
        """Every mistake is a PolicyError whose message starts with file:line and the field path."""
        write(tmp_path / "policy.yaml", text)
        with pytest.raises(devpolicy.PolicyError, match=message):
            devpolicy.load_policy(tmp_path / "policy.yaml", environ={})

    def test_all_problems_are_reported_at_once(self, tmp_path: Path) -> None:
        """Several mistakes give one error listing each, with its own line."""
        write(
            tmp_path / "policy.yaml",
            "version: 1\ndefault: gpuu\nrules:\n  - {match: a, device: cpux}\n",
        )
        with pytest.raises(devpolicy.PolicyError) as info:
            devpolicy.load_policy(tmp_path / "policy.yaml", environ={})
        assert [(p.line, p.field) for p in info.value.problems] == [
            (2, "default"),
            (4, "rules[0].device"),
        ]
        assert (info.value.file, info.value.line, info.value.field) == ("policy.yaml", 2, "default")

    def test_missing_file_names_the_path(self, tmp_path: Path) -> None:
        """A path that does not exist is a PolicyError, not FileNotFoundError."""
        with pytest.raises(devpolicy.PolicyError, match=r"^nope\.yaml: policy file not found$"):
            devpolicy.load_policy("nope.yaml", environ={})

    def test_a_directory_is_not_a_policy(self, tmp_path: Path) -> None:
        """Giving a directory says so."""
        (tmp_path / "d").mkdir()
        with pytest.raises(devpolicy.PolicyError, match=r"^d: is a directory, not a policy file$"):
            devpolicy.load_policy("d", environ={})

    def test_binary_file_is_not_utf8(self, tmp_path: Path) -> None:
        """A binary file is reported as not UTF-8 text."""
        (tmp_path / "p.yaml").write_bytes(b"version: 1\n\xff\xfe")
        with pytest.raises(devpolicy.PolicyError, match=r"^p\.yaml:2: not UTF-8 text"):
            devpolicy.load_policy("p.yaml", environ={})

    def test_a_fifo_is_refused_without_blocking(self, tmp_path: Path) -> None:
        """A FIFO with no writer is refused at once (it used to block forever)."""
        os.mkfifo(tmp_path / "p.yaml")
        with pytest.raises(
            devpolicy.PolicyError, match=r"^p\.yaml: is a FIFO or pipe .*, not a policy file$"
        ):
            within(30, lambda: devpolicy.load_policy("p.yaml", environ={}))

    def test_a_fifo_with_a_writer_is_refused_too(self, tmp_path: Path) -> None:
        """A FIFO that has a writer is still not a policy file (it used to say 'cannot read: None')."""
        os.mkfifo(tmp_path / "p.yaml")
        writer = os.open(tmp_path / "p.yaml", os.O_RDWR)  # holds the FIFO open as a writer
        try:
            with pytest.raises(devpolicy.PolicyError, match=r"^p\.yaml: is a FIFO or pipe"):
                within(30, lambda: devpolicy.load_policy("p.yaml", environ={}))
        finally:
            os.close(writer)

    def test_an_endless_device_is_refused(self) -> None:
        """/dev/zero is refused at once instead of being read until memory runs out."""
        with pytest.raises(
            devpolicy.PolicyError, match=r"^/dev/zero: is a character device, not a policy file$"
        ):
            within(30, lambda: devpolicy.load_policy("/dev/zero", environ={}))

    def test_a_policy_over_one_mib_is_refused_before_parsing(self, tmp_path: Path) -> None:
        """A 50 MB file is refused by its size, not parsed for minutes first."""
        with (tmp_path / "p.yaml").open("w") as f:
            f.write("version: 1\nrules:\n")
            f.truncate(50_000_000)
        with pytest.raises(
            devpolicy.PolicyError,
            match=r"^p\.yaml: is 50000000 bytes; at most 1048576 are accepted$",
        ):
            within(60, lambda: devpolicy.load_policy("p.yaml", environ={}))

    @pytest.mark.parametrize(
        ("make", "match"),
        [
            (lambda d: os.symlink("p.yaml", d / "p.yaml"), r"^p\.yaml: symlink loop"),
            (
                lambda d: os.symlink("gone.yaml", d / "p.yaml"),
                r"^p\.yaml: dangling symlink \(its target 'gone\.yaml' does not exist\)$",
            ),
        ],
        ids=["loop", "dangling"],
    )
    def test_broken_links_say_what_is_wrong(self, tmp_path: Path, make: Any, match: str) -> None:
        """A symlink loop or a dangling link is named as such (a loop used to raise RuntimeError)."""
        make(tmp_path)
        with pytest.raises(devpolicy.PolicyError, match=match):
            devpolicy.load_policy("p.yaml", environ={})

    def test_an_unreadable_file_says_permission_denied(self, tmp_path: Path) -> None:
        """A file without read permission is a PolicyError saying so."""
        if os.geteuid() == 0:
            pytest.skip("root reads any file")
        write(tmp_path / "p.yaml", "version: 1\n").chmod(0)
        with pytest.raises(devpolicy.PolicyError, match=r"^p\.yaml: permission denied$"):
            devpolicy.load_policy("p.yaml", environ={})

    def test_billion_laughs_is_refused(self, tmp_path: Path) -> None:
        """Aliases that expand exponentially stop with an error instead of eating memory."""
        lines = ["version: 1", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
        lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
        write(tmp_path / "p.yaml", "\n".join(lines) + "\n")
        with pytest.raises(devpolicy.PolicyError, match=r"document too large"):
            devpolicy.load_policy("p.yaml", environ={})

    def test_mapping_errors_name_the_field(self) -> None:
        """A bad mapping gives the field path with `<mapping>` as the file."""
        with pytest.raises(
            devpolicy.PolicyError, match=r"^<mapping>: rules\[0\]: give exactly one of `device`"
        ):
            devpolicy.load_policy({"version": 1, "rules": [{"match": "a"}]}, environ={})

    def test_errors_are_value_errors_and_device_policy_errors(self) -> None:
        """Callers may catch the base class or the builtin it refines."""
        with pytest.raises(devpolicy.DevicePolicyError):
            devpolicy.load_policy({"version": 3}, environ={})
        with pytest.raises(ValueError, match="unsupported policy version"):
            devpolicy.load_policy({"version": 3}, environ={})


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.text(max_size=8),
    st.sampled_from(["cpu", "gpu:1", "auto", "4GiB", "*"]),
)
documents = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(
            st.sampled_from(
                [
                    "version",
                    "default",
                    "fallback",
                    "strict",
                    "rules",
                    "match",
                    "regex",
                    "device",
                    "min_bytes",
                    "memory",
                    "logging",
                    "level",
                    "x",
                ]
            ),
            children,
            max_size=4,
        ),
    ),
    max_leaves=12,
)


class TestRandomDocuments:
    @pytest.mark.slow
    @settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
    @given(documents)
    def test_random_mappings_load_or_raise_policy_error(self, document: object) -> None:
        """Whatever the shape, the result is a Policy or a PolicyError, never another exception."""
        if not isinstance(document, dict):
            document = {"version": 1, "rules": document}
        with contextlib.suppress(devpolicy.PolicyError):
            devpolicy.load_policy(document, environ={})

    @pytest.mark.slow
    @settings(
        max_examples=300,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(st.text(max_size=60))
    def test_random_yaml_text_loads_or_raises_policy_error(self, tmp_path: Path, text: str) -> None:
        """Arbitrary file contents never leak a yaml or pydantic exception."""
        (tmp_path / "r.yaml").write_text(text, encoding="utf-8")
        with contextlib.suppress(devpolicy.PolicyError):
            devpolicy.load_policy(tmp_path / "r.yaml", environ={})


class TestMergeKeyLines:
    def test_a_key_that_overrides_a_merged_one_reports_its_own_line(self, tmp_path: Path) -> None:
        """Errors in an explicit key after `<<:` name that key's line, not the anchor's."""
        text = "version: 1\nbase: &r {match: a, device: cpu}\nrules:\n  - <<: *r\n    match: b\n    device: gpuu\n"
        write(tmp_path / "p.yaml", text.replace("base: &r", "x-base: &r"))
        with pytest.raises(devpolicy.PolicyError) as info:
            devpolicy.load_policy(tmp_path / "p.yaml", environ={})
        lines = {p.field: p.line for p in info.value.problems}
        assert lines["rules[0].device"] == 6
