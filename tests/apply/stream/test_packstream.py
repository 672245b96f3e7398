"""Packed rows as a stream (`windows(pack="first_fit")`, `devpolicy._apply.stream.packstream`):
each batch holds the packer's rows, exactly, with their segment ids and positions; every
document comes once an epoch, none cut unless longer than a row; a saved state resumes
exactly at any step, at another global batch too; every promise of a stream holds
(Ctrl-C, threads, close from another thread, fork, a truncated file); bad arguments are
refused naming the argument, with nothing opened or written; the padding share and
documents a row are said."""

from __future__ import annotations

import gc
import json
import os
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

import devpolicy
from devpolicy._apply import hostview
from devpolicy._apply.stream import groups, packstream
from devpolicy._apply.stream.docindex import in_memory
from devpolicy._apply.stream.documents import BLOCK, on_device_packed
from devpolicy._apply.stream.packed import WORD_BITS, Layout, gather, segments, start_words
from devpolicy._apply.stream.packing import PackSettings
from devpolicy._apply.stream.packrows import PackedRows
from devpolicy._decide.decision import single_device_sharding
from devpolicy.errors import HostViewError, StreamEndedError, StreamStateError
from tests.apply.stream.test_groups import ROWS, rows_rule, sent_bytes
from tests.apply.streams import (
    closed_while_pulled,
    forked_child_refuses,
    held_open,
    pull_through_interrupts,
    pulled_by_threads,
)
from tests.helpers import policy_of

SEPARATOR = 0
PAD = 65_000
LENGTH = 64
BATCH = 4


def corpus(documents: int = 600, seed: int = 0, mean: float = 30.0) -> np.ndarray:
    """Documents of lognormal lengths (some longer than a row), each ended by the
    separator, their tokens 1 .. 999 (never the separator or the pad)."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(np.log(mean), 1.0, documents).astype(np.int64))
    parts = [np.append(rng.integers(1, 1000, n), SEPARATOR) for n in lengths.tolist()]
    return np.concatenate(parts).astype(np.uint16)


TOKENS = corpus()


def packed(tokens: Any, batch: int = BATCH, **options: Any) -> Any:
    options = {"report_every": None, "pack": "first_fit", "separator": SEPARATOR, "pad": PAD,
               **options}  # fmt: skip
    return devpolicy.windows(tokens, LENGTH, batch, policy=policy_of(), **options)


def as_numpy(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    return {key: np.asarray(value) for key, value in batch.items()}


def reference(tokens: np.ndarray, order: str, seed: int | None, epochs: int | None, rows: int):
    """The first `rows` packed rows, their ids and positions, from the engine directly."""
    index = in_memory(tokens, SEPARATOR, "eos")
    layout = PackedRows(index, PackSettings(LENGTH, order=order, seed=seed, epochs=epochs)).rows(
        0, rows
    )
    ids, positions = segments(layout)
    return gather(tokens, layout, PAD), ids, positions


def rows_of(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {key: np.concatenate([b[key] for b in batches]) for key in batches[0]}


def documents_in(tokens: np.ndarray, ids: np.ndarray) -> list[tuple[int, ...]]:
    """The documents (runs of one segment id > 0 in a row) of packed rows."""
    found = []
    for row, row_ids in zip(tokens, ids, strict=True):
        for segment in range(1, int(row_ids.max(initial=0)) + 1):
            found.append(tuple(row[row_ids == segment].tolist()))
    return found


def document_pieces(tokens: np.ndarray) -> list[tuple[int, ...]]:
    """Each document of `tokens` (separator-ended), cut into pieces of `LENGTH`."""
    ends = np.flatnonzero(tokens == SEPARATOR) + 1
    starts = np.concatenate(([0], ends[:-1]))
    pieces = []
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        for at in range(start, end, LENGTH):
            pieces.append(tuple(tokens[at : min(end, at + LENGTH)].tolist()))
    return pieces


class TestRows:
    @pytest.mark.parametrize(
        ("order", "seed", "epochs"), [("sequential", None, None), ("shuffled", 7, 2)]
    )
    def test_each_batch_holds_the_packers_rows_with_their_ids_and_positions(
        self, order: str, seed: int | None, epochs: int | None
    ) -> None:
        batches = [as_numpy(b) for b in packed(TOKENS, order=order, seed=seed, epochs=epochs)]
        got = rows_of(batches)
        rows = got["tokens"].shape[0]
        want_tokens, want_ids, want_positions = reference(
            TOKENS, order, seed, 1 if order == "sequential" else epochs, rows
        )
        real = want_tokens.shape[0]
        assert rows - real < BATCH  # the last batch filled with rows of padding only
        np.testing.assert_array_equal(got["tokens"][:real], want_tokens)
        np.testing.assert_array_equal(got["segment_ids"][:real], want_ids)
        np.testing.assert_array_equal(got["positions"][:real], want_positions)
        assert (got["tokens"][real:] == PAD).all()
        assert not got["segment_ids"][real:].any()
        assert {b["tokens"].shape for b in batches} == {(BATCH, LENGTH)}
        assert {b["segment_ids"].dtype for b in batches} == {np.dtype(np.int32)}

    def test_every_document_comes_once_an_epoch_none_cut_unless_longer_than_a_row(self) -> None:
        got = rows_of([as_numpy(b) for b in packed(TOKENS, order="shuffled", seed=3, epochs=3)])
        found = Counter(documents_in(got["tokens"], got["segment_ids"]))
        pieces = Counter(document_pieces(TOKENS))
        assert found == Counter({piece: 3 * n for piece, n in pieces.items()})
        # The padding is the pad token with segment id 0 and position 0, never a token.
        padding = got["segment_ids"] == 0
        assert (got["tokens"][padding] == PAD).all()
        assert not got["positions"][padding].any()

    def test_a_shuffled_stream_orders_documents_otherwise_each_epoch(self) -> None:
        index = in_memory(TOKENS, SEPARATOR, "eos")
        documents = len(index)
        got = rows_of([as_numpy(b) for b in packed(TOKENS, order="shuffled", seed=3, epochs=2)])
        firsts = list(documents_in(got["tokens"], got["segment_ids"]))
        half = len(firsts) // 2
        assert firsts[:half] != firsts[half:]
        assert documents > 100

    def test_a_token_file_is_read_through_its_mapping_and_its_index_kept_beside_it(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "tokens.bin"
        TOKENS.tofile(path)
        mapped = np.memmap(path, np.uint16, "r")
        with capture_logs() as logs:
            batches = [as_numpy(b) for b in packed(mapped)]
        assert [p.name for p in tmp_path.iterdir() if p.suffix == ".docs"]
        ended = [e for e in logs if e["event"] == "stream_ended"]
        assert ended[0]["reads"] == "mapping"
        built = [e for e in logs if e["event"] == "document_index_built"]
        assert len(built) == 1
        np.testing.assert_array_equal(
            rows_of(batches)["tokens"], rows_of([as_numpy(b) for b in packed(TOKENS)])["tokens"]
        )
        with capture_logs() as logs:
            list(packed(mapped))  # the kept index, not built again
        assert not [e for e in logs if e["event"] == "document_index_built"]

    def test_the_index_goes_where_index_says(self, tmp_path: Path) -> None:
        path = tmp_path / "tokens.bin"
        TOKENS.tofile(path)
        (tmp_path / "kept").mkdir()
        list(packed(np.memmap(path, np.uint16, "r"), index=tmp_path / "kept"))
        assert len(list((tmp_path / "kept").iterdir())) == 1
        assert not [p for p in tmp_path.iterdir() if p.suffix == ".docs"]

    def test_steps_bounds_the_stream(self) -> None:
        assert len(list(packed(TOKENS, order="shuffled", seed=1, steps=5))) == 5

    def test_64_bit_tokens_are_narrowed_exactly_with_x64_off(self) -> None:
        wide = TOKENS.astype(np.int64)
        got = rows_of([as_numpy(b) for b in packed(wide, steps=3)])
        want = rows_of([as_numpy(b) for b in packed(TOKENS, steps=3)])
        assert got["tokens"].dtype == np.int32
        np.testing.assert_array_equal(got["tokens"], want["tokens"].astype(np.int32))

    def test_fields_rename_a_batchs_keys(self) -> None:
        lm1b = {"tokens": "inputs", "segment_ids": "inputs_segmentation"}
        batch = next(packed(TOKENS, fields=lm1b))
        assert sorted(batch) == ["inputs", "inputs_segmentation", "positions"]


class TestResume:
    @pytest.mark.parametrize("order", ["sequential", "shuffled"])
    def test_a_state_saved_at_any_step_resumes_exactly(self, order: str) -> None:
        options: dict[str, Any] = {"order": order}
        if order == "shuffled":
            options |= {"seed": 5, "epochs": 2}
        stream = packed(TOKENS, **options)
        states, batches = [stream.state()], []
        for batch in stream:
            batches.append(as_numpy(batch))
            states.append(stream.state())
        assert len(batches) > 20
        for step in [*range(0, len(batches), 7), len(batches) - 1, len(batches)]:
            saved = json.loads(json.dumps(states[step]))
            assert saved["step"] == step
            resumed = [as_numpy(b) for b in packed(TOKENS, resume=saved, **options)]
            assert len(resumed) == len(batches) - step
            for got, want in zip(resumed, batches[step:], strict=True):
                for key in want:
                    np.testing.assert_array_equal(got[key], want[key])

    @pytest.mark.parametrize("other", [48, 96])
    def test_a_state_saved_at_64_rows_resumes_at_another_global_batch_from_the_same_row(
        self, other: int
    ) -> None:
        tokens = corpus(4000, seed=2)
        options = {"order": "shuffled", "seed": 9, "epochs": 1}
        whole = packed(tokens, 64, **options)
        batches = [as_numpy(next(whole)) for _ in range(3)]
        saved = whole.state()
        rest = [as_numpy(b) for b in whole]
        flat = rows_of(rest)["tokens"]
        resumed = rows_of([as_numpy(b) for b in packed(tokens, other, resume=saved, **options)])
        real = int((flat != PAD).any(axis=1).sum())
        np.testing.assert_array_equal(resumed["tokens"][:real], flat[:real])
        assert not (resumed["tokens"][real:] != PAD).any()
        assert batches

    def test_another_separator_pad_or_open_rows_is_refused_naming_pack(self) -> None:
        stream = packed(TOKENS)
        next(stream)
        saved = stream.state()
        for change in ({"pad": 7}, {"open_rows": 4}):
            with pytest.raises(StreamStateError, match="pack"):
                packed(TOKENS, resume=saved, **change)

    def test_a_damaged_packing_state_is_refused_naming_it(self) -> None:
        stream = packed(TOKENS)
        next(stream)
        next(stream)
        saved = stream.state()
        for damaged in (
            {**saved, "packing": {**saved["packing"], "row": 0}},
            {**saved, "packing": "x"},
            {k: v for k, v in saved.items() if k != "packing"},
        ):
            with pytest.raises(StreamStateError, match=r"packing|resume"):
                packed(TOKENS, resume=damaged)

    def test_other_documents_are_refused(self) -> None:
        stream = packed(TOKENS)
        next(stream)
        saved = stream.state()
        with pytest.raises(StreamStateError):
            packed(corpus(600, seed=1)[: TOKENS.size], resume=saved)


def compiled() -> None:
    """Every device function's compile started so far, done."""
    for compiling in list(groups._COMPILING.values()):
        compiling.result()


def device_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The groups placed by the device's code (`groups.placed_packed`) from now on."""
    calls: list[int] = []
    real = packstream.placed_packed

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(packstream, "placed_packed", counted)
    return calls


@pytest.fixture(params=["host", "device"])
def ids_made_on(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Each contract test twice: the ids and positions made on the host (the CPU's path)
    and by the device from the rows' starts (an accelerator's path: the CPU's devices
    standing in for a copying one, the device function compiled first), which must then
    have placed groups."""
    if request.param == "host":
        yield
        return
    request.getfixturevalue("copying_device")
    list(packed(TOKENS, steps=80, order="shuffled", seed=9))  # the group shapes compiled
    compiled()
    calls = device_calls(monkeypatch)
    yield
    assert calls, "no group was placed by the device's code"


def batch_checker(want: list[dict[str, np.ndarray]]) -> Any:
    """A check that a pulled batch is `want`'s of its step, array for array."""

    def check(batch: Any, step: int) -> None:
        got = as_numpy(batch)
        for key in got:
            np.testing.assert_array_equal(got[key], want[step][key])

    return check


@pytest.mark.usefixtures("ids_made_on")
class TestContract:
    def check(self, want: list[dict[str, np.ndarray]]) -> Any:
        return batch_checker(want)

    def test_ctrl_c_anywhere_in_a_pull_skips_and_repeats_nothing(self) -> None:
        options = {"order": "shuffled", "seed": 4}
        want = [as_numpy(b) for b in packed(TOKENS, steps=160, **options)]
        stream = packed(TOKENS, steps=160, **options)
        # A pull packs a group on the caller's thread: thousands of places to strike.
        reached = pull_through_interrupts(stream, self.check(want), pulls=150, places=1000)
        assert 20 < reached <= 140  # and at least 10 pulls struck
        stream.close()

    def test_threads_share_a_stream_each_step_once(self) -> None:
        options = {"order": "shuffled", "seed": 4, "steps": 60}
        want = [as_numpy(b)["tokens"].tobytes() for b in packed(TOKENS, **options)]
        step_of = {tokens: step for step, tokens in enumerate(want)}
        assert len(step_of) == len(want)
        pulled_by_threads(
            packed(TOKENS, **options), lambda b: step_of[np.asarray(b["tokens"]).tobytes()]
        )

    def test_close_from_another_thread_never_raises(self) -> None:
        options = {"order": "shuffled", "seed": 4, "steps": 200}
        want = [as_numpy(b) for b in packed(TOKENS, **options)]
        closed_while_pulled(lambda: packed(TOKENS, **options), self.check(want), attempts=10)

    @pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
    @pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
    def test_a_forked_childs_copy_refuses_to_run(self) -> None:
        stream = packed(TOKENS, order="shuffled", seed=4)
        next(stream)
        assert forked_child_refuses(stream, 1) == 0
        next(stream)
        stream.close()

    def test_a_truncated_token_file_ends_the_stream_naming_it(self, tmp_path: Path) -> None:
        path = tmp_path / "tokens.bin"
        np.tile(TOKENS, 40).tofile(path)
        mapped = np.memmap(path, np.uint16, "r")
        before = held_open(path)  # the caller's own mapping
        stream = packed(mapped, order="shuffled", seed=2)
        for _ in range(3):
            next(stream)
        # After the worker copied the group ahead: a truncation during a copy from the
        # mapping is SIGBUS, as for any read of a mapping past its file's end.
        time.sleep(0.3)
        os.truncate(path, 4096)
        with pytest.raises(HostViewError, match="truncated after it was mapped"):  # noqa: PT012
            for _ in range(10_000):
                next(stream)
        with pytest.raises(StreamEndedError, match="HostViewError"):
            next(stream)
        stream.close()
        del stream
        assert held_open(path) == before


@pytest.mark.usefixtures("copying_device")
class TestWorkedOutOnTheDevice:
    """On a device that copies host memory (an accelerator's), a packed group crosses as
    its tokens and its rows' start words (a bit a token, a word a row for the tokens of
    documents), and the device works the ids and positions out: the same values, sharded
    as the tokens are."""

    @pytest.mark.parametrize("sharded", [False, True], ids=["one-device", "rows-of-4"])
    def test_only_the_tokens_and_their_starts_are_sent_the_values_the_hosts(
        self, monkeypatch: pytest.MonkeyPatch, sharded: bool
    ) -> None:
        policy = policy_of(meshes=ROWS, rules=rows_rule()) if sharded else policy_of()
        options = {"report_every": None, "pack": "first_fit", "separator": SEPARATOR,
                   "pad": PAD, "order": "shuffled", "seed": 3, "steps": 90}  # fmt: skip
        want = [as_numpy(b) for b in devpolicy.windows(TOKENS, LENGTH, 8, **options)]
        list(devpolicy.windows(TOKENS, LENGTH, 8, policy=policy, **options))  # compiles
        compiled()
        calls = device_calls(monkeypatch)
        sent = sent_bytes(monkeypatch)
        got = list(devpolicy.windows(TOKENS, LENGTH, 8, policy=policy, **options))
        assert len(calls) == len(sent) // 2 > 2  # two transfers a group, every group
        words = -(-LENGTH // WORD_BITS) + 1
        assert sum(sent) == 90 * 8 * (LENGTH * 2 + words * 4)  # 1.09x the tokens' bytes
        for batch, expected in zip(got, want, strict=True):
            for key in ("segment_ids", "positions"):
                assert batch[key].dtype == np.int32
                assert batch[key].sharding == batch["tokens"].sharding
            for key, value in as_numpy(batch).items():
                np.testing.assert_array_equal(value, expected[key])

    def test_a_shape_still_compiling_is_served_by_the_host(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A group shape never compiled: its ids and positions come from the host (the
        same values) while the device function compiles on a thread of its own."""
        # Batches of 5 rows: shapes no other test compiles (JAX's own cache would make a
        # compile too quick to see), compiled first here.
        calls = device_calls(monkeypatch)
        stream = packed(TOKENS, 5, steps=40, order="shuffled", seed=8)
        first = as_numpy(next(stream))
        assert calls == []
        second = as_numpy(next(stream))  # a group of another size: compiled meanwhile
        assert calls == []
        compiled()
        rest = [as_numpy(b) for b in stream]
        assert calls
        # The same stream with the host's ids alone (the CPU's own path).
        monkeypatch.setattr(hostview, "ADOPTING", frozenset({"cpu"}))
        want = [as_numpy(b) for b in packed(TOKENS, 5, steps=40, order="shuffled", seed=8)]
        for got, expected in zip([first, second, *rest], want, strict=True):
            for key in got:
                np.testing.assert_array_equal(got[key], expected[key])


def rows_of_spans(length: int, rows: int) -> st.SearchStrategy[list[list[int]]]:
    """Each row's span lengths, in order, summing to at most `length` (a row may be all
    padding, or a span fill it)."""

    def fitted(spans: list[int]) -> list[int]:
        kept, used = [], 0
        for n in spans:
            if used + n > length:
                break
            kept.append(n)
            used += n
        return kept

    spans = st.lists(st.integers(1, length), max_size=12).map(fitted)
    one = st.one_of(spans, st.lists(st.integers(1, 3), max_size=40).map(fitted))
    return st.lists(one, min_size=rows, max_size=rows)


@settings(max_examples=60, deadline=None)
@given(layout=rows_of_spans(70, 6))
def test_start_words_worked_out_on_the_device_give_the_hosts_ids_and_positions(
    layout: list[list[int]],
) -> None:
    """Any rows of spans (two starting in one word, a span filling a row, a row of
    padding alone, a length not a multiple of a word): the device's ids and positions
    from `start_words` are `packed.segments`' exactly."""
    assert WORD_BITS == BLOCK
    counts = np.array([n for row in layout for n in row], np.int64)
    bounds = np.concatenate(([0], np.cumsum([len(row) for row in layout])))
    spans = Layout(0, 70, bounds, np.zeros(counts.size, np.int64), counts)
    sharding = single_device_sharding(jax.devices("cpu")[0], None)
    tokens = np.zeros((2, 3, 70), np.uint16)
    words = start_words(spans).reshape(2, 3, -1)
    _, ids, positions = on_device_packed(sharding)(tokens, words)
    want_ids, want_positions = segments(spans)
    np.testing.assert_array_equal(np.concatenate([np.asarray(a) for a in ids]), want_ids)
    np.testing.assert_array_equal(
        np.concatenate([np.asarray(a) for a in positions]), want_positions
    )


@pytest.mark.slow
def test_memory_stays_flat_over_thousands_of_steps_and_many_epochs() -> None:
    """An endless shuffled packed stream, 4,000 steps (about 30 epochs of its documents):
    what Python and numpy hold after the last step is what they held after the 1,000th
    (the packer's notes, the rings and the shuffles' blocks are bounded)."""
    tokens = corpus(2_000, seed=3, mean=12)
    stream = packed(tokens, 8, order="shuffled", seed=1)
    tracemalloc.start()
    try:
        for step, _ in enumerate(stream):
            if step == 1_000:
                gc.collect()
                early = tracemalloc.get_traced_memory()[0]
            if step == 4_000:
                break
        gc.collect()
        late = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        stream.close()
    assert late - early < 128 * 1024


class TestReported:
    def test_stream_ended_and_report_say_the_padding_share_and_documents_a_row(self) -> None:
        with capture_logs() as logs:
            stream = packed(TOKENS, name="packed-rows")
            list(stream)
        (ended,) = [e for e in logs if e["event"] == "stream_ended"]
        assert 0 < ended["padding_share"] < 0.2
        assert ended["documents_per_row"] > 1
        assert ended["rows"] > 0
        lines = [line for line in str(devpolicy.report()).splitlines() if "packed-rows" in line]
        assert any("padding" in line and "documents a row" in line for line in lines)


class TestRefused:
    @pytest.mark.parametrize(
        ("options", "names"),
        [
            ({"pack": "best_fit", "separator": 0, "pad": 1}, "pack must be one of"),
            ({"pack": "first_fit", "pad": 1}, "pass separator="),
            ({"pack": "first_fit", "separator": 0}, "needs pad="),
            ({"pack": "first_fit", "separator": 0, "pad": 70_000}, "pad=70000 does not fit"),
            ({"pack": "first_fit", "separator": 0, "pad": -1}, "pad=-1 does not fit"),
            ({"pack": "first_fit", "separator": 0, "pad": 1, "order": "random", "seed": 1},
             "order='sequential'"),
            ({"pack": "first_fit", "separator": 0, "pad": 1, "stride": 2}, "stride="),
            ({"pack": "first_fit", "separator": 0, "pad": 1, "start": 3}, "start=3"),
            ({"pack": "first_fit", "separator": 0, "pad": 1, "reads": "keep"}, "reads="),
            ({"pack": "first_fit", "separator": 0, "pad": 1, "open_rows": 0}, "open_rows"),
            ({"pad": 1}, "pad= applies to packed rows only"),
            ({"open_rows": 3}, "open_rows= applies"),
            ({"index": "x"}, "index= applies"),
        ],
    )  # fmt: skip
    def test_bad_arguments_are_refused_naming_the_argument(
        self, options: dict[str, Any], names: str, tmp_path: Path
    ) -> None:
        path = tmp_path / "tokens.bin"
        TOKENS.tofile(path)
        mapped = np.memmap(path, np.uint16, "r")
        before = held_open(path)
        with pytest.raises(ValueError, match=names):
            devpolicy.windows(mapped, LENGTH, BATCH, policy=policy_of(), **options)
        assert held_open(path) == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens.bin"]

    def test_a_mixture_is_refused(self) -> None:
        common = {"pack": "first_fit", "separator": 0, "pad": 1, "policy": policy_of()}
        with pytest.raises(ValueError, match="a mixture's sources are not packed yet"):
            devpolicy.windows(
                {"a": TOKENS, "b": TOKENS}, LENGTH, BATCH, order="shuffled", seed=1,
                weights={"a": 1, "b": 1}, **common,
            )  # fmt: skip

    def test_tokens_without_a_document_are_refused(self) -> None:
        with pytest.raises(ValueError, match="found no document"):
            packed(np.zeros(1000, np.uint16))

    def test_an_index_path_that_is_no_index_is_refused_never_overwritten(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "tokens.bin"
        TOKENS.tofile(path)
        other = tmp_path / "notes.txt"
        other.write_text("mine")
        with pytest.raises(ValueError, match="index"):
            packed(np.memmap(path, np.uint16, "r"), index=other)
        assert other.read_text() == "mine"


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 400),
    st.integers(1, 6),
    st.sampled_from(["sequential", "shuffled"]),
    st.integers(0, 3),
)
def test_any_corpus_any_batch_hands_out_the_engines_rows(
    documents: int, batch: int, order: str, seed: int
) -> None:
    tokens = corpus(documents, seed=seed, mean=20)
    epochs = 1 if order == "sequential" else 2
    options: dict[str, Any] = {"order": order}
    if order == "shuffled":
        options |= {"seed": seed, "epochs": epochs}
    got = rows_of([as_numpy(b) for b in packed(tokens, batch, **options)])
    want, ids, _ = reference(tokens, order, seed if order == "shuffled" else None, epochs, 10**6)
    assert got["tokens"].shape[0] == -(-want.shape[0] // batch) * batch
    np.testing.assert_array_equal(got["tokens"][: want.shape[0]], want)
    np.testing.assert_array_equal(got["segment_ids"][: want.shape[0]], ids)
