"""Finding the policy when none is given: DEVPOLICY_FILE, devpolicy.yaml, pyproject.toml."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ._documents import display_path
from ._errors import PolicyError, did_you_mean
from ._files import FileRefused, check_regular, read_capped

POLICY_FILENAME = "devpolicy.yaml"
MAX_PYPROJECT_BYTES = 16 << 20


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
        # Anything by that name (a dangling link, a loop, a directory, a FIFO) is the policy:
        # reading it reports what is wrong, rather than a parent's policy being used instead.
        if os.path.lexists(candidate):
            return Found(candidate, f"{POLICY_FILENAME} in the working directory or a parent")
    for directory in directories:
        pyproject = directory / "pyproject.toml"
        if os.path.lexists(pyproject):
            return _from_pyproject(pyproject)
    return Found(None, "no policy file (every name goes to JAX's default device)")


def _from_pyproject(pyproject: Path) -> Found:
    label = display_path(pyproject)
    try:
        text = read_capped(pyproject, MAX_PYPROJECT_BYTES, "a pyproject.toml file").decode("utf-8")
        data = tomllib.loads(text)
    except FileRefused as e:
        raise PolicyError.single(
            label, None, "", f"cannot read pyproject.toml: {e.reason}"
        ) from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as e:
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
    why = check_regular(path, "a policy file")
    if why is not None:
        why = "policy file not found" if why == "no such file" else why
        raise PolicyError.single(
            label, None, "tool.devpolicy.policy", f"{why}: {display_path(path)}"
        )
    return Found(path, f"[tool.devpolicy] in {label}")
