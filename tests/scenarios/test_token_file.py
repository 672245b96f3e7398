"""The story's token file written as a user would write one, at full scale (issue 43, N1).

10,248,871,837 uint16 tokens (19.09 GiB on paper) are written by `devpolicy.save_chunks`
from chunks of 64 MiB, zeros but for a few known values at known offsets (the first
tokens, one past 2**31, the middle, the last), in a fresh process whose resident memory
must stay within a few chunks. The file must be sparse where the data is zero, its header
exactly what the `safetensors` reference reader expects (one tensor, its data at a
64-byte offset, the file's length the header's), every known value where it was written,
and `load_file(..., mmap=True)` must map it (file-backed on the host, nothing copied).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from safetensors import safe_open

import devpolicy
from tests.conftest import REPO

STORY_TOKENS = 10_248_871_837
MiB = 2**20

#: Token offsets and the values written there.
KNOWN = {
    0: [1, 2, 3],
    2**31 + 5: [4242, 4243, 4244],
    STORY_TOKENS // 2: [11, 12, 13],
    STORY_TOKENS - 3: [7, 8, 9],
}

#: The child: chunks of zeros (one buffer, yielded again and again) but for the chunks that
#: hold a known value; the resident memory before the save and the peak after.
WRITER = """
import json, sys, numpy as np, devpolicy

count, chunk, known = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
zeros = np.zeros(chunk, dtype=np.uint16)

def chunks():
    for start in range(0, count, chunk):
        piece = zeros[: min(chunk, count - start)]
        hits = [(int(k) - start, v) for k, v in known.items() if start <= int(k) < start + chunk]
        if hits:
            piece = piece.copy()
            for at, values in hits:
                piece[at : at + len(values)] = values
        yield piece

def status(field):
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith(field))

devpolicy.save_chunks  # its imports before the baseline
before = status("VmRSS:")
devpolicy.save_chunks(chunks(), "train.safetensors", metadata={"tokenizer": "test"})
print(json.dumps({"before": before, "peak": status("VmHWM:")}))
"""


@pytest.mark.slow
def test_the_story_token_file_written_from_chunks_is_exact_sparse_and_maps(
    tmp_path: Path,
) -> None:
    """19.09 GiB of tokens from 64 MiB chunks: memory stays within a few chunks, holes stay
    holes, the reference reader reads every known value back, and load_file maps it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOLICY_", "JAX_"))}
    env["PYTHONPATH"] = str(REPO)
    chunk = 32 * MiB  # tokens: 64 MiB a chunk
    result = subprocess.run(
        [
            sys.executable, "-c", textwrap.dedent(WRITER),
            str(STORY_TOKENS), str(chunk), json.dumps({str(k): v for k, v in KNOWN.items()}),
        ],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    grown = measured["peak"] - measured["before"]
    print(f"the writer's peak grew {grown / MiB:.1f} MiB")
    assert grown < 4 * 64 * MiB, f"the writer grew {grown / MiB:.0f} MiB"

    path = tmp_path / "train.safetensors"
    with path.open("rb") as f:
        raw = f.read(4096)
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    assert header == {
        "__metadata__": {"tokenizer": "test"},
        "tokens": {"dtype": "U16", "shape": [STORY_TOKENS], "data_offsets": [0, 2 * STORY_TOKENS]},
    }
    start = 8 + length
    assert start % 64 == 0
    assert path.stat().st_size == start + 2 * STORY_TOKENS
    assert path.stat().st_blocks * 512 < 64 * MiB  # 19.09 GiB on paper, holes on disk

    with safe_open(path, framework="numpy") as f:
        assert list(f.keys()) == ["tokens"]
        tokens = f.get_slice("tokens")
        assert tokens.get_shape() == [STORY_TOKENS]
        for offset, values in KNOWN.items():
            assert tokens[offset : offset + 3].tolist() == values
        assert not tokens[2**31 : 2**31 + 5].any()

    assert devpolicy.unmappable(path) == {}
    policy = devpolicy.load_policy({"version": 1, "rules": [{"match": "*", "device": "cpu"}]})
    loaded = policy.load_file(path, mmap=True)["tokens"]
    assert devpolicy.report().by_device["cpu:0"].file_backed == 2 * STORY_TOKENS
    view = devpolicy.host_view(loaded)
    for offset, values in KNOWN.items():
        assert view[offset : offset + 3].tolist() == values
