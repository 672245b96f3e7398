"""Documents packed whole into rows (`devpolicy._apply.stream.packing`): every document
once an epoch, none cut unless longer than a row, padding only where a row is not full,
a deterministic row sequence resumed exactly from a small JSON state."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devpolicy._apply.stream.docindex import DocumentIndex, in_memory
from devpolicy._apply.stream.packed import Layout
from devpolicy._apply.stream.packing import (
    PACK_KEY,
    Packer,
    PackSettings,
    checked_pad,
    checked_settings,
)
from devpolicy._base.errors import StreamStateError

SEPARATOR = 0


def corpus(lengths: list[int]) -> tuple[np.ndarray, DocumentIndex]:
    """Tokens of documents of `lengths` (each its EOS included), every document's tokens
    its own number + 1 (so a span says whose it is), and their index."""
    parts = []
    for number, size in enumerate(lengths):
        parts.append(np.full(size - 1, number + 1, np.int32))
        parts.append(np.array([SEPARATOR], np.int32))
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    return tokens, in_memory(tokens, SEPARATOR, "eos")


def rows_of(layout: Layout) -> list[list[tuple[int, int]]]:
    b = layout.bounds.tolist()
    pairs = list(zip(layout.starts.tolist(), layout.counts.tolist(), strict=True))
    return [pairs[b[r] : b[r + 1]] for r in range(layout.rows)]


def same(a: Layout, b: Layout) -> bool:
    return rows_of(a) == rows_of(b)


@st.composite
def packings(draw: st.DrawFn, *, most: int = 60) -> tuple[list[int], PackSettings]:
    lengths = draw(st.lists(st.integers(2, 40), min_size=1, max_size=most))
    order = draw(st.sampled_from(["sequential", "shuffled"]))
    return lengths, PackSettings(
        draw(st.integers(1, 24)), draw(st.integers(1, 6)), order,
        draw(st.integers(0, 2**64 - 1)) if order == "shuffled" else None,
        draw(st.integers(1, 3)),
    )  # fmt: skip


def whole_run(index: DocumentIndex, settings_: PackSettings) -> Layout:
    """Every row of a finite order, asked for a few at a time."""
    packer = Packer(index, settings_)
    parts = []
    while (layout := packer.take(7)).rows:
        parts.append(layout)
    return Layout.joined(parts, 0, settings_.length) if parts else packer.take(1)


class TestEveryDocumentOnceAnEpoch:
    @settings(max_examples=150)
    @given(packings())
    def test_each_epoch_packs_every_document_once_and_cuts_only_those_longer_than_a_row(
        self, case: tuple[list[int], PackSettings]
    ) -> None:
        """The spans of all rows, put together by document, are each document `epochs`
        times over; a document no longer than a row is one span; a longer one is pieces
        of `length` (the last shorter) that cover it once an epoch."""
        lengths, settings_ = case
        tokens, index = corpus(lengths)
        layout = whole_run(index, settings_)
        tokens_of: Counter[int] = Counter()
        pieces: Counter[tuple[int, int]] = Counter()
        for start, count in zip(layout.starts.tolist(), layout.counts.tolist(), strict=True):
            span = tokens[start : start + count]
            owner = int(span[0]) if span[0] != SEPARATOR else int(tokens[start - 1])
            assert 1 <= count <= settings_.length
            pieces[(start, count)] += 1
            tokens_of[owner] += count
        epochs = settings_.epochs or 1
        assert tokens_of == Counter({n + 1: size * epochs for n, size in enumerate(lengths)})
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        for start, size in zip(starts.tolist(), lengths, strict=True):
            expected = [
                (start + at, min(settings_.length, size - at))
                for at in range(0, size, settings_.length)
            ]
            assert all(pieces[piece] == epochs for piece in expected), (start, size)

    @settings(max_examples=100)
    @given(packings())
    def test_rows_hold_at_most_their_length_the_rest_padding(
        self, case: tuple[list[int], PackSettings]
    ) -> None:
        """Each row's spans fill it from column 0 to at most `length`; the tally's
        padding is what is left of the rows."""
        lengths, settings_ = case
        _, index = corpus(lengths)
        packer = Packer(index, settings_)
        layout = packer.take(10**6)
        assert (layout.used >= 1).all()
        assert (layout.used <= settings_.length).all()
        tally = packer.tally
        assert tally.rows == layout.rows
        assert tally.tokens == sum(lengths) * (settings_.epochs or 1)
        assert tally.spans == layout.counts.size
        expected = 1 - tally.tokens / (layout.rows * settings_.length)
        assert tally.padding_share(settings_.length) == pytest.approx(expected)
        assert tally.per_row() == pytest.approx(layout.counts.size / layout.rows)

    def test_a_shuffled_order_differs_each_epoch_and_with_the_seed(self) -> None:
        """Documents of 3 tokens in rows of 3: one document a row, the order itself."""
        _, index = corpus([3] * 50)

        def order(seed: int) -> list[int]:
            layout = Packer(index, PackSettings(3, 1, "shuffled", seed, 2)).take(100)
            return (layout.starts // 3).tolist()

        first = order(5)
        assert sorted(first[:50]) == sorted(first[50:]) == list(range(50))
        assert first[:50] != first[50:]
        assert first == order(5)
        assert first != order(6)

    def test_the_sequential_order_is_the_files(self) -> None:
        _, index = corpus([3] * 10)
        layout = Packer(index, PackSettings(3, 2, "sequential", None, 1)).take(100)
        assert (layout.starts // 3).tolist() == list(range(10))

    def test_open_rows_never_exceed_the_bound(self) -> None:
        lengths = [int(x) for x in np.random.default_rng(0).integers(2, 30, 2000)]
        _, index = corpus(lengths)
        for most in (1, 3, 8):
            packer = Packer(index, PackSettings(32, most, "sequential"))
            for _ in range(50):
                packer.take(5)
                assert len(packer.state()["open"]) <= most


class TestResume:
    @settings(max_examples=120)
    @given(packings(), st.data())
    def test_a_state_saved_after_any_row_resumes_to_the_same_rows(
        self, case: tuple[list[int], PackSettings], data: st.DataObject
    ) -> None:
        """Saved after row k (as JSON text), a new packer makes exactly the rows an
        uninterrupted one makes after it, and saves the same states after."""
        lengths, settings_ = case
        _, index = corpus(lengths)
        whole = whole_run(index, settings_)
        k = data.draw(st.integers(0, whole.rows))
        packer = Packer(index, settings_)
        packer.take(k)
        saved = json.loads(json.dumps(packer.state()))
        assert saved[PACK_KEY] == 1
        assert saved["row"] == k
        resumed = Packer(index, settings_, saved)
        rest = resumed.take(10**6)
        assert rows_of(rest) == rows_of(whole)[k:]
        packer.take(10**6)
        assert resumed.state() == packer.state()
        again = Packer(index, settings_, saved)
        again.take(10**6)
        assert again.state() == resumed.state()

    def test_an_endless_stream_resumes_at_any_row_across_blocks(self) -> None:
        """A long endless shuffled stream (many blocks of documents, several epochs):
        saved every 1,000 rows, resumed, the same rows."""
        lengths = [int(x) for x in np.random.default_rng(1).integers(2, 300, 3000)]
        _, index = corpus(lengths)
        settings_ = PackSettings(256, 8, "shuffled", 11)
        packer = Packer(index, settings_)
        for _ in range(6):
            saved = packer.state()
            ahead = packer.take(1000)
            assert same(Packer(index, settings_, saved).take(1000), ahead)
        assert packer.state()["epoch"] >= 2

    @pytest.mark.parametrize(
        ("change", "says"),
        [
            ({"length": 99}, r"length: saved 16, now 99"),
            ({"open_rows": 2}, r"open_rows: saved 4, now 2"),
            ({"seed": 8}, r"seed: saved 7, now 8"),
        ],
    )
    def test_a_state_of_other_settings_is_refused_naming_each(
        self, change: dict[str, Any], says: str
    ) -> None:
        _, index = corpus([5, 9, 3] * 20)
        base = PackSettings(16, 4, "shuffled", 7)
        packer = Packer(index, base)
        packer.take(5)
        saved = packer.state()
        other = replace(base, **change)
        with pytest.raises(StreamStateError, match=says):
            Packer(index, other, saved)

    def test_a_state_of_other_documents_is_refused(self) -> None:
        _, index = corpus([5, 9, 3] * 20)
        _, other = corpus([5, 9, 3] * 21)
        packer = Packer(index, PackSettings(16))
        with pytest.raises(StreamStateError, match=r"documents: saved 60, now 63"):
            Packer(other, PackSettings(16), packer.state())

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("row", -1),
            ("position", "3"),
            ("offset", 5),
            ("offset", 16),
            ("open", [[0, 99]]),
            ("open", [[0]]),
            ("open", [[10**9, 2]]),
            ("open", [[0, 1]] * 9),
        ],
        ids=["row", "position", "offset", "offset-past", "too-full", "odd", "outside", "too-many"],
    )
    def test_a_damaged_state_is_refused_naming_the_field(self, field: str, value: object) -> None:
        _, index = corpus([5, 9, 3] * 20)
        packer = Packer(index, PackSettings(16, 4))
        packer.take(3)
        saved = {**packer.state(), field: value}
        with pytest.raises(StreamStateError, match=rf"resume\['{field}'\]"):
            Packer(index, PackSettings(16, 4), saved)

    def test_what_is_no_packing_state_is_refused(self) -> None:
        _, index = corpus([5, 9])
        with pytest.raises(StreamStateError, match="not a packing state of version 1"):
            Packer(index, PackSettings(16), {"devpolicy.windows": 3})


class TestBadInput:
    @pytest.mark.parametrize(
        ("args", "says"),
        [
            ((0, 16, "sequential", None, None), r"^windows length must be an int >= 1, got 0$"),
            (
                (2048, 0, "sequential", None, None),
                r"^windows open_rows must be an int >= 1, got 0$",
            ),
            (
                (2048, 1.5, "sequential", None, None),
                r"^windows open_rows must be an int >= 1, got 1.5$",
            ),
            (
                (2048, 16, "random", None, None),
                r"^windows pack= takes order one of \('sequential', 'shuffled'\), got 'random'$",
            ),
            (
                (2048, 16, "sequential", None, 0),
                r"^windows epochs must be None or an int >= 1, got 0$",
            ),
            (
                (2048, 16, "shuffled", None, None),
                r"^windows order='shuffled' packs in an order drawn by a seed: pass seed=$",
            ),
            (
                (2048, 16, "shuffled", -1, None),
                r"^windows seed must be None or an int from 0 to 2\*\*64 - 1, got -1$",
            ),
        ],
        ids=["length", "open_rows", "open_rows-float", "order", "epochs", "no-seed", "seed"],
    )
    def test_bad_settings_name_the_argument_and_what_it_takes(
        self, args: tuple[Any, ...], says: str
    ) -> None:
        with pytest.raises(ValueError, match=says):
            checked_settings(*args)

    def test_good_settings_are_taken(self) -> None:
        assert checked_settings(np.int64(2048), 16, "shuffled", 3, 2) == PackSettings(
            2048, 16, "shuffled", 3, 2
        )

    @pytest.mark.parametrize(
        ("pad", "dtype", "says"),
        [
            (65536, np.uint16, r"^windows pad=65536 does not fit tokens of uint16 \(0 to 65535\)$"),
            (-1, np.uint32, r"^windows pad=-1 does not fit tokens of uint32 \(0 to 4294967295\)$"),
            (128, np.int8, r"^windows pad=128 does not fit tokens of int8 \(-128 to 127\)$"),
            ("0", np.uint16, r"^windows pad must be an int \(a token id\), got '0'$"),
            (0, np.float32, r"^windows pack= needs integer token ids, got tokens of float32$"),
        ],
        ids=["above", "below", "int8", "str", "float"],
    )
    def test_a_pad_outside_the_dtypes_range_is_refused_naming_it(
        self, pad: object, dtype: Any, says: str
    ) -> None:
        with pytest.raises(ValueError, match=says):
            checked_pad(pad, dtype)

    def test_tokens_without_a_document_are_refused(self) -> None:
        index = in_memory(np.zeros(10, np.int32), 0, "eos")
        with pytest.raises(
            ValueError,
            match=r"^windows pack= found no document in 10 tokens \(separator=0, separator_is='eos'\)",
        ):
            Packer(index, PackSettings(8))
