"""Each call of a function decorated with `@place` (or a `Scope`): decided, run on its
device, its result committed.

A repeat call of a decorated function is: one cache lookup in the decider, one
`jax.default_device` swap, and committing only when the result can hold an array. That
path (the wrappers below and `commit_result`) stays in this module, so a repeat call
enters this module and the decider and nothing else unless an event is due (or a result is
recorded in the ledger). Moving arguments and the colder sides of committing (sharded
results, arrays found elsewhere) are in `moves`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias, TypeVar

import jax

from .._base.events import EventLog
from .._decide.decider import Decider
from .._decide.decision import Decision
from .._machine.ledger import record, record_all
from .default_device import device_scope, enter, entry, get_device, leave, set_device
from .moves import commit_sharded, leaf_path, move_inputs, report_mismatch

T = TypeVar("T")
#: `@place(inputs=...)`: move committed array arguments, keep them, or None (the rule's).
Inputs: TypeAlias = 'Literal["keep", "move"] | None'


class HasDecider(Protocol):
    """What activation holds: something with a decider (a `Policy`)."""

    @property
    def decider(self) -> Decider: ...


@dataclass(frozen=True, slots=True)
class Active:
    """How to find the active decider at each call, without calling up into `_policy.active`.

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


# Results of these types hold no array: nothing to commit, nothing to walk.
_NO_ARRAYS = frozenset({int, float, bool, complex, str, bytes, type(None)})


def decorate(
    source: DeciderSource,
    name: str,
    nbytes: int | None,
    commit: bool | None,
    fn: Any,
    inputs: Inputs = None,
) -> Any:
    """`fn` wrapped so that each call is decided by `source` for `name` and runs on the
    decided device, its result committed (`commit`: None follows the rule); generators
    and coroutines get the device around each step, never across a pause. `inputs`: see
    `Inputs`. What `Scope.__call__` returns."""
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
                return _entered_call(fn, args, kwargs, decision, finish, fixed_events)
            # Read before the change, changed inside `try`: an interrupt at any point
            # leaves this thread's device as it was (issue 42, M4).
            prev = get_device()
            try:
                set_device(decision.device)
                result = fn(*args, **kwargs)
            finally:
                set_device(prev)
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
                return _entered_call(fn, args, kwargs, decision, finish, decider.events)
            # Read before the change, changed inside `try`: an interrupt at any point
            # leaves this thread's device as it was (issue 42, M4).
            prev = get_device()
            try:
                set_device(decision.device)
                result = fn(*args, **kwargs)
            finally:
                set_device(prev)
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
        return _entered_call(fn, args, kwargs, decision, finish, events)

    return sized_wrapper


def _entered_call(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    decision: Decision,
    finish: Callable[[Any, Decision, EventLog], Any],
    events: EventLog,
) -> Any:
    """`fn` called inside `decision`'s scope (`enter`: a mesh, or a device), its result
    finished outside it."""
    entered = entry()
    try:
        enter(decision, entered)
        result = fn(*args, **kwargs)
    finally:
        try:
            leave(entered)
        except BaseException:
            leave(entered)  # finish what an interrupt stopped, then raise it
            raise
    return finish(result, decision, events)


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
        return commit_sharded(result, decision, events)
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
        and _needs_commit(leaf, decision, events, functools.partial(leaf_path, result, i))
    ]
    if not indices:
        return result
    placed = jax.device_put([leaves[i] for i in indices], decision.destination)
    for i, leaf in zip(indices, placed, strict=True):
        leaves[i] = leaf
    record_all(placed, decision.name, decision.origin, decision.rule)
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
        report_mismatch(events, decision, device, leaf, path if isinstance(path, str) else path())
        return False
    return not leaf.committed or (
        decision.memory_kind is not None and leaf.sharding.memory_kind != decision.memory_kind
    )
