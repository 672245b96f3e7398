"""Saving arrays that span processes: one safetensors file that every process of a
`jax.distributed` job writes its own part of.

The header follows from the global shapes and dtypes alone, so every process lays the
file out alike (`layout`) and knows where each of its shards goes. Each process writes the
shards it holds whose `replica_id` is 0 (every distinct slice is replica 0 on exactly one
device of the job: nothing is written twice); arrays no other process can see (numpy,
or held on one process's devices) are taken as the same everywhere and written by
process 0. The steps, each ending in every process's verdict (`joint_steps`), so that one
process's failure fails the save everywhere, with its reason:

1. `layout`: every process works out the header; process 0 creates the unfinished file.
   The processes compare headers: different trees are an error, not a mixed file.
2. `written`: every process writes its pieces at their offsets and syncs them.
3. `published`: process 0 renames the file into place; the save returns everywhere only
   once it is there (the others wait for process 0's verdict alone: a process lost after
   writing its part does not undo a complete file).

Where the bytes go is a `JointTarget`: a file on a filesystem every process sees
(`local_files.LocalJointFile`), or an object in S3 (`remote.upload.RemoteUpload`): `create`
starts a multipart upload (its id the token), `write` uploads a process's parts and returns
their tags as the receipt, `publish` completes the upload with every receipt. Its parts are
planned after the layout (`upload_parts.plan_parts`): tensors whose bytes interleave between the
processes, or are too small for a part of their own, are gathered and process 0 uploads
them whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jax
import numpy as np

from ..._base.errors import SafetensorsFileError
from ..._base.locations import FilePath
from ..format.header import PACKED, pack
from ..format.layout import Shaped, Slot, plan_layout, slice_runs, slots_of
from .joint_steps import Agreement, StepFailed
from .local_files import (
    LocalJointFile,
    _UnfinishedFileGoneError,
    check_metadata,
    temporaries_removed_on_sigterm,
)
from .upload_parts import Part, plan_parts

#: Joint saves this process has started: the same count in every process of a job (every
#: process saves the same trees in the same order), so it names each save's agreement.
_saves = itertools.count()


class JointTarget(Protocol):
    """Where a joint save's bytes go: a file on a filesystem every process sees
    (`local_files.LocalJointFile`), or an object written as a multipart upload
    (`remote.upload.RemoteUpload`, which has `parted`: its parts are planned first)."""

    def create(self, header: bytes, size: int) -> str:
        """Process 0: begin the file (`size` bytes, `header` first); return its token."""
        ...

    def write(
        self,
        token: str,
        pieces: Iterator[tuple[int, memoryview]],
        parts: Sequence[Part] | None = None,
    ) -> tuple[int, str]:
        """Any process: write (file offset, bytes) pieces durably; (bytes, receipt).
        `parts`: for an upload in parts, this process's (`upload_parts.plan_parts`)."""
        ...

    def publish(self, token: str, receipts: Sequence[str]) -> None:
        """Process 0, once every process has written: make the file appear, atomically."""
        ...

    def discard(self, token: str) -> None:
        """Process 0, when the save failed: remove what was begun."""
        ...


@dataclass(frozen=True, slots=True)
class JointSaved:
    """What one process did in a joint save (the `save_file` event's fields)."""

    file_bytes: int  # the whole file's size
    nbytes: int  # its tensors' bytes (every process's, as written: header and padding not)
    bytes_written: int  # by this process
    processes: int
    gathered_bytes: int = 0  # of tensors gathered for process 0 to upload whole


def spans_processes(value: object) -> bool:
    """Whether `value` is a JAX array some of whose shards no process here can read."""
    return isinstance(value, jax.Array) and not value.is_fully_addressable


def save_joint(
    arrays: Mapping[str, Any],
    path: FilePath,
    *,
    align: int,
    metadata: Mapping[str, str] | None,
    timeout: float,
    target: JointTarget | None = None,
    alone: bool = False,
) -> JointSaved:
    """Write `arrays` (some spanning processes) as one file, together with every other
    process of the job; every process must call this with the same names, shapes, dtypes
    and metadata.

    `alone`: only this process saves (its own arrays, to `target`), whatever the job.

    Raises:
        SafetensorsFileError: this or another process failed (another's reason is named),
            or a process did not answer within `timeout` seconds; nothing is written.
    """
    # Alone: one process's own arrays (to an upload); not counted among the job's saves.
    agreement = Agreement("save/alone" if alone else f"save/{next(_saves)}", timeout, alone=alone)
    me = agreement.index
    gathered_bytes = 0
    where = target if target is not None else LocalJointFile(Path(str(path)))
    token: str | None = None
    published = False
    with temporaries_removed_on_sigterm():
        try:
            # 1. layout: the same header everywhere; process 0 begins the file.
            try:
                tensors = {key: _tensor(value) for key, value in arrays.items()}
                check_metadata(metadata, path)
                header, order = plan_layout(slots_of(tensors, path), metadata, align)
                size = 8 + len(header) + sum(slot.nbytes for slot in order)
                if me == 0:
                    token = where.create(header, size)
                said = f"{hashlib.sha256(header).hexdigest()} {len(order)} {size} {token or ''}"
            except BaseException as e:
                _fail(agreement, "layout", e)
                raise
            texts = _step(agreement, "layout", said, path)
            digests = {text.split(" ")[0] for text in texts}
            if len(digests) > 1:
                shown = ", ".join(
                    f"process {i}: {text.split(' ')[1]} tensors, {text.split(' ')[2]} bytes"
                    for i, text in enumerate(texts)
                )
                raise SafetensorsFileError(
                    path,
                    "the processes would write different files (every process must save the "
                    f"same names, shapes, dtypes and metadata; {shown}); nothing written",
                )
            token = texts[0].split(" ", 3)[3]  # a name may hold spaces: the rest is it

            # 2. written: each process its pieces (an upload: its parts, some tensors
            # gathered for process 0 first).
            try:
                mine: list[Part] | None = None
                if getattr(where, "parted", False):
                    plan = plan_parts(
                        tensors,
                        order,
                        8 + len(header),
                        {key: spans_processes(value) for key, value in tensors.items()},
                    )
                    tensors = _gathered(tensors, order, plan.gathered, me)
                    gathered_bytes = plan.gathered_bytes
                    mine = [part for part in plan.parts if part.process == me]
                pieces = _pieces(tensors, order, 8 + len(header), me, path)
                written, receipt = where.write(token, pieces, mine)
            except BaseException as e:
                _fail(agreement, "written", e)
                if isinstance(e, _UnfinishedFileGoneError):
                    _creator_removed_it(agreement, path, e)
                raise
            receipts = _step(agreement, "written", receipt, path)

            # 3. published: process 0 names the file; everyone returns once it is there.
            try:
                if me == 0:
                    where.publish(token, receipts)
                    published = True
            except BaseException as e:
                _fail(agreement, "published", e)
                raise
            # Only process 0's verdict counts: a process lost after writing its part
            # does not undo a complete file.
            _step(agreement, "published", "", path, waits_for=(0,))
        finally:
            if me == 0 and token is not None and not published:
                where.discard(token)
    header_bytes = 8 + len(header) if me == 0 and mine is None else 0  # uploads count it
    data = sum(slot.nbytes for slot in order)
    return JointSaved(size, data, written + header_bytes, agreement.count, gathered_bytes)


def _gathered(
    tensors: Mapping[str, Any], order: list[Slot], keys: frozenset[str], me: int
) -> dict[str, Any]:
    """`tensors` with those of `keys` gathered whole as numpy on process 0 (and left out
    elsewhere): every process takes part in each gathering, in file order."""
    if not keys:
        return dict(tensors)
    from jax.experimental import multihost_utils

    out = dict(tensors)
    for slot in order:
        if slot.key in keys:
            whole = multihost_utils.process_allgather(tensors[slot.key], tiled=True)
            out[slot.key] = _tensor(whole) if me == 0 else np.zeros(0, np.uint8)
    return out


def _creator_removed_it(
    agreement: Agreement, path: FilePath, error: _UnfinishedFileGoneError
) -> None:
    """This process found no unfinished file: where process 0 failed (and so removed it),
    raise naming process 0's failure; where process 0 cannot say, raise naming both
    causes. Only where process 0 wrote its part is the filesystem surely not shared, and
    `error` says so."""
    verdict = agreement.verdict_of("written", 0)
    if verdict is not None and verdict[0]:
        return
    count = agreement.count
    if verdict is not None:
        why = f"saved by no process: process 0 of {count} failed: {verdict[1]}"
    else:
        why = (
            f"saved by no process: the unfinished file process 0 created is gone and "
            f"process 0 of {count} did not answer: it failed (and removed the file), or "
            "this process sees another filesystem than process 0 (every process of a "
            "multi-process save must see the same one, shared between hosts)"
        )
    raise SafetensorsFileError(path, f"{why}; nothing written") from None


def _fail(agreement: Agreement, step: str, error: BaseException) -> None:
    """Tell the other processes this one failed `step`, and why; the caller raises `error`
    (a failure to tell them must not hide it: they then time out, naming this process)."""
    with contextlib.suppress(Exception):
        agreement.step(step, "", error)


def _step(
    agreement: Agreement,
    step: str,
    text: str,
    path: FilePath,
    waits_for: tuple[int, ...] | None = None,
) -> list[str]:
    try:
        return agreement.step(step, text, waits_for=waits_for)
    except StepFailed as e:
        raise SafetensorsFileError(path, f"saved by no process: {e}; nothing written") from None


def _tensor(value: Any) -> Shaped:
    """A leaf as the layout sees it: global arrays as they are, anything else as numpy in
    native byte order (what process 0 will write)."""
    if spans_processes(value):
        return value  # type: ignore[no-any-return]
    array = np.asarray(value)
    return np.require(array.astype(array.dtype.newbyteorder("="), copy=False), requirements="C")


def _pieces(
    tensors: Mapping[str, Any], order: list[Slot], data_start: int, me: int, path: FilePath
) -> Iterator[tuple[int, memoryview]]:
    """This process's (file offset, bytes): its replica-0 shards of global arrays, and on
    process 0 every other array whole. One shard is on the host at a time."""
    offset = data_start
    for slot in order:
        value = tensors[slot.key]
        if spans_processes(value):
            for shard in value.addressable_shards:
                if shard.replica_id != 0:
                    continue
                bounds = tuple(
                    s.indices(dim)[:2] for dim, s in zip(slot.shape, shard.index, strict=True)
                )
                yield from _runs_of(slot, np.asarray(shard.data), bounds, offset, path)
        elif me == 0 and slot.nbytes:
            yield from _runs_of(slot, value, tuple((0, d) for d in slot.shape), offset, path)
        offset += slot.nbytes


def _runs_of(
    slot: Slot,
    data: np.ndarray[Any, Any],
    bounds: tuple[tuple[int, int], ...],
    start: int,
    path: FilePath,
) -> Iterator[tuple[int, memoryview]]:
    """A slice's bytes as the runs of the file it fills."""
    data = np.ascontiguousarray(data)
    if slot.dtype_name in PACKED:  # two values a byte: runs counted in values, then halved
        offsets, run = slice_runs(slot.shape, 1, bounds)
        if run % 2 or np.any(offsets % 2):
            raise SafetensorsFileError(
                path,
                f"a shard {bounds} of this {slot.dtype_name} tensor starts or ends inside a "
                "byte (two values a byte): shard it so every shard's rows hold an even "
                "number of values",
                tensor=slot.key,
            )
        offsets, run, flat = offsets // 2, run // 2, pack(data)
    else:
        offsets, run = slice_runs(slot.shape, data.dtype.itemsize, bounds)
        flat = data.reshape(-1).view(np.uint8)
    view = flat.data
    for k, offset in enumerate(offsets.tolist()):
        yield start + offset, view[k * run : (k + 1) * run]
