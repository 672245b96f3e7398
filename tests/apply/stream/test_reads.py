"""The read paths (`devpolicy._apply.stream.reads`): each gives the same exact windows, a
kept mapping looks at its file before each group, and every path lets go of what it
opened."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import devpolicy
from devpolicy.errors import HostViewError, StreamEndedError
from devpolicy.types import WindowStream
from tests.apply.conftest import batched_reads_here
from tests.apply.streams import assert_exact, held_open, tokens_for
from tests.helpers import policy_of

COUNT = 2**20
LENGTH = 33
BATCH = 4

#: Every path a file mapping can be held to, and the options that hold it there.
HELD = {
    "mapping kept": devpolicy.ReadOptions(path="keep"),
    "mapping within a budget": devpolicy.ReadOptions(path="budget"),
    "preadv": devpolicy.ReadOptions(path="file", io_uring=False),
    "io_uring": devpolicy.ReadOptions(path="file", polled=False),
    "io_uring polled": devpolicy.ReadOptions(path="file"),
    "the rules' guess": devpolicy.ReadOptions(measure=False),
}


def stream(tokens: object, reads: devpolicy.ReadOptions, **options: object) -> WindowStream:
    return devpolicy.windows(
        tokens, LENGTH, BATCH, order="random", seed=5, reads=reads, policy=policy_of(), **options
    )


@pytest.mark.parametrize("held", list(HELD))
def test_every_path_gives_the_same_exact_windows_and_closes_what_it_opened(
    held: str, tmp_path: Path
) -> None:
    """Each path, held to, over the same mapped file: every batch its step's windows, and
    after `close()` no descriptor, ring or worker thread of the stream is left."""
    if "io_uring" in held and not batched_reads_here(polled=held.endswith("polled")):
        pytest.skip(f"{held} cannot be had here")
    path = tmp_path / "t.safetensors"
    tokens = tokens_for(True, path, COUNT)
    before = held_open(path)
    with stream(tokens, HELD[held], steps=300) as batches:
        for step, batch in enumerate(batches):
            assert_exact(batch, 5, step, LENGTH, COUNT)
    assert held_open(path) == before


def test_a_kept_mapping_refuses_a_file_truncated_between_two_groups(tmp_path: Path) -> None:
    """Gathered through its mapping (no worker reading ahead, so nothing is being copied
    when the file is cut), a truncated file is an error naming it at the next group, not
    a SIGBUS that kills the process."""
    path = tmp_path / "t.safetensors"
    tokens = tokens_for(True, path, COUNT)
    batches = stream(tokens, devpolicy.ReadOptions(path="keep", ahead=False), size=1)
    for step in range(20):
        assert_exact(next(batches), 5, step, LENGTH, COUNT)
    os.truncate(path, 4096)
    truncated = r"t\.safetensors: the file is 4,096 bytes, .*truncated after it was mapped"
    with pytest.raises(HostViewError, match=truncated):  # noqa: PT012
        for _ in range(100):
            next(batches)
    with pytest.raises(StreamEndedError, match="HostViewError"):
        next(batches)
    batches.close()


def test_a_mixture_kept_mapped_refuses_a_truncated_source_naming_it(tmp_path: Path) -> None:
    sources = {
        name: tokens_for(True, tmp_path / f"{name}.safetensors", COUNT) for name in ("web", "code")
    }
    batches = devpolicy.windows(
        sources, LENGTH, BATCH, order="random", seed=5, weights={"web": 1, "code": 1},
        reads=devpolicy.ReadOptions(path="keep", ahead=False), size=1, policy=policy_of(),
    )  # fmt: skip
    for _ in range(20):
        next(batches)
    os.truncate(tmp_path / "code.safetensors", 4096)
    with pytest.raises(HostViewError, match=r"code\.safetensors: the file is 4,096 bytes"):  # noqa: PT012
        for _ in range(100):
            next(batches)
    batches.close()


def test_tokens_in_memory_are_gathered_from_memory_whatever_the_path_held() -> None:
    tokens = np.arange(COUNT, dtype=np.uint32)
    for reads in HELD.values():
        with stream(tokens, reads, steps=5) as batches:
            for step, batch in enumerate(batches):
                assert_exact(batch, 5, step, LENGTH, COUNT)
