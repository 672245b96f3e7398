"""A user's type checker sees devpolicy's real types after the README's editable install.

setuptools' default editable install of a flat layout is an import hook (a
`__editable___*_finder.py` that a `.pth` line installs), which type checkers do not run:
mypy in the user's project then finds no `devpolicy` at all and treats it as `Any`.
`pyproject.toml` maps the root package directory explicitly (`package-dir = {"" = "."}`),
so setuptools writes a plain path `.pth` instead, which mypy and pyright read.
"""

from __future__ import annotations

import importlib.util
import os
import re
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.conftest import REPO

USER_SCRIPT = """\
import devpolicy

reveal_type(devpolicy.load_file)
reveal_type(devpolicy.load_policy("devpolicy.yaml").resolve("model/w").device_text)
with devpolicy.windows([1, 2, 3], 2, 1) as stream:
    reveal_type(stream.state())
"""


def outer_site_packages() -> list[str]:
    """Where this environment's packages are (mypy among them), for the fresh venv's .pth."""
    return [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)] or list(
        site.getsitepackages()
    )


@pytest.mark.slow
def test_mypy_in_a_users_project_sees_real_types_after_an_editable_install(
    tmp_path: Path,
) -> None:
    """`pip install -e .` (no deps; the other packages visible through a .pth) into a fresh
    venv, then mypy on a user's script: `devpolicy.load_file` is a function, not Any."""
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("this test needs mypy: pip install -e '.[dev,docs]'", pytrace=False)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "outer.pth").write_text("\n".join(outer_site_packages()) + "\n")
    environ = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "-e",
            str(REPO),
        ],
        capture_output=True,
        text=True,
        env=environ,
        timeout=600,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-4000:]
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(USER_SCRIPT, encoding="utf-8")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--python-executable",
            str(python),
            "--follow-imports=silent",
            "--cache-dir",
            str(tmp_path / "cache"),
            "train.py",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        env=environ,
        timeout=600,
        check=False,
    )
    notes = [line for line in result.stdout.splitlines() if "Revealed type" in line]
    assert len(notes) == 3, result.stdout + result.stderr
    assert "def (path:" in notes[0], notes[0]
    assert "Any" not in notes[0], notes[0]
    assert re.search(r'Revealed type is "(builtins\.)?str"$', notes[1]), notes[1]
    # A stream opened in a `with` is still a WindowStream: its state() is known.
    assert re.search(r'Revealed type is "(builtins\.)?dict\[(builtins\.)?str, Any\]"$', notes[2]), (
        result.stdout
    )
