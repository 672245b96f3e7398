"""The story devpolicy exists for, at full scale, as a new user runs it from the README.

A 19.09 GiB safetensors file of 10,248,871,837 uint16 tokens (written sparse: its full size
on paper, a few known values at known offsets) is loaded by the README's first policy and
its first code block, unchanged but for the number of steps, in a fresh process with two
CPU devices and the batch rule sent to the second one (`DEVPOLICY_RULES`, as the README
shows): the tokens must be mapped on the host without the process growing past 1 GiB,
windows past 2**31 and at the very end must hold the values written and arrive on the
batch device, and the ledger must show the tokens as file-backed on the host.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import devpolicy
from tests.conftest import REPO

README = REPO / "README.md"
STORY_TOKENS = 10_248_871_837
GiB = 2**30
SMALL = 65_536


def known(count: int) -> dict[int, list[int]]:
    """Token offsets and the values written there: the first window, one past 2**31 (where
    the file reaches it), one in the middle and the last window."""
    values = {0: [1, 2, 3], count // 2: [11, 12, 13], count - 3: [7, 8, 9]}
    if count > 2**31 + 8:
        values[2**31 + 5] = [4242, 4243, 4244]
    return values


def readme_block(language: str) -> str:
    """The README's first fenced block in `language`, as written there."""
    found = re.search(rf"```{language}\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert found is not None, f"README has no {language} block"
    return found.group(1)


def story_file(path: Path, count: int, *, aligned: bool) -> int:
    """One `tokens` tensor of `count` uint16 values, zeros but for `known(count)`; returns the
    file offset of its data. `aligned=False` lays the header out as
    `safetensors.numpy.save_file` does (padded to 8 bytes only), so the data is not at a
    64-byte boundary and cannot be mapped."""
    header = json.dumps(
        {"tokens": {"dtype": "U16", "shape": [count], "data_offsets": [0, 2 * count]}},
        separators=(",", ":"),
    ).encode()
    header += b" " * (-(8 + len(header)) % (64 if aligned else 8))
    if not aligned and (8 + len(header)) % 64 == 0:
        header += b" " * 8
    start = 8 + len(header)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(start + 2 * count)
        for offset, values in known(count).items():
            data = np.asarray(values, dtype="<u2").tobytes()
            os.pwrite(f.fileno(), data, start + 2 * offset)
    return start


def write_model(path: Path) -> None:
    rng = np.random.default_rng(0)
    devpolicy.save_file(
        {
            "embed": rng.normal(size=(512, 16)).astype(np.float32),
            "out": rng.normal(size=(16,)).astype(np.float32),
        },
        path,
    )


#: Runs before the README's block: a training step that records what it was given.
PROLOGUE = """
import json
seen = []

def train_step(params, batch):
    (device,) = batch.devices()
    seen.append((devpolicy.inventory().text(device), list(batch.shape), str(batch.dtype)))
    return 0.0
"""

#: Runs after it: what the test checks, printed as one JSON line.
EPILOGUE = """
view = devpolicy.host_view(tokens)
values = {k: view[int(k) : int(k) + len(v)].tolist() for k, v in json.loads(KNOWN).items()}
tail = next(iter(devpolicy.windows(tokens, 3, 2, stride=len(view) - 3)))
(tail_device,) = tail.devices()
ledger = devpolicy.report()
host = ledger.by_device["cpu:0"]
tokens_entry = next(e for e in host.entries if "train/tokens" in e.names)
with open("/proc/self/status", encoding="ascii") as status:
    hwm = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
(tokens_device,) = tokens.devices()
print("RESULT " + json.dumps({
    "tokens_device": devpolicy.inventory().text(tokens_device),
    "shape": list(tokens.shape),
    "values": values,
    "tail": tail.tolist(),
    "tail_device": devpolicy.inventory().text(tail_device),
    "seen": seen,
    "tokens_nbytes": tokens_entry.nbytes,
    "tokens_file_backed": tokens_entry.file_backed,
    "tokens_origin": tokens_entry.origin,
    "peak_rss": hwm,
}))
"""


def run_readme_story(project: Path, steps: int, count: int) -> tuple[dict[str, object], str]:
    """The README's first code block, run as a user would (its policy as `devpolicy.yaml`
    in the working directory), with `steps` steps; returns the checks and stderr."""
    (project / "devpolicy.yaml").write_text(readme_block("yaml"), encoding="utf-8")
    code = readme_block("python")
    assert "steps=1000" in code, "the README's story calls windows(..., steps=1000)"
    code = code.replace("steps=1000", f"steps={steps}")
    head, _, rest = code.partition("devpolicy.bootstrap()")
    script = head + "devpolicy.bootstrap()" + PROLOGUE + rest + EPILOGUE
    script = f"KNOWN = {json.dumps(json.dumps(known(count)))}\n" + script
    (project / "story.py").write_text(script, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOLICY_", "XLA_", "JAX_"))}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    env["DEVPOLICY_RULES"] = "batch*=cpu:1"
    env["PYTHONPATH"] = str(REPO)
    result = subprocess.run(
        [sys.executable, "story.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT ")), result.stdout + result.stderr


def expected_values(count: int) -> dict[str, list[int]]:
    return {str(k): v for k, v in known(count).items()}


@pytest.mark.slow
class TestTheStoryAtFullScale:
    def test_the_readme_story_maps_19_gib_of_tokens_and_samples_them_onto_the_batch_device(
        self, tmp_path: Path
    ) -> None:
        """The README's policy and code on the real size: the tokens stay on the host,
        mapped (the process peaks under 1 GiB), readable past 2**31 and at the end, and
        every batch arrives on the batch device; the ledger counts the whole file as
        file-backed on the host, placed by the README's `file:` rule."""
        story_file(tmp_path / "train.safetensors", STORY_TOKENS, aligned=True)
        write_model(tmp_path / "model.safetensors")

        result, output = run_readme_story(tmp_path, steps=3, count=STORY_TOKENS)

        assert result["tokens_device"] == "cpu:0"
        assert result["shape"] == [STORY_TOKENS]
        assert result["values"] == expected_values(STORY_TOKENS)
        assert result["tail"] == [[1, 2, 3], [7, 8, 9]]
        assert result["tail_device"] == "cpu:1"
        assert result["seen"] == [["cpu:1", [32, 1025], "uint16"]] * 3
        assert result["tokens_nbytes"] == result["tokens_file_backed"] == 2 * STORY_TOKENS
        assert str(result["tokens_origin"]).startswith("devpolicy.yaml:")
        assert int(str(result["peak_rss"])) < GiB
        assert "huge_array_x64_off" in output  # the load says how to index it
        assert "file-backed" in output  # print(devpolicy.report())

    def test_an_unaligned_token_file_is_read_once_at_1x_and_sampled_correctly(
        self, tmp_path: Path
    ) -> None:
        """A 3 GiB token file laid out as `safetensors.numpy.save_file` writes it (not
        64-byte aligned: it cannot be mapped) is read into memory JAX adopts: the process
        peaks at the file's size plus its own baseline, not 2x or 3x, and the host view
        and windows hold the values written."""
        count = 3 * GiB // 2 + 7
        start = story_file(tmp_path / "train.safetensors", count, aligned=False)
        assert start % 64 != 0
        write_model(tmp_path / "model.safetensors")
        baseline, _ = run_readme_story(small_project(tmp_path), steps=1, count=SMALL)

        result, output = run_readme_story(tmp_path, steps=2, count=count)

        assert result["tokens_device"] == "cpu:0"
        assert result["values"] == expected_values(count)
        assert result["tail"] == [[1, 2, 3], [7, 8, 9]]
        assert result["seen"] == [["cpu:1", [32, 1025], "uint16"]] * 2
        assert result["tokens_file_backed"] == 0
        assert "mmap_refused" in output  # the rule asked for a map: the user is told why not
        grown = int(str(result["peak_rss"])) - int(str(baseline["peak_rss"]))
        assert grown < 1.1 * 2 * count, f"peak grew {grown / GiB:.2f} GiB for a 3 GiB file"


def small_project(tmp_path: Path) -> Path:
    """The same story over a small aligned token file: the process's baseline peak."""
    project = tmp_path / "small"
    project.mkdir()
    story_file(project / "train.safetensors", SMALL, aligned=True)
    write_model(project / "model.safetensors")
    return project


def test_the_story_block_is_the_first_python_block_of_the_readme() -> None:
    """The README leads with the path that scales: `devpolicy.load_file` and `windows`,
    not `safetensors.flax.load_file` under a scope (3x the file in host RAM)."""
    code = textwrap.dedent(readme_block("python"))
    assert "devpolicy.load_file(" in code
    assert "devpolicy.windows(" in code
    assert "safetensors.flax" not in code
