"""Finding the policy when none is given: DEVPOLICY_FILE, devpolicy.yaml, pyproject.toml."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from ._documents import display_path
from ._errors import PolicyError, did_you_mean

POLICY_FILENAME = "devpolicy.yaml"


@dataclass(frozen=True, slots=True)
class Found:
    """A discovered policy file and how it was found (for `devpolicy check` and logs)."""

    path: Path | None
    how: str


def discover(env_file: Path | None, cwd: Path) -> Found:
    """Find the policy file, in order: DEVPOLICY_FILE, `devpolicy.yaml` in `cwd` or a parent,
    `[tool.devpolicy] policy` in the nearest `pyproject.toml`; else none.

    Raises:
        PolicyError: if the nearest `pyproject.toml` cannot be read or its
            `[tool.devpolicy]` table is malformed.
    """
    if env_file is not None:
        return Found(env_file, "DEVPOLICY_FILE")
    directories = [cwd, *cwd.parents]
    for directory in directories:
        candidate = directory / POLICY_FILENAME
        if candidate.is_file():
            return Found(candidate, f"{POLICY_FILENAME} in the working directory or a parent")
    for directory in directories:
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file():
            return _from_pyproject(pyproject)
    return Found(None, "no policy file (every name goes to JAX's default device)")


def _from_pyproject(pyproject: Path) -> Found:
    label = display_path(pyproject)
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise PolicyError.single(label, None, "", f"cannot read pyproject.toml: {e}") from None
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise PolicyError.single(label, None, "tool", "must be a table")
    table = tool.get("devpolicy")
    if table is None:
        return Found(None, f"no policy file ({label} has no [tool.devpolicy] table)")
    if not isinstance(table, dict):
        raise PolicyError.single(label, None, "tool.devpolicy", "must be a table")
    unknown = sorted(set(table) - {"policy"})
    if unknown:
        hint = did_you_mean(unknown[0], ["policy"])
        raise PolicyError.single(
            label, None, f"tool.devpolicy.{unknown[0]}", f"unknown key{hint}; valid keys: policy"
        )
    policy = table.get("policy")
    if not isinstance(policy, str) or not policy:
        raise PolicyError.single(
            label, None, "tool.devpolicy.policy", f"must be a path to a policy file, got {policy!r}"
        )
    path = pyproject.parent / policy
    if not path.is_file():
        raise PolicyError.single(
            label, None, "tool.devpolicy.policy", f"policy file not found: {display_path(path)}"
        )
    return Found(path, f"[tool.devpolicy] in {label}")
