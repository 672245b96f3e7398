"""The items of one placement (a tree's leaves, a file's tensors): the forms an item may
take and their checks (`make_query`: the one query each decision is asked as), the memory
earlier items claim, and the decisions later items may be made like (`Alike`).

Memory claimed by earlier items is passed along explicitly (`claim` into a dict the
caller holds), never kept in hidden state.
"""

from __future__ import annotations

import numbers
from collections.abc import Hashable, Mapping
from typing import Any, Generic

from .._document.axes import Attached
from .._names.matching import SourceFile
from .decision import Decision, DeviceT
from .routing import ALWAYS_MAPPED, NEVER_MAPPED, Choice, Fit, Query, Route

#: An array's shape, where sharding must know whether it divides.
Shape = tuple[int, ...]
#: One item of a placement: (name, nbytes), (name, nbytes, shape), with a fourth
#: element saying whether a loader would map it from its file (`routing.NEVER_MAPPED`...),
#: a fifth naming the file it comes from (for `file:` rules), and a sixth holding the axis
#: names its framework attached to it (`_apply.leaves.leaf_names_and_axes`; for rules with
#: `axes: attached`).
Item = (
    tuple[str, int | None]
    | tuple[str, int | None, Shape | None]
    | tuple[str, int | None, Shape | None, int]
    | tuple[str, int | None, Shape | None, int, SourceFile | None]
    | tuple[str, int | None, Shape | None, int, SourceFile | None, Attached | None]
)


def make_query(fit: Fit[DeviceT], claimed: Mapping[Hashable, int], item: Item) -> Query[DeviceT]:
    """What deciding `item` asks, checked (a size and a shape as plain ints, the name a
    str), in the placement `fit` and `claimed` describe: every way into the decider builds
    its query here, once (a name decided alone comes as a full item).

    Raises:
        ValueError: A size or a shape is not one.
        TypeError: The name is not a str.
    """
    if len(item) == 6:
        name, nbytes, shape, maps, source, attached = item
    else:
        name, nbytes = item[0], item[1]
        shape = item[2] if len(item) > 2 else None
        maps = item[3] if len(item) > 3 else NEVER_MAPPED
        source = item[4] if len(item) > 4 else None
        attached = None
    # Written out (this runs for every item of a placement); a plain int and a tuple of
    # ints pass at once.
    if nbytes is not None and (type(nbytes) is not int or nbytes < 0):
        nbytes = checked_nbytes(nbytes)
    if shape is not None:
        shape = checked_shape(shape)
    if not isinstance(name, str):
        raise TypeError(f"a placement name must be a str, got {type(name).__name__} {name!r}")
    return name, nbytes, shape, maps, source, attached, fit, claimed


def checked_shape(shape: object) -> Shape:
    """A shape as a tuple of non-negative ints."""
    if type(shape) is tuple:
        # The common case (file headers, numpy shapes), without the abstract-class checks.
        for d in shape:
            if type(d) is not int or d < 0:
                break
        else:
            return shape
    if isinstance(shape, tuple | list) and all(
        isinstance(d, numbers.Integral) and not isinstance(d, bool) and int(d) >= 0 for d in shape
    ):
        return tuple(int(d) for d in shape)
    raise ValueError(f"shape must be None or a tuple of non-negative ints, got {shape!r}")


def checked_nbytes(nbytes: object) -> int:
    """A size as a plain int; numpy integers are fine, bools, floats and negatives are not."""
    if isinstance(nbytes, numbers.Integral) and not isinstance(nbytes, bool) and int(nbytes) >= 0:
        return int(nbytes)
    raise ValueError(f"nbytes must be None or a non-negative int, got {nbytes!r}")


def claim(
    claimed: dict[Hashable, int], decision: Decision[DeviceT], fit: Fit[DeviceT], maps: int
) -> None:
    """Count a decision's bytes against the memory pools of the devices that will hold them
    (none when the loader maps the array from its file)."""
    if maps_from_file(decision, maps):
        return
    share = decision.bytes_per_device() or 0
    for device in decision.local_devices:
        pool = fit.pool(device)
        claimed[pool] = claimed.get(pool, 0) + share


def maps_from_file(decision: Decision[Any], maps: int) -> bool:
    """Whether a loader maps this decision's array from its file (no memory taken), given
    what the loader said of it (`maps`: `routing.NEVER_MAPPED`, ...)."""
    if maps == NEVER_MAPPED or decision.mesh is not None:
        return False
    on_host = getattr(decision.device, "platform", None) == "cpu"
    return on_host and (maps == ALWAYS_MAPPED or decision.mmap)


class Alike(Generic[DeviceT]):
    """One placement's decisions so far by (route, maps, shape where judged, names where
    attached): what `Decider._alike` decides runs by (the placement's memory snapshot and
    claims come with each item's `routing.Query`)."""

    __slots__ = ("made",)

    def __init__(self) -> None:
        self.made: dict[
            tuple[Route[DeviceT], int, Shape | None, Attached | None],
            tuple[Choice[DeviceT], Decision[DeviceT]],
        ] = {}
