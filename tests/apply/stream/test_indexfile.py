"""A document index kept in a file (`devpolicy._apply.stream.indexfile`): built once,
mapped for reuse, rebuilt where the token file changed or the index is damaged (an event
says why), never used stale, never written over a file that is no index."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from devpolicy._apply.stream import docindex, indexfile
from devpolicy._apply.stream.docindex import TokenFile, find_documents
from devpolicy._apply.stream.indexfile import document_index, index_of, index_path
from devpolicy._base.events import EventLog

EVENTS = EventLog("debug", "console")


def token_file(
    tmp_path: Path, count: int = 50_000, *, seed: int = 0, name: str = "tokens.bin"
) -> tuple[TokenFile, np.ndarray]:
    """Random uint16 tokens below 40 (separator 0 about every 40 tokens) in a raw file
    after a 64-byte header."""
    tokens = np.random.default_rng(seed).integers(0, 40, count).astype(np.uint16)
    path = tmp_path / name
    path.write_bytes(b"h" * 64 + tokens.tobytes())
    return TokenFile(path, 64, np.dtype(np.uint16), count), tokens


def indexed(file: TokenFile, **kwargs: Any) -> tuple[Any, list[dict[str, Any]]]:
    with capture_logs() as logs:
        index = document_index(file, 0, "eos", EVENTS, **kwargs)
    return index, [e for e in logs if e["event"] == "document_index_rebuilt"]


def rewrite_keeping_mtime(path: Path, data: bytes) -> None:
    """`data` written into the file in place, its mtime put back as it was."""
    info = path.stat()
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


class TestBuiltAndKept:
    def test_the_index_holds_the_documents_and_is_mapped_from_its_file(
        self, tmp_path: Path
    ) -> None:
        """Built beside the token file, its documents those found in memory, mapped."""
        file, tokens = token_file(tmp_path)
        index, rebuilt = indexed(file)
        spans, alone = find_documents(tokens, 0, "eos")
        assert np.array_equal(np.asarray(index.spans), spans)
        assert (index.alone, index.tokens, index.covered) == (alone, 50_000, int(spans[:, 1].sum()))
        assert isinstance(index.spans, np.memmap)
        assert index.path == tmp_path / "tokens.bin.eos0.64-50000.docs"
        assert rebuilt == []  # none kept before: built, and said so below

    def test_a_build_says_what_it_found_in_an_event(self, tmp_path: Path) -> None:
        file, _ = token_file(tmp_path)
        with capture_logs() as logs:
            index = document_index(file, 0, "eos", EVENTS)
        (built,) = [e for e in logs if e["event"] == "document_index_built"]
        assert built["documents"] == len(index)
        assert built["alone"] == index.alone
        assert built["longest"] == index.longest
        assert built["tokens"] == str(file.path)
        with capture_logs() as logs:
            document_index(file, 0, "eos", EVENTS)
        assert [e["event"] for e in logs] == []  # used again: nothing to say

    def test_a_kept_index_is_used_again_without_a_pass_over_the_tokens(
        self, tmp_path: Path
    ) -> None:
        file, _ = token_file(tmp_path)
        indexed(file)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(indexfile, "_build", lambda *a: pytest.fail("built again"))
            index, rebuilt = indexed(file)
        assert rebuilt == []
        assert len(index) > 1000

    def test_each_separator_and_side_has_an_index_of_its_own(self, tmp_path: Path) -> None:
        file, tokens = token_file(tmp_path)
        eos = document_index(file, 0, "eos", EVENTS)
        bos = document_index(file, 1, "bos", EVENTS)
        assert eos.path != bos.path
        assert np.array_equal(np.asarray(bos.spans), find_documents(tokens, 1, "bos")[0])

    def test_the_tokens_are_read_a_chunk_at_a_time_with_a_progress_bar(
        self, tmp_path: Path
    ) -> None:
        """One buffer of `CHUNK` tokens, read again and again (memory stays flat); the bar
        is named for the file and counts its tokens' bytes."""
        file, tokens = token_file(tmp_path)
        bars: list[tuple[str, int, object]] = []
        done: list[int] = []

        class Bar:
            def __init__(self, name: str, total: int, wanted: object) -> None:
                bars.append((name, total, wanted))

            def __enter__(self) -> Any:
                return done.append

            def __exit__(self, *exc: object) -> None:
                return None

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(docindex, "CHUNK", 4096)
            patch.setattr(indexfile, "CHUNK", 4096)
            patch.setattr(indexfile, "progress_bar", Bar)
            index, _ = indexed(file, progress=True)
        assert bars == [("indexing tokens.bin", 100_000, True)]
        assert done == [8192] * 12 + [100_000 - 12 * 8192]
        assert np.array_equal(np.asarray(index.spans), find_documents(tokens, 0, "eos")[0])

    def test_in_a_folder_the_index_is_named_for_the_token_files_real_path(
        self, tmp_path: Path
    ) -> None:
        """Two token files of one name in two folders: two indexes in one cache folder."""
        cache = tmp_path / "cache"
        cache.mkdir()
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        one, _ = token_file(tmp_path / "a", seed=1)
        two, _ = token_file(tmp_path / "b", seed=2)
        first = document_index(one, 0, "eos", EVENTS, where=cache)
        second = document_index(two, 0, "eos", EVENTS, where=cache)
        assert first.path is not None
        assert second.path is not None
        assert first.path.parent == second.path.parent == cache
        assert first.path != second.path
        assert not np.array_equal(np.asarray(first.spans), np.asarray(second.spans))

    def test_where_a_files_path_is_given_the_index_is_that_file(self, tmp_path: Path) -> None:
        file, _ = token_file(tmp_path)
        index = document_index(file, 0, "eos", EVENTS, where=tmp_path / "mine.docs")
        assert index.path == tmp_path / "mine.docs"
        assert index_path(file, 0, "eos", tmp_path / "mine.docs") == tmp_path / "mine.docs"

    def test_the_write_is_atomic_and_a_failed_build_leaves_nothing(self, tmp_path: Path) -> None:
        """A pass that fails leaves neither the index nor its temporary file."""
        file, _ = token_file(tmp_path)

        def broken(*_: object) -> Any:
            raise OSError(5, "Input/output error")

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(indexfile, "read_at", broken)
            with pytest.raises(OSError, match="Input/output"):
                document_index(file, 0, "eos", EVENTS)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens.bin"]

    def test_a_folder_that_cannot_be_written_is_an_error_naming_index(self, tmp_path: Path) -> None:
        file, _ = token_file(tmp_path)
        missing = tmp_path / "no" / "such" / "folder" / "x.docs"
        with pytest.raises(
            ValueError,
            match=r"^windows index='.*x\.docs' cannot be written \(No such file or directory\): pass index= a folder you can write",
        ):
            document_index(file, 0, "eos", EVENTS, where=missing)

    def test_a_token_file_that_is_gone_is_an_error_naming_it(self, tmp_path: Path) -> None:
        file, _ = token_file(tmp_path)
        file.path.unlink()
        with pytest.raises(ValueError, match=r"^windows tokens: .*tokens\.bin no such file"):
            document_index(file, 0, "eos", EVENTS)


class TestIndexOf:
    def test_a_mapped_files_index_is_kept_beside_it_and_memorys_in_memory(
        self, tmp_path: Path
    ) -> None:
        """A view of a file (a memmap at an offset) is indexed in a file beside it; tokens
        in memory are indexed in memory, nothing written."""
        file, tokens = token_file(tmp_path)
        mapped = np.memmap(file.path, np.uint16, "r", offset=64)
        kept = index_of(mapped, 0, "eos", EVENTS)
        assert kept.path == tmp_path / "tokens.bin.eos0.64-50000.docs"
        in_memory = index_of(np.array(tokens), 0, "eos", EVENTS)
        assert in_memory.path is None
        assert np.array_equal(np.asarray(kept.spans), in_memory.spans)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens.bin", kept.path.name]


class TestRebuiltWhenTheFileChanged:
    def test_a_file_grown_is_indexed_again(self, tmp_path: Path) -> None:
        file, _ = token_file(tmp_path)
        indexed(file)
        with open(file.path, "ab") as f:
            f.write(b"\0\0")
        _, rebuilt = indexed(file)
        assert [e["reason"] for e in rebuilt] == [rebuilt[0]["reason"]]
        assert rebuilt[0]["reason"].startswith("the token file changed: file size was")
        assert rebuilt[0]["log_level"] == "info"

    def test_an_edit_in_place_with_the_mtime_put_back_is_seen(self, tmp_path: Path) -> None:
        """Same size, same mtime: the ctime (which no one can put back) says it changed,
        and the new index holds the new documents."""
        file, tokens = token_file(tmp_path)
        indexed(file)
        tokens[100:200] = 0
        rewrite_keeping_mtime(file.path, b"h" * 64 + tokens.tobytes())
        index, rebuilt = indexed(file)
        assert "ctime_ns was" in rebuilt[0]["reason"]
        assert np.array_equal(np.asarray(index.spans), find_documents(tokens, 0, "eos")[0])

    def test_an_edit_where_a_sampled_block_lies_is_seen_by_the_digest(self, tmp_path: Path) -> None:
        """Were the file's size, times and inode all as before, an edit in a sampled
        block (a large file's first, last and 14 evenly between; a small file's all) is
        still seen."""
        file, tokens = token_file(tmp_path, count=2_000_000)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(indexfile, "_identity", lambda info: (info.st_size, 0, 0, 0, 0))
            indexed(file)
            tokens[-5:] = 0  # in the last block
            rewrite_keeping_mtime(file.path, b"h" * 64 + tokens.tobytes())
            index, rebuilt = indexed(file)
        assert rebuilt[0]["reason"].startswith("the token file changed: sampled digest was")
        assert np.array_equal(np.asarray(index.spans), find_documents(tokens, 0, "eos")[0])

    def test_a_file_replaced_by_another_of_the_same_size_is_indexed_again(
        self, tmp_path: Path
    ) -> None:
        file, _ = token_file(tmp_path)
        indexed(file)
        other, tokens = token_file(tmp_path, seed=9, name="other.bin")
        os.replace(other.path, file.path)
        index, rebuilt = indexed(file)
        assert rebuilt
        assert rebuilt[0]["reason"].startswith("the token file changed")
        assert np.array_equal(np.asarray(index.spans), find_documents(tokens, 0, "eos")[0])


class TestDamaged:
    @pytest.mark.parametrize(
        ("damage", "says"),
        [
            (lambda b: b[:300], "damaged: 300 bytes, where"),
            (lambda b: b[:100], "damaged: cut short (100 bytes"),
            (lambda b: b"", "damaged: cut short (0 bytes"),
            (lambda b: b[:8] + b"\x09" + b[9:], "damaged: version 9, this devpolicy reads 1"),
            (
                lambda b: b[:40] + bytes([b[40] ^ 1]) + b[41:],
                "damaged: its header is not what was written",
            ),
            (
                lambda b: b[:-3] + bytes([b[-3] ^ 1]) + b[-2:],
                "damaged: its documents are not what was written",
            ),
        ],
        ids=["truncated", "header-cut", "empty", "version", "header-flip", "body-flip"],
    )
    def test_a_damaged_index_is_rebuilt_and_a_warning_says_why(
        self, tmp_path: Path, damage: Any, says: str
    ) -> None:
        file, tokens = token_file(tmp_path)
        index, _ = indexed(file)
        assert index.path is not None
        index.path.write_bytes(damage(index.path.read_bytes()))
        again, rebuilt = indexed(file)
        assert len(rebuilt) == 1
        assert rebuilt[0]["log_level"] == "warning"
        assert rebuilt[0]["reason"].startswith(says)
        assert np.array_equal(np.asarray(again.spans), find_documents(tokens, 0, "eos")[0])

    def test_a_file_that_is_no_index_is_refused_and_left_as_it_is(self, tmp_path: Path) -> None:
        """Someone's file where the index would go (a mistyped index=) is never written
        over."""
        file, _ = token_file(tmp_path)
        theirs = tmp_path / "notes.txt"
        theirs.write_bytes(b"my notes, not an index" * 20)
        with pytest.raises(
            ValueError,
            match=r"^windows index='.*notes\.txt' is not a document index \(no DPDOCIDX header\)",
        ):
            document_index(file, 0, "eos", EVENTS, where=theirs)
        assert theirs.read_bytes() == b"my notes, not an index" * 20

    def test_a_file_changed_while_it_is_indexed_is_refused(self, tmp_path: Path) -> None:
        file, _ = token_file(tmp_path)
        real = indexfile.read_at

        def writing(fd: int, views: Any, offset: int) -> int:
            with open(file.path, "ab") as f:
                f.write(b"\1\0")
            return real(fd, views, offset)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(indexfile, "sampled_digest", lambda fd, f: b"\0" * 16)
            patch.setattr(indexfile, "read_at", writing)
            with pytest.raises(ValueError, match=r"changed while its documents were indexed"):
                document_index(file, 0, "eos", EVENTS)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens.bin"]  # none kept
