"""Steps the processes of a `jax.distributed` job take together, each ending in every
process's verdict: what a multi-process save needs so that one process's failure fails
the save on all of them, with its reason, and nothing waits for ever.

A verdict (ok, or failed and why, with a short text) goes through the job's coordination
service (its key-value store), not through a collective: a collective cannot carry the
reason, has no timeout, and compiles. Every wait has a deadline; a process that does not
answer in time (killed, stuck, or not taking part) is named as such.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import jax

#: This process's keys of the steps since the last one it heard every process's verdict
#: on. Once it has (every process said its verdict on a later step), every process has read
#: them (a process says its verdict on a step only after reading what the steps before
#: needed), and they are deleted: the store keeps a key or two a process.
_passed: list[str] = []


@dataclass(frozen=True, slots=True)
class Missing:
    """One process's part in a step that did not come: it failed (with why) or never said."""

    process: int
    reason: str | None  # None: no answer before the deadline


class StepFailed(Exception):  # noqa: N818 - internal; the caller says it as its own error
    """Some process failed a step, or did not answer in time; `missing` says which and why."""

    def __init__(self, step: str, count: int, missing: list[Missing], timeout: float) -> None:
        self.step = step
        self.missing = missing
        parts = [
            f"process {m.process} of {count} failed: {m.reason}"
            if m.reason is not None
            else f"process {m.process} of {count} did not reach step {step!r} within "
            f"{timeout:g} s (killed, stuck, or not taking part)"
            for m in missing
        ]
        super().__init__("; ".join(parts))


class Agreement:
    """One operation's steps, taken by every process of the job in the same order.

    Args:
        name: Unique in the job for this operation, the same in every process (a count of
            the operations each process has started, say).
        timeout: Seconds a process waits, at each step, for the others' verdicts.
        alone: This process takes the steps alone (as process 0 of 1), whatever the job.
    """

    def __init__(self, name: str, timeout: float, *, alone: bool = False) -> None:
        from jax._src import distributed  # the job's coordination client: no public handle

        client = None if alone else distributed.global_state.client
        self.index = 0 if alone else jax.process_index()
        self.count = 1 if alone else jax.process_count()
        self._prefix = f"devpolicy/{name}"
        self._timeout = timeout
        self._client: Any = client
        if client is None and self.count == 1:
            return  # this process alone (an upload of its own arrays): its verdict is all
        if client is None:
            raise RuntimeError(
                "arrays span several processes but jax.distributed is not initialized here: "
                "call jax.distributed.initialize() in every process first"
            )

    def step(
        self,
        step: str,
        text: str,
        error: BaseException | None = None,
        waits_for: tuple[int, ...] | None = None,
    ) -> list[str]:
        """Say this process's verdict on `step` (`error` None: ok, with `text`), then wait
        for every other process's, or only for those of `waits_for` (a step only they take:
        the others' verdicts say nothing).

        Returns:
            Every process's text, by process index ("" for those not waited for).

        Raises:
            StepFailed: another process failed the step or did not answer in time (after
                waiting for all of them: every failure is named). When this process failed
                (`error`), it says so and returns at once; the caller raises its own error.
        """
        if self._client is None:
            return [text if error is None else ""]
        key = f"{self._prefix}/{step}/{self.index}"
        verdict = f"ok:{text}" if error is None else f"failed:{_reason(error)}"
        self._client.key_value_set(key, verdict)
        texts = [""] * self.count
        if error is not None:
            return texts
        deadline = time.monotonic() + self._timeout
        missing = []
        texts[self.index] = text
        for process in range(self.count) if waits_for is None else waits_for:
            if process == self.index:
                continue
            heard = self._verdict(step, process, deadline - time.monotonic())
            if heard is None:
                missing.append(Missing(process, None))
            elif heard[0]:
                texts[process] = heard[1]
            else:
                missing.append(Missing(process, heard[1]))
        if missing:
            raise StepFailed(step, self.count, missing, self._timeout)
        while _passed and waits_for is None:  # every process passed the steps before
            self._delete(_passed.pop())
        _passed.append(key)
        return texts

    def verdict_of(self, step: str, process: int) -> tuple[bool, str] | None:
        """`process`'s verdict on `step`, waiting for it up to the timeout: (True, its
        text) where it passed, (False, why) where it failed; None where it did not answer
        in time or the job can no longer be asked."""
        if self._client is None:
            return None
        return self._verdict(step, process, self._timeout)

    def _verdict(self, step: str, process: int, seconds: float) -> tuple[bool, str] | None:
        """`process`'s verdict on `step` as `verdict_of` says it, waiting `seconds` at most
        (at least a millisecond)."""
        try:
            answer = self._client.blocking_key_value_get(
                f"{self._prefix}/{step}/{process}", max(1, int(seconds * 1000))
            )
        except Exception:  # JaxRuntimeError DEADLINE_EXCEEDED; any other is as bad
            return None
        said, _, rest = str(answer).partition(":")
        return said == "ok", rest

    def _delete(self, key: str) -> None:
        # A key left in the store costs a few bytes: never fail the save for it.
        with contextlib.suppress(Exception):
            self._client.key_value_delete(key)


def _reason(error: BaseException) -> str:
    """An error as one line for the other processes' messages: its type (a private
    subclass as its public parent) and text; an interruption (SIGTERM, Ctrl-C, exit) as
    what it says."""
    text = " ".join(str(error).split())
    kind = next(c for c in type(error).__mro__ if not c.__name__.startswith("_")).__name__
    if not isinstance(error, Exception):
        return (text or kind)[:2000]
    return f"{kind}: {text}"[:2000] if text else kind
