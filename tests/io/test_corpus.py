"""The bad-input corpus: every malformed input raises its specific error, saying where and what.

No case may leak a raw KeyError, yaml.YAMLError, ValidationError or JSONDecodeError, return a
partial result, or leave JAX's default device changed (the autouse fixture checks that).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import devpolicy
from tests.helpers import safetensors_bytes


@dataclass(frozen=True)
class Case:
    id: str
    run: Callable[[Path], Any]
    error: type[Exception]
    match: str


def yaml_case(id: str, text: str, match: str) -> Case:
    def run(tmp: Path) -> Any:
        (tmp / "p.yaml").write_text(text, encoding="utf-8")
        return devpolicy.load_policy(tmp / "p.yaml", environ={})

    return Case(id, run, devpolicy.PolicyError, match)


def env_case(id: str, environ: dict[str, str], match: str) -> Case:
    def run(tmp: Path) -> Any:
        return devpolicy.load_policy({"version": 1}, environ=environ)

    return Case(id, run, devpolicy.errors.EnvOverrideError, match)


def file_case(id: str, content: bytes, match: str) -> Case:
    def run(tmp: Path) -> Any:
        (tmp / "f.safetensors").write_bytes(content)
        return devpolicy.load_file(
            tmp / "f.safetensors", policy=devpolicy.load_policy({"version": 1}, environ={})
        )

    return Case(id, run, devpolicy.SafetensorsFileError, match)


def one(
    dtype: str = "U8", shape: list[int] | None = None, offsets: list[int] | None = None
) -> dict[str, object]:
    return {
        "t": {
            "dtype": dtype,
            "shape": [1] if shape is None else shape,
            "data_offsets": [0, 1] if offsets is None else offsets,
        }
    }


R = "version: 1\nrules:\n  - "  # a rule follows on line 3

CASES = [
    # YAML syntax and document shape
    yaml_case("yaml-unclosed-flow", "version: 1\nrules: [\n", r"^p\.yaml:\d+: invalid YAML"),
    yaml_case("yaml-bad-indent", "version: 1\n  x: 1\n", r"^p\.yaml:2: invalid YAML"),
    yaml_case("yaml-tab-indent", "version: 1\nrules:\n\t- x\n", r"^p\.yaml:3: invalid YAML"),
    yaml_case("yaml-unclosed-quote", 'version: 1\ndefault: "cpu\n', r"^p\.yaml:\d+: invalid YAML"),
    yaml_case("yaml-control-char", "version: 1\n\x07\n", r"^p\.yaml:2: invalid YAML"),
    yaml_case(
        "yaml-two-documents",
        "version: 1\n---\nversion: 1\n",
        r"^p\.yaml:\d+: invalid YAML: expected a single document",
    ),
    yaml_case(
        "yaml-python-tag",
        "version: !!python/name:os.system ''\n",
        r"^p\.yaml:1: invalid YAML: could not determine a constructor",
    ),
    yaml_case(
        "yaml-python-object", "!!python/object:os.system {}\n", r"^p\.yaml:1: unsupported YAML tag"
    ),
    yaml_case(
        "yaml-recursive-alias",
        "version: 1\nrules: &a [*a]\n",
        r"^p\.yaml:2: rules\[0\]: recursive alias",
    ),
    yaml_case(
        "yaml-undefined-alias",
        "version: 1\nrules: *nope\n",
        r"^p\.yaml:2: invalid YAML: .*undefined alias",
    ),
    yaml_case(
        "yaml-complex-key",
        "version: 1\n? [a]\n: 1\n",
        r"^p\.yaml:2: mapping keys must be plain scalars",
    ),
    yaml_case("empty-file", "", r"^p\.yaml:1: empty policy"),
    yaml_case("only-comments", "# nothing\n", r"^p\.yaml:1: empty policy"),
    yaml_case(
        "document-is-list",
        "- version: 1\n",
        r"^p\.yaml:1: a policy must be a mapping of fields, got a list",
    ),
    yaml_case(
        "document-is-string",
        "cpu\n",
        r"^p\.yaml:1: a policy must be a mapping of fields, got a string",
    ),
    yaml_case(
        "document-is-number", "1\n", r"^p\.yaml:1: a policy must be a mapping of fields, got a int"
    ),
    yaml_case(
        "duplicate-top-key",
        "version: 1\nstrict: true\nstrict: false\n",
        r"^p\.yaml:3: strict: duplicate key 'strict' \(first given on line 2\)",
    ),
    yaml_case(
        "duplicate-rule-key",
        R + "match: a\n    device: cpu\n    device: gpu\n",
        r"^p\.yaml:5: rules\[0\]\.device: duplicate key",
    ),
    # Hardening (issue 9): nesting, unusable scalars, lines of aliases, several problems at once
    yaml_case(
        "yaml-nested-1000-deep",
        "version: 1\nx: " + "[" * 1000 + "]" * 1000 + "\n",
        r"^p\.yaml:2: invalid YAML: nested more than 64 levels deep$",
    ),
    yaml_case(
        "yaml-nested-mappings-deep",
        "version: 1\nx:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 200)),
        r"^p\.yaml:\d+: invalid YAML: nested more than 64 levels deep$",
    ),
    yaml_case(
        "yaml-int-tag-on-word",
        "version: !!int one\n",
        r"^p\.yaml:1: version: not a valid int: 'one'$",
    ),
    yaml_case(
        "yaml-float-tag-on-word",
        "version: 1\nheadroom: !!float x\n",
        r"^p\.yaml:2: headroom: not a valid float: 'x'$",
    ),
    yaml_case(
        "yaml-5000-digit-integer",
        "version: " + "9" * 5000 + "\n",
        r"^p\.yaml:1: version: too many digits: '9+\.\.\.\(5000 characters\)'$",
    ),
    yaml_case(
        "yaml-million-digit-size",
        f"{R}match: a\n    device: cpu\n    min_bytes: '{'9' * 1_000_000}'\n",
        r"^p\.yaml:5: rules\[0\]\.min_bytes: size out of range",
    ),
    yaml_case(
        "yaml-alias-rule-reported-at-its-own-line",
        "version: 1\nrules:\n  - match: a\n    device: &d gpuu\n  - match: b\n    device: *d\n",
        r"(?s)^2 problems.*p\.yaml:4: rules\[0\]\.device: .*\n  p\.yaml:6: rules\[1\]\.device: ",
    ),
    yaml_case(
        "yaml-alias-whole-rule",
        "version: 1\nrules:\n  - &r\n    match: a\n    device: gpuu\n  - *r\n",
        r"(?s)^2 problems.*p\.yaml:5: rules\[0\]\.device: .*\n  p\.yaml:6: rules\[1\]\.device: ",
    ),
    yaml_case(
        "yaml-duplicate-and-other-problems-all-listed",
        "version: 1\nversion: 1\ndefault: gpux\nrules:\n  - match: a\n    devce: cpu\n",
        r"(?s)^\d problems in p\.yaml:\n  p\.yaml:2: version: duplicate key.*p\.yaml:3: default: .*p\.yaml:6: rules\[0\]\.devce: unknown field",
    ),
    yaml_case(
        "yaml-two-duplicates-both-listed",
        "version: 1\nrules: []\nrules: []\ndefault: cpu\ndefault: cpu\n",
        r"(?s)^2 problems in p\.yaml:\n  p\.yaml:3: rules: duplicate key.*\n  p\.yaml:5: default: duplicate key",
    ),
    yaml_case(
        "yaml-unclosed-quote-at-its-line",
        "version: 1\nrules:\n  - match: a\n    device: cpu\n  - match: 'b\n    device: cpu\n",
        r"^p\.yaml:5: invalid YAML",
    ),
    yaml_case(
        "yaml-error-at-end-within-the-file",
        "version: 1\nrules:\n  - match: a\n    device: cpu\n  - [\n    x\n",
        r"^p\.yaml:[1-6]: invalid YAML",
    ),
    yaml_case(
        "yaml-large-without-aliases",
        "version: 1\nx: [" + "1," * 150_000 + "1]\n",
        r"^p\.yaml:2: document too large: more than 100000 values \(a policy is far smaller\)$",
    ),
    # Regexes RE2 cannot run in linear time, and ones Python's parser chokes on (issue 9 item 3, 12)
    yaml_case(
        "regex-backreference",
        f"{R}regex: '(a)\\1'\n    device: cpu\n",
        r"^p\.yaml:3: rules\[0\]\.regex: unsupported regular expression '\(a\)\\\\1': a backreference \(\\1 or \(\?P=name\)\); regexes are matched by RE2",
    ),
    yaml_case(
        "regex-lookahead",
        f"{R}regex: '(?=a)a'\n    device: cpu\n",
        r"^p\.yaml:3: rules\[0\]\.regex: unsupported regular expression .*: a lookahead \(\(\?=\.\.\.\)\);.*no backreferences",
    ),
    yaml_case(
        "regex-huge-repeat",
        f"{R}regex: 'a{{4294967296}}'\n    device: cpu\n",
        r"^p\.yaml:3: rules\[0\]\.regex: invalid regular expression 'a\{4294967296\}': a repeat count is too large$",
    ),
    yaml_case(
        "regex-1000-nested-groups",
        f"{R}regex: '{'(' * 1000}a{')' * 1000}'\n    device: cpu\n",
        r"^p\.yaml:3: rules\[0\]\.regex: .*regular expression",
    ),
    yaml_case(
        "regex-repeat-over-1000",
        f"{R}regex: 'a{{1001}}'\n    device: cpu\n",
        r"^p\.yaml:3: rules\[0\]\.regex: unsupported regular expression 'a\{1001\}': a repeat count above 1000 \(1001\)",
    ),
    # Wrong types and unknown keys
    yaml_case(
        "missing-version",
        "default: cpu\n",
        r"^p\.yaml:1: version: missing required field 'version'",
    ),
    yaml_case("version-2", "version: 2\n", r"^p\.yaml:1: version: unsupported policy version 2"),
    yaml_case(
        "version-string",
        "version: '1'\n",
        r"^p\.yaml:1: version: version must be the number 1, not the string '1'",
    ),
    yaml_case(
        "version-bool", "version: true\n", r"^p\.yaml:1: version: unsupported policy version True"
    ),
    yaml_case(
        "unknown-top-key",
        "version: 1\nrulez: []\n",
        r"^p\.yaml:2: rulez: unknown field 'rulez' \(did you mean 'rules'\?\); valid fields:",
    ),
    yaml_case(
        "unknown-rule-key",
        R + "match: a\n    device: cpu\n    min_byte: 1\n",
        r"^p\.yaml:5: rules\[0\]\.min_byte: unknown field 'min_byte' \(did you mean 'min_bytes'\?\)",
    ),
    yaml_case(
        "unknown-logging-key",
        "version: 1\nlogging: {lvl: info}\n",
        r"^p\.yaml:2: logging\.lvl: unknown field 'lvl'.*valid fields: level, format",
    ),
    yaml_case(
        "rules-not-list",
        "version: 1\nrules: x\n",
        r"^p\.yaml:2: rules: Input should be a valid list, got string 'x'",
    ),
    yaml_case(
        "rule-not-mapping",
        R + "5\n",
        r"^p\.yaml:3: rules\[0\]: expected a mapping with fields match",
    ),
    yaml_case(
        "rule-without-device",
        R + "match: a\n",
        r"^p\.yaml:3: rules\[0\]: give exactly one of `device` \(a target such as cpu or gpu:1\) or `sharding`",
    ),
    yaml_case(
        "rule-without-pattern",
        R + "device: cpu\n",
        r"^p\.yaml:3: rules\[0\]: give exactly one of `match`",
    ),
    yaml_case(
        "rule-with-both-patterns",
        R + "{match: a, regex: a, device: cpu}\n",
        r"^p\.yaml:3: rules\[0\]: give exactly one of",
    ),
    yaml_case(
        "match-not-string",
        R + "{match: 5, device: cpu}\n",
        r"^p\.yaml:3: rules\[0\]\.match: Input should be a valid string, got int 5",
    ),
    yaml_case(
        "match-empty",
        R + "{match: '', device: cpu}\n",
        r"^p\.yaml:3: rules\[0\]\.match: empty pattern",
    ),
    yaml_case(
        "fallback-not-list",
        "version: 1\nfallback: cpu\n",
        r"^p\.yaml:2: fallback: Input should be a valid list",
    ),
    yaml_case(
        "strict-string",
        "version: 1\nstrict: 'yes'\n",
        r"^p\.yaml:2: strict: expected true or false, got string 'yes'",
    ),
    yaml_case(
        "commit-int",
        R + "{match: a, device: cpu, commit: 1}\n",
        r"^p\.yaml:3: rules\[0\]\.commit: expected true or false, got int 1",
    ),
    yaml_case(
        "logging-list",
        "version: 1\nlogging: []\n",
        r"^p\.yaml:2: logging: expected a mapping with fields level, format",
    ),
    yaml_case(
        "log-level-bad",
        "version: 1\nlogging: {level: loud}\n",
        r"^p\.yaml:2: logging\.level: unknown log level 'loud'; accepted: debug",
    ),
    yaml_case(
        "log-format-bad",
        "version: 1\nlogging: {format: xml}\n",
        r"^p\.yaml:2: logging\.format: unknown log format 'xml'; accepted: auto, console, json, stdlib",
    ),
    yaml_case(
        "headroom-too-big",
        "version: 1\nheadroom: 1.5\n",
        r"^p\.yaml:2: headroom: expected a fraction in \[0, 1\)",
    ),
    yaml_case(
        "headroom-bad-percent",
        "version: 1\nheadroom: 110%\n",
        r"^p\.yaml:2: headroom: expected a fraction",
    ),
    # Targets
    yaml_case(
        "target-unknown-platform",
        R + "{match: a, device: npu}\n",
        r"^p\.yaml:3: rules\[0\]\.device: unknown platform 'npu'",
    ),
    yaml_case("target-typo", R + "{match: a, device: gpuu:0}\n", r"did you mean 'gpu'\?"),
    yaml_case(
        "target-uppercase",
        "version: 1\ndefault: CPU\n",
        r"^p\.yaml:2: default: .*did you mean 'cpu'\?",
    ),
    yaml_case(
        "target-negative-index",
        R + "{match: a, device: 'gpu:-1'}\n",
        r"^p\.yaml:3: rules\[0\]\.device: not a target: 'gpu:-1'",
    ),
    yaml_case(
        "target-huge-index",
        R + "{match: a, device: 'gpu:99999999999'}\n",
        r"^p\.yaml:3: rules\[0\]\.device: device index 99999999999 .* out of range \(0\.\.65535\)",
    ),
    yaml_case(
        "target-leading-zero", R + "{match: a, device: 'cpu:01'}\n", r"not a target: 'cpu:01'"
    ),
    yaml_case(
        "target-auto-index",
        "version: 1\ndefault: 'auto:1'\n",
        r"^p\.yaml:2: default: 'auto:1': `auto` takes no device index",
    ),
    yaml_case(
        "target-number",
        R + "{match: a, device: 3}\n",
        r"^p\.yaml:3: rules\[0\]\.device: expected a target string, got int 3",
    ),
    yaml_case(
        "target-null",
        R + "{match: a, device: null}\n",
        r"^p\.yaml:3: rules\[0\]: give exactly one of `device` \(a target such as cpu or gpu:1\) or `sharding`",
    ),
    yaml_case(
        "fallback-bad-entry",
        "version: 1\nfallback: [cpu, 'tpu:x']\n",
        r"^p\.yaml:2: fallback\[1\]: not a target: 'tpu:x'",
    ),
    yaml_case(
        "reject-in-a-rule",
        R + "{match: a, device: reject}\n",
        r"^p\.yaml:3: rules\[0\]\.device: unknown platform 'reject'",
    ),
    yaml_case(
        "memory-kind-bad",
        R + "{match: a, device: cpu, memory: hbm}\n",
        r"^p\.yaml:3: rules\[0\]\.memory: unknown memory kind 'hbm'; accepted: device, pinned_host, unpinned_host",
    ),
    # Sizes and regexes
    yaml_case(
        "size-negative",
        R + "{match: a, device: cpu, min_bytes: -1}\n",
        r"^p\.yaml:3: rules\[0\]\.min_bytes: size out of range: -1",
    ),
    yaml_case(
        "size-bad-unit",
        R + "{match: a, device: cpu, min_bytes: 4 gigs}\n",
        r"unknown size unit 'gigs'",
    ),
    yaml_case(
        "size-fraction-of-byte",
        R + "{match: a, device: cpu, max_bytes: 0.5B}\n",
        r"is not a whole number of bytes",
    ),
    yaml_case(
        "size-infinite", R + "{match: a, device: cpu, max_bytes: .inf}\n", r"size must be finite"
    ),
    yaml_case(
        "size-bool",
        R + "{match: a, device: cpu, max_bytes: true}\n",
        r"expected a size, got the boolean True",
    ),
    yaml_case(
        "size-huge", R + "{match: a, device: cpu, max_bytes: 99999999PiB}\n", r"size out of range"
    ),
    yaml_case(
        "size-min-above-max",
        R + "{match: a, device: cpu, min_bytes: 2KiB, max_bytes: 1KiB}\n",
        r"min_bytes \(2048\) is larger than max_bytes \(1024\)",
    ),
    yaml_case(
        "regex-unbalanced",
        R + "{regex: '(a', device: cpu}\n",
        r"^p\.yaml:3: rules\[0\]\.regex: invalid regular expression '\(a': missing \)",
    ),
    yaml_case(
        "regex-nothing-to-repeat",
        R + "{regex: '*a', device: cpu}\n",
        r"invalid regular expression '\*a': nothing to repeat",
    ),
    yaml_case(
        "regex-bad-class",
        R + "{regex: '[a-', device: cpu}\n",
        r"invalid regular expression '\[a-': unterminated character set",
    ),
    # Mappings and overrides given in code
    Case(
        "mapping-unknown-key",
        lambda _: devpolicy.load_policy({"version": 1, "x": 1}, environ={}),
        devpolicy.PolicyError,
        r"^<mapping>: x: unknown field 'x'",
    ),
    Case(
        "overrides-bad-target",
        lambda _: devpolicy.load_policy({"version": 1}, environ={}, overrides={"default": "gpuu"}),
        devpolicy.PolicyError,
        r"^<overrides>: default: unknown platform 'gpuu'",
    ),
    # Environment: every variable
    env_case(
        "env-file-missing",
        {"DEVPOLICY_FILE": "nope.yaml"},
        r"^DEVPOLICY_FILE='nope\.yaml': no such file; accepted: the path of a YAML policy file",
    ),
    env_case(
        "env-empty-unknown-variable-no-file-hint",
        {"DEVPOLICY_X": ""},
        r"^DEVPOLICY_X='': unknown devpolicy variable; accepted:",
    ),
    env_case(
        "env-lowercase-suffix-hint",
        {"DEVPOLICY_file": "p.yaml"},
        r"^DEVPOLICY_file='p\.yaml': unknown devpolicy variable \(did you mean 'DEVPOLICY_FILE'\?\)",
    ),
    env_case(
        "env-file-char-device",
        {"DEVPOLICY_FILE": "/dev/null"},
        r"^DEVPOLICY_FILE='/dev/null': is a character device, not a policy file",
    ),
    env_case("env-file-directory", {"DEVPOLICY_FILE": "/"}, r"^DEVPOLICY_FILE='/': is a directory"),
    env_case(
        "env-rules-no-equals",
        {"DEVPOLICY_RULES": "a"},
        r"^DEVPOLICY_RULES='a': item 0 \('a'\) is not pattern=target",
    ),
    env_case(
        "env-rules-empty-item",
        {"DEVPOLICY_RULES": "a=cpu,"},
        r"item 1 \(''\) is not pattern=target",
    ),
    env_case(
        "env-rules-bad-target", {"DEVPOLICY_RULES": "a=cpu:x"}, r"item 0: not a target: 'cpu:x'"
    ),
    env_case(
        "env-rules-huge-index",
        {"DEVPOLICY_RULES": "a=cpu:999999"},
        r"item 0: device index 999999 .* out of range",
    ),
    env_case(
        "env-default-bad", {"DEVPOLICY_DEFAULT": "gpu:"}, r"^DEVPOLICY_DEFAULT='gpu:': not a target"
    ),
    env_case(
        "env-strict-bad",
        {"DEVPOLICY_STRICT": "sometimes"},
        r"^DEVPOLICY_STRICT='sometimes': not a boolean; accepted: 1, true",
    ),
    env_case(
        "env-disable-bad",
        {"DEVPOLICY_DISABLE": "disable"},
        r"^DEVPOLICY_DISABLE='disable': not a boolean",
    ),
    env_case(
        "env-log-level-bad",
        {"DEVPOLICY_LOG_LEVEL": "trace"},
        r"^DEVPOLICY_LOG_LEVEL='trace': unknown value; accepted: debug, info",
    ),
    env_case(
        "env-log-format-bad",
        {"DEVPOLICY_LOG_FORMAT": "yaml"},
        r"^DEVPOLICY_LOG_FORMAT='yaml': unknown value",
    ),
    env_case(
        "env-unknown-variable",
        {"DEVPOLICY_STICT": "1"},
        r"^DEVPOLICY_STICT='1': unknown devpolicy variable \(did you mean 'DEVPOLICY_STRICT'\?\)",
    ),
    # safetensors files
    file_case("st-empty", b"", r"file is 0 bytes, too short to hold the 8-byte header length"),
    file_case("st-seven-bytes", b"\x01" * 7, r"file is 7 bytes, too short"),
    file_case(
        "st-length-past-end",
        safetensors_bytes({}, length=4096),
        r"header length 4096 is larger than the rest of the file",
    ),
    file_case(
        "st-length-huge",
        struct.pack("<Q", 2**63) + b"{}",
        r"header length 9223372036854775808 is larger than the rest",
    ),
    file_case("st-not-utf8", safetensors_bytes(b"\xff\xfe\xfd"), r"header is not UTF-8 \(byte 8\)"),
    file_case("st-not-json", safetensors_bytes(b"{'t': 1}"), r"header is not valid JSON"),
    file_case("st-json-list", safetensors_bytes(b"[]"), r"header must be a JSON object, got list"),
    file_case(
        "st-unknown-dtype",
        safetensors_bytes(one(dtype="F128"), b"\0"),
        r"tensor 't': unknown dtype 'F128'; supported: BOOL",
    ),
    file_case(
        "st-missing-offsets",
        safetensors_bytes({"t": {"dtype": "U8", "shape": [1]}}),
        r"tensor 't': entry must be an object with dtype, shape and data_offsets "
        r"\(it lacks data_offsets\)$",
    ),
    file_case(
        "st-negative-shape",
        safetensors_bytes(one(shape=[-1]), b"\0"),
        r"tensor 't': shape must be a list of non-negative integers",
    ),
    file_case(
        "st-shape-not-list",
        safetensors_bytes(one(shape="1"), b"\0"),
        r"tensor 't': shape must be a list",
    ),  # type: ignore[arg-type]
    file_case(
        "st-shape-mismatch",
        safetensors_bytes(one(dtype="F32"), b"\0"),
        r"tensor 't': shape \[1\] of F32 needs 4 bytes but data_offsets \[0, 1\] give 1",
    ),
    file_case(
        "st-offsets-reversed",
        safetensors_bytes(one(offsets=[1, 0]), b"\0"),
        r"data_offsets must be \[begin, end\] with begin <= end",
    ),
    file_case(
        "st-offsets-past-end",
        safetensors_bytes(one(offsets=[0, 1]), b""),
        r"tensors need 1 data bytes but the file has 0: truncated\?",
    ),
    file_case(
        "st-offsets-far-outside",
        safetensors_bytes(one(shape=[1000], offsets=[0, 1000]), b"\0" * 10),
        r"tensors need 1000 data bytes but the file has 10",
    ),
    file_case(
        "st-trailing-bytes",
        safetensors_bytes(one(), b"\0\0\0"),
        r"2 bytes after the last tensor are not described",
    ),
    file_case(
        "st-hole",
        safetensors_bytes(one(offsets=[2, 3]), b"\0\0\0"),
        r"starts at data byte 2, leaving a hole at 0",
    ),
    file_case(
        "st-overlap",
        safetensors_bytes(
            {
                "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]},
            },
            b"\0" * 3,
        ),
        r"tensor 'b': overlaps 'a'",
    ),
    file_case(  # the last entry of a repeated tensor wins, but each must be valid
        "st-duplicate-tensor-replaced-entry-bad",
        safetensors_bytes(
            b'{"t": {"dtype": "Q8", "shape": [1], "data_offsets": [0, 1]}, "t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
            b"\0",
        ),
        r"tensor 't': unknown dtype 'Q8'",
    ),
    file_case(
        "st-bad-metadata",
        safetensors_bytes({"__metadata__": {"k": 1}}),
        r"__metadata__ must map strings to strings",
    ),
    file_case(
        "st-dtype-not-string",
        safetensors_bytes(
            {"t": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4
        ),
        r"tensor 't': unknown dtype \['F32'\]",
    ),
    file_case(
        "st-nested-too-deep",
        safetensors_bytes(b"[" * 100_000 + b"]" * 100_000),
        r"header JSON is nested too deeply",
    ),
    file_case(
        "st-integer-too-long",
        safetensors_bytes(b'{"t": ' + b"9" * 5000 + b"}"),
        r"header is not usable JSON",
    ),
    file_case(
        "st-too-many-dims",
        safetensors_bytes(one(shape=[1] * 65), b"\0"),
        r"tensor 't': 65 dimensions; numpy .* holds at most (64|32)$",  # numpy 2 | numpy 1
    ),
    file_case(
        "st-huge-dimension",
        safetensors_bytes(one(shape=[2**64, 0], offsets=[0, 0])),
        r"tensor 't': shape must be a list of non-negative integers",
    ),
    file_case(
        "st-empty-shape-too-large-for-numpy",
        safetensors_bytes(one(shape=[2**61, 2**61, 0], offsets=[0, 0])),
        r"tensor 't': shape \[2305843009213693952, 2305843009213693952, 0\] overflows 64 bits",
    ),
    file_case(
        "st-duplicate-key-inside-an-entry",
        safetensors_bytes(
            b'{"t": {"dtype": "U8", "dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', b"\0"
        ),
        r"tensor 't': entry gives 'dtype' more than once$",
    ),
    file_case(
        "st-metadata-twice",
        safetensors_bytes(b'{"__metadata__": {}, "__metadata__": {}}'),
        r"safetensors: __metadata__ given more than once$",
    ),
    file_case(
        "st-offsets-bool",
        safetensors_bytes(one(offsets=[False, True]), b"\0"),
        r"data_offsets must be \[begin, end\]",
    ),
]


def test_the_corpus_is_large_enough() -> None:
    """The issue asks for at least 60 malformed inputs."""
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_input_raises_its_specific_error(case: Case, tmp_path: Path) -> None:
    """Each input raises the specific DevicePolicyError subclass, saying where and what."""
    before = jax.config.jax_default_device
    with pytest.raises(case.error, match=case.match) as info:
        case.run(tmp_path)
    assert isinstance(info.value, devpolicy.DevicePolicyError)
    assert type(info.value.__cause__).__module__.split(".")[0] not in (
        "yaml",
        "pydantic",
        "pydantic_core",
        "json",
    )
    assert jax.config.jax_default_device == before


class TestRandomFiles:
    @settings(
        max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(st.binary(max_size=120))
    def test_random_bytes_load_or_raise_cleanly(self, tmp_path: Path, data: bytes) -> None:
        """Any byte string as a safetensors file either loads or raises SafetensorsFileError."""
        (tmp_path / "r.safetensors").write_bytes(data)
        policy = devpolicy.load_policy({"version": 1, "logging": {"level": "error"}}, environ={})
        try:
            out = devpolicy.load_file(tmp_path / "r.safetensors", policy=policy)
        except devpolicy.SafetensorsFileError:
            return
        assert isinstance(out, dict)

    @pytest.mark.slow
    @settings(
        max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(
        st.dictionaries(
            st.text(min_size=1, max_size=4),
            st.fixed_dictionaries(
                {
                    "dtype": st.sampled_from(["U8", "F32", "I64", "BF16", "X"]),
                    "shape": st.lists(st.integers(-1, 4), max_size=3),
                    "data_offsets": st.lists(st.integers(-1, 40), min_size=0, max_size=3),
                }
            ),
            max_size=3,
        ),
        st.binary(max_size=48),
    )
    def test_random_headers_load_or_raise_cleanly(
        self, tmp_path: Path, header: dict[str, Any], data: bytes
    ) -> None:
        """Plausible but random headers never crash the loader or leak another exception."""
        (tmp_path / "r.safetensors").write_bytes(safetensors_bytes(header, data))
        policy = devpolicy.load_policy({"version": 1, "logging": {"level": "error"}}, environ={})
        with contextlib.suppress(devpolicy.SafetensorsFileError):
            devpolicy.load_file(tmp_path / "r.safetensors", policy=policy, narrow="lossy")
