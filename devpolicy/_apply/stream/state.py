"""Where a `windows` stream is, as a small value saved beside a checkpoint, and a stream
rebuilt from it only if it would draw the same batches.

The state names the next batch (`step`) and everything that decides which windows each
batch holds: the order, seed, length, batch, stride and steps, and the tokens' rows,
row shape and dtype. Resuming checks each against the stream being built: another
length, batch or token count would give other batches, silently, so it is an error
naming the field, the saved value and the given one. No JAX here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..._base.errors import StreamStateError

#: The key that marks a saved state, and its format's version.
STATE_KEY = "devpolicy.windows"
STATE_VERSION = 1


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

    def saved(self) -> dict[str, Any]:
        """The state as plain JSON-able values (`json.dumps` it into a checkpoint's
        metadata, or keep it as it is)."""
        fields = asdict(self)
        fields["row_shape"] = list(self.row_shape)
        return {STATE_KEY: STATE_VERSION, **fields}


#: The fields a resumed stream must share with the saved one (all but the step).
_MATCHED = ("order", "seed", "length", "batch", "stride", "steps", "rows", "row_shape", "dtype")


def read_state(saved: object) -> dict[str, Any]:
    """A saved state (a mapping, or its JSON text) checked for its marker and fields.

    Raises:
        StreamStateError: not a saved state of `windows`, or a field missing or mistyped.
    """
    if isinstance(saved, (str, bytes)):
        try:
            saved = json.loads(saved)
        except ValueError as e:
            raise StreamStateError(
                "resume", f"not JSON ({e})", "pass stream.state(), or its json.dumps"
            ) from None
    if not isinstance(saved, Mapping) or saved.get(STATE_KEY) != STATE_VERSION:
        raise StreamStateError(
            "resume",
            f"not a saved stream state (no {STATE_KEY!r}: {STATE_VERSION}), got {repr(saved)[:80]}",
            "pass the value a stream's state() returned, or its json.dumps",
        )
    fields = dict(saved)
    for name, kinds in (
        ("step", int),
        ("length", int),
        ("batch", int),
        ("rows", int),
        ("order", str),
        ("dtype", str),
        ("row_shape", list),
    ):
        value = fields.get(name)
        if not isinstance(value, kinds) or isinstance(value, bool):
            raise StreamStateError(
                f"resume[{name!r}]",
                f"must be a {kinds.__name__}, got {value!r}",
                "the saved state is damaged: save stream.state() again",
            )
    if fields["step"] < 0:
        raise StreamStateError(
            "resume['step']", f"must be >= 0, got {fields['step']!r}", "save stream.state() again"
        )
    fields["row_shape"] = tuple(fields["row_shape"])
    return fields


def resumed_step(saved: Mapping[str, Any], stream: StreamState) -> int:
    """The step to resume at: the saved one, once every field that decides the batches
    matches `stream` (a saved seed taken where the stream was given none)."""
    for name in _MATCHED:
        given, kept = getattr(stream, name), saved.get(name)
        if name == "seed" and given is None:
            continue
        if given != kept:
            raise StreamStateError(
                name,
                f"the saved stream had {name}={kept!r}, this one has {name}={given!r}: "
                "other arguments draw other batches",
                "resume with the arguments (and tokens) the state was saved with",
            )
    step: int = saved["step"]
    return step
