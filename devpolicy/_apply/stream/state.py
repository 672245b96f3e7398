"""Where a `windows` stream is, as a small value saved beside a checkpoint, and a stream
rebuilt from it only if it would draw the same batches.

The state names the next batch (`step`), the global row it starts at (`row`: the rows of
every process handed out before it), and everything that decides which windows each batch
holds: the order, seed, length, global batch (all processes' rows of a step), stride, steps
and epochs, the tokens' rows, row shape and dtype, a mixture's sources and weights, and
shards' count and sizes (a digest of them: `shards`, saved only where a source is a list of
shards, so a state of one array reads as before). Resuming checks each against the stream
being built: another length, batch or token count would give other batches, silently, so it
is an error naming every field that differs, the saved value and the given one. The batch of
each process is not checked: a state saved by N processes resumes on M with the same global
batches. A random, shuffled or mixed stream resumes at another global batch too: from the
same global row, each later row the row of the uninterrupted stream (the rows of step s are
then from `row_base + s * global_batch`). A saved state is read as untrusted text: each
field's type and range is checked, and every one at fault is named. States of the first
version (before epochs and mixtures) and the second (before `row`) still read. No JAX here.
"""

from __future__ import annotations

import json
import reprlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from ..._base.errors import StreamStateError

#: The key that marks a saved state, and its format's version.
STATE_KEY = "devpolicy.windows"
STATE_VERSION = 4
#: The versions read back: 1 had no epochs, global batch or mixture; 2 no `row`; 3 no
#: packing.
_VERSIONS = (1, 2, 3, 4)


@dataclass(frozen=True, slots=True)
class StreamState:
    """What decides a stream's batches, and the next batch it hands out (`step`)."""

    step: int
    order: str
    seed: int | None
    length: int
    batch: int
    stride: int | None
    steps: int | None
    rows: int
    row_shape: tuple[int, ...]
    dtype: str
    epochs: int | None = None
    global_batch: int = 0  # all processes' rows of a step (0: `batch`)
    sources: tuple[tuple[str, int], ...] | None = None  # a mixture's (name, rows)
    weights: tuple[tuple[str, float], ...] | None = None  # and (name, weight)
    #: The global row of step 0: step s's rows are from `row_base + s * global_batch` (not
    #: 0 after a resume at another global batch; negative where that batch is larger).
    row_base: int = 0
    #: Shards' count and sizes (`Shards.fingerprint`): one source's, or a mixture's
    #: (name, fingerprint) for each source given as shards; None where none is.
    shards: str | tuple[tuple[str, str], ...] | None = None
    #: A packed stream's packing (how, separator, its side, pad, open rows), matched on
    #: resume; None for windows. Where packing is at the step is saved beside it
    #: (`packing`, from the packer), checked by the packer itself.
    pack: tuple[tuple[str, Any], ...] | None = None

    @property
    def row(self) -> int:
        """The global row `step` starts at: every process's rows handed out before it."""
        return self.row_base + self.step * (self.global_batch or self.batch)

    def saved(
        self,
        epoch: int | dict[str, int] | None = None,
        packing: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The state as plain JSON-able values (`json.dumps` it into a checkpoint's
        metadata, or keep it as it is); `epoch`, where given, says which epoch the step is
        in (a mixture's, of each source), for people reading it; `packing`, a packed
        stream's packing state at the step."""
        fields = asdict(self)
        del fields["row_base"]
        fields["row"] = self.row
        fields["row_shape"] = list(self.row_shape)
        fields["global_batch"] = self.global_batch or self.batch
        for name in ("sources", "weights"):
            pairs = getattr(self, name)
            fields[name] = None if pairs is None else dict(pairs)
        shards = fields.pop("shards")
        if shards is not None:  # saved only where there are shards: older states read
            fields["shards"] = shards if isinstance(shards, str) else dict(shards)
        pack = fields.pop("pack")
        if pack is not None:  # saved only for packed rows
            fields["pack"] = dict(pack)
            fields["packing"] = packing
        if epoch is not None:
            fields["epoch"] = epoch
        return {STATE_KEY: STATE_VERSION, **fields}


#: The fields a resumed stream must share with the saved one (all but the step, this
#: process's batch and the epoch it is in).
_MATCHED = (
    "order",
    "seed",
    "length",
    "global_batch",
    "stride",
    "steps",
    "epochs",
    "rows",
    "row_shape",
    "dtype",
    "sources",
    "weights",
    "shards",
    "pack",
)
_FIELDS = ("step", "row", "batch", "epoch", "packing", *_MATCHED)
#: A packed stream's `pack`: each key and what its value must be.
_PACK_KEYS = ("how", "separator", "separator_is", "pad", "open_rows")
#: The orders a state resumes at another global batch: their rows are drawn from global
#: row counters (a sequential pass is the same windows in every process, by step).
ELASTIC_ORDERS = ("random", "shuffled")


#: The steps a stream can reach: 0 .. 2**63 - 1 (its counters are 64-bit, and a group is
#: drawn past its first step); an endless stream ends there.
LAST_STEP = 2**63
#: Seeds are 64-bit: two seeds equal modulo 2**64 would draw the same windows.
SEEDS = 2**64
#: The longest JSON text read as a state: a saved state is a few hundred bytes, a packed
#: one holds its open rows' spans besides (at most `open_rows` rows of up to a row's tokens
#: of documents each: 24 MB at 1,000 rows of 4,097 two-token documents).
_MOST_TEXT = 256 * 2**20
_ORDERS = ("sequential", "random", "shuffled")
#: What to do with a damaged saved state.
DAMAGED = "the saved state is damaged: save stream.state() again, or start without resume="
# A damaged state is shown short and shallow (a deeply nested one would exhaust repr).
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 2, 40, 40


def _whole(value: object, low: int, high: int | None = None) -> bool:
    """Whether `value` is an int (not a bool) from `low` to `high` - 1."""
    return (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= low
        and (high is None or value < high)
    )


def _field_problems(fields: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Each field of a saved state that is missing, mistyped or out of range: (field, what
    it must be, and what it is)."""
    problems: list[tuple[str, str]] = []

    def need(name: str, ok: bool, must: str) -> None:
        if name not in fields:
            problems.append((name, f"missing (must be {must})"))
        elif not ok:
            problems.append((name, f"must be {must}, got {_SHOWN.repr(fields[name])}"))

    get = fields.get
    order = get("order")
    need("order", order in _ORDERS, f"one of {', '.join(map(repr, _ORDERS))}")
    need("step", _whole(get("step"), 0, LAST_STEP + 1), "an int from 0 to 2**63")
    need("length", _whole(get("length"), 1), "an int >= 1")
    need("batch", _whole(get("batch"), 1), "an int >= 1")
    need("rows", _whole(get("rows"), 1), "an int >= 1")
    steps = get("steps")
    need(
        "steps", steps is None or _whole(steps, 1, LAST_STEP + 1), "null or an int from 1 to 2**63"
    )
    seed, stride = get("seed"), get("stride")
    pack = get("pack")
    need(
        "pack",
        pack is None
        or (
            isinstance(pack, Mapping)
            and set(pack) == set(_PACK_KEYS)
            and pack["how"] == "first_fit"
            and pack["separator_is"] in ("eos", "bos")
            and all(_whole(pack[k], -(2**63), 2**64) for k in ("separator", "pad"))
            and _whole(pack["open_rows"], 1)
        ),
        f"null or a mapping of {', '.join(_PACK_KEYS)} (a packed stream's)",
    )
    if pack is not None:
        need(
            "packing",
            isinstance(get("packing"), Mapping),
            "a mapping (the packing state a packed stream saved)",
        )
    if order in ("random", "shuffled"):
        need("seed", _whole(seed, 0, SEEDS), f"an int from 0 to 2**64 - 1 (a {order} stream's)")
    if order == "random" or pack is not None:
        need(
            "stride",
            stride is None,
            f"null (a {'packed' if pack else 'random'} stream has no stride)",
        )
    elif order in ("sequential", "shuffled"):
        if order == "sequential":
            need("seed", seed is None, "null (a sequential stream has no seed)")
        need("stride", _whole(stride, 1), f"an int >= 1 (a {order} stream's)")
    need("epochs", get("epochs") is None or _whole(get("epochs"), 1), "null or an int >= 1")
    need("global_batch", _whole(get("global_batch"), 1), "an int >= 1")
    need("row", _whole(get("row"), 0, SEEDS), "an int from 0 to 2**64 - 1")
    sources, weights = get("sources"), get("weights")
    need("sources", sources is None or _named(sources, 1), "null or a mapping of names to rows")
    need("weights", weights is None or _named(weights, 0), "null or a mapping of names to weights")
    shards = get("shards")
    need(
        "shards",
        shards is None
        or _fingerprint(shards)
        or (
            isinstance(shards, Mapping)
            and bool(shards)
            and all(isinstance(k, str) and _fingerprint(v) for k, v in shards.items())
        ),
        "null, a str (the shards' fingerprint) or a mapping of source names to them",
    )
    shape = get("row_shape")
    need(
        "row_shape",
        isinstance(shape, (list, tuple)) and all(_whole(n, 0) for n in shape),
        "a list of ints >= 0",
    )
    dtype = get("dtype")
    need("dtype", isinstance(dtype, str) and _is_dtype(dtype), "a numpy dtype's name")
    if not problems and steps is not None and get("step") > steps:
        problems.append(("step", f"is past steps={steps}, got {get('step')}"))
    unknown = sorted(str(k) for k in fields if k != STATE_KEY and k not in _FIELDS)
    problems.extend(
        (k[:40], f"is not a field of a saved state ({', '.join(_FIELDS)})") for k in unknown[:3]
    )
    return problems


def _named(value: object, low: int) -> bool:
    """Whether `value` maps names to ints >= `low` (1), or to positive numbers (0)."""
    if not isinstance(value, Mapping) or not value:
        return False
    return all(
        isinstance(k, str)
        and (
            _whole(v, low)
            if low
            else isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")
        )
        for k, v in value.items()
    )


def _fingerprint(value: object) -> bool:
    """Whether `value` may be shards' fingerprint: a short str."""
    return isinstance(value, str) and 0 < len(value) <= 200


def _is_dtype(name: str) -> bool:
    try:
        np.dtype(name)
    except (TypeError, ValueError, SyntaxError):
        return False
    return True


def read_state(saved: object) -> dict[str, Any]:
    """A saved state (a mapping, or its JSON text) checked for its marker and, field by
    field, for every field's type and range.

    Raises:
        StreamStateError: not a saved state of `windows`, or damaged: every field at
            fault is named, with what it must be.
    """
    if isinstance(saved, (str, bytes, bytearray)):
        if len(saved) > _MOST_TEXT:
            raise StreamStateError(
                "resume",
                f"not a saved stream state: {len(saved):,} characters of text, where a "
                f"state is a few hundred (a packed stream's, its open rows' spans more: "
                f"{_MOST_TEXT:,} at most)",
                "pass stream.state(), or its json.dumps",
            )
        try:
            saved = json.loads(saved)
        except (ValueError, RecursionError) as e:
            raise StreamStateError(
                "resume",
                f"not JSON ({type(e).__name__}: {str(e)[:80]})",
                "pass stream.state(), or its json.dumps",
            ) from None
    marker = saved.get(STATE_KEY) if isinstance(saved, Mapping) else None
    if not isinstance(saved, Mapping) or type(marker) is not int or marker not in _VERSIONS:
        raise StreamStateError(
            "resume",
            f"not a saved stream state (no {STATE_KEY!r}: {STATE_VERSION} or 1), got "
            f"{_SHOWN.repr(saved)}",
            "pass the value a stream's state() returned, or its json.dumps",
        )
    fields = dict(saved)
    if marker == 1:  # before epochs and mixtures: one process's batch was the global one
        fields.setdefault("epochs", None)
        fields.setdefault("global_batch", fields.get("batch"))
        fields.setdefault("sources", None)
        fields.setdefault("weights", None)
    fields.setdefault("shards", None)  # saved only where a source is shards
    fields.setdefault("pack", None)  # and only for packed rows
    if marker < 3 and _whole(fields.get("step"), 0) and _whole(fields.get("global_batch"), 1):
        fields.setdefault("row", fields["step"] * fields["global_batch"])
    problems = _field_problems(fields)
    if problems:
        raise StreamStateError(
            ", ".join(f"resume[{name!r}]" for name, _ in problems),
            "; ".join(f"{name} {problem}" for name, problem in problems),
            DAMAGED,
        )
    fields["row_shape"] = tuple(fields["row_shape"])
    for name in ("sources", "weights"):
        if fields[name] is not None:
            fields[name] = tuple(fields[name].items())
    if isinstance(fields["shards"], Mapping):
        fields["shards"] = tuple(fields["shards"].items())
    if fields["pack"] is not None:
        fields["pack"] = tuple((key, fields["pack"][key]) for key in _PACK_KEYS)
    return fields


def resumed(saved: Mapping[str, Any], stream: StreamState) -> StreamState:
    """`stream` at the saved step, once every field that decides the batches matches (a
    saved seed taken where the stream was given none); a random, shuffled or mixed
    stream of another global batch goes on from the saved global row (`row_base`).

    Raises:
        StreamStateError: naming every field that differs, with both values.
    """
    # Packed rows are numbered globally too: a packed stream of either order is elastic.
    elastic = stream.order in ELASTIC_ORDERS or stream.pack is not None
    differ = [
        name
        for name in _MATCHED
        if not (name == "seed" and stream.seed is None)
        and not (name == "global_batch" and elastic)
        and getattr(stream, name) != saved.get(name)
    ]
    if differ:
        fix = "resume with the arguments (and tokens) the state was saved with"
        if differ == ["global_batch"]:
            # Windows of the pass handed out, over the new batch: where it was.
            start = -(-saved["row"] // stream.global_batch)
            fix += (
                f"; a sequential pass resumes at its own batch only: go on from the same "
                f"place in the data with start={start}, without resume="
            )
        raise StreamStateError(
            ", ".join(differ),
            "the saved stream had "
            + ", ".join(f"{name}={_shown(saved.get(name))!r}" for name in differ)
            + "; this one has "
            + ", ".join(f"{name}={_shown(getattr(stream, name))!r}" for name in differ)
            + ": other arguments draw other batches",
            fix,
        )
    at: int = saved["step"]
    row: int = saved["row"]
    if not elastic and row != at * saved["global_batch"]:
        raise StreamStateError(
            "resume['row']",
            f"a {stream.order} stream's row is its step times its global batch "
            f"({at} x {saved['global_batch']}), got {row}",
            DAMAGED,
        )
    return replace(stream, step=at, row_base=row - at * (stream.global_batch or stream.batch))


def _shown(value: object) -> object:
    """A field as it is saved (a mixture's pairs as a mapping)."""
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):
        return dict(value)
    return value
