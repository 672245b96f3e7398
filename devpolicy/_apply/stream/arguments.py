"""`windows`' arguments as one record (`WindowsArguments`, the verb's keywords written
once), checked into what the stream is made of (`Checked`), from which its saved state is
made.

Everything that can be refused is refused here, before anything is opened, read or
placed: a bad length, batch, order, seed, step or saved state is an error naming the
argument and what it accepts. No device is touched here (JAX's config is read, for x64).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import jax
import numpy as np

from ..._base.errors import StreamStateError
from ..._base.sizes import format_size
from ..._machine.capacity import host_available_bytes
from ..narrowing import NARROWER, Narrow, check_mode
from .documents import FIELDS, SEPARATOR_KINDS, SeparatorIs
from .packing import OPEN_ROWS, PackSettings, checked_pad, checked_settings
from .prefetch import as_int, checked_size
from .reading import ReadOptions, read_options
from .shards import Shards
from .sources import TokenView, source_view, token_sources
from .state import LAST_STEP, SEEDS, StreamState, read_state


@dataclass(frozen=True, slots=True)
class WindowsArguments:
    """The arguments of `devpolicy.windows`, as given (see it for each one's meaning):
    the verb's keywords, written once. A test holds the verb's signature to these fields.
    """

    tokens: Any
    length: int
    batch: int
    name: str = "batch"
    order: str = "sequential"
    seed: int | None = None
    stride: int | None = None
    steps: int | None = None
    epochs: int | None = None
    weights: Mapping[str, float] | None = None
    separator: int | None = None
    separator_is: str = "eos"
    fields: Mapping[str, str] | None = None
    reads: ReadOptions | str | None = None
    size: int = 2
    narrow: str = "exact"
    start: int = 0
    resume: Mapping[str, Any] | str | None = None
    report_every: float | None = 60.0
    pack: str | None = None
    pad: int | None = None
    open_rows: int | None = None
    index: Any = None


#: How documents are packed whole into rows (`pack=`).
PACKINGS = ("first_fit",)


@dataclass(frozen=True, slots=True)
class Packing:
    """A packed stream's packing, checked: how (`PACKINGS`), its settings (the order of
    the documents and its seed included), the padding token, where the document index is
    kept (None: beside a token file)."""

    how: str
    settings: PackSettings
    pad: int
    where: Any

    def saved(self, separator: tuple[int, SeparatorIs]) -> tuple[tuple[str, Any], ...]:
        """What a saved state holds of it (matched on resume): how, the separator, its
        side, the padding token and the open rows."""
        token, side = separator
        return (
            ("how", self.how),
            ("separator", token),
            ("separator_is", side),
            ("pad", self.pad),
            ("open_rows", self.settings.open_rows),
        )


@dataclass(frozen=True, slots=True)
class Checked:
    """A stream's arguments, checked: its token views (a mixture's, by name), and every
    value that decides its batches, as the stream uses them."""

    views: list[TokenView]  # an array, or shards as one (`shards.Shards`), a source
    names: tuple[str, ...]  # a mixture's sources; () for one array
    shares: list[float] | None  # a mixture's weights
    name: str
    length: int
    batch: int
    order: str
    seed: int | None  # drawn here for a random or shuffled stream given none
    stride: int
    steps: int | None
    epochs: int | None
    separator: tuple[int, SeparatorIs] | None
    fields: tuple[str, str, str] | None
    reads: ReadOptions
    size: int
    narrow: Narrow
    start: int
    saved: dict[str, Any] | None
    report_every: float | None
    packing: Packing | None = None

    @property
    def starts(self) -> list[int]:
        """Every offset a window fits at, a source."""
        return [view.shape[0] - self.length + 1 for view in self.views]

    def state(self, global_batch: int) -> StreamState:
        """The state the stream starts in (its `start` step), of a global batch of
        `global_batch` rows: what its saved states are made from."""
        view = self.views[0]
        return StreamState(
            self.start,
            self.order,
            self.seed,
            self.length,
            self.batch,
            None if self.order == "random" or self.packing is not None else self.stride,
            self.steps,
            sum(part.shape[0] for part in self.views),
            tuple(int(n) for n in view.shape[1:]),
            str(view.dtype),
            epochs=self.epochs,
            global_batch=global_batch,
            sources=(
                tuple(zip(self.names, (int(v.shape[0]) for v in self.views), strict=True))
                if self.names
                else None
            ),
            weights=tuple(zip(self.names, self.shares, strict=True)) if self.shares else None,
            shards=self._shards(),
            pack=(
                None
                if self.packing is None or self.separator is None
                else self.packing.saved(self.separator)
            ),
        )

    def _shards(self) -> str | tuple[tuple[str, str], ...] | None:
        """What a saved state holds of the shards: one source's fingerprint, a mixture's
        for each source given as shards; None where no source is."""
        found = [
            (name, view.fingerprint())
            for name, view in zip(self.names or ("",), self.views, strict=True)
            if isinstance(view, Shards)
        ]
        if not found:
            return None
        return found[0][1] if not self.names else tuple(found)


#: How windows are chosen: in order, each start drawn at random, or epochs of every
#: window once each in an order drawn anew each epoch.
Order: TypeAlias = 'Literal["sequential", "random", "shuffled"]'
ORDERS = ("sequential", "random", "shuffled")

#: A batch this large or larger is checked against the host's available memory first.
ASK_HOST_FROM = 64 * 2**20


def _positive(what: str, value: object) -> int:
    number = as_int(value)
    if number is None or number < 1:
        raise ValueError(f"windows {what} must be an int >= 1, got {value!r}")
    return number


def _batch_fits(
    view: TokenView,
    length: int,
    batch: int,
    windows: int,
    size: int,
    segments: bool,
) -> None:
    """Refuse a stream the host cannot hold, before anything is allocated for it: its
    batches ahead (`size` placed, as many cut, one in use and one being cut), each with
    its offsets and, with segments, two int32 arrays a token. The host is asked only
    where that is `ASK_HOST_FROM` or more: reading its available memory is dear under
    gVisor (docs/benchmarks.md), and a smaller stream that does not fit fails in numpy
    as it would by hand."""
    row = view.itemsize * int(np.prod(view.shape[1:], dtype=np.int64))
    per_window = length * row + 8 + (8 * length if segments else 0)
    per_batch = min(batch, windows) * per_window
    held = 2 * size + 2  # the batches a stream holds at once, at most
    nbytes = per_batch * held
    if nbytes < ASK_HOST_FROM:
        return
    available = host_available_bytes()
    if available is not None and nbytes > available:
        raise ValueError(
            f"windows batch={batch} of length={length} needs {format_size(per_batch)} per "
            f"batch ({view.dtype}, {format_size(length * row)} a window"
            + (", with segment ids and positions" if segments else "")
            + f"), and size={size} holds up to {held} batches at once: "
            f"{format_size(nbytes)}, more than the {format_size(available)} this host has "
            "available: lower size, batch or length"
        )


def _separator(
    separator: int | None, separator_is: str, view: TokenView
) -> tuple[int, SeparatorIs] | None:
    """The separator token and its side, checked against the tokens (None: no segments)."""
    if separator_is not in SEPARATOR_KINDS:
        raise ValueError(
            f"windows separator_is must be one of {SEPARATOR_KINDS}, got {separator_is!r}"
        )
    if separator is None:
        return None
    token = as_int(separator)
    if token is None:
        raise TypeError(f"windows separator must be an int (a token id), got {separator!r}")
    if view.ndim != 1 or view.dtype.kind not in "iu":
        raise ValueError(
            f"windows separator= needs a 1-D array of integer token ids, got shape "
            f"{view.shape} of {view.dtype}"
        )
    info = np.iinfo(view.dtype)
    if not info.min <= token <= info.max:
        raise ValueError(
            f"windows separator={token} cannot occur in tokens of {view.dtype} "
            f"({info.min} to {info.max}): it would never separate anything"
        )
    _fits_narrowed(
        "separator",
        token,
        view.dtype,
        "a batch holding it would raise (narrow='exact') or never separate (narrow='lossy')",
    )
    kind: SeparatorIs = "bos" if separator_is == "bos" else "eos"
    return token, kind


def _fits_narrowed(name: str, token: int, dtype: np.dtype[Any], otherwise: str) -> None:
    """Refuse a token id (`name`) that 64-bit tokens narrowed with x64 off cannot hold."""
    narrowed = NARROWER.get(dtype)
    if narrowed is None or jax.config.jax_enable_x64:  # type: ignore[attr-defined]
        return
    info = np.iinfo(narrowed)
    if not info.min <= token <= info.max:
        raise ValueError(
            f"windows {name}={token} does not fit {narrowed} ({info.min} to {info.max}), and "
            f"with x64 off JAX narrows tokens of {dtype} to {narrowed}: {otherwise}; use a "
            f"{name} that fits, or enable jax_enable_x64"
        )


def _fields(fields: Mapping[str, str] | None, segments: bool) -> tuple[str, str, str] | None:
    """A batch's keys (tokens, segment ids, positions) renamed by `fields`, checked; None
    where a batch is the tokens alone."""
    if fields is None:
        return None
    known = FIELDS if segments else FIELDS[:1]
    if not isinstance(fields, Mapping):
        raise TypeError(
            f"windows fields must be a mapping of a batch's keys ({', '.join(known)}) to "
            f"the names a model wants, got {type(fields).__name__} {fields!r}"
        )
    unknown = [key for key in fields if key not in known]
    if unknown:
        why = (
            ""
            if segments or any(k not in FIELDS for k in unknown)
            else " (segment_ids and positions come with separator= only)"
        )
        raise ValueError(
            f"windows fields names a batch's keys: {', '.join(known)}; got "
            f"{', '.join(map(repr, unknown))}{why}"
        )
    for key, value in fields.items():
        if not isinstance(value, str) or not value:
            raise TypeError(f"windows fields[{key!r}] must be a non-empty str, got {value!r}")
    names = tuple(fields.get(key, key) for key in FIELDS)
    if len(set(names[: len(known)])) < len(known):
        raise ValueError(
            f"windows fields would give two of a batch's arrays one key: "
            f"{dict(zip(known, names, strict=False))}"
        )
    return names[0], names[1], names[2]


def checked(args: WindowsArguments) -> Checked:
    """`args` checked, every fault an error naming its argument; nothing opened."""
    sources, shares = token_sources(args.tokens, args.weights)
    views = [view for _, view in sources] if sources else [source_view(None, args.tokens)]
    view = views[0]
    length = _positive("length", args.length)
    batch = _positive("batch", args.batch)
    order, stride, steps, epochs = args.order, args.stride, args.steps, args.epochs
    if order not in ORDERS:
        raise ValueError(f"windows order must be one of {ORDERS}, got {order!r}")
    if sources is not None and order == "sequential":
        raise ValueError(
            "windows of a mixture are drawn by weight: pass order='random' (with "
            "replacement) or order='shuffled' (each source's epochs), not 'sequential'"
        )
    if stride is not None and order == "random":
        # Silently ignored, it would look like it took effect.
        raise ValueError(
            f"windows stride applies to order='sequential' or 'shuffled' only; "
            f"order='random' draws every start at random, got stride={stride!r}"
        )
    if epochs is not None:
        epochs = _positive("epochs", epochs)
        if order != "shuffled" or sources is not None:
            raise ValueError(
                "windows epochs= bounds an order='shuffled' stream of one array"
                + (
                    f"; got order={order!r}"
                    if order != "shuffled"
                    else "; each source of a mixture has its own epochs: bound it with steps="
                )
            )
    if steps is not None:
        steps = _positive("steps", steps)
    seed = args.seed
    number = None if seed is None else as_int(seed)
    if seed is not None and number is None:
        raise TypeError(f"windows seed must be an int or None, got {seed!r}")
    if number is not None and not 0 <= number < SEEDS:
        raise ValueError(f"windows seed must be an int from 0 to 2**64 - 1, got {seed!r}")
    size = checked_size("windows", args.size)
    name = args.name
    if not isinstance(name, str):
        raise TypeError(f"windows name must be a str, got {type(name).__name__} {name!r}")
    narrow: Narrow = "lossy" if args.narrow == "lossy" else "exact"
    check_mode(args.narrow)
    # Packed rows need a token, not a window's worth: a short document is padded.
    fewest = length if args.pack is None else 1
    for index, part in enumerate(views):
        if part.ndim == 0 or part.shape[0] < fewest:
            rows = part.shape[0] if part.ndim else 0
            which = f"source {sources[index][0]!r}" if sources else "the array"
            if isinstance(part, Shards):
                which += f" (its {len(part.sizes):,} shards, in all)"
            raise ValueError(
                f"windows of length {length} need at least {fewest} rows along the first "
                f"dimension; {which} has {rows} (shape {part.shape})"
            )
    documents = _separator(args.separator, args.separator_is, view)
    keys = _fields(args.fields, documents is not None)
    options = read_options(args.reads)
    every = _report_every(args.report_every)
    starts = [part.shape[0] - length + 1 for part in views]  # every offset a window fits at
    stride = length if stride is None else _positive("stride", stride)
    # A stride past the last start gives one window a pass, as that last start does
    # (and keeps the offsets within int64).
    stride = max(1, min(stride, max(starts)))  # packed rows: a corpus shorter than a row
    first = as_int(args.start)
    if first is None or not 0 <= first < LAST_STEP:
        raise ValueError(f"windows start must be an int from 0 to 2**63 - 1, got {args.start!r}")
    if steps is not None and steps > LAST_STEP:
        raise ValueError(f"windows steps must be an int from 1 to 2**63, got {steps!r}")
    saved = None if args.resume is None else read_state(args.resume)
    if saved is not None and first:
        raise ValueError(
            f"windows takes start= or resume=, not both (start={first}, and the "
            f"state saved at step {saved['step']})"
        )
    if order != "sequential" and number is None:
        if saved is not None and saved["seed"] is None:
            raise StreamStateError(
                "order, seed",
                f"the saved stream had order={saved['order']!r} (no seed); this one has "
                f"order={order!r}, which draws by a seed: other arguments draw other batches",
                f"resume with the arguments the state was saved with (order={saved['order']!r})",
            )
        # Drawn here, so that the stream's state can name it and a resume draw the same.
        number = secrets.randbits(63) if saved is None else saved["seed"]
    packing = _packing(args, length, view, bool(sources), documents, number)
    _batch_fits(
        view,
        length,
        batch,
        -(-starts[0] // stride) if order == "sequential" else batch,
        size,
        documents is not None,
    )
    return Checked(
        views,
        tuple(key for key, _ in sources) if sources else (),
        shares,
        name,
        length,
        batch,
        order,
        number,
        stride,
        steps,
        epochs,
        documents,
        keys,
        options,
        size,
        narrow,
        first,
        saved,
        every,
        packing,
    )


def _packing(
    args: WindowsArguments,
    length: int,
    view: TokenView,
    mixture: bool,
    documents: tuple[int, SeparatorIs] | None,
    seed: int | None,
) -> Packing | None:
    """`pack=` and its arguments checked (None: windows, not packed rows); every fault
    names the argument and what it takes."""
    pack = args.pack
    if pack is None:
        given = [
            name
            for name, value in (("pad", args.pad), ("open_rows", args.open_rows),
                                ("index", args.index))
            if value is not None
        ]  # fmt: skip
        if given:
            raise ValueError(
                f"windows {given[0]}= applies to packed rows only: pass pack='first_fit' "
                "(with separator=) or leave it out"
            )
        return None
    if pack not in PACKINGS:
        raise ValueError(f"windows pack must be one of {PACKINGS} or None, got {pack!r}")
    if documents is None:
        raise ValueError(
            "windows pack= packs documents, the spans between separator tokens: pass "
            "separator= (the token that ends, or with separator_is='bos' starts, each one)"
        )
    if mixture:
        raise ValueError(
            "windows pack= packs the documents of one source (an array of tokens, or a "
            "list of shards); a mixture's sources are not packed yet: pack each corpus on "
            "its own, or leave pack= out"
        )
    order = args.order
    if order not in ("sequential", "shuffled"):
        raise ValueError(
            "windows pack= takes order='sequential' (documents in the file's order, one "
            f"pass) or 'shuffled' (the documents shuffled each epoch), got order={order!r}"
        )
    if args.stride is not None:
        raise ValueError(
            f"windows stride= moves windows; packed rows are made of whole documents: "
            f"leave stride= out with pack= (got stride={args.stride!r})"
        )
    if args.reads is not None:
        raise ValueError(
            "windows reads= chooses how windows are read; packed rows copy each "
            "document from memory or the file's mapping: leave reads= out with pack="
        )
    if as_int(args.start):
        raise ValueError(
            f"windows start={args.start!r} with pack=: a packed row depends on every row "
            "before it, so a step is reached exactly only from a saved state: pass "
            "resume=stream.state() (saved by the packed stream), or start at 0"
        )
    if args.pad is None:
        raise ValueError(
            "windows pack= needs pad=: the token that fills the rest of each row (its "
            "segment id is 0, so a model masks it)"
        )
    pad = checked_pad(args.pad, view.dtype)
    _fits_narrowed("pad", pad, view.dtype, "every padded batch would raise")
    open_rows = OPEN_ROWS if args.open_rows is None else args.open_rows
    # A sequential packed stream is one pass over the documents, as a sequential one is
    # over the windows.
    epochs = 1 if order == "sequential" else args.epochs
    settings = checked_settings(length, open_rows, order, seed, epochs)
    return Packing(str(pack), settings, pad, args.index)


def _report_every(value: object) -> float | None:
    """`report_every`, checked: seconds between a stream's `stream_progress` lines, or
    None (or 0) for none."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
        raise ValueError(
            "windows report_every must be seconds between progress lines (a number >= 0; "
            f"0 or None: none), got {value!r}"
        )
    return float(value) or None
