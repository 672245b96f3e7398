"""Spans in the profiler's trace: every span devpolicy names shows in a real trace of the
story (a token file saved, loaded mapped and read, streamed from memory and from the
file), and with no trace taken a span is one shared context that does nothing."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import devpolicy
from devpolicy._machine import spans


def traced_events(folder: Path) -> list[dict[str, Any]]:
    """Every event of the Perfetto trace `jax.profiler.trace` wrote under `folder`."""
    found = sorted(folder.glob("plugins/profile/*/perfetto_trace.json.gz"))
    assert found, f"no Perfetto trace under {folder}"
    with gzip.open(found[-1], "rt", encoding="utf-8") as f:
        events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    return events


def traced_names(folder: Path) -> set[str]:
    """The names of every event of the Perfetto trace written under `folder`."""
    return {str(event["name"]) for event in traced_events(folder) if "name" in event}


def ours(folder: Path) -> list[dict[str, Any]]:
    """The events of devpolicy's spans in the trace written under `folder`."""
    return [e for e in traced_events(folder) if str(e.get("name", "")).startswith("devpolicy.")]


def the_story(folder: Path) -> None:
    """A token file saved, loaded read and mapped, and streamed from memory and from the
    mapped file read by position on the stream's worker thread (a polled ring's reads are
    the kernel's: no thread of ours runs them): everything devpolicy spans."""
    path = folder / "train.safetensors"
    devpolicy.save_file({"tokens": np.arange(40_000, dtype=np.uint16)}, path)
    read = devpolicy.load_file(path, mmap=False)["tokens"]
    mapped = devpolicy.load_file(path, mmap=True)["tokens"]
    for batch in devpolicy.windows(read, 65, 4, order="random", seed=0, steps=3):
        batch.block_until_ready()
    by_position = devpolicy.ReadOptions(path="file", polled=False)
    for batch in devpolicy.windows(
        mapped, 65, 4, order="random", seed=0, steps=3, reads=by_position
    ):
        batch.block_until_ready()


class TestInATrace:
    def test_every_span_shows_in_a_trace_of_the_story(self, tmp_path: Path) -> None:
        """Each name of `spans.NAMES` is an event of the Perfetto trace taken around the
        story: the stream's wait, read and placing, load_file's read and transfer, and
        the save; the reads on the worker threads that do them."""
        trace = tmp_path / "trace"
        with jax.profiler.trace(str(trace), create_perfetto_trace=True):
            the_story(tmp_path)
        names = traced_names(trace)
        assert set(spans.NAMES) <= names, sorted(set(spans.NAMES) - names)

    def test_a_file_is_named_without_its_folder(self, tmp_path: Path) -> None:
        """Each span of the story that names a file names it as `train.safetensors`: no
        folder of the machine in a trace that is shared."""
        trace = tmp_path / "trace"
        with jax.profiler.trace(str(trace), create_perfetto_trace=True):
            the_story(tmp_path)
        files = {e["args"]["file"] for e in ours(trace) if "file" in e.get("args", {})}
        assert files == {"train.safetensors"}

    def test_save_chunks_and_a_sharded_tensor_are_spanned(self, tmp_path: Path) -> None:
        """`save_chunks` is one `devpolicy.save` span (`verb` save_chunks); a tensor
        sharded over four devices is one transfer span marked `sharded`, its bytes the
        tensor's."""
        four = devpolicy.load_policy(
            {
                "version": 1,
                "meshes": {"four": {"axes": {"data": 4}, "devices": "cpu"}},
                "rules": [{"match": "*", "sharding": {"mesh": "four", "spec": ["data"]}}],
            },
            environ={},
        )
        path = tmp_path / "chunks.safetensors"
        trace = tmp_path / "trace"
        with jax.profiler.trace(str(trace), create_perfetto_trace=True):
            devpolicy.save_chunks((np.zeros(1000, np.uint16) for _ in range(4)), path)
            devpolicy.load_file(path, policy=four)
        args = [(e["name"], e["args"]) for e in ours(trace)]
        assert (spans.SAVE, {"file": path.name, "tensors": "1", "verb": "save_chunks"}) in args
        sharded = [a for name, a in args if name == spans.LOAD_TRANSFER and "sharded" in a]
        assert sharded == [{"bytes": "8000", "file": path.name, "sharded": "1", "tensors": "1"}]

    def test_odd_metadata_is_recorded_without_breaking_the_trace(self, tmp_path: Path) -> None:
        """A span whose metadata holds the characters a trace's annotation uses itself
        (`#`, `=`, `,`), quotes, a newline and non-ASCII is recorded under its name; the
        code inside runs once."""
        odd = "data/#a=b,c\"d'e\n\u00e9\u6f22"
        ran = []
        trace = tmp_path / "trace"
        with jax.profiler.trace(str(trace), create_perfetto_trace=True):
            assert spans.tracing()
            with spans.span(spans.SAVE, file=odd, tensors=1, bytes=2**40):
                ran.append(1)
        assert ran == [1]
        assert spans.SAVE in traced_names(trace)


class TestWithoutATrace:
    def test_a_span_is_one_shared_context_that_does_nothing(self) -> None:
        """With no trace taken, `span` hands back the same do-nothing context each time,
        whatever its name and metadata, and `tracing()` is False."""
        assert not spans.tracing()
        first = spans.span(spans.STREAM_NEXT, name="batch")
        assert spans.span(spans.LOAD_READ, file="x", tensors=3, bytes=12) is first
        with first as entered:
            assert entered is None

    def test_odd_metadata_is_fine_without_a_trace(self) -> None:
        """Metadata that is no string or number (None, a list, a path) does not matter
        when no trace is taken: the context still does nothing."""
        with spans.span(spans.SAVE, file=None, shape=[1, 2], where=Path("a b")):
            pass

    @pytest.mark.parametrize("name", spans.NAMES)
    def test_names_are_devpolicy_dotted(self, name: str) -> None:
        """Every span's name starts `devpolicy.`, so a trace viewer's search finds them all."""
        assert name.startswith("devpolicy.")
        assert " " not in name
