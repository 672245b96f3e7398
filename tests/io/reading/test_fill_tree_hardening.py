"""`load_file(into=...)` and the names of a load against awkward checkpoints (issue 28):
shards no leaf needs are never opened (D10), look-alike names are told apart, and a
`prefix=` is held to the rule `names.prefix` is."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy

SHARD_1 = "model-00001-of-00002.safetensors"
SHARD_2 = "model-00002-of-00002.safetensors"


def _indexed(folder: Path) -> Path:
    """A checkpoint of two shards and its index: `w` in the first, `opt/mu` in the second."""
    folder.mkdir()
    devpolicy.save_file({"w": np.arange(3, dtype=np.float32)}, folder / SHARD_1)
    devpolicy.save_file({"opt/mu": np.zeros(3, np.float32)}, folder / SHARD_2)
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": SHARD_1, "opt/mu": SHARD_2}}))
    return index


def _damage(path: Path, how: str) -> None:
    if how == "missing":
        path.unlink()
    elif how == "damaged":
        path.write_bytes(b"\xff" * 64)
    else:  # a dangling link, as a Hugging Face cache snapshot whose blob is gone
        path.unlink()
        os.symlink(path.parent / "gone-blob", path)


WANTED = {"w": np.zeros(3, np.float32)}


class TestShardsNoLeafNeeds:
    @pytest.mark.parametrize("how", ["missing", "damaged", "dangling symlink"])
    @pytest.mark.parametrize("named", ["index", "directory"])
    def test_a_shard_no_leaf_needs_is_never_opened(
        self, tmp_path: Path, how: str, named: str
    ) -> None:
        """With strict=False, a shard the index says holds only tensors no leaf takes is
        not opened: missing, damaged or a dangling link, the load fills the tree."""
        index = _indexed(tmp_path / "ckpt")
        _damage(index.parent / SHARD_2, how)
        given = index if named == "index" else index.parent
        with capture_logs() as events:
            out = devpolicy.load_file(given, into=WANTED, strict=False)
        assert out["w"].tolist() == [0.0, 1.0, 2.0]
        loaded = [e["file"] for e in events if e["event"] == "load_file"]
        assert loaded == [str(index.parent / SHARD_1)]
        (skipped,) = [e for e in events if e["event"] == "into_skipped"]
        assert (skipped["count"], skipped["first"]) == (1, ["opt/mu"])

    def test_a_missing_shard_a_leaf_needs_is_an_error_naming_it(self, tmp_path: Path) -> None:
        """The shard a leaf's tensor is in must be there: its absence is named."""
        index = _indexed(tmp_path / "ckpt")
        (index.parent / SHARD_1).unlink()
        with pytest.raises(devpolicy.SafetensorsFileError, match=rf"{SHARD_1}: no such file"):
            devpolicy.load_file(index, into=WANTED, strict=False)

    def test_strict_still_reads_every_shard(self, tmp_path: Path) -> None:
        """strict=True must know every tensor of the checkpoint: a damaged shard fails."""
        index = _indexed(tmp_path / "ckpt")
        _damage(index.parent / SHARD_2, "damaged")
        with pytest.raises(devpolicy.SafetensorsFileError, match=SHARD_2):
            devpolicy.load_file(index, into=WANTED)

    def test_a_shard_the_index_wrongly_describes_is_still_caught(self, tmp_path: Path) -> None:
        """A shard that is opened is held to the index as before."""
        index = _indexed(tmp_path / "ckpt")
        devpolicy.save_file({"w": np.zeros(3, np.float32), "x": np.ones(1)}, index.parent / SHARD_1)
        with pytest.raises(devpolicy.SafetensorsFileError, match=r"does not list: 'x'"):
            devpolicy.load_file(index, into=WANTED, strict=False)


class TestLookAlikeNames:
    def test_a_leaf_and_a_tensor_that_look_alike_are_told_apart_by_code_point(
        self, tmp_path: Path
    ) -> None:
        """`kern\\u0435l` (a Cyrillic e) against `kernel`: the message names the code
        points that differ, not two names that look the same."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"dense/kernel": np.ones(2, np.float32)}, path)
        with pytest.raises(devpolicy.errors.CheckpointMismatchError) as caught:
            devpolicy.load_file(path, into={"dense": {"kern\u0435l": np.ones(2, np.float32)}})
        assert (
            "leaf 'dense/kern\u0435l' and tensor 'dense/kernel' look alike but differ: "
            "at character 11 the leaf has U+0435 CYRILLIC SMALL LETTER IE, the tensor "
            "U+0065 LATIN SMALL LETTER E"
        ) in str(caught.value)

    def test_an_invisible_character_is_named(self, tmp_path: Path) -> None:
        """A zero-width space in a tensor key is shown, with the position it is at."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"w\u200b": np.ones(2, np.float32)}, path)
        with pytest.raises(devpolicy.errors.CheckpointMismatchError) as caught:
            devpolicy.load_file(path, into={"w": np.ones(2, np.float32)}, strict=False)
        assert (
            r"leaf 'w' and tensor 'w\u200b' look alike but differ: at character 2 the "
            "tensor has U+200B ZERO WIDTH SPACE, the leaf nothing"
        ) in str(caught.value)

    def test_names_that_differ_plainly_get_no_look_alike_line(self, tmp_path: Path) -> None:
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"kernel": np.ones(2, np.float32)}, path)
        with pytest.raises(devpolicy.errors.CheckpointMismatchError) as caught:
            devpolicy.load_file(path, into={"bias": np.ones(2, np.float32)})
        assert "look alike" not in str(caught.value)


class TestPrefixArgument:
    @pytest.mark.parametrize("prefix", ["/abs", "params/", "/"])
    @pytest.mark.parametrize("verb", ["plan", "load_file"])
    def test_a_prefix_names_prefix_refuses_is_refused_by_the_call(
        self, tmp_path: Path, prefix: str, verb: str
    ) -> None:
        """prefix= follows the rule the policy's `names.prefix` does: no leading or
        trailing '/'."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"w": np.ones(1)}, path)
        with pytest.raises(devpolicy.PolicyError, match=r"names\.prefix"):
            devpolicy.load_policy({"version": 1, "names": {"prefix": prefix}})
        with pytest.raises(
            ValueError,
            match=rf"^prefix= takes text with no leading or trailing '/', got '{prefix}'$",
        ):
            getattr(devpolicy, verb)(path, prefix=prefix)

    def test_a_prefix_that_is_not_text_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"w": np.ones(1)}, path)
        with pytest.raises(
            ValueError, match=r"^prefix= takes text with no leading or trailing '/', got 3$"
        ):
            devpolicy.plan(path, prefix=3)  # type: ignore[arg-type]
