"""`load_policy`: read a policy and apply the environment and code layers.

`load_settings` does all of it but build the `Policy`, and imports no JAX: `devpolicy run`
prepares a child's environment with it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._base.errors import PolicyError
from .._base.files import Untrusted, untrusted
from .._document.discovery import (
    NO_POLICY_FIX,
    POLICY_POINTERS,
    Found,
    discover,
    working_directory,
)
from .._document.documents import display_path, read_document, validate_overrides
from .._document.environment import read_env
from .._document.layers import Settings, merge

if TYPE_CHECKING:
    from .._machine.capacity import Capacity
    from .policy import Policy

PolicyInput = str | os.PathLike[str] | Mapping[str, Any]

#: Policy files loaded by path in this process and not yet compared with the discovered
#: policy (absolute path, as shown). `_active` drains it to warn when module-level calls
#: decide by a discovered policy while another file was loaded (and not activated).
loaded_files: list[tuple[str, str]] = []
_lock = threading.Lock()
#: Whether this process has said that discovery found no policy (`no_policy`, once).
_said_nothing_found = False


@dataclass(frozen=True, slots=True)
class Loaded:
    """Settings of every layer, how the policy was found, and the trust check's verdict.

    Attributes:
        settings: The merged settings.
        how: How the policy was found (`DEVPOLICY_FILE`, a path, ...).
        untrusted: Why the file the user named is not trusted, or None. (A file that
            discovery found untrusted is refused, never loaded.)
        nothing_found: Discovery's result when it found no policy and the environment
            gives none either (no rules, no default, not disabled): every name goes to
            JAX's default device, which is said (`no_policy`). Else None.
    """

    settings: Settings
    how: str
    untrusted: Untrusted | None = None
    nothing_found: Found | None = None

    def untrusted_fields(self) -> dict[str, Any]:
        """Fields of the `untrusted_policy` warning event."""
        assert self.untrusted is not None
        return {
            "policy": self.settings.file,
            "reason": self.untrusted.reason,
            "owner_uid": self.untrusted.uid,
            "owner": self.untrusted.name,
            "fix": self.untrusted.fix,
        }


def load_settings(
    source: PolicyInput | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    required: bool | None = None,
) -> Loaded:
    """Everything `load_policy` does but build the Policy (no JAX is imported).

    Raises:
        PolicyError, EnvOverrideError: as `load_policy`.
        UntrustedPolicyError: discovery found a file someone else could have written.
    """
    env = read_env(os.environ if environ is None else environ)
    code = validate_overrides(overrides) if overrides is not None else None
    named: Path | None = None
    nothing_found = None
    if source is None:
        found = discover(env.file, working_directory())
        document = read_document(found.path) if found.path is not None else None
        how = found.how
        named = found.path if found.named else None
        if found.path is None and not env.rules and env.default is None and not env.disable:
            nothing_found = found
            _refuse_nothing_found(found, required, env.require)
    else:
        document = read_document(source)
        how = "given to load_policy" if isinstance(source, Mapping) else display_path(Path(source))
        named = None if isinstance(source, Mapping) else Path(source)
    # A file the user named is theirs to choose: used, with a warning if others could
    # have written it. (Discovery refuses such a file.)
    why = untrusted(named) if named is not None else None
    return Loaded(merge(document, env, code), how, why, nothing_found)


def _refuse_nothing_found(found: Found, required: bool | None, env_require: bool | None) -> None:
    """Raise when a policy is required (`required=True`, else `DEVPOLICY_REQUIRE`) and
    discovery found none."""
    if not (required if required is not None else env_require):
        return
    asked = "required=True" if required else "DEVPOLICY_REQUIRE"
    raise PolicyError.single(
        asked,
        None,
        "",
        f"no policy found (looked for {found.looked_text}), and a policy is required; "
        f"to fix: {POLICY_POINTERS}",
    )


def say_nothing_found(policy: Policy, found: Found) -> None:
    """The `no_policy` warning: once per process (until `forget_nothing_found`)."""
    global _said_nothing_found
    with _lock:
        if _said_nothing_found:
            return
        _said_nothing_found = True
    policy.events.emit(
        "warning",
        "no_policy",
        {
            "looked": found.looked_text,
            "effect": "an empty policy: every name goes to JAX's default device, unsharded",
            "fix": NO_POLICY_FIX,
        },
    )


def forget_nothing_found() -> None:
    """Say `no_policy` again at the next discovery that finds nothing."""
    global _said_nothing_found
    with _lock:
        _said_nothing_found = False


def load_policy(
    source: PolicyInput | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    capacity: Capacity | None = None,
    required: bool | None = None,
) -> Policy:
    """Load a policy and apply `DEVPOLICY_*` environment overrides.

    Layers, lowest precedence first: built-in defaults < the policy file (or mapping) <
    environment < `overrides` given here. Rules from higher layers are tried first.

    Args:
        source: A YAML file path or a mapping. None discovers: `DEVPOLICY_FILE`, else
            `devpolicy.yaml` in the working directory or a parent up to the project root,
            else `[tool.devpolicy] policy = "..."` in the project's `pyproject.toml`, else
            an empty policy (every name goes to JAX's default device). A file discovery
            finds must pass the trust check (README, "Trust"); a file named here or in
            `DEVPOLICY_FILE` that fails it is used, with an `untrusted_policy` warning.
        overrides: Settings given in code, highest precedence: `default`, `fallback`,
            `strict`, `disable`, `rules` (tried before all others), `logging_level`,
            `logging_format`.
        environ: Environment to read instead of `os.environ`.
        capacity: Where memory-aware placement (`fits`, sized `auto`) learns free memory;
            default `DeviceMemory()` (the backend's memory stats, else host RAM). Pass a
            `StaticCapacity` to plan for stated capacities.
        required: With `source=None`: whether finding no policy (no file, and no
            `DEVPOLICY_RULES`/`DEVPOLICY_DEFAULT`) raises; None: `DEVPOLICY_REQUIRE`
            decides. Not required, it is one `no_policy` warning per process, naming where
            discovery looked and the fix.

    Raises:
        PolicyError: the policy is malformed (file, line, field path, valid choices), or
            none was found and one is required.
        UntrustedPolicyError: discovery found a policy file that someone other than you
            or root could have written or put there (a PolicyError).
        EnvOverrideError: a `DEVPOLICY_*` variable is malformed.

    Example:
        >>> import devpolicy
        >>> rules = [{"match": "dataset/*", "device": "cpu"}]
        >>> p = devpolicy.load_policy({"version": 1, "rules": rules},
        ...                           environ={"DEVPOLICY_RULES": "dataset/*=cpu:1"})
        >>> p.resolve("dataset/train").device_text, p.resolve("dataset/train").origin
        ('cpu:1', 'env:DEVPOLICY_RULES')
    """
    # Imported here, not above: the Policy brings JAX, which `load_settings` must not.
    from .policy import Policy

    loaded = load_settings(source, overrides=overrides, environ=environ, required=required)
    if source is not None and not isinstance(source, Mapping):
        loaded_files.append((os.path.abspath(source), loaded.how))
    policy = Policy(loaded.settings, loaded.how, capacity)
    if loaded.untrusted is not None:
        policy.events.emit("warning", "untrusted_policy", loaded.untrusted_fields())
    if loaded.nothing_found is not None:
        say_nothing_found(policy, loaded.nothing_found)
    return policy
