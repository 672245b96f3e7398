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
from threading import get_ident
from typing import Any, TypeVar

from .._base.errors import ScopeInCoroutineError
from .._base.limits import CACHE_GENERATION
from .._decide.decider import Decider
from .._decide.decision import Decision
from .calls import DeciderSource, Inputs, decorate
from .default_device import NOT_SWAPPED, MeshToken, enter, leave, restore_device, swap_device
from .transfers import Watch, arm, disarm, watching

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
        "_stacks",
    )

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
        # What to restore, a stack per thread: entries and exits pair up within each
        # thread whatever others do with the same object. Each thread touches only its own
        # key, and single dict operations are atomic, so no lock is needed.
        self._stacks: dict[int, list[Any]] = {}

    def __enter__(self) -> Decision:
        if sys._getframe(1).f_code.co_flags & _ASYNC_CODE:
            raise ScopeInCoroutineError(self._name)
        source = self._source
        if type(source) is Decider:
            decision = source.resolve(self._name, self._nbytes)
        else:
            holder = source.get()  # type: ignore[union-attr]
            decider = holder.decider if holder is not None else source.fallback()  # type: ignore[union-attr]
            decision = decider.resolve(self._name, self._nbytes)
        # `enter`, written out for the common case (one device): this is the hot path.
        if decision.mesh is None and not decision.is_auto:
            token = swap_device(decision.device)
        else:
            token = enter(decision)
        ident = get_ident()
        stack = self._stacks.get(ident)
        if stack is None:
            self._stacks[ident] = [token]
        else:
            stack.append(token)
        return decision

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        ident = get_ident()
        stack = self._stacks.get(ident)
        if not stack:
            raise RuntimeError(f"{self!r} exited in a thread that did not enter it")
        # The emptied list stays for the thread's next entry: no allocation per `with`.
        token = stack.pop()
        if token is NOT_SWAPPED or type(token) is MeshToken:
            leave(token)
        else:
            restore_device(token)

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

    def __enter__(self) -> Decision:
        decision = Scope.__enter__(self)
        # The watch's token goes on the thread's own stack, above the device's token that
        # `Scope.__enter__` just put there: `__exit__` takes both off, in turn.
        self._stacks[get_ident()].append(arm(self._watch, decision.origin))
        return decision

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        stack = self._stacks.get(get_ident())
        if stack:
            disarm(stack.pop())
        Scope.__exit__(self, exc_type, exc, tb)

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

        @functools.wraps(fn)
        def watched(*args: Any, **kwargs: Any) -> Any:
            with watching(watch):
                return wrapped(*args, **kwargs)

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
