"""The documents of a token array (`devpolicy._apply.stream.docindex`): the spans between
separators, found a chunk at a time; a separator alone is no document."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devpolicy._apply.stream import docindex
from devpolicy._apply.stream.docindex import (
    checked_separator,
    find_documents,
    in_memory,
    token_file,
)


def by_hand(tokens: list[int], separator: int, kind: str) -> tuple[list[list[int]], int]:
    """Documents as `documents.segments` cuts them, less the separators alone."""
    spans: list[list[int]] = []
    start = 0
    bounds = [i + 1 if kind == "eos" else i for i, t in enumerate(tokens) if t == separator]
    alone = 0
    for end in [*bounds, len(tokens)]:
        if end > start:
            part = tokens[start:end]
            if len(part) == 1 and part[0] == separator:
                alone += 1
            else:
                spans.append([start, end - start])
        start = max(start, end)
    return spans, alone


class TestFindDocuments:
    @pytest.mark.parametrize(
        ("tokens", "kind", "spans", "alone"),
        [
            ([5, 0, 0, 6, 7, 0, 8], "eos", [[0, 2], [3, 3], [6, 1]], 1),
            ([0, 5, 0, 0, 6, 7, 0], "bos", [[0, 2], [3, 3]], 2),
            ([5, 0, 5, 0], "bos", [[0, 1], [1, 2]], 1),
            ([0, 0, 0], "eos", [], 3),
            ([5, 6], "eos", [[0, 2]], 0),
            ([], "eos", [], 0),
        ],
        ids=["eos", "bos", "bos-prefix", "only-separators", "no-separator", "empty"],
    )
    def test_documents_are_the_spans_between_separators_a_separator_alone_none(
        self, tokens: list[int], kind: str, spans: list[list[int]], alone: int
    ) -> None:
        """An EOS ends its document, a BOS starts one; what comes before the first BOS or
        after the last EOS is a document too; a separator alone is counted, not kept."""
        found, counted = find_documents(np.asarray(tokens, np.int64), 0, kind)  # type: ignore[arg-type]
        assert (found.tolist(), counted) == (spans, alone)
        assert found.dtype == np.dtype("<u8")

    @settings(max_examples=200)
    @given(
        tokens=st.lists(st.integers(0, 3), max_size=120),
        kind=st.sampled_from(["eos", "bos"]),
        chunk=st.integers(1, 9),
    )
    def test_chunks_of_any_size_find_what_one_pass_by_hand_does(
        self, tokens: list[int], kind: str, chunk: int
    ) -> None:
        """A document cut by a chunk's edge is carried to the next chunk: the chunk size
        changes nothing."""
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(docindex, "CHUNK", chunk)
            found, alone = find_documents(np.asarray(tokens, np.int16), 0, kind)  # type: ignore[arg-type]
        assert (found.tolist(), alone) == by_hand(tokens, 0, kind)

    def test_the_index_in_memory_counts_its_documents(self) -> None:
        """Its length, the separators alone, the longest document and the tokens in
        documents; read-only."""
        index = in_memory(np.array([1, 2, 3, 0, 0, 4, 0, 5], np.uint16), 0, "eos")
        assert (len(index), index.alone, index.longest, index.covered, index.tokens) == (
            3,
            1,
            4,
            7,
            8,
        )
        assert not index.spans.flags.writeable
        assert index.path is None


class TestCheckedSeparator:
    def test_a_separator_and_its_side_in_the_dtypes_range_are_taken(self) -> None:
        assert checked_separator(np.int64(7), "bos", np.uint16) == (7, "bos")

    @pytest.mark.parametrize(
        ("separator", "side", "dtype", "error", "says"),
        [
            (
                0,
                "end",
                np.uint16,
                ValueError,
                r"separator_is must be one of \('eos', 'bos'\), got 'end'",
            ),
            (
                70_000,
                "eos",
                np.uint16,
                ValueError,
                r"separator=70000 cannot occur in tokens of uint16 \(0 to 65535\)",
            ),
            (-1, "eos", np.uint32, ValueError, r"separator=-1 cannot occur"),
            (1.0, "eos", np.uint16, TypeError, r"separator must be an int \(a token id\), got 1.0"),
            (True, "eos", np.uint16, TypeError, r"separator must be an int"),
            (
                0,
                "eos",
                np.float32,
                ValueError,
                r"pack= needs integer token ids, got tokens of float32",
            ),
        ],
        ids=["side", "above", "below", "float", "bool", "float-tokens"],
    )
    def test_a_bad_separator_names_the_argument_and_what_it_takes(
        self, separator: object, side: object, dtype: object, error: type, says: str
    ) -> None:
        with pytest.raises(error, match=f"^windows {says}"):
            checked_separator(separator, side, dtype)


class TestTokenFile:
    def test_a_memmap_is_found_in_its_file_at_its_offset(self, tmp_path: Path) -> None:
        """The file a view maps, the byte offset of its first token, dtype and count."""
        path = tmp_path / "tokens.bin"
        np.arange(5000, dtype=np.uint16).tofile(path)
        view = np.memmap(path, np.uint16, "r", offset=200)[10:]
        found = token_file(view)
        assert found is not None
        assert (found.path, found.offset, found.dtype, found.count) == (
            path, 220, np.dtype(np.uint16), 4890,
        )  # fmt: skip

    def test_tokens_in_memory_or_of_more_than_one_axis_have_no_file(self, tmp_path: Path) -> None:
        path = tmp_path / "tokens.bin"
        np.arange(5000, dtype=np.uint16).tofile(path)
        assert token_file(np.arange(10)) is None
        assert token_file(np.memmap(path, np.uint16, "r").reshape(50, 100)) is None
        assert token_file(np.memmap(path, np.uint16, "r+")[:0]) is None
