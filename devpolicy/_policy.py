"""A loaded policy and the decisions it makes."""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, overload

import jax
import structlog
from jax.sharding import SingleDeviceSharding

from ._capacity import Capacity, DeviceMemory
from ._errors import DevicePolicyError, DeviceUnavailableError, UnmatchedNameError
from ._inventory import current_default_device, inventory, memory_kinds
from ._layers import RuleEntry, Settings
from ._logging import EventLog
from ._matching import Matcher, Step, compile_condition
from ._placement import Scope, make_place, put_with
from ._schema import Source
from ._sizes import format_size
from ._targets import REJECT, Target, parse_target

if TYPE_CHECKING:
    from ._loader import Plan

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

_CACHE_LIMIT = 65_536


@dataclass(frozen=True, slots=True)
class Decision:
    """Where one name goes, and why.

    Attributes:
        name: The name resolved (`dataset/train`, `model/w`).
        device: The device chosen.
        device_text: The device as target text (`cpu:2`, `gpu:0`; process-local index).
        memory_kind: JAX memory kind asked for, or None for the device's default.
        requested: The target text the rule (or default) asked for.
        rule: Index of the matching rule in its layer (YAML `rules[i]`, env item i), or None.
        origin: Where the deciding rule or setting was written (`policies/x.yaml:9`,
            `env:DEVPOLICY_RULES`, `default`).
        source: `code`, `env`, `policy`, `default`, or `disabled` under DEVPOLICY_DISABLE.
        fallback_reason: None, or why `requested` could not be had and what was used instead.
        nbytes: The size the decision was made for, when known.
        commit: Whether `@place` commits results to `device`.
        is_auto: Whether the decision defers to JAX's own default device.
        applies: Whether a scope for this decision changes JAX's default device
            (false for `auto` and under DEVPOLICY_DISABLE).
        mmap: Whether loaders may map the tensor from its file (the rule's `mmap`).

    Example:
        >>> import devpolicy
        >>> rules = [{"match": "data/*", "device": "cpu"}]
        >>> p = devpolicy.load_policy({"version": 1, "rules": rules})
        >>> d = p.resolve("data/train")
        >>> d.device_text, d.rule, d.source
        ('cpu:0', 0, 'policy')
    """

    name: str
    device: jax.Device
    device_text: str
    memory_kind: str | None
    requested: str
    rule: int | None
    origin: str
    source: Source
    fallback_reason: str | None
    nbytes: int | None
    commit: bool
    is_auto: bool
    applies: bool
    mmap: bool = False

    @property
    def sharding(self) -> SingleDeviceSharding:
        """A sharding that puts an array on `device` in `memory_kind`."""
        return SingleDeviceSharding(self.device, memory_kind=self.memory_kind)

    def event_fields(self) -> dict[str, Any]:
        """The flat fields of this decision's `placement` event."""
        return {
            "name": self.name,
            "device": self.device_text,
            "device_id": self.device.id,
            "requested": self.requested,
            "rule": self.rule,
            "origin": self.origin,
            "source": self.source,
            "fallback_reason": self.fallback_reason,
            "nbytes": self.nbytes,
            "memory_kind": self.memory_kind,
            "process_index": self.device.process_index,
        }


@dataclass(frozen=True, slots=True)
class Explanation:
    """How a name was decided, step by step.

    Attributes:
        name: The name explained.
        nbytes: The size given, if any.
        steps: Each rule tried, in order, with its origin and why it did or did not match.
        fallback: Each target tried on the way to the device, with why it was passed over.
        decision: The decision, or None when no device could be had.
        error: The error resolving would raise, or None.
    """

    name: str
    nbytes: int | None
    steps: tuple[tuple[RuleEntry, Step], ...]
    fallback: tuple[tuple[str, str], ...]
    decision: Decision | None
    error: str | None


@dataclass(frozen=True, slots=True)
class _Choice:
    device: jax.Device | None  # None: auto, decided per call
    target: Target
    tried: tuple[tuple[str, str], ...]
    sized: bool  # free memory was consulted: valid for this call only


@dataclass(frozen=True, slots=True)
class _Fit:
    """How memory-aware placement judges a size: by `capacity`, keeping `headroom` free."""

    capacity: Capacity
    headroom: float

    def problem(self, device: jax.Device, nbytes: int) -> str | None:
        free = self.capacity.free_bytes(device)
        if free is None:
            return None
        claimed = (_CLAIMED.get() or {}).get(device, 0)
        budget = int(free * (1 - self.headroom)) - claimed
        if nbytes <= budget:
            return None
        where = inventory().text(device)
        kept = f", keeping {self.headroom:.0%} free" if self.headroom else ""
        earlier = f", {format_size(claimed)} of it taken by earlier items" if claimed else ""
        return f"needs {format_size(nbytes)}, {format_size(free)} free on {where}{earlier}{kept}"


# Bytes already decided for each device by the current resolve_many call, so that several
# tensors of one file are judged together against free memory, not each on its own.
_CLAIMED: ContextVar[dict[jax.Device, int] | None] = ContextVar("devpolicy_claimed", default=None)


class _Route:
    """A target with its fallback chain, resolved against the inventory once."""

    def __init__(
        self,
        requested: str,
        fallback: tuple[str, ...],
        memory_kind: str | None,
        strict: bool,
        context: str,
        fits: bool,
        fit: _Fit,
    ) -> None:
        self.requested = requested
        self.chain = (parse_target(requested), *(parse_target(t) for t in fallback))
        self.memory_kind = memory_kind
        self.strict = strict
        self.context = context
        self.fits = fits
        self.fit = fit
        self._fixed: _Choice | None = None

    def choose(self, name: str, nbytes: int | None) -> _Choice:
        if self._fixed is not None and (nbytes is None or not self._judges_size()):
            return self._fixed
        choice = self.walk(name, nbytes)
        if isinstance(choice, DeviceUnavailableError):
            raise choice
        if choice.device is not None and not choice.sized:
            self._fixed = choice
        return choice

    def _judges_size(self) -> bool:
        return self.fits or any(t.is_auto for t in self.chain)

    def walk(self, name: str, nbytes: int | None) -> _Choice | DeviceUnavailableError:
        """Try each target of the chain in order (only the first under strict).

        With a size known, `auto` targets (and every target of a `fits` rule) are used only
        if the size fits; the last target of the chain is used even then, unless strict.
        """
        inv = inventory()
        tried: list[tuple[str, str]] = []
        chain = self.chain[:1] if self.strict else self.chain
        sized = False
        for position, target in enumerate(chain, start=1):
            found: jax.Device | str
            found = current_default_device() if target.is_auto else inv.find(target)
            if not isinstance(found, str) and self.memory_kind is not None:
                kinds = memory_kinds(found)
                if self.memory_kind not in kinds:
                    found = (
                        f"no memory kind {self.memory_kind!r} (has: {', '.join(kinds) or 'none'})"
                    )
            if not isinstance(found, str) and nbytes is not None and (self.fits or target.is_auto):
                sized = True
                too_small = self.fit.problem(found, nbytes)
                if too_small is not None:
                    if position < len(chain) or self.strict:
                        tried.append((target.text, too_small))
                        continue
                    tried.append((target.text, f"{too_small}; placed anyway, nothing else to try"))
            if isinstance(found, str):
                tried.append((target.text, found))
                continue
            return _Choice(None if target.is_auto else found, target, tuple(tried), sized)
        context = f" for name {name!r}{self.context}"
        if self.strict:
            context += " (strict: no fallback)"
        elif len(self.chain) == 1:
            context += " (no fallback given)"
        missing = inv.missing_for({t.platform for t in chain})
        return DeviceUnavailableError(self.requested, tried, inv.available(), missing, context)


def _checked_nbytes(nbytes: object) -> int:
    """A size as a plain int; numpy integers are fine, bools, floats and negatives are not."""
    if isinstance(nbytes, numbers.Integral) and not isinstance(nbytes, bool) and int(nbytes) >= 0:
        return int(nbytes)
    raise ValueError(f"nbytes must be None or a non-negative int, got {nbytes!r}")


class Policy:
    """A loaded policy: ordered rules, a default, fallbacks, and settings from every layer.

    Make one with `devpolicy.load_policy`. Every module-level function of devpolicy is
    also a method here, deciding by this policy instead of the active one.

    Example:
        >>> import devpolicy
        >>> rules = [{"match": "dataset/*", "device": "cpu:1"}]
        >>> p = devpolicy.load_policy({"version": 1, "rules": rules})
        >>> p.resolve("dataset/train").device_text
        'cpu:1'
    """

    def __init__(
        self, settings: Settings, found: str = "", capacity: Capacity | None = None
    ) -> None:
        self.settings = settings
        self.capacity: Capacity = capacity if capacity is not None else DeviceMemory()
        fit = _Fit(self.capacity, settings.headroom.value)
        self.found = found
        self.file = settings.file
        self.strict: bool = settings.strict.value
        self.disabled: bool = settings.disable.value
        self.events = EventLog(settings.log_level.value, settings.log_format.value)
        # Repeats are debug events; below debug our own logger drops them unseen.
        self._repeats_dropped = settings.log_level.value != "debug"
        self._matcher = Matcher(
            [
                compile_condition(
                    r.spec.match if r.spec.match is not None else str(r.spec.regex),
                    r.spec.regex is not None,
                    r.spec.min_bytes,
                    r.spec.max_bytes,
                )
                for r in settings.rules
            ]
        )
        fallback = tuple(settings.fallback.value)
        self._routes = [
            _Route(
                r.spec.device,
                tuple(r.spec.fallback) if r.spec.fallback is not None else fallback,
                r.spec.memory,
                self.strict,
                f" (rule {r.origin})",
                r.spec.fits,
                fit,
            )
            for r in settings.rules
        ]
        self._rejects = settings.default.value == REJECT
        self._default_route = _Route(
            "auto" if self._rejects else settings.default.value,
            fallback,
            None,
            self.strict,
            f" (default, {settings.default.origin})",
            False,
            fit,
        )
        self._decisions: dict[tuple[str, int | None], Decision] = {}
        self._unsized: dict[str, Decision] = {}

    @property
    def rules(self) -> tuple[RuleEntry, ...]:
        """Every rule, in the order tried: code, then environment, then the policy file."""
        return self.settings.rules

    def __repr__(self) -> str:
        default = self.settings.default.value
        return f"<Policy file={self.file!r} rules={len(self.rules)} default={default!r}>"

    def resolve(self, name: str, *, nbytes: int | None = None) -> Decision:
        """Decide where `name` goes, and log the decision.

        The first decision for a (name, device, rule) is logged at info, repeats at debug.
        A repeated name is a cached lookup.

        Args:
            name: What is being placed (`dataset/train`, `model/layer0/w`).
            nbytes: Its size, if known; rules with `min_bytes`/`max_bytes` match only when given.

        Raises:
            DeviceUnavailableError: when neither the target nor its fallbacks can be had,
                or at once under `strict: true`.

        Example:
            >>> import devpolicy
            >>> p = devpolicy.load_policy({"version": 1, "rules": [
            ...     {"match": "*", "min_bytes": "1KiB", "device": "cpu:2"}]})
            >>> p.resolve("x", nbytes=4096).device_text, p.resolve("x").rule
            ('cpu:2', None)
        """
        if nbytes is not None and (type(nbytes) is not int or nbytes < 0):
            nbytes = _checked_nbytes(nbytes)
        # Unsized, fixed-device decisions (scope and @place) get a cache of their own
        # keyed by the bare name: the cheapest lookup for the hottest path.
        decision = (
            self._unsized.get(name) if nbytes is None else self._decisions.get((name, nbytes))
        )
        if decision is not None and not decision.is_auto:
            # A cached decision has been logged once already: this is a repeat.
            if not self._repeats_dropped or structlog.is_configured():
                self.events.emit("debug", "placement", decision.event_fields())
            return decision
        return self._resolve_uncached(name, nbytes)

    def _resolve_unsized(self, name: str) -> Decision:
        """`resolve(name)` for the hottest path (`@place`, `scope`): no size, fewest steps."""
        decision = self._unsized.get(name)
        if decision is None:
            return self.resolve(name)
        if not self._repeats_dropped or structlog.is_configured():
            self.events.emit("debug", "placement", decision.event_fields())
        return decision

    def resolve_many(self, items: Iterable[tuple[str, int | None]]) -> list[Decision]:
        """Resolve several (name, nbytes) pairs as one placement, each logged.

        Memory-aware checks (`fits`, sized `auto`) count the bytes earlier items were
        given on each device, so the tensors of one file cannot overfill a device
        together. `load_file` and `put` decide this way. Raises like `resolve`.

        Example:
            >>> import devpolicy
            >>> p = devpolicy.load_policy({"version": 1, "fallback": ["cpu:1"]},
            ...     capacity=devpolicy.StaticCapacity({"cpu:0": 1000}), environ={})
            >>> [d.device_text for d in p.resolve_many([("a", 600), ("b", 600)])]
            ['cpu:0', 'cpu:1']
        """
        return self._many(items, self.resolve)

    def decide_many(
        self, items: Iterable[tuple[str, int | None]]
    ) -> list[Decision | DevicePolicyError]:
        """Like `resolve_many`, logging nothing, with each failure returned in its place."""

        def decide_or_error(name: str, *, nbytes: int | None) -> Decision | DevicePolicyError:
            try:
                return self.decide(name, nbytes=nbytes)
            except DevicePolicyError as e:
                return e

        return self._many(items, decide_or_error)

    def _many(self, items: Iterable[tuple[str, int | None]], one: Callable[..., T]) -> list[T]:
        claimed: dict[jax.Device, int] = {}
        token = _CLAIMED.set(claimed)
        try:
            results = []
            for name, nbytes in items:
                result = one(name, nbytes=nbytes)
                if isinstance(result, Decision):
                    claimed[result.device] = claimed.get(result.device, 0) + (nbytes or 0)
                results.append(result)
            return results
        finally:
            _CLAIMED.reset(token)

    def decide(self, name: str, *, nbytes: int | None = None) -> Decision:
        """Like `resolve`, but logs nothing and caches nothing: for plans and tools.

        Example:
            >>> import devpolicy
            >>> devpolicy.load_policy({"version": 1, "default": "cpu:3"}).decide("x").device_text
            'cpu:3'
        """
        decision, _ = self._decide(name, nbytes)
        return decision

    def _resolve_uncached(self, name: str, nbytes: int | None) -> Decision:
        decision = self._decisions.get((name, nbytes))
        if decision is None or decision.device != current_default_device():
            decision, cacheable = self._decide(name, nbytes)
            if cacheable:
                if len(self._decisions) >= _CACHE_LIMIT:
                    self._decisions.clear()
                    self._unsized.clear()
                self._decisions[(name, nbytes)] = decision
                if nbytes is None and not decision.is_auto:
                    self._unsized[name] = decision
        events = self.events
        if events.first_time((name, decision.device_text, decision.rule, decision.origin)):
            events.emit("info", "placement", decision.event_fields())
        elif events.wants_debug():
            events.emit("debug", "placement", decision.event_fields())
        return decision

    def _decide(self, name: str, nbytes: int | None) -> tuple[Decision, bool]:
        """The decision, and whether it may be cached (not if free memory was consulted)."""
        if not isinstance(name, str):
            raise TypeError(f"a placement name must be a str, got {type(name).__name__} {name!r}")
        if nbytes is not None and (type(nbytes) is not int or nbytes < 0):
            nbytes = _checked_nbytes(nbytes)
        index = self._matcher.first(name, nbytes)
        if index is None and self._rejects:
            raise self._unmatched(name)
        if index is None:
            route = self._default_route
            entry = None
            origin = self.settings.default.origin
            source: Source = "default"
        else:
            route = self._routes[index]
            entry = self.rules[index]
            origin = entry.origin
            source = entry.source
        if self.disabled:
            # The kill switch must work where the policy cannot: no device is looked up.
            choice = _Choice(None, route.chain[0], (), False)
            source = "disabled"
        else:
            choice = route.choose(name, nbytes)
        device = choice.device if choice.device is not None else current_default_device()
        reason = None
        if choice.tried:
            passed = "; ".join(f"{t}: {why}" for t, why in choice.tried)
            reason = f"{passed}; used {choice.target.text}"
        decision = Decision(
            name=name,
            device=device,
            device_text=inventory().text(device),
            memory_kind=route.memory_kind,
            requested=route.requested,
            rule=None if entry is None else entry.index,
            origin=origin,
            source=source,
            fallback_reason=reason,
            nbytes=nbytes,
            commit=True if entry is None else entry.spec.commit,
            is_auto=choice.device is None or self.disabled,
            applies=choice.device is not None and not self.disabled,
            mmap=False if entry is None else entry.spec.mmap,
        )
        return decision, not choice.sized

    def _unmatched(self, name: str) -> UnmatchedNameError:
        patterns = [c.pattern for c in self._matcher.conditions]
        return UnmatchedNameError(name, self.settings.default.origin, patterns)

    def explain(self, name: str, *, nbytes: int | None = None) -> Explanation:
        """Every rule tried for `name` and every fallback step, without logging.

        Example:
            >>> import devpolicy
            >>> rules = [{"match": "a/*", "device": "cpu"}]
            >>> p = devpolicy.load_policy({"version": 1, "rules": rules})
            >>> [step.matched for _, step in p.explain("b/x").steps]
            [False]
        """
        steps = tuple((self.rules[s.rule], s) for s in self._matcher.trace(name, nbytes))
        index = next((s.rule for _, s in steps if s.matched), None)
        if index is None and self._rejects:
            return Explanation(name, nbytes, steps, (), None, str(self._unmatched(name)))
        route = self._default_route if index is None else self._routes[index]
        choice = route.walk(name, nbytes)
        if isinstance(choice, DeviceUnavailableError):
            return Explanation(name, nbytes, steps, choice.tried, None, str(choice))
        decision, _ = self._decide(name, nbytes)
        return Explanation(name, nbytes, steps, choice.tried, decision, None)

    def scope(self, name: str, *, nbytes: int | None = None) -> Scope:
        """Context manager: `jax.default_device` set to where `name` goes. See `devpolicy.scope`."""
        return Scope(self, name, nbytes)

    @overload
    def place(self, name: F, /, *, commit: bool | None = None) -> F: ...
    @overload
    def place(
        self, name: str | None = None, /, *, commit: bool | None = None
    ) -> Callable[[F], F]: ...
    def place(self, name: Any = None, /, *, commit: bool | None = None) -> Any:
        """Decorator: run the function in this policy's scope for `name`. See `devpolicy.place`."""
        return make_place(self, name, commit)

    def put(self, name: str, x: T) -> T:
        """Place an array or pytree by this policy. See `devpolicy.put`."""
        return put_with(self, name, x)

    def load_file(self, path: str | os.PathLike[str], **options: Any) -> dict[str, jax.Array]:
        """Load a safetensors file by this policy. See `devpolicy.load_file`."""
        from ._loader import load_file

        return load_file(path, policy=self, **options)

    def plan(self, path: str | os.PathLike[str], *, prefix: str | None = None) -> Plan:
        """Where each tensor of a file would go by this policy. See `devpolicy.plan`."""
        from ._loader import plan

        return plan(path, prefix=prefix, policy=self)

    def prefetch(self, iterable: Iterable[T], name: str = "batch", size: int = 2) -> Iterator[T]:
        """Place each element by this policy, ahead of use. See `devpolicy.prefetch`."""
        from ._prefetch import prefetch

        return prefetch(iterable, name, size, policy=self)
