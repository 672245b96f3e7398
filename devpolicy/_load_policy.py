"""`load_policy`: read a policy and apply the environment and code layers."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._capacity import Capacity
from ._discovery import discover
from ._documents import display_path, read_document, validate_overrides
from ._env import read_env
from ._layers import merge
from ._policy import Policy

PolicyInput = str | os.PathLike[str] | Mapping[str, Any]

#: Policy files loaded by path in this process and not yet compared with the discovered
#: policy (absolute path, as shown). `_active` drains it to warn when module-level calls
#: decide by a discovered policy while another file was loaded (and not activated).
loaded_files: list[tuple[str, str]] = []


def load_policy(
    source: PolicyInput | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    capacity: Capacity | None = None,
) -> Policy:
    """Load a policy and apply `DEVPOLICY_*` environment overrides.

    Layers, lowest precedence first: built-in defaults < the policy file (or mapping) <
    environment < `overrides` given here. Rules from higher layers are tried first.

    Args:
        source: A YAML file path or a mapping. None discovers: `DEVPOLICY_FILE`, else
            `devpolicy.yaml` in the working directory or a parent, else
            `[tool.devpolicy] policy = "..."` in the nearest `pyproject.toml`, else an
            empty policy (every name goes to JAX's default device).
        overrides: Settings given in code, highest precedence: `default`, `fallback`,
            `strict`, `disable`, `rules` (tried before all others), `logging_level`,
            `logging_format`.
        environ: Environment to read instead of `os.environ`.
        capacity: Where memory-aware placement (`fits`, sized `auto`) learns free memory;
            default `DeviceMemory()` (the backend's memory stats, else host RAM). Pass a
            `StaticCapacity` to plan for stated capacities.

    Raises:
        PolicyError: the policy is malformed (file, line, field path, valid choices).
        EnvOverrideError: a `DEVPOLICY_*` variable is malformed.

    Example:
        >>> import devpolicy
        >>> rules = [{"match": "dataset/*", "device": "cpu"}]
        >>> p = devpolicy.load_policy({"version": 1, "rules": rules},
        ...                           environ={"DEVPOLICY_RULES": "dataset/*=cpu:1"})
        >>> p.resolve("dataset/train").device_text, p.resolve("dataset/train").origin
        ('cpu:1', 'env:DEVPOLICY_RULES')
    """
    env = read_env(os.environ if environ is None else environ)
    code = validate_overrides(overrides) if overrides is not None else None
    if source is None:
        found = discover(env.file, Path.cwd())
        document = read_document(found.path) if found.path is not None else None
        how = found.how
    else:
        document = read_document(source)
        how = "given to load_policy" if isinstance(source, Mapping) else display_path(Path(source))
        if not isinstance(source, Mapping):
            loaded_files.append((os.path.abspath(source), how))
    return Policy(merge(document, env, code), how, capacity)
