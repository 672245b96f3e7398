"""Applying decisions: scopes, the `place` decorator, `put`, and committing results."""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import jax
import numpy as np

from ._errors import DevicePolicyError

if TYPE_CHECKING:
    from ._policy import Decision, Policy

T = TypeVar("T")
# A fixed policy, or a function giving the active one at each call.
PolicySource: TypeAlias = "Policy | Callable[[], Policy]"


# A `with scope()` written in an async body would hold JAX's thread-local default device
# across its awaits, where other tasks run and see it.
_ASYNC_CODE = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


class ScopeInCoroutineError(DevicePolicyError, RuntimeError):
    """`with devpolicy.scope(...)` was written directly in an `async def` body.

    `jax.default_device` is thread-local, not task-local: held across an `await`, other
    tasks on the event loop would see the device, and the thread could be left on it.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"devpolicy.scope({name!r}) cannot be held in a coroutine: JAX's default device is "
            "per thread, so across an `await` other tasks would see it. Decorate the async "
            f"function with @devpolicy.place({name!r}) instead (the scope then applies to each "
            "step and is lifted at every await), or call a plain function that uses the scope, "
            f"or place arrays with devpolicy.put({name!r}, x)."
        )


# nullcontext holds no state, so one instance serves every entry.
_NO_SCOPE: AbstractContextManager[Any] = nullcontext()


def device_scope(decision: Decision) -> AbstractContextManager[Any]:
    """A fresh `jax.default_device` manager for `decision` (a no-op if it does not apply).

    Fresh per entry: one `jax.default_device` object entered twice leaks its device.
    """
    return jax.default_device(decision.device) if decision.applies else _NO_SCOPE


class Scope:
    """Context manager that sets `jax.default_device` to where a name goes; yields the Decision.

    The decision is made (and can fail) before anything changes. On exit, normal or by
    exception, the previous default device is restored. One Scope object may be entered
    again while already entered, nested or from another thread.

    `jax.default_device` is thread-local: the scope holds in the thread that entered it
    only. Threads started inside it do not inherit it.
    """

    __slots__ = ("_name", "_nbytes", "_policy", "_stacks")

    def __init__(self, policy: PolicySource, name: str, nbytes: int | None) -> None:
        self._policy = policy
        self._name = name
        self._nbytes = nbytes
        # One stack of entered managers per thread: entries and exits pair up within a
        # thread, whatever other threads do with the same object.
        self._stacks: dict[int, list[AbstractContextManager[Any]]] = {}

    def __enter__(self) -> Decision:
        if sys._getframe(1).f_code.co_flags & _ASYNC_CODE:
            raise ScopeInCoroutineError(self._name)
        decision = _policy_now(self._policy).resolve(self._name, nbytes=self._nbytes)
        manager = jax.default_device(decision.device) if decision.applies else _NO_SCOPE
        manager.__enter__()
        self._stacks.setdefault(threading.get_ident(), []).append(manager)
        return decision

    def __exit__(self, *exc_info: Any) -> None:
        ident = threading.get_ident()
        stack = self._stacks.get(ident)
        if not stack:
            raise RuntimeError(f"{self!r} exited in a thread that did not enter it")
        manager = stack.pop()
        if not stack:
            del self._stacks[ident]
        manager.__exit__(*exc_info)

    def __repr__(self) -> str:
        return f"<devpolicy.Scope name={self._name!r} nbytes={self._nbytes!r}>"


def _policy_now(policy: PolicySource) -> Policy:
    return policy if not callable(policy) else policy()


def default_name(fn: Callable[..., Any]) -> str:
    """`module.qualname` of a function: the name `@place` uses when given none.

    Callables without their own (a `functools.partial`, an object with `__call__`) are
    named by their type.
    """
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{qualname}"


def make_place(policy: PolicySource, name: Any, commit: bool | None) -> Any:
    """Implement `place` for both `@place` and `@place("name")`."""
    if commit is not None and not isinstance(commit, bool):
        raise TypeError(f"place(commit=...) must be a bool or None, got {commit!r}")
    if callable(name):
        return _decorate(policy, default_name(name), commit, name)
    if name is not None and not isinstance(name, str):
        raise TypeError(
            f"place() takes a name (str) or a function, got {type(name).__name__} {name!r}"
        )
    if commit is not None and not isinstance(commit, bool):
        raise TypeError(f"place(commit=...) must be a bool or None, got {commit!r}")

    def decorator(fn: Callable[..., Any]) -> Any:
        return _decorate(policy, name if name is not None else default_name(fn), commit, fn)

    return decorator


def _decorate(policy: PolicySource, name: str, commit: bool | None, fn: Callable[..., Any]) -> Any:
    def resolve_active(name: str) -> Decision:
        return _policy_now(policy)._resolve_unsized(name)

    # A fixed policy's bound method skips a lookup on every call.
    resolve = resolve_active if callable(policy) else policy._resolve_unsized

    def finish(result: Any, decision: Decision) -> Any:
        wanted = decision.commit if commit is None else commit
        if not wanted or result is None or not decision.applies:
            return result
        return commit_result(result, decision, _policy_now(policy))

    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def async_gen_wrapper(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
            decision = resolve(name)
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
                    sent, thrown = (yield finish(item, decision)), None
                except GeneratorExit:
                    await _Stepped(agen.aclose(), decision)
                    raise
                except BaseException as e:
                    sent, thrown = None, e

        return async_gen_wrapper

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def coroutine_wrapper(*args: Any, **kwargs: Any) -> Any:
            decision = resolve(name)
            result = await _Stepped(fn(*args, **kwargs), decision)
            return finish(result, decision)

        return coroutine_wrapper

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def generator_wrapper(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
            decision = resolve(name)
            return (yield from _stepped_generator(fn(*args, **kwargs), decision, finish))

        return generator_wrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        decision = resolve(name)
        if not decision.applies:
            return fn(*args, **kwargs)
        with jax.default_device(decision.device):
            result = fn(*args, **kwargs)
        if result is None:
            return None
        return finish(result, decision)

    return wrapper


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


def commit_result(result: T, decision: Decision, policy: Policy) -> T:
    """Commit every single-device `jax.Array` leaf of `result` that sits on the decided device.

    Such leaves are uncommitted when made in a scope and would later migrate silently.
    Committing them is a `device_put` to the same device: no copy. Leaves on another
    device are left alone and reported as a `placement_mismatch` warning.
    """
    leaves, treedef = jax.tree_util.tree_flatten(result)
    indices = []
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, jax.Array) or isinstance(leaf, jax.core.Tracer):
            continue
        devices = leaf.devices()
        if len(devices) != 1:
            continue  # sharded on purpose; not ours to judge
        (device,) = devices
        if device != decision.device:
            _report_mismatch(policy, decision, device, leaf, _leaf_path(result, i))
        elif not leaf.committed or (
            decision.memory_kind is not None and leaf.sharding.memory_kind != decision.memory_kind
        ):
            indices.append(i)
    if not indices:
        return result
    placed = jax.device_put([leaves[i] for i in indices], decision.sharding)
    for i, leaf in zip(indices, placed, strict=True):
        leaves[i] = leaf
    out: T = jax.tree_util.tree_unflatten(treedef, leaves)
    return out


def _leaf_path(tree: Any, index: int) -> str:
    # Paths are only worked out when a mismatch is reported: flattening with paths is slower.
    path, _ = jax.tree_util.tree_flatten_with_path(tree)[0][index]
    return jax.tree_util.keystr(path, simple=True, separator="/")


def _report_mismatch(
    policy: Policy, decision: Decision, device: jax.Device, leaf: jax.Array, path: str
) -> None:
    from ._inventory import inventory

    actual = inventory().text(device)
    events = policy.events
    level = (
        "warning" if events.first_time(("placement_mismatch", decision.name, actual)) else "debug"
    )
    events.emit(
        level,
        "placement_mismatch",
        {
            "name": decision.name,
            "leaf": path,
            "device": decision.device_text,
            "actual_device": actual,
            "shape": tuple(leaf.shape),
            "dtype": str(leaf.dtype),
            "origin": decision.origin,
            "process_index": decision.device.process_index,
        },
    )


def _nbytes(leaf: Any) -> int:
    nbytes = getattr(leaf, "nbytes", None)
    return nbytes if isinstance(nbytes, int) else int(np.asarray(leaf).nbytes)


_ARRAY_LIKE = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def put_with(policy: Policy, name: str, x: T) -> T:
    """Place each leaf of `x` by `policy`, every decision made before anything moves."""
    if not isinstance(name, str):
        raise TypeError(f"put() takes a name (str) first, got {type(name).__name__} {name!r}")
    pairs, treedef = jax.tree_util.tree_flatten_with_path(x)
    if len(pairs) == 1 and pairs[0][0] == ():
        names = [name]
    else:
        names = [
            f"{name}/{jax.tree_util.keystr(path, simple=True, separator='/')}" for path, _ in pairs
        ]
    leaves = [leaf for _, leaf in pairs]
    for leaf_name, leaf in zip(names, leaves, strict=True):
        if not isinstance(leaf, _ARRAY_LIKE):
            raise TypeError(
                f"put({name!r}): leaf {leaf_name!r} is a {type(leaf).__name__}, not an array "
                "or number; JAX cannot place it (keep such values out of the tree)"
            )
    decisions = policy.resolve_many(
        [(n, _nbytes(leaf)) for n, leaf in zip(names, leaves, strict=True)]
    )
    if policy.disabled:
        placed = jax.device_put(
            leaves
        )  # what JAX does without devpolicy: default device, uncommitted
    else:
        placed = jax.device_put(leaves, [d.sharding for d in decisions])
    out: T = jax.tree_util.tree_unflatten(treedef, placed)
    return out
