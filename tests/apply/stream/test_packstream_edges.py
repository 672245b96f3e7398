"""Packed rows at their edges (`windows(pack="first_fit")`): each test states a promise
the verb's docstring (or the engine's) makes, on inputs the existing tests leave out: a
reversed view of a mapped token file, an `index=` that is a FIFO or a device node, a pad
that x64 off cannot hold, a state resumed over other documents of the same count, the
cost of a document as the open rows fill, and a state with many open rows read back from
its own JSON text."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import devpolicy
from devpolicy._apply.stream.docindex import in_memory
from devpolicy._apply.stream.packing import PackSettings
from devpolicy._apply.stream.packrows import PackedRows
from devpolicy.errors import StreamStateError
from tests.conftest import REPO
from tests.helpers import policy_of, run_script

SEPARATOR = 0
PAD = 65_000
LENGTH = 64
BATCH = 4


def corpus(documents: int = 300, seed: int = 0) -> np.ndarray:
    """Documents of lognormal lengths (mean about 30), each ended by the separator, their
    tokens 1 .. 999 (never the separator or the pad)."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(np.log(30.0), 1.0, documents).astype(np.int64))
    parts = [np.append(rng.integers(1, 1000, n), SEPARATOR) for n in lengths.tolist()]
    return np.concatenate(parts).astype(np.uint16)


TOKENS = corpus()


def packed(tokens: Any, batch: int = BATCH, length: int = LENGTH, **options: Any) -> Any:
    options = {"report_every": None, "pack": "first_fit", "separator": SEPARATOR, "pad": PAD,
               **options}  # fmt: skip
    return devpolicy.windows(tokens, length, batch, policy=policy_of(), **options)


def all_rows(stream: Any) -> dict[str, np.ndarray]:
    batches = [{key: np.asarray(value) for key, value in b.items()} for b in stream]
    return {key: np.concatenate([b[key] for b in batches]) for key in batches[0]}


class TestTokenViews:
    def test_a_reversed_view_of_a_mapped_token_file_packs_as_its_copy_does(
        self, tmp_path: Path
    ) -> None:
        """`tokens[::-1]` of an `np.memmap` is a legal 1-D view (plain `windows` streams
        it); packed, its rows are those of the same tokens in memory. Before the fix, the file's
        watch takes the view's first address for its lowest and refuses every group:
        "the file is 29,696 bytes, and the tokens mapped from it need 59,390: it was
        truncated after it was mapped" (a file nobody touched)."""
        path = tmp_path / "tokens.bin"
        TOKENS.tofile(path)
        mapped = np.memmap(path, np.uint16, "r")[::-1]
        got = all_rows(packed(mapped))
        want = all_rows(packed(TOKENS[::-1].copy()))
        for key, value in want.items():
            np.testing.assert_array_equal(got[key], value)


class TestIndexPath:
    @pytest.mark.slow
    def test_a_fifo_given_as_index_is_refused_not_waited_on(self, tmp_path: Path) -> None:
        """`index=` a FIFO: refused naming `index=` (as a file that is no index is), the
        FIFO left as it is. Before the fix, `open(path, "rb")` on it blocks until a writer comes:
        `windows` never returns."""
        TOKENS.tofile(tmp_path / "tokens.bin")
        fifo = tmp_path / "index.fifo"
        os.mkfifo(fifo)
        code = f"""
            import numpy as np, devpolicy
            from tests.helpers import policy_of
            tokens = np.memmap({str(tmp_path / "tokens.bin")!r}, np.uint16, "r")
            try:
                devpolicy.windows(tokens, 64, 4, policy=policy_of(), report_every=None,
                    pack="first_fit", separator=0, pad=65000, index={str(fifo)!r})
            except ValueError as e:
                print("REFUSED", e)
            else:
                print("ACCEPTED")
        """
        try:
            done = run_script(code, REPO, timeout=45)
        except subprocess.TimeoutExpired:
            pytest.fail("windows(index=<a FIFO>) hung: it opened the FIFO and waited for a writer")
        assert "REFUSED" in done.stdout, done.stdout + done.stderr
        assert "index=" in done.stdout
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)

    def test_a_device_node_given_as_index_is_refused_never_replaced(self, tmp_path: Path) -> None:
        """`index=` a character device (here a node like /dev/null, made in tmp_path):
        refused naming `index=`, the node never replaced. Before the fix, it reads as an index "cut
        short (0 bytes)", is "rebuilt", and `os.replace` puts a regular file where the
        device node was: `index="/dev/null"` run as root replaces the machine's
        /dev/null (seen in this review; it had to be made again with mknod)."""
        node = tmp_path / "null"
        try:
            os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except (PermissionError, OSError) as e:
            pytest.skip(f"cannot make a device node here: {e}")
        path = tmp_path / "tokens.bin"
        TOKENS.tofile(path)
        refused: ValueError | None = None
        try:
            packed(np.memmap(path, np.uint16, "r"), index=node).close()
        except ValueError as e:
            refused = e
        assert stat.S_ISCHR(os.lstat(node).st_mode), "the device node was replaced by a file"
        assert refused is not None
        assert "index=" in str(refused)


class TestRefusedAtTheCall:
    def test_a_pad_that_x64_off_cannot_hold_is_refused_at_the_call(self) -> None:
        """int64 tokens with x64 off are narrowed to int32 (`narrow="exact"`): a pad past
        int32 can never be placed, so it is refused at the call naming `pad=`, as a
        separator past int32 is ("Everything that can be refused is refused before
        anything is opened"; the docstring's Raises lists "a `pad` outside the tokens'
        dtype"). Before the fix, the call returns and the first `next()` raises NarrowingError
        about "tensor 'batch'"."""
        import jax

        assert not jax.config.jax_enable_x64
        wide = TOKENS.astype(np.int64)
        with pytest.raises(ValueError, match=r"pad=1099511627776"):
            packed(wide, pad=2**40).close()  # closed only where the call did not refuse


class TestResumeOtherDocuments:
    def test_a_state_saved_over_other_documents_of_the_same_count_and_tokens_is_refused(
        self,
    ) -> None:
        """The same documents in another order (same token count, same document count,
        same dtype): the saved open rows are spans of the old file's documents, so
        resumed here they would cut this file's documents and hand some out twice. The
        existing test "other documents are refused" holds only where the document count
        differs. Before the fix, this resumes silently."""
        ends = np.flatnonzero(TOKENS == SEPARATOR) + 1
        documents = np.split(TOKENS, ends[:-1])
        order = np.random.default_rng(0).permutation(len(documents))
        other = np.concatenate([documents[i] for i in order])
        assert other.size == TOKENS.size
        assert (other == SEPARATOR).sum() == (TOKENS == SEPARATOR).sum()
        stream = packed(TOKENS)
        for _ in range(10):
            next(stream)
        saved = stream.state()
        stream.close()
        with pytest.raises(StreamStateError):
            packed(other, resume=saved).close()


def _first_row_seconds(open_rows: int, length: int) -> float:
    """Seconds to pack the first row of two-token documents in rows of odd `length`:
    each row fills to one free token and stays open, so the first row closes only once
    `open_rows` are open (`open_rows * (length // 2)` documents packed). Best of two."""
    tokens = np.tile(np.array([1, SEPARATOR], np.uint16), (open_rows + 2) * (length // 2))
    index = in_memory(tokens, SEPARATOR, "eos")
    best = float("inf")
    for _ in range(2):
        rows = PackedRows(index, PackSettings(length, open_rows=open_rows, epochs=1))
        began = time.perf_counter()
        assert rows.rows(0, 1).rows == 1
        best = min(best, time.perf_counter() - began)
    return best


class TestCost:
    @pytest.mark.slow
    def test_a_documents_cost_does_not_grow_with_the_tokens_held_in_open_rows(self) -> None:
        """Packing costs "a few list operations a piece" (packing.py) and "the open rows'
        count costs no speed" (docs/benchmarks.md). Per document, 400 open rows cost
        what 25 do, within 2.5x. Before the fix, every block of 4,096 documents carries every open
        span into a new table (`_next_block`, a Python list comprehension over all open
        spans), so the cost a document grows with the spans held open: measured 2.1 us
        at 25 rows, 3.4 at 100, 8.0 at 400 (length 1,025); at length 4,097 and 1,000
        open rows the first batch took 144 s (72 us a document)."""
        length = 1025
        small = _first_row_seconds(25, length) / (25 * (length // 2))
        large = _first_row_seconds(400, length) / (400 * (length // 2))
        assert large < 2.5 * small, (
            f"{small * 1e6:.2f} us a document at 25 rows, {large * 1e6:.2f} at 400"
        )


class TestStateText:
    @pytest.mark.slow
    def test_a_state_with_many_open_rows_resumes_from_its_json_text_as_from_the_dict(
        self,
    ) -> None:
        """`resume` takes a state "(or its JSON text)". A packed state holds its open rows'
        spans: with `open_rows=1000` at length 4,097 and two-token documents (every row
        one token short of full, so all 1,000 stay open) it is 24 MB of JSON, over the
        16 MiB `read_state` takes (sized for 16 open rows), and refused as "not a saved
        stream state: ... where a state is a few hundred". The state below is what
        `stream.state()` holds after the first pull of such a stream (reaching it by
        pulling took 144 s: see the cost test), moved to row 0; the dict resumes, its
        JSON text must too."""
        length, open_rows = 4097, 1000
        per_row = length // 2  # documents in an open row
        tokens = np.tile(np.array([1, SEPARATOR], np.uint16), (open_rows + 10) * per_row)
        options = {"open_rows": open_rows}
        stream = packed(tokens, 1, length, **options)
        saved = stream.state()
        stream.close()
        rows = []
        for row in range(open_rows):
            spans: list[int] = []
            for document in range(row * per_row, (row + 1) * per_row):
                spans += [2 * document, 2]
            rows.append(spans)
        saved["packing"] = {**saved["packing"], "position": open_rows * per_row, "open": rows}
        from_dict = np.asarray(next(packed(tokens, 1, length, resume=saved, **options))["tokens"])
        assert from_dict[0, :4].tolist() == [1, 0, 1, 0]  # the oldest open row closed
        text = json.dumps(saved)
        assert len(text) > 16 * 2**20
        from_text = next(packed(tokens, 1, length, resume=text, **options))
        np.testing.assert_array_equal(np.asarray(from_text["tokens"]), from_dict)
