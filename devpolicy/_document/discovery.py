"""Finding the policy when none is given: DEVPOLICY_FILE, devpolicy.yaml, pyproject.toml.

The search stays inside the project (it stops at the first directory holding
`pyproject.toml` or `.git`, and at a filesystem boundary), and a file it finds is used only
if neither it, nor a symlink followed on the way to it, nor a directory holding either
could have been written or re-pointed by someone other than you or root (`untrusted`).
"""

from __future__ import annotations

import os
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .._base.errors import PolicyError, UntrustedPolicyError, did_you_mean
from .._base.files import FileRefused, check_regular, read_capped, untrusted
from .documents import display_path

POLICY_FILENAME = "devpolicy.yaml"
MAX_PYPROJECT_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class Found:
    """A discovered policy file and how it was found (for `devpolicy check` and logs).

    Attributes:
        path: The policy file, or None when there is none.
        how: How it was found, in words.
        named: Whether the user named it (`DEVPOLICY_FILE`) rather than discovery finding it.
        looked: Where discovery looked, in order: each `devpolicy.yaml` it tried, then the
            project's `pyproject.toml` when there is one.
        no_cwd: Whether there was no working directory to look from (it was deleted).
    """

    path: Path | None
    how: str
    named: bool = False
    looked: tuple[Path, ...] = ()
    no_cwd: bool = False

    @property
    def looked_text(self) -> str:
        """Where discovery looked, in words (for the `no_policy` warning and its error).

        Example:
            >>> Found(None, "none", looked=(Path("/p/a/devpolicy.yaml"), Path("/p/devpolicy.yaml"),
            ...     Path("/p/pyproject.toml"))).looked_text
            'devpolicy.yaml in /p/a, /p; [tool.devpolicy] in /p/pyproject.toml'
        """
        if self.no_cwd:
            return f"nowhere: {NO_CWD}"
        places = [p.parent for p in self.looked if p.name == POLICY_FILENAME]
        parts = [f"{POLICY_FILENAME} in " + ", ".join(map(str, places))] if places else []
        parts += [f"[tool.devpolicy] in {p}" for p in self.looked if p.name == "pyproject.toml"]
        return "; ".join(parts) or "nowhere"


#: How to point devpolicy at a policy when discovery finds none (the error, when one is
#: required); the warning adds how to require one.
POLICY_POINTERS = (
    "set DEVPOLICY_FILE=path/to/devpolicy.yaml, or put devpolicy.yaml in the working "
    "directory or a parent up to the project root (or `[tool.devpolicy] policy = ...` in "
    "its pyproject.toml), or pass the policy: bootstrap(path), load_policy(path)"
)
NO_POLICY_FIX = f"{POLICY_POINTERS}; DEVPOLICY_REQUIRE=1 makes a missing policy an error"


#: Files whose presence marks a project's root: discovery never looks above it.
ROOT_MARKERS = ("pyproject.toml", ".git")

#: Why discovery looked nowhere: a working directory removed while a process was in it
#: (a shell or job left in a deleted checkout) has no path, so it has no policy either.
NO_CWD = "the working directory no longer exists"


def working_directory() -> Path | None:
    """The working directory, or None when it was deleted (or cannot be named): discovery
    then finds no policy, as plain JAX would start there."""
    try:
        return Path.cwd()
    except OSError:
        return None


def search_directories(cwd: Path) -> list[Path]:
    """`cwd` and its parents up to the project root, nearest first.

    The project root is the first directory holding `pyproject.toml` or `.git`, and is
    included. Like git (without GIT_DISCOVERY_ACROSS_FILESYSTEM) the walk never crosses
    into another filesystem. Without a project root it ends at `/`.
    """
    device = _device(cwd)
    found = []
    for directory in (cwd, *cwd.parents):
        if device is None or _device(directory) != device:
            break
        found.append(directory)
        if any(os.path.lexists(directory / marker) for marker in ROOT_MARKERS):
            break
    return found


def _device(directory: Path) -> int | None:
    """The filesystem a directory is on, or None if it cannot be examined."""
    try:
        return os.stat(directory).st_dev
    except OSError:
        return None


def discover(env_file: Path | None, cwd: Path | None) -> Found:
    """Find the policy file, in order: DEVPOLICY_FILE, `devpolicy.yaml` in `cwd` or a parent
    up to the project root, `[tool.devpolicy] policy` in the root's `pyproject.toml`; else
    none. No `cwd` (the working directory was deleted: `working_directory`) finds none
    but the one DEVPOLICY_FILE names.

    A file found (not named) must pass the trust check (`_files.untrusted`).

    Raises:
        PolicyError: if the project's `pyproject.toml` cannot be read or its
            `[tool.devpolicy]` table is malformed.
        UntrustedPolicyError: a file found could have been written or placed by someone
            other than you or root.
    """
    if env_file is not None:
        return Found(env_file, "DEVPOLICY_FILE", named=True)
    if cwd is None:
        return Found(None, f"no policy file ({NO_CWD})", no_cwd=True)
    directories = search_directories(cwd) or [cwd]
    for directory in directories:
        candidate = directory / POLICY_FILENAME
        # Anything by that name (a dangling link, a loop, a directory, a FIFO) is the policy:
        # reading it reports what is wrong, rather than a parent's policy being used instead.
        if os.path.lexists(candidate):
            _refuse_untrusted(candidate, "found")
            return Found(candidate, f"{POLICY_FILENAME} in the working directory or a parent")
    looked = tuple(directory.absolute() / POLICY_FILENAME for directory in directories)
    pyproject = directories[-1] / "pyproject.toml"
    if os.path.lexists(pyproject):
        found = _from_pyproject(pyproject)
        if found.path is None:
            return Found(None, found.how, looked=(*looked, pyproject.absolute()))
        return found
    return Found(None, "no policy file (every name goes to JAX's default device)", looked=looked)


def _refuse_untrusted(path: Path, how: str, policy: Path | None = None) -> None:
    """Raise UntrustedPolicyError if `path` (the policy, or the pyproject.toml naming
    `policy`) fails the trust check."""
    why = untrusted(path)
    if why is None:
        return
    shown = os.path.abspath(policy if policy is not None else path)
    fix = (
        f"devpolicy {how} this file without being told to use it, and does not trust it. "
        f"To use it anyway, name the policy yourself: DEVPOLICY_FILE={shlex.quote(shown)} "
        f"(or --policy, or load_policy(path)); to trust it from now on, {why.fix}"
    )
    raise UntrustedPolicyError(display_path(path), why.reason, why.uid, why.name, fix)


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
    # The table decides which file is read: it must be trusted like the file itself.
    path = pyproject.parent / policy
    _refuse_untrusted(pyproject, "read [tool.devpolicy] from", path)
    why = check_regular(path, "a policy file")
    if why is not None:
        why = "policy file not found" if why == "no such file" else why
        raise PolicyError.single(
            label, None, "tool.devpolicy.policy", f"{why}: {display_path(path)}"
        )
    _refuse_untrusted(path, "found")
    return Found(path, f"[tool.devpolicy] in {label}")
