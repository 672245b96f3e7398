"""The README's figures for the test suite stay true: its count is the collected count,
rounded, and the stream model test's examples are the ones it states, by default and in CI."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.apply import test_stream_model
from tests.conftest import REPO

#: The README rounds the suite's count to this, so it need not change with each test added.
ROUNDED_TO = 500


def quick_start() -> str:
    """The README's Quick start, its prose without the code block."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Quick start\n(.*?)(?=^## |\Z)", readme, re.S | re.M)
    assert section is not None, "README.md has no Quick start"
    return re.sub(r"^```.*?^```", "", section.group(1), flags=re.S | re.M)


def stated(pattern: str) -> int:
    """The one number the Quick start states where `pattern` (one group) matches."""
    found = re.findall(pattern, " ".join(quick_start().split()))
    assert len(found) == 1, f"the README's Quick start should say {pattern!r} once: {found}"
    return int(found[0].replace(",", ""))


def test_the_stream_model_runs_the_readmes_examples_and_ci_asks_for_the_full_number() -> None:
    """By default the stream model test runs the examples a read path the README says, and
    .ci/run asks for the full number the README gives CI, before the README's test command."""
    assert stated(r"runs (\d+) examples a read path") == test_stream_model.DEFAULT_EXAMPLES
    assert stated(r"`STREAM_MODEL_EXAMPLES=(\d+)`") == test_stream_model.CI_EXAMPLES
    assert test_stream_model.CI_EXAMPLES > test_stream_model.DEFAULT_EXAMPLES
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    asked = ci.find(f"export STREAM_MODEL_EXAMPLES={test_stream_model.CI_EXAMPLES}\n")
    assert asked != -1, ".ci/run does not ask for the stream model test's full examples"
    assert asked < ci.index('pip install -e ".[test]" && python -m pytest'), (
        ".ci/run asks for the full examples after the test command"
    )


@pytest.mark.slow
def test_the_readmes_count_of_tests_is_the_collected_count_rounded() -> None:
    """`about N tests` in the Quick start is what pytest collects, to the nearest 500."""
    said = stated(r"about ([\d,]+) tests")
    assert said % ROUNDED_TO == 0, f"the README's {said:,} tests is not rounded to {ROUNDED_TO}"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    collected = int(re.findall(r"^(\d+) tests? collected", run.stdout, re.M)[-1])
    rounded = int(collected / ROUNDED_TO + 0.5) * ROUNDED_TO
    assert said == rounded, (
        f"{collected:,} tests collected: the README's Quick start should say about {rounded:,}"
    )
