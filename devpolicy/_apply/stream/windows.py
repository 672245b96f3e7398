"""`windows`: a stream of batches of windows made from its checked arguments
(`arguments`): its placer, the rows this process draws, its sampler (made whole, never
changed after), its cutter and its state (read back from a saved one where given).

Everything that can be refused is refused before anything is opened, read or placed
(`arguments.checked`, then the resume against the saved state). The stream itself
(`owner.WindowStream`) owns what happens after; how it cuts its groups is `cutting`. Why
it is built this way, and what it costs: docs/host-arrays.md and docs/benchmarks.md.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..._base.errors import StreamStateError
from ..._decide.decider import Decider
from .arguments import Checked, WindowsArguments, checked
from .cutting import GroupCutter
from .indexfile import index_of
from .mixing import PERIOD_MOST, Mixed, MixedViews
from .owner import WindowStream
from .packrows import PackedRows
from .packstream import PackedCutter, PackedSteps
from .placing import GroupPlacer
from .sampling import Random, Rows, Sampler, Sequential
from .shards import Shards
from .shuffling import SMALL, Shuffled
from .state import DAMAGED, STATE_KEY, StreamState, resumed


def windows(decider: Decider, args: WindowsArguments) -> WindowStream:
    """Batches of windows of `args.tokens` placed by `decider`. See `devpolicy.windows`."""
    given = checked(args)
    views = given.views
    view = views[0]
    placer = GroupPlacer(
        decider,
        given.name,
        given.narrow,
        view.dtype,
        (given.length, *view.shape[1:]),
        separator=given.separator,
        fields=given.fields,
    )
    # Every process draws the same windows of a sequential pass.
    batch = given.batch
    rows = Rows.every(batch) if given.order == "sequential" else placer.process_rows(batch)
    state = given.state(rows.per_step)
    saved = given.saved
    if saved is not None:
        state = resumed(saved, state)  # at another global batch: from the saved row
    if given.packing is not None:
        return _packed(decider, given, placer, rows, state)
    # A mixture, or shards: several arrays as one range of rows.
    joined = given.names or any(isinstance(part, Shards) for part in views)
    mixture = MixedViews(views, given.length) if joined else None
    sampler = _sampler(given, dataclasses.replace(rows, base=state.row_base), mixture)
    if saved is not None:
        _refuse_older_orders(saved, sampler)
    first = state.step
    last = sampler.steps
    if given.steps is not None and last is not None and last < given.steps:
        _steps_past_end(decider, given, last)
    if saved is not None and last is not None and first > last:
        raise StreamStateError(
            "resume['step']",
            f"the saved step {first} is past the end of this stream, which has {last} batches",
            DAMAGED,
        )
    if last is not None and first > last:
        order = given.order
        raise ValueError(
            f"windows start={first} is past steps={given.steps}"
            if order == "random"
            else f"windows start={first} is past the end: "
            + (
                f"a sequential pass of this stream has {last} batches"
                if order == "sequential"
                else f"this stream has {last} batches"
            )
        )
    # A shuffled stream's state names its epoch (a mixture's, each source's).
    epoch_at: Callable[[int], int | dict[str, int]] | None = None
    count_sources = None
    if isinstance(sampler, Shuffled):
        epoch_at = sampler.epoch_at
    elif isinstance(sampler, Mixed):
        count_sources = functools.partial(sampler.counted, given.names, first)
        if given.order == "shuffled":
            epoch_at = functools.partial(sampler.epoch_at, given.names)
    if mixture is not None:
        view = mixture.stand_in  # a window's shape and dtype: the parts are read
    assert isinstance(view, np.ndarray)
    cutter = GroupCutter(
        view,
        given.length,
        given.batch,
        sampler,
        placer,
        given.size,
        mixture=mixture,
        reads=given.reads,
    )
    stream = WindowStream(
        cutter,
        state,
        epoch_at=epoch_at,
        count_sources=count_sources,
        report_every=given.report_every,
    )
    stream.start()
    return stream


def _steps_past_end(decider: Decider, given: Checked, last: int) -> None:
    """`steps=` past the stream's own end (a sequential pass, or `epochs=`): the stream
    ends first, and says so once, rather than stop short of what was asked silently."""
    why = (
        "a sequential stream is one pass over its windows"
        if given.order == "sequential"
        else f"epochs={given.epochs} ends it first"
    )
    decider.events.emit(
        "warning",
        "stream_steps_past_end",
        {
            "name": given.name,
            "steps": given.steps,
            "batches": last,
            "reason": f"{why}: it has {last:,} batches, not the {given.steps:,} of steps=",
        },
    )


def _packed(
    decider: Decider, given: Checked, placer: GroupPlacer, rows: Rows, state: StreamState
) -> WindowStream:
    """A stream of packed rows (`pack=`): the documents of the tokens found from their
    index (kept beside a token file, built where there is none or it no longer
    describes the file), packed from row 0 or from the saved packing state."""
    packing = given.packing
    separator = given.separator
    assert packing is not None
    assert separator is not None
    view = given.views[0]
    index = index_of(view, *separator, decider.events, where=packing.where)
    saved = given.saved
    kept = None if saved is None else saved["packing"]
    packed = PackedRows(index, packing.settings, kept)
    row = state.row
    # Where packing ended before the saved row, the stream was saved at its end.
    if (
        saved is not None
        and packed.first != row
        and (row < packed.first or packed.rows(packed.first, 1).rows)
    ):
        raise StreamStateError(
            "resume['packing']",
            f"the packing state is at row {packed.first}, and the stream's at row {row}",
            DAMAGED,
        )
    # A saved step past `steps` is refused as the state is read (`read_state`).
    steps = PackedSteps(packed, rows.per_step, rows.own, state.row_base, given.steps)
    cutter = PackedCutter(view, steps, placer, given.size, packing.pad, given.length, given.fields)
    stream = WindowStream(
        cutter,
        state,
        epoch_at=None,
        report_every=given.report_every,
    )
    stream.start()
    return stream


def _refuse_older_orders(saved: dict[str, Any], sampler: Sampler) -> None:
    """A shuffled state saved before version 3 drew epochs of at most `SMALL` windows in
    another order (the Feistel network's, not uniform there): resumed now it would draw
    other windows, silently. Refused, saying how to go on."""
    if saved[STATE_KEY] >= 3:
        return
    if isinstance(sampler, Shuffled):
        small = sampler.count <= SMALL
    elif isinstance(sampler, Mixed) and saved["order"] == "shuffled":
        small = min(sampler.windows) <= SMALL
    else:
        return
    if small:
        raise StreamStateError(
            f"resume[{STATE_KEY!r}]",
            f"this state is version {saved[STATE_KEY]}: its shuffled epochs of at most "
            f"{SMALL:,} windows were drawn in an order this version no longer draws "
            "(every order is now equally likely): resumed, it would hand out other windows",
            "finish the run with the devpolicy that saved the state, or start a new epoch "
            "without resume=",
        )


def _sampler(given: Checked, rows: Rows, mixture: MixedViews | None) -> Sampler:
    """What draws the stream's windows, with this process's `rows` of each step."""
    starts = given.starts
    seed = given.seed
    if given.names:
        assert mixture is not None
        assert given.shares is not None
        assert seed is not None
        mixed = Mixed(
            starts,
            mixture.bases,
            given.shares,
            rows,
            seed,
            given.steps,
            given.stride if given.order == "shuffled" else None,
        )
        unseen = [key for key, n in zip(given.names, mixed.counts.tolist(), strict=True) if not n]
        if unseen:
            raise ValueError(
                f"windows weights[{unseen[0]!r}] is too small: under 1/{PERIOD_MOST:,} of "
                "the weights' total, that source would never be drawn from (leave it out, "
                "or raise its weight)"
            )
        return mixed
    if given.order == "random":
        assert seed is not None
        return Random(starts[0], rows, seed, given.steps)
    if given.order == "shuffled":
        assert seed is not None
        return Shuffled(starts[0], rows, given.stride, seed, given.steps, given.epochs)
    return Sequential(starts[0], given.batch, given.stride, given.steps)
