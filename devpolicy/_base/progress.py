"""The terminal bar a long read or write shows: the file's name, bytes done of the whole,
the rate and the time left (`load_file`, `save_chunks`, `align_file`, `devpolicy align`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from .visible import visible

#: Files larger than this show a progress bar on a terminal (`progress=None`).
PROGRESS_THRESHOLD = 256 * 2**20


def _nothing(_n: int) -> None:
    return None


@contextmanager
def progress_bar(
    name: str, total: int | None, wanted: bool | None
) -> Iterator[Callable[[int], Any]]:
    """A function to call with each count of bytes done: a bar named `name` on a terminal
    (asked for, or by default for files over `PROGRESS_THRESHOLD`), else one that does
    nothing. `total` None: the size is not known beforehand (a generator's chunks); by
    default the bar then appears once `PROGRESS_THRESHOLD` bytes are done, and shows no
    time left. Where the total is known, the function may be called from any thread."""
    if wanted is False or not sys.stderr.isatty():
        yield _nothing
        return
    if wanted is None and total is not None and total <= PROGRESS_THRESHOLD:
        yield _nothing
        return
    if total is not None or wanted is True:
        with _bar(name, total) as advance:
            yield advance
        return
    # Unknown total, not asked for: the bar starts only once the write is long.
    done = 0
    shown: list[Callable[[int], Any]] = []
    with ExitStack() as stack:

        def advance(n: int) -> None:
            nonlocal done
            if shown:
                shown[0](n)
                return
            done += n
            if done > PROGRESS_THRESHOLD:
                shown.append(stack.enter_context(_bar(name, None)))
                shown[0](done)

        yield advance


@contextmanager
def _bar(name: str, total: int | None) -> Iterator[Callable[[int], Any]]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        # The file's name is whoever made the checkpoint's text: shown, never read as
        # markup (`[white on white]`, `[link=...]`) nor obeyed as a terminal escape.
        TextColumn("{task.description}", style="bold", markup=False),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(visible(name), total=total)
        yield lambda n: bar.advance(task, n)
