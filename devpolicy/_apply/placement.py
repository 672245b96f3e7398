"""Applying decisions: `Scope` (context manager and decorator), `put`, committing results.

A repeat call of a decorated function is: one cache lookup in the decider, one
`jax.default_device` swap, and committing only when the result can hold an array.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from threading import get_ident
from typing import Any, Literal, Protocol, TypeAlias, TypeVar

import jax
import numpy as np

from .._base.compat import mesh_context
from .._base.errors import ScopeInCoroutineError
from .._base.events import EventLog
from .._base.limits import CACHE_GENERATION
from .._base.sizes import format_size
from .._decide.decider import Decider, Decision, Item
from .._decide.routing import NEVER_MAPPED
from .._document.axes import Attached
from .._machine.inventory import inventory
from .._machine.ledger import record, record_all
from .narrowing import Narrow, check_mode, narrow_leaves

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
#: Makes a mesh current (looked up once: which function depends on the jax version).
_mesh_context = mesh_context()
#: `@place(inputs=...)`: move committed array arguments, keep them, or None (the rule's).
Inputs: TypeAlias = 'Literal["keep", "move"] | None'


class HasDecider(Protocol):
    """What activation holds: something with a decider (a `Policy`)."""

    @property
    def decider(self) -> Decider: ...


@dataclass(frozen=True, slots=True)
class Active:
    """How to find the active decider at each call, without calling up into `_active`.

    Attributes:
        get: The activation context variable's `get` (the policy activated here, or None).
        fallback: The decider to use when nothing is activated in this context.
    """

    get: Callable[[], HasDecider | None]
    fallback: Callable[[], Decider]

    def decider(self) -> Decider:
        """The decider module-level calls use now."""
        holder = self.get()
        return holder.decider if holder is not None else self.fallback()


#: A fixed policy's decider, or the active one looked up at each call.
DeciderSource: TypeAlias = "Decider | Active"


# A `with scope()` written in an async body would hold JAX's thread-local default device
# across its awaits, where other tasks run and see it.
_ASYNC_CODE = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


def _swap_public(device: jax.Device) -> Any:
    # A fresh manager per entry: one `jax.default_device` object entered twice leaks.
    manager = jax.default_device(device)
    manager.__enter__()
    return manager


def _restore_public(token: Any) -> None:
    token.__exit__(None, None, None)


# Why not `with jax.default_device(d)`: each entry builds a StateContextManager (argument
# parser, object, hook checks), about 0.5 us, most of a scope's cost. That manager only
# calls its thread-local state's `swap_local` and `set_local`; called directly they cost
# about 0.09 us. Used where this JAX has them and no thread-local hook for the option
# (the manager would call it); otherwise the public manager, with the same effect.
_STATE: Any = jax.default_device
if (
    callable(getattr(_STATE, "swap_local", None))
    and callable(getattr(_STATE, "set_local", None))
    and getattr(_STATE, "_update_thread_local_hook", "missing") is None
):
    swap_device: Callable[[jax.Device], Any] = _STATE.swap_local
    restore_device: Callable[[Any], None] = _STATE.set_local
else:  # pragma: no cover - depends on the installed JAX
    swap_device, restore_device = _swap_public, _restore_public


# The token of an entry that changed nothing (an `auto` decision).
_NOT_SWAPPED = object()


class _MeshToken:
    """What a sharded decision's entry changed: the mesh context and the default device."""

    __slots__ = ("mesh_scope", "previous")

    def __init__(self, mesh_scope: Any, previous: Any) -> None:
        self.mesh_scope = mesh_scope
        self.previous = previous


def enter(decision: Decision) -> Any:
    """Apply `decision` to this thread; the token says what to undo (see `leave`).

    A sharded decision runs under its mesh (`jax.set_mesh`, or `use_mesh` before jax 0.7.1,
    so `jax.jit` and sharding constraints see it) with the mesh's first local device as the
    default device.
    """
    if decision.is_auto:
        return _NOT_SWAPPED
    if decision.mesh is None:
        return swap_device(decision.device)
    mesh_scope: Any = _mesh_context(decision.sharding.mesh)  # type: ignore[union-attr]
    mesh_scope.__enter__()
    return _MeshToken(mesh_scope, swap_device(decision.device))


def leave(token: Any) -> None:
    """Undo what `enter` did."""
    if token is _NOT_SWAPPED:
        return
    if type(token) is _MeshToken:
        restore_device(token.previous)
        token.mesh_scope.__exit__(None, None, None)
        return
    restore_device(token)


class _DeviceScope:
    """`with` for one decision's device, or nothing when the decision is `auto`."""

    __slots__ = ("_decision", "_token")

    def __init__(self, decision: Decision) -> None:
        self._decision = decision

    def __enter__(self) -> None:
        self._token = enter(self._decision)

    def __exit__(self, *exc_info: object) -> None:
        leave(self._token)


def device_scope(decision: Decision) -> AbstractContextManager[None]:
    """A fresh scope for `decision`'s device (a no-op if it does not apply)."""
    return _DeviceScope(decision)


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
        if token is _NOT_SWAPPED or type(token) is _MeshToken:
            leave(token)
        else:
            restore_device(token)

    def __call__(self, fn: F) -> F:
        """Decorate `fn`: each call is decided afresh and runs inside the scope."""
        wrapped: F = _decorate(
            self._source, self._name, self._nbytes, self._commit, fn, self._inputs
        )
        return wrapped

    def __repr__(self) -> str:
        return f"<devpolicy.Scope name={self._name!r} nbytes={self._nbytes!r}>"


class Scopes:
    """The scope for each name of one source, made once: a Scope is re-entrant (per-thread
    stacks), so one object per name serves every `with`, and a repeat costs no construction.

    Example:
        >>> import devpolicy
        >>> p = devpolicy.load_policy({"version": 1})
        >>> p.scope("x") is p.scope("x")
        True
    """

    __slots__ = ("_source", "by_name")

    def __init__(self, source: DeciderSource) -> None:
        self._source = source
        #: The scopes made so far, by name. Never replaced (only cleared), so a caller may
        #: keep its `get` for a lookup without a call of ours.
        self.by_name: dict[str, Scope] = {}

    def make(self, name: str, nbytes: int | None) -> Scope:
        """A new scope for `name`, kept for the next lookup in `by_name` when unsized (sized
        scopes are made afresh: sizes vary per call). Callers look in `by_name` first."""
        scope = Scope(self._source, name, nbytes)
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


def make_place(source: DeciderSource, name: Any, commit: bool | None, inputs: Inputs = None) -> Any:
    """Implement `place` for both `@place` and `@place("name")`."""
    if commit is not None and not isinstance(commit, bool):
        raise TypeError(f"place(commit=...) must be a bool or None, got {commit!r}")
    if inputs not in (None, "keep", "move"):
        raise ValueError(f"place(inputs=...) must be 'move', 'keep' or None, got {inputs!r}")
    if callable(name):
        return Scope(source, default_name(name), None, commit, inputs)(name)
    if name is not None and not isinstance(name, str):
        raise TypeError(
            f"place() takes a name (str) or a function, got {type(name).__name__} {name!r}"
        )
    if name is not None:
        return Scope(source, name, None, commit, inputs)

    def decorator(fn: F) -> F:
        return Scope(source, default_name(fn), None, commit, inputs)(fn)

    return decorator


# Results of these types hold no array: nothing to commit, nothing to walk.
_NO_ARRAYS = frozenset({int, float, bool, complex, str, bytes, type(None)})


def _decorate(
    source: DeciderSource,
    name: str,
    nbytes: int | None,
    commit: bool | None,
    fn: Any,
    inputs: Inputs = None,
) -> Any:
    # Decided here, once: whether any call may move inputs. A fixed policy none of whose
    # rules says `inputs: move` gets the plain wrappers below, untouched.
    rule_moves = inputs is None and (
        not isinstance(source, Decider)
        or any(r.spec.inputs == "move" for r in source.settings.rules)
    )
    may_move = inputs == "move" or rule_moves

    # Events go to the log of the decider that decided (the active one may change by the
    # time a generator's step or a result is finished), so each path carries it along.
    def moved(decision: Decision, events: EventLog, args: Any, kwargs: Any) -> tuple[Any, Any]:
        if inputs == "move" or (rule_moves and decision.move_inputs):
            return move_inputs(args, kwargs, decision, events)
        return args, kwargs

    if isinstance(source, Decider):
        fixed = source

        def resolve() -> tuple[Decision, EventLog]:
            return fixed.resolve(name, nbytes), fixed.events
    else:
        active = source

        def resolve() -> tuple[Decision, EventLog]:
            decider = active.decider()
            return decider.resolve(name, nbytes), decider.events

    def finish(result: Any, decision: Decision, events: EventLog) -> Any:
        if type(result) in _NO_ARRAYS or decision.is_auto:
            return result
        if not (decision.commit if commit is None else commit):
            return result
        return commit_result(result, decision, events)

    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def async_gen_wrapper(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
            decision, events = resolve()
            if may_move and not decision.is_auto:
                args, kwargs = moved(decision, events, args, kwargs)
            agen = fn(*args, **kwargs)
            sent: Any = None
            thrown: BaseException | None = None
            while True:
                try:
                    step = agen.asend(sent) if thrown is None else agen.athrow(thrown)
                    item = await _Stepped(step, decision)
                except StopAsyncIteration:
                    return
                try:
                    sent, thrown = (yield finish(item, decision, events)), None
                except GeneratorExit:
                    await _Stepped(agen.aclose(), decision)
                    raise
                except BaseException as e:
                    sent, thrown = None, e

        return async_gen_wrapper

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def coroutine_wrapper(*args: Any, **kwargs: Any) -> Any:
            decision, events = resolve()
            if may_move and not decision.is_auto:
                args, kwargs = moved(decision, events, args, kwargs)
            result = await _Stepped(fn(*args, **kwargs), decision)
            return finish(result, decision, events)

        return coroutine_wrapper

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def generator_wrapper(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
            decision, events = resolve()
            if may_move and not decision.is_auto:
                args, kwargs = moved(decision, events, args, kwargs)

            def finished(item: Any, decision: Decision) -> Any:
                return finish(item, decision, events)

            return (yield from _stepped_generator(fn(*args, **kwargs), decision, finished))

        return generator_wrapper

    # The hottest path, written out for each kind of source: no call but the lookup.
    if isinstance(source, Decider) and nbytes is None and not may_move:
        decider_resolve = source.resolve
        fixed_events = source.events

        @functools.wraps(fn)
        def fixed_wrapper(*args: Any, **kwargs: Any) -> Any:
            decision = decider_resolve(name)
            if decision.is_auto:
                return fn(*args, **kwargs)
            if decision.mesh is not None:
                return _sharded_call(fn, args, kwargs, decision, finish, fixed_events)
            token = swap_device(decision.device)
            try:
                result = fn(*args, **kwargs)
            finally:
                restore_device(token)
            if type(result) in _NO_ARRAYS:
                return result
            return finish(result, decision, fixed_events)

        return fixed_wrapper

    if isinstance(source, Active) and nbytes is None and inputs != "move":
        get, fallback = source.get, source.fallback

        @functools.wraps(fn)
        def active_wrapper(*args: Any, **kwargs: Any) -> Any:
            holder = get()
            decider = holder.decider if holder is not None else fallback()
            decision = decider.resolve(name)
            if decision.is_auto:
                return fn(*args, **kwargs)
            if decision.move_inputs and rule_moves:  # the rule says `inputs: move`
                args, kwargs = move_inputs(args, kwargs, decision, decider.events)
            if decision.mesh is not None:
                return _sharded_call(fn, args, kwargs, decision, finish, decider.events)
            token = swap_device(decision.device)
            try:
                result = fn(*args, **kwargs)
            finally:
                restore_device(token)
            if type(result) in _NO_ARRAYS:
                return result
            return finish(result, decision, decider.events)

        return active_wrapper

    @functools.wraps(fn)
    def sized_wrapper(*args: Any, **kwargs: Any) -> Any:
        decision, events = resolve()
        if decision.is_auto:
            return fn(*args, **kwargs)
        if may_move:
            args, kwargs = moved(decision, events, args, kwargs)
        token = enter(decision)
        try:
            result = fn(*args, **kwargs)
        finally:
            leave(token)
        return finish(result, decision, events)

    return sized_wrapper


def _sharded_call(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    decision: Decision,
    finish: Callable[[Any, Decision, EventLog], Any],
    events: EventLog,
) -> Any:
    token = enter(decision)
    try:
        result = fn(*args, **kwargs)
    finally:
        leave(token)
    return finish(result, decision, events)


def move_inputs(
    args: tuple[Any, ...], kwargs: dict[str, Any], decision: Decision, events: EventLog
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`args` and `kwargs` with each committed single-device `jax.Array` leaf that sits on
    another device moved to the decided one, in one `device_put`.

    Uncommitted arrays are left alone (JAX moves them itself), and so are sharded arrays
    and tracers. Each move is a debug `input_moved` event; each call that moves anything
    one `inputs_moved` event (info the first time for a name and its source devices).
    """
    if decision.mesh is not None:
        # A sharded rule: arguments go to its sharding, as results are committed to it
        # (what does not divide over the mesh stays, reported as a placement_mismatch).
        moved: tuple[tuple[Any, ...], dict[str, Any]] = _commit_sharded(
            (args, kwargs), decision, events
        )
        return moved
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    indices = [i for i, leaf in enumerate(leaves) if _elsewhere(leaf, decision.device)]
    if not indices:
        return args, kwargs
    moving = [leaves[i] for i in indices]
    placed = jax.device_put(moving, decision.destination)
    for i, leaf in zip(indices, placed, strict=True):
        leaves[i] = leaf
    record_all(placed, decision.name, decision.origin, decision.rule)
    _report_moves(events, decision, moving, indices, (args, kwargs), arguments=True)
    moved_args, moved_kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
    return moved_args, moved_kwargs


def _elsewhere(leaf: Any, device: jax.Device) -> bool:
    if not isinstance(leaf, jax.Array) or isinstance(leaf, jax.core.Tracer):
        return False
    if not leaf.committed:
        return False
    devices = leaf.devices()
    return len(devices) == 1 and device not in devices


def _report_moves(
    events: EventLog,
    decision: Decision,
    moving: list[jax.Array],
    indices: list[int],
    tree: Any,
    *,
    arguments: bool = False,
) -> None:
    """Log moved leaves; `arguments`: `tree` is (args, kwargs), named `0/...` or `key/...`."""
    inv = inventory()
    sources = sorted({inv.text(next(iter(leaf.devices()))) for leaf in moving})
    nbytes = sum(leaf.nbytes for leaf in moving)
    if events.enabled("debug"):
        for leaf, index in zip(moving, indices, strict=True):
            events.emit(
                "debug",
                "input_moved",
                {
                    "name": decision.name,
                    "leaf": _leaf_path(tree, index).split("/", 1)[1]
                    if arguments
                    else _leaf_path(tree, index),
                    "from_device": inv.text(next(iter(leaf.devices()))),
                    "device": decision.device_text,
                    "nbytes": leaf.nbytes,
                },
            )
    first = events.first_time(("inputs_moved", decision.name, *sources))
    events.emit(
        "info" if first else "debug",
        "inputs_moved",
        {
            "name": decision.name,
            "device": decision.device_text,
            "from_devices": ", ".join(sources),
            "count": len(moving),
            "nbytes": nbytes,
            "origin": decision.origin,
        },
    )


def move_to(decider: Decider, x: T, name: str) -> T:
    """Every `jax.Array` leaf of `x` on the device decided for `name`, committed there."""
    if not isinstance(name, str):
        raise TypeError(f"to() takes a name (str) second, got {type(name).__name__} {name!r}")
    decision = decider.resolve(name)
    if decision.mesh is not None:
        return _commit_sharded(x, decision, decider.events)
    leaves, treedef = jax.tree_util.tree_flatten(x)
    indices = [
        i
        for i, leaf in enumerate(leaves)
        if isinstance(leaf, jax.Array)
        and not isinstance(leaf, jax.core.Tracer)
        and (
            not leaf.committed
            or leaf.devices() != {decision.device}
            or (
                decision.memory_kind is not None
                and leaf.sharding.memory_kind != decision.memory_kind
            )
        )
    ]
    if not indices:
        return x
    moving = [leaves[i] for i in indices]
    placed = jax.device_put(moving, decision.destination)
    for i, leaf in zip(indices, placed, strict=True):
        leaves[i] = leaf
    record_all(placed, decision.name, decision.origin, decision.rule)
    committed = [(j, leaf) for j, leaf in zip(indices, moving, strict=True) if leaf.committed]
    if committed:
        _report_moves(
            decider.events, decision, [leaf for _, leaf in committed], [j for j, _ in committed], x
        )
    out: T = jax.tree_util.tree_unflatten(treedef, leaves)
    return out


def _stepped_generator(
    gen: Any, decision: Decision, finish: Callable[[Any, Decision], Any] | None = None
) -> Generator[Any, Any, Any]:
    """Run each step of `gen` inside the decision's scope and none of its pauses.

    `finish`, if given, is applied to each yielded item outside the scope.
    """
    send: Any = None
    throw: BaseException | None = None
    while True:
        with device_scope(decision):
            try:
                item = gen.send(send) if throw is None else gen.throw(throw)
            except StopIteration as stop:
                return stop.value if finish is None else finish(stop.value, decision)
        if finish is not None:
            item = finish(item, decision)
        try:
            send, throw = (yield item), None
        except GeneratorExit:
            with device_scope(decision):  # its `finally` blocks run on its device too
                gen.close()
            raise
        except BaseException as e:
            send, throw = None, e


class _Stepped:
    """Await `awaitable` with the decision's scope around each step, removed at every suspension.

    Interleaved tasks therefore never see each other's device, and nothing is left set
    on the thread when a task is suspended.
    """

    __slots__ = ("_awaitable", "_decision")

    def __init__(self, awaitable: Awaitable[Any], decision: Decision) -> None:
        self._awaitable = awaitable
        self._decision = decision

    def __await__(self) -> Generator[Any, Any, Any]:
        steps = self._awaitable.__await__()
        return (yield from _stepped_generator(steps, self._decision))


def commit_result(result: T, decision: Decision, events: EventLog) -> T:
    """Commit every single-device `jax.Array` leaf of `result` that sits on the decided device.

    Such leaves are uncommitted when made in a scope and would later migrate silently.
    Committing them is a `device_put` to the same device: no copy. Leaves on another
    device are left alone and reported as a `placement_mismatch` warning. For a sharded
    decision every array leaf is committed to the rule's sharding (resharded if needed).
    """
    if decision.mesh is not None:
        return _commit_sharded(result, decision, events)
    if isinstance(result, jax.Array):
        # One array, the commonest result: no tree to walk.
        if _needs_commit(result, decision, events, ""):
            committed: T = jax.device_put(result, decision.destination)
            record(committed, decision.name, decision.origin, decision.rule)
            return committed
        return result
    leaves, treedef = jax.tree_util.tree_flatten(result)
    indices = [
        i
        for i, leaf in enumerate(leaves)
        if isinstance(leaf, jax.Array)
        and _needs_commit(leaf, decision, events, functools.partial(_leaf_path, result, i))
    ]
    if not indices:
        return result
    placed = jax.device_put([leaves[i] for i in indices], decision.destination)
    for i, leaf in zip(indices, placed, strict=True):
        leaves[i] = leaf
    record_all(placed, decision.name, decision.origin, decision.rule)
    out: T = jax.tree_util.tree_unflatten(treedef, leaves)
    return out


def _commit_sharded(result: T, decision: Decision, events: EventLog) -> T:
    sharding = decision.sharding
    assert sharding is not None
    leaves, treedef = jax.tree_util.tree_flatten(result)
    changed = False
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, jax.Array) or isinstance(leaf, jax.core.Tracer):
            continue
        if leaf.committed and leaf.sharding.is_equivalent_to(sharding, leaf.ndim):
            continue
        try:
            leaves[i] = jax.device_put(leaf, sharding)
        except ValueError as e:  # a shape that does not divide over the mesh: say so
            _report_mismatch(events, decision, None, leaf, _leaf_path(result, i), str(e))
            continue
        record(leaves[i], decision.name, decision.origin, decision.rule)
        changed = True
    if not changed:
        return result
    out: T = jax.tree_util.tree_unflatten(treedef, leaves)
    return out


def _needs_commit(
    leaf: jax.Array, decision: Decision, events: EventLog, path: str | Callable[[], str]
) -> bool:
    """Whether `leaf` sits uncommitted (or in another memory kind) on the decided device.

    A leaf on another device is reported, not moved; a sharded one is not ours to judge.
    """
    if isinstance(leaf, jax.core.Tracer):
        return False
    devices = leaf.devices()
    if len(devices) != 1:
        return False
    (device,) = devices
    if device != decision.device:
        _report_mismatch(events, decision, device, leaf, path if isinstance(path, str) else path())
        return False
    return not leaf.committed or (
        decision.memory_kind is not None and leaf.sharding.memory_kind != decision.memory_kind
    )


def _leaf_path(tree: Any, index: int) -> str:
    # Paths are only worked out when a mismatch is reported: flattening with paths is slower.
    path, _ = jax.tree_util.tree_flatten_with_path(tree)[0][index]
    return jax.tree_util.keystr(path, simple=True, separator="/")


def _report_mismatch(
    events: EventLog,
    decision: Decision,
    device: jax.Device | None,
    leaf: jax.Array,
    path: str,
    reason: str | None = None,
) -> None:
    actual = "sharded" if device is None else inventory().text(device)
    level = (
        "warning" if events.first_time(("placement_mismatch", decision.name, actual)) else "debug"
    )
    fields = {
        "name": decision.name,
        "leaf": path,
        "device": decision.device_text,
        "actual_device": actual,
        "shape": tuple(leaf.shape),
        "dtype": str(leaf.dtype),
        "origin": decision.origin,
        "process_index": decision.device.process_index,
    }
    events.emit(
        level, "placement_mismatch", fields if reason is None else {**fields, "reason": reason}
    )


def _nbytes(leaf: Any) -> int:
    nbytes = getattr(leaf, "nbytes", None)
    return nbytes if isinstance(nbytes, int) else int(np.asarray(leaf).nbytes)


#: What a leaf may be to be placed: an array or a number.
ARRAY_LIKE = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def leaf_shape_dtype(leaf: Any, call: str, leaf_name: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """The shape and dtype of a leaf that is an array, a `jax.ShapeDtypeStruct` or a
    number (only these are read); TypeError naming `call` and the leaf otherwise."""
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    if shape is None or dtype is None:
        if not isinstance(leaf, ARRAY_LIKE):
            raise TypeError(
                f"{call}: leaf {leaf_name!r} is a {type(leaf).__name__}, not an array, "
                "jax.ShapeDtypeStruct or number"
            )
        value = np.asarray(leaf)
        shape, dtype = value.shape, value.dtype
    return tuple(int(d) for d in shape), np.dtype(dtype)


def shardings(decider: Decider, name: str, tree: T) -> T:
    """The sharding each leaf of `tree` would be placed with by `put(name, tree)`: its
    leaves arrays or `jax.ShapeDtypeStruct`s (shape and dtype are all that is read), all
    decided as one placement. Nothing moves and nothing is created. The axis names a
    framework attached to a leaf (`leaf_axes`) go with it, for rules with `axes: attached`."""
    if not isinstance(name, str):
        raise TypeError(f"shardings() takes a name (str) first, got {type(name).__name__} {name!r}")
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    names, axes = leaf_names_and_axes(name, tree)
    items: list[Item] = []
    for leaf_name, leaf, attached in zip(names, leaves, axes, strict=True):
        shape, dtype = leaf_shape_dtype(leaf, f"shardings({name!r})", leaf_name)
        # What JAX will hold: 64-bit types narrowed when x64 is off.
        itemsize = np.dtype(jax.dtypes.canonicalize_dtype(dtype)).itemsize
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        items.append((leaf_name, nbytes, shape, NEVER_MAPPED, None, attached))
    # As `put`: a tree is one summary event, each leaf's decision debug.
    many = len(items) > 1
    decisions = decider.resolve_many(items, summarised=many)
    if many:
        _put_summary(decider.events, name, decisions, "shardings")
    found: list[Any] = []
    for decision in decisions:
        if decision.sharding is None:
            raise ValueError(
                f"shardings({name!r}): {decision.name!r} has no sharding on this machine "
                f"({decision.device_text})"
            )
        found.append(decision.sharding)
    out: T = jax.tree_util.tree_unflatten(treedef, found)
    return out


def put(decider: Decider, name: str, x: T, narrow: Narrow = "exact", *, local: bool = False) -> T:
    """Place each leaf of `x` by `decider`, every decision made before anything moves.

    With x64 disabled, 64-bit host leaves are narrowed first, all or none (see
    `_narrowing.narrow_leaves`), so the sizes decided by are what JAX will hold.
    `local`: each process holds only its own part of the data (a data-parallel batch): a
    sharded leaf becomes a global array made of every process's part
    (`jax.make_array_from_process_local_data`), its size judged by the local part.
    """
    if not isinstance(name, str):
        raise TypeError(f"put() takes a name (str) first, got {type(name).__name__} {name!r}")
    check_mode(narrow)
    leaves, treedef = jax.tree_util.tree_flatten(x)
    names, axes = leaf_names_and_axes(name, x)
    for leaf_name, leaf in zip(names, leaves, strict=True):
        if not isinstance(leaf, ARRAY_LIKE):
            raise TypeError(
                f"put({name!r}): leaf {leaf_name!r} is a {type(leaf).__name__}, not an array "
                "or number; JAX cannot place it (keep such values out of the tree)"
            )
    if not jax.config.jax_enable_x64:  # type: ignore[attr-defined]
        leaves = narrow_leaves(names, leaves, narrow, decider.events)
    # A process-local part's shape says nothing of the global one across processes.
    shapes = local and jax.process_count() > 1
    # A tree is one placement with one summary event; each leaf's decision is debug.
    many = len(leaves) > 1
    decisions = decider.resolve_many(
        [
            (n, _nbytes(leaf), None if shapes else np.shape(leaf), NEVER_MAPPED, None, attached)
            for n, leaf, attached in zip(names, leaves, axes, strict=True)
        ],
        summarised=many,
    )
    if many:
        _put_summary(decider.events, name, decisions)
    # Disabled: what JAX does without devpolicy (the default device, uncommitted).
    placed = jax.device_put(leaves) if decider.disabled else _place_leaves(leaves, decisions, local)
    for array, decision in zip(placed, decisions, strict=True):
        record(array, decision.name, decision.origin, decision.rule)
    out: T = jax.tree_util.tree_unflatten(treedef, placed)
    return out


def _put_summary(
    events: EventLog, name: str, decisions: list[Decision], event: str = "put"
) -> None:
    """One `put` (or `shardings`) event per call: info the first time a tree is placed
    this way, debug after (a training loop's batches do not flood the log)."""
    per_device: dict[str, list[int]] = {}
    per_rule: dict[str, int] = {}
    for decision in decisions:
        totals = per_device.setdefault(decision.device_text, [0, 0])
        totals[0] += 1
        totals[1] += decision.nbytes or 0
        per_rule[decision.origin] = per_rule.get(decision.origin, 0) + 1
    devices = ", ".join(
        f"{d} {format_size(n)} ({count} lea{'f' if count == 1 else 'ves'})"
        for d, (count, n) in sorted(per_device.items())
    )
    rules = ", ".join(f"{origin} x{count}" for origin, count in per_rule.items())
    first = events.first_time((event, name, devices, rules))
    if not events.enabled("info" if first else "debug"):
        return
    events.emit(
        "info" if first else "debug",
        event,
        {
            "name": name,
            "leaves": len(decisions),
            "nbytes": sum(n for _, n in per_device.values()),
            "devices": devices,
            "rules": rules,
            "fallbacks": sum(d.fallback_reason is not None for d in decisions),
        },
    )


# Boxes around one array that a framework prints as the array itself: flax's
# `AxisMetadata` (`Partitioned`, `LogicallyPartitioned`), nnx's `Variable` (`Param`...)
# and `VariableState`, haliax's `NamedArray`. Recognised by class name and module, so
# neither library is imported.
_FLAX_BOXES = frozenset({"AxisMetadata", "Variable", "VariableState"})


def _is_box(node: Any) -> bool:
    return _box_kind(type(node)) is not None


def leaf_names(name: str, tree: Any) -> list[str]:
    """Each leaf's name, in `jax.tree_util.tree_leaves(tree)` order: `name/` and the
    leaf's path with `/` between its parts, as the framework prints the tree.

    Dict keys, attribute names and list indices are written as they print (`layers/0/w`);
    a box that holds one array is not a part of the name: nnx's `Param`/`Variable` and
    flax's `Partitioned` (no `/value`), haliax's `NamedArray` (no `/0`). A tree that is one
    leaf is named `name`.

    Example:
        >>> import numpy as np
        >>> leaf_names("params", {"dense": {"kernel": np.zeros(2)}, "layers": [np.zeros(1)]})
        ['params/dense/kernel', 'params/layers/0']
    """
    return leaf_names_and_axes(name, tree)[0]


def leaf_axes(tree: Any) -> list[Attached | None]:
    """The axis names each leaf's framework attached to it, in `tree_leaves` order (None
    for a leaf that carries none): what rules with `axes: attached` shard by.

    Read from the box around the array: flax's `LogicallyPartitioned.names` (logical
    names) and `Partitioned.names` (mesh axes, `mesh_axes=True`), nnx Variables' sharding
    metadata (`out_sharding`, `sharding_names` before flax 0.12, `sharding` before 0.11;
    a `PartitionSpec` as its entries), haliax `NamedArray` axis names. Neither library is
    imported.

    Example:
        >>> import numpy as np
        >>> leaf_axes({"w": np.zeros(2)})
        [None]
    """
    return leaf_names_and_axes("", tree)[1]


def leaf_names_and_axes(name: str, tree: Any) -> tuple[list[str], list[Attached | None]]:
    """`leaf_names(name, tree)` and `leaf_axes(tree)` from one walk of the tree: what a
    placement passes its decider (items' sixth element).

    Example:
        >>> import numpy as np
        >>> leaf_names_and_axes("params", {"w": np.zeros(2)})
        (['params/w'], [None])
    """
    names: list[str] = []
    axes: list[Attached | None] = []
    interned: dict[tuple[Any, bool], Attached] = {}

    def walk(prefix: tuple[Any, ...], node: Any, boxed: bool, carried: Attached | None) -> None:
        def inner_box(n: Any) -> bool:
            return n is not node and _is_box(n)

        for sub, leaf in jax.tree_util.tree_flatten_with_path(node, is_leaf=inner_box)[0]:
            # A box's own key (`value`, haliax's flat index 0) is not part of the name.
            path = prefix + (sub[1:] if boxed else sub)
            if inner_box(leaf):
                walk(path, leaf, True, _attached(leaf, interned) or carried)
            else:
                names.append(_joined(name, path))
                axes.append(carried)

    walk((), tree, _is_box(tree), _attached(tree, interned) if _is_box(tree) else None)
    return names, axes


# The metadata keys nnx Variables keep their axis names under, newest first: flax 0.12
# `out_sharding`, 0.11 `sharding_names`, 0.10 `sharding`.
_NNX_SHARDING_KEYS = ("out_sharding", "sharding_names", "sharding")


def _attached(box: Any, interned: dict[tuple[Any, bool], Attached]) -> Attached | None:
    """The axis names a framework box carries, or None. One `Attached` per distinct names
    (`interned`): equal names are one object, so decisions cached by them compare fast."""
    how = _box_kind(type(box))
    names: Any = None
    mesh_axes = False
    if how == "logical":
        names = getattr(box, "names", None)
    elif how == "mesh":
        names, mesh_axes = getattr(box, "names", None), True
    elif how == "named":
        names = tuple(getattr(a, "name", None) for a in getattr(box, "axes", ()) or ())
    else:  # nnx Variable / VariableState
        get = getattr(box, "get_metadata", None)
        metadata = get() if callable(get) else None
        if isinstance(metadata, dict):
            for key in _NNX_SHARDING_KEYS:
                if metadata.get(key) is not None:
                    names = metadata[key]
                    break
    if names is None or isinstance(names, str):
        return None
    try:
        entries = tuple(_entry(n) for n in names)
    except (TypeError, ValueError):
        return None  # not names (a Sharding object, say): nothing a rule can read
    found = interned.get((entries, mesh_axes))
    if found is None:
        found = interned[(entries, mesh_axes)] = Attached(entries, mesh_axes)
    return found


# By type: the test runs once per node of every tree.
_BOX_KINDS: dict[type, str | None] = {}
_UNSEEN = object()


def _box_kind(kind: type) -> str | None:
    """Whether a type is a box around one array, and how it carries axis names: flax
    `logical` or `mesh` axes, haliax `named`, nnx `metadata`; None for no box. Worked out
    once per type."""
    known = _BOX_KINDS.get(kind, _UNSEEN)
    if known is not _UNSEEN:
        return known  # type: ignore[return-value]
    found: str | None = None
    for cls in kind.__mro__:
        module = cls.__module__
        if (cls.__name__ in _FLAX_BOXES and module.startswith("flax.")) or (
            cls.__name__ == "NamedArray" and (module == "haliax" or module.startswith("haliax."))
        ):
            names = {c.__name__ for c in kind.__mro__}
            if "LogicallyPartitioned" in names:
                found = "logical"
            elif "Partitioned" in names:
                found = "mesh"
            elif "NamedArray" in names:
                found = "named"
            else:
                found = "metadata"
            break
    if len(_BOX_KINDS) < 4096:
        _BOX_KINDS[kind] = found
    return found


def _entry(name: Any) -> str | tuple[str, ...] | None:
    """One dimension's entry: a name, None, or several names (a tuple of strings)."""
    if name is None or isinstance(name, str):
        return name
    if isinstance(name, tuple | list) and all(isinstance(n, str) for n in name):
        return tuple(name)
    raise ValueError(f"not an axis name: {name!r}")


def _part(key: Any) -> str:
    """One path entry as `jax.tree_util.keystr(..., simple=True)` writes it."""
    kind = type(key)
    if kind is jax.tree_util.DictKey:
        return str(key.key)
    if kind is jax.tree_util.GetAttrKey:
        return str(key.name)
    if kind is jax.tree_util.SequenceKey:
        return str(key.idx)
    return jax.tree_util.keystr((key,), simple=True, separator="/")


def _joined(name: str, path: tuple[Any, ...]) -> str:
    if not path:
        return name
    return "/".join([name, *map(_part, path)])


def _place_leaves(leaves: list[Any], decisions: list[Decision], local: bool) -> list[Any]:
    """Single-device leaves in one batched `device_put`; sharded host data built from the
    slices each device holds, so no process ever sends (or all-gathers) the whole array."""
    placed: list[Any] = [None] * len(leaves)
    batch = [
        i for i, d in enumerate(decisions) if d.mesh is None or isinstance(leaves[i], jax.Array)
    ]
    if batch:
        moved = jax.device_put(
            [leaves[i] for i in batch], [decisions[i].destination for i in batch]
        )
        for i, array in zip(batch, moved, strict=True):
            placed[i] = array
    for i, decision in enumerate(decisions):
        if placed[i] is None and local:
            placed[i] = jax.make_array_from_process_local_data(  # type: ignore[no-untyped-call]
                decision.sharding, leaves[i]
            )
        elif placed[i] is None:
            placed[i] = sharded_from_host(np.asarray(leaves[i]), decision)
    return placed


def sharded_from_host(array: np.ndarray[Any, Any], decision: Decision) -> jax.Array:
    """A global array sharded by `decision` from a host array every process holds whole.

    Each addressable device gets its slice, read once even when several devices share it.
    """
    assert decision.sharding is not None
    slices: dict[tuple[tuple[int | None, int | None, int | None], ...], Any] = {}

    def piece(index: Any) -> Any:
        key = tuple((s.start, s.stop, s.step) for s in index)
        found = slices.get(key)
        if found is None:
            found = slices[key] = array[index]
        return found

    return jax.make_array_from_callback(array.shape, decision.sharding, piece)
