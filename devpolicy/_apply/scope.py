"""`Scope`: one name's decision applied around a block (`with`) or a function (`@`).

A Scope decides when it is entered or called, never earlier; as a context manager it swaps
JAX's default device for the block (`default_device`), as a decorator it hands the
function to `calls.decorate`, which wraps each call. `Scopes` keeps one Scope per name;
`make_place` is `@place` in both its forms.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from .._base.errors import ScopeInCoroutineError
from .._base.limits import CACHE_GENERATION
from .._decide.decider import Decider
from .._decide.decision import Decision
from .calls import DeciderSource, Inputs, decorate
from .default_device import (
    NOT_SWAPPED,
    close_out_of_order,
    devices_local,
    enter_mesh,
    get_device,
    open_entries,
    set_device,
)
from .transfers import Watch, armed
from .transfers import enter as enter_watch
from .transfers import leave as leave_watch

F = TypeVar("F", bound=Callable[..., Any])


# A `with scope()` written in an async body would hold JAX's thread-local default device
# across its awaits, where other tasks run and see it.
_ASYNC_CODE = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


class Scope:
    """Where a name goes, applied: a context manager that yields the Decision, and a decorator.

    As a context manager it sets `jax.default_device` to the decided device; the decision
    is made (and can fail) before anything changes, and on exit, normal or by exception,
    the previous default device is restored. One Scope object may be entered again while
    already entered, nested or from another thread.

    As a decorator it decides at each call and runs the function inside the scope, then
    commits the result's arrays (see `devpolicy.place`). Generators and coroutines get the
    scope around each step, never across a pause.

    `jax.default_device` is thread-local: the scope holds in the thread that entered it
    only. Threads started inside it do not inherit it.
    """

    __slots__ = (
        "_commit",
        "_inputs",
        "_name",
        "_nbytes",
        "_source",
    )

    #: The policy's `transfers:` a `WatchedScope` watches by; a plain Scope watches none.
    _watch: Watch | None = None

    def __init__(
        self,
        source: DeciderSource,
        name: str,
        nbytes: int | None,
        commit: bool | None = None,
        inputs: Inputs = None,
    ) -> None:
        self._source = source
        self._name = name
        self._nbytes = nbytes
        self._commit = commit
        self._inputs = inputs

    def __enter__(self) -> Decision:
        if sys._getframe(1).f_code.co_flags & _ASYNC_CODE:
            raise ScopeInCoroutineError(self._name)
        # What this entry changes, recorded before each change so that `_close` can undo
        # whatever part was made: [device before, mesh scope, watch entry, this scope].
        record: list[Any] = [NOT_SWAPPED, None, None, self]
        try:
            entries: list[list[Any]] = devices_local.open
        except AttributeError:  # this thread's first entry
            entries = open_entries()
        try:
            source = self._source
            if type(source) is Decider:
                decision = source.resolve(self._name, self._nbytes)
            else:
                holder = source.get()  # type: ignore[union-attr]
                decider = holder.decider if holder is not None else source.fallback()  # type: ignore[union-attr]
                decision = decider.resolve(self._name, self._nbytes)
            entries.append(record)
            if not decision.is_auto:
                record[0] = get_device()
                if decision.mesh is None:  # the hot path: one device
                    set_device(decision.device)
                else:
                    enter_mesh(record, decision)
            if self._watch is not None:
                watched = armed(self._watch, decision.origin)
                record[2] = watched
                enter_watch(watched)
            return decision
        except BaseException:
            # After an exception here (a KeyboardInterrupt at any point included) the
            # `with` never calls `__exit__`: undo what was recorded (issue 42, M4).
            self._close(record, entries)
            raise

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        # Attribute and item reads only before `try`: CPython takes no interrupt there.
        try:
            entries: list[list[Any]] = devices_local.open
            record = entries[-1]
        except (AttributeError, IndexError):
            record = None
        if record is None or record[3] is not self:  # left out of order, or not entered
            record = self._newest(entries if record is not None else [])
        try:
            # The hot path: the newest entry, one device, no watch.
            if (
                record is entries[-1]
                and record[0] is not NOT_SWAPPED
                and record[1] is None
                and record[2] is None
            ):
                set_device(record[0])
                record[0] = NOT_SWAPPED
                del entries[-1]
                return
            self._close(record, entries)
        except BaseException:
            self._close(record, entries)  # finish what an interrupt stopped, then raise it
            raise

    def _newest(self, entries: list[list[Any]]) -> list[Any]:
        """This scope's newest open record in this thread (others were entered after it)."""
        for record in reversed(entries):
            if record[3] is self:
                found: list[Any] = record
                return found
        raise RuntimeError(f"{self!r} exited in a thread that did not enter it")

    @staticmethod
    def _close(record: list[Any], entries: list[list[Any]]) -> None:
        """Undo what `record` changed, whatever part of it is done already (so it can be
        called again after an interrupt), and drop it from this thread's `entries`."""
        if record[2] is not None:
            leave_watch(record[2])
            record[2] = None
        if entries and entries[-1] is record:
            if record[0] is not NOT_SWAPPED:
                try:
                    set_device(record[0])
                finally:
                    record[0] = NOT_SWAPPED
                    del entries[-1]
            else:
                del entries[-1]
            if record[1] is not None:
                mesh_scope, record[1] = record[1], None
                mesh_scope.__exit__(None, None, None)
        else:
            close_out_of_order(entries, record)

    def __call__(self, fn: F) -> F:
        """Decorate `fn`: each call is decided afresh and runs inside the scope."""
        wrapped: F = decorate(
            self._source, self._name, self._nbytes, self._commit, fn, self._inputs
        )
        return wrapped

    def __repr__(self) -> str:
        return f"<devpolicy.Scope name={self._name!r} nbytes={self._nbytes!r}>"


class WatchedScope(Scope):
    """A Scope of a policy with `transfers:`: JAX's implicit transfers in the thread are
    watched while it is entered, or while the function it decorates runs (see
    `devpolicy.transfers`). A policy without `transfers:` makes plain Scopes, whose cost
    this adds nothing to."""

    __slots__ = ("_watch",)

    def __init__(
        self,
        source: DeciderSource,
        name: str,
        nbytes: int | None,
        commit: bool | None = None,
        inputs: Inputs = None,
        *,
        watch: Watch,
    ) -> None:
        super().__init__(source, name, nbytes, commit, inputs)
        self._watch = watch

    def __call__(self, fn: F) -> F:
        """Decorate `fn`: each call is decided afresh, runs inside the scope, and has its
        implicit transfers watched (plain functions; generators and coroutines are
        watched only where the policy is active)."""
        wrapped = Scope.__call__(self, fn)
        if inspect.isgeneratorfunction(fn) or inspect.iscoroutinefunction(fn):
            return wrapped
        if inspect.isasyncgenfunction(fn):
            return wrapped
        watch = self._watch
        assert watch is not None  # a WatchedScope always has one

        @functools.wraps(fn)
        def watched(*args: Any, **kwargs: Any) -> Any:
            entry = armed(watch)
            try:
                enter_watch(entry)
                return wrapped(*args, **kwargs)
            finally:
                try:
                    leave_watch(entry)
                except BaseException:
                    leave_watch(entry)  # finish what an interrupt stopped, then raise it
                    raise

        return watched  # type: ignore[return-value]


class Scopes:
    """The scope for each name of one source, made once: a Scope is re-entrant (per-thread
    stacks), so one object per name serves every `with`, and a repeat costs no construction.

    Example:
        >>> import devpolicy
        >>> p = devpolicy.load_policy({"version": 1})
        >>> p.scope("x") is p.scope("x")
        True
    """

    __slots__ = ("_source", "_watch", "by_name")

    def __init__(self, source: DeciderSource, watch: Watch | None = None) -> None:
        self._source = source
        #: The policy's `transfers:`, when it has one: its scopes watch transfers.
        self._watch = watch
        #: The scopes made so far, by name. Never replaced (only cleared), so a caller may
        #: keep its `get` for a lookup without a call of ours.
        self.by_name: dict[str, Scope] = {}

    def make(self, name: str, nbytes: int | None) -> Scope:
        """A new scope for `name`, kept for the next lookup in `by_name` when unsized (sized
        scopes are made afresh: sizes vary per call). Callers look in `by_name` first."""
        scope = (
            Scope(self._source, name, nbytes)
            if self._watch is None
            else WatchedScope(self._source, name, nbytes, watch=self._watch)
        )
        if nbytes is None and type(name) is str:
            if len(self.by_name) >= CACHE_GENERATION:
                self.by_name.clear()  # a stream of made-up names: start over, nothing is lost
            self.by_name[name] = scope
        return scope


def default_name(fn: Callable[..., Any]) -> str:
    """`module.qualname` of a function: the name `@place` uses when given none.

    Callables without their own (a `functools.partial`, an object with `__call__`) are
    named by their type.
    """
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{qualname}"


def make_place(
    source: DeciderSource,
    name: Any,
    commit: bool | None,
    inputs: Inputs = None,
    watch: Watch | None = None,
) -> Any:
    """Implement `place` for both `@place` and `@place("name")` (`watch`: the policy's
    `transfers:`, whose scopes watch implicit transfers)."""
    if commit is not None and not isinstance(commit, bool):
        raise TypeError(f"place(commit=...) must be a bool or None, got {commit!r}")
    if inputs not in (None, "keep", "move"):
        raise ValueError(f"place(inputs=...) must be 'move', 'keep' or None, got {inputs!r}")

    def make(scope_name: str) -> Scope:
        if watch is None:
            return Scope(source, scope_name, None, commit, inputs)
        return WatchedScope(source, scope_name, None, commit, inputs, watch=watch)

    if callable(name):
        return make(default_name(name))(name)
    if name is not None and not isinstance(name, str):
        raise TypeError(
            f"place() takes a name (str) or a function, got {type(name).__name__} {name!r}"
        )
    if name is not None:
        return make(name)

    def decorator(fn: F) -> F:
        return make(default_name(fn))(fn)

    return decorator
