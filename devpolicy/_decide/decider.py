"""The decision engine: names (and sizes) in, logged `Decision`s out, one cache.

Everything that decides goes through `Decider._outcome`: `resolve` (cached and logged),
`decide` (neither), `explain` (the same walk, reported) and the `*_many` forms (memory
claimed by earlier items passed along explicitly, `items.claim`). Each way in checks what it
was asked once, into one `routing.Query` (`items.make_query`), and hands that down. What a decision
is lives in `decision`, what a placement's items are in `items`, the warnings that name a
rule to write in `advice`; the fallback walk itself in `routing`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic

import jax

from .._base.errors import (
    AxisNamesError,
    DevicePolicyError,
    DeviceUnavailableError,
    UnmatchedNameError,
)
from .._base.events import EventLog
from .._base.limits import CACHE_GENERATION
from .._base.sizes import format_size
from .._document.axes import ATTACHED, Attached, resolve_axes
from .._document.layers import Settings
from .._document.schema import MeshSpec, RuleSpec, Source
from .._document.targets import (
    AUTO,
    REJECT,
    AttachedTarget,
    ShardingTarget,
    Target,
    parse_target,
)
from .._machine.capacity import Capacity
from .._machine.fallbacks import count_fallback
from .._machine.machine import Machine, VirtualDevice, VirtualMachine
from .._machine.meshes import Meshes, shards
from .._names.matching import Condition, Matcher, SourceFile, compile_condition
from .._names.nearby import Fact
from .advice import LARGE_BY_DEFAULT, AttachedRules, warn_large_by_default
from .decision import Decision, DeviceT, Explanation, renamed, single_device_sharding
from .items import Alike, Item, Shape, claim, make_query
from .overrides import Overrides
from .routing import (
    NEVER_MAPPED,
    NOTHING_CLAIMED,
    Choice,
    Fit,
    NamesNeededError,
    Query,
    Route,
)


@dataclass(frozen=True, slots=True)
class _Outcome(Generic[DeviceT]):
    """What deciding one name came to: the rule (None: the default), and the walk's end."""

    rule: int | None
    route: Route[DeviceT]
    choice: Choice[DeviceT] | DevicePolicyError


def _first_target(
    rule: RuleSpec, meshes: Mapping[str, MeshSpec]
) -> Target | ShardingTarget | AttachedTarget:
    sharding = rule.sharding
    if sharding is not None:
        if sharding.axes == ATTACHED:
            mesh = meshes[sharding.mesh]
            return AttachedTarget(
                sharding.mesh, tuple(mesh.axis_rules or ()), tuple(mesh.axes), sharding.indivisible
            )
        if sharding.axes is not None:
            # Resolved once, here: the table and the names do not change while deciding.
            rules = meshes[sharding.mesh].axis_rules or ()
            logical = tuple(sharding.axes)
            resolved = resolve_axes(logical, rules)
            return ShardingTarget(sharding.mesh, resolved, logical, sharding.indivisible)
        spec = tuple(tuple(e) if isinstance(e, list) else e for e in sharding.spec)
        return ShardingTarget(sharding.mesh, spec, None, sharding.indivisible)
    assert rule.device is not None  # the schema requires one of the two
    return parse_target(rule.device)


class Decider(Generic[DeviceT]):
    """Decides where names go by one policy's settings; logs each decision once at info.

    Built once per policy: patterns compiled, chains parsed. A repeated unsized name is
    one lookup in a bounded two-generation cache (recently used names survive a turnover;
    no cliff where everything is forgotten at once).

    Attributes:
        settings: The merged settings decided by.
        capacity: Where memory-aware rules learn free memory.
        machine: The devices decided between: this process's (`inventory()`), or a
            planned machine's (`VirtualMachine`).
        events: Where events go.
        disabled: Whether DEVPOLICY_DISABLE is in force.
    """

    __slots__ = (
        "_attached",
        "_counts_fallbacks",
        "_default",
        "_fit",
        "_matcher",
        "_old",
        "_overrides",
        "_quiet_repeats",
        "_recent",
        "_rejects",
        "_routes",
        "_singles",
        "_walked",
        "capacity",
        "disabled",
        "events",
        "machine",
        "meshes",
        "settings",
    )

    def __init__(
        self, settings: Settings, capacity: Capacity[DeviceT], machine: Machine[DeviceT]
    ) -> None:
        self.settings = settings
        self.capacity = capacity
        self.machine = machine
        self.disabled: bool = settings.disable.value
        self.events = EventLog(settings.log_level.value, settings.log_format.value)
        # Decided once: whether a repeat can be seen by anyone (devpolicy's level is applied
        # before any renderer, so a repeat below it costs nothing).
        self._quiet_repeats = not self.events.enabled("debug")
        # Fallbacks taken in this process are counted for `report`; a plan's are not.
        self._counts_fallbacks = not isinstance(machine, VirtualMachine)
        self._fit = Fit(capacity, settings.headroom.value)
        self._matcher = Matcher(
            [
                compile_condition(
                    *r.spec.name_pattern,
                    r.spec.min_bytes,
                    r.spec.max_bytes,
                    r.spec.file,
                    search=r.spec.search,
                    shape_test=r.spec.shape_test,
                )
                for r in settings.rules
            ]
        )
        fallback = tuple(settings.fallback.value)
        strict: bool = settings.strict.value
        self.meshes = Meshes(settings.meshes, machine)
        self._routes = tuple(
            Route(
                _first_target(r.spec, settings.meshes),
                tuple(r.spec.fallback) if r.spec.fallback is not None else fallback,
                r.spec.memory,
                strict,
                f" (rule {r.origin})",
                r.spec.fits,
                self.meshes,
                r.spec.mmap,
                declared=r.spec.fallback is not None,
            )
            for r in settings.rules
        )
        self._attached = AttachedRules(
            ((r.source, r.index), r.origin, route.attached)
            for r, route in zip(settings.rules, self._routes, strict=True)
            if route.attached is not None
        )
        self._rejects = settings.default.value == REJECT
        self._default = Route(
            parse_target("auto" if self._rejects else settings.default.value),
            fallback,
            None,
            strict,
            f" (default, {settings.default.origin})",
            True,
            self.meshes,
        )
        # What each DEVPOLICY_RULES item takes, so that one that misses says so.
        self._overrides = (
            Overrides(settings, self._matcher.conditions, self.events)
            if not self.disabled and any(r.source == "env" for r in settings.rules)
            else None
        )
        self._recent: dict[object, Decision[DeviceT]] = {}
        self._old: dict[object, Decision[DeviceT]] = {}
        self._singles: dict[tuple[Any, str | None], Any] = {}
        # Sized decisions: (route, walk's end, decision) by key, checked by walking again.
        self._walked: dict[object, tuple[Route[DeviceT], Choice[DeviceT], Decision[DeviceT]]] = {}

    def use_mesh(self, name: str, mesh: Any) -> None:
        """Decide with `mesh` as the policy's mesh `name` (see `Meshes.use`); decisions
        made before, with the mesh built from the policy, are forgotten."""
        self.meshes.use(name, mesh)
        self._recent.clear()
        self._old.clear()
        self._walked.clear()
        for route in (*self._routes, self._default):
            route.forget()

    @property
    def conditions(self) -> tuple[Condition, ...]:
        """Each rule compiled (its pattern, then its size, shape and file conditions), in
        rule order: what the accounting asks of a rule that took nothing."""
        return self._matcher.conditions

    @property
    def routes(self) -> tuple[Route[DeviceT], ...]:
        """Each rule's route, in rule order."""
        return self._routes

    @property
    def default_route(self) -> Route[DeviceT] | None:
        """The default's route, or None under `default: reject`."""
        return None if self._rejects else self._default

    def resolve(
        self,
        name: str,
        nbytes: int | None = None,
        shape: Shape | None = None,
        source: SourceFile | None = None,
    ) -> Decision[DeviceT]:
        """Decide where `name` goes and log it: info the first time, debug on repeats.

        `source`: the file the array comes from, for rules with `file:`."""
        if nbytes is None and shape is None and source is None:
            # The hot path (`@place`, `scope`): one lookup, nothing built, nothing logged
            # unless someone can see a debug event.
            decision = self._recent.get(name)
            if decision is not None and self._quiet_repeats and not decision.is_auto:
                return decision
            if decision is None:
                # The older generation (as `_cached`), looked in before a query is built: a
                # working set past one generation costs one lookup more, not a decision.
                decision = self._old.get(name)
                if decision is not None and self._quiet_repeats and not decision.is_auto:
                    self._remember(name, decision)
                    return decision
        query = make_query(self._fit, NOTHING_CLAIMED, (name, nbytes, shape, NEVER_MAPPED, source))
        return self._resolve(query, "info")

    def _resolve(
        self, query: Query[DeviceT], first_level: str, alike: Alike[DeviceT] | None = None
    ) -> Decision[DeviceT]:
        """`query` decided, cached and logged (`first_level` the first time); `alike`: one
        placement's decisions so far, which later items may be made like (`_alike`)."""
        name, nbytes, shape, maps, source, attached, fit, claimed = query
        key: object = (
            name
            if nbytes is None and shape is None and source is None and attached is None
            else (name, nbytes, shape, maps, source, attached)
        )
        decision = self._cached(key)
        # An `auto` decision follows JAX's default device: still good while that is the same.
        if decision is not None and (
            not decision.is_auto or decision.device == self.machine.default_device()
        ):
            self.events.repeat("placement", decision.event_fields)
            return decision
        walked = self._walked.get(key)
        if walked is not None:
            # Judged by free memory: the rule is the same, but the walk is taken again
            # (memory changes); when it ends the same way, the decision built is reused.
            route, before, decision = walked
            same = (
                nbytes is not None and route.ends_again(before, nbytes, fit, claimed)
            ) or route.walk(name, nbytes, fit, claimed, shape, maps, attached) == before
            if same and (not decision.is_auto or decision.device == self.machine.default_device()):
                self.events.repeat("placement", decision.event_fields)
                return decision
        made = None if alike is None else self._alike(query, alike)
        if made is None:
            made = self._decision(query)
            if alike is not None and nbytes is not None and not self.disabled:
                decision, choice, route = made
                shaped = shape if route.judges_shape() else None
                named = attached if route.attached is not None else None
                alike.made[(route, maps, shaped, named)] = (choice, decision)
        decision, choice, route = made
        if not choice.sized:
            self._remember(key, decision)
        else:
            if len(self._walked) >= CACHE_GENERATION:
                self._walked.clear()
            self._walked[key] = (route, choice, decision)
        if self._overrides is not None:
            self._overrides.decided(decision, source)
        first = (name, decision.device_text, decision.rule, decision.origin)
        if decision.fallback_reason is not None and self._counts_fallbacks:
            count_fallback(
                decision.origin,
                decision.rule,
                decision.requested,
                decision.device_text,
                decision.fallback_declared,
                choice.short,
                decision.nbytes,
                decision.fallback_reason,
            )
        if (
            decision.fallback_reason is not None
            # A leaf without names of its own under `axes: attached` is said by the
            # `no_attached_axes` warning of its placement (`resolve_many`), with the count
            # and the fix; a name resolved alone gets the fallback warning.
            and not (
                alike is not None
                and decision.attached
                and attached is None
                and decision.mesh is not None
            )
            and self.events.first_time(
                (
                    "fallback",
                    decision.origin,
                    decision.requested,
                    decision.device_text,
                    choice.short,
                )
            )
        ):
            # The event a user most needs: their rule's device was not had (or could not
            # hold the bytes). Once per rule and outcome, however many names follow it down
            # the chain: a warning where the policy's chain took over, info where the rule
            # wrote the way it went (`fallback: [replicate]`): planned, not a surprise.
            first_level = "info" if decision.fallback_declared else "warning"
        self.events.decided(first, "placement", decision.event_fields, first_level)
        if (
            decision.rule is None
            and nbytes is not None
            and nbytes >= LARGE_BY_DEFAULT
            and not self.disabled
            # A default written to a device (`cpu`, `gpu:0`) is where the user chose; only
            # JAX's default device (`auto`, written or not) differs between machines.
            and self.settings.default.value == AUTO
        ):
            warn_large_by_default(self.events, decision, source)
        return decision

    def _cached(self, key: object) -> Decision[DeviceT] | None:
        decision = self._recent.get(key)
        if decision is None:
            decision = self._old.get(key)
            if decision is not None:
                self._remember(key, decision)
        return decision

    def _remember(self, key: object, decision: Decision[DeviceT]) -> None:
        if len(self._recent) >= CACHE_GENERATION:
            # Turn over: what was used in the last generation stays reachable for one more.
            self._old = self._recent
            self._recent = {}
        self._recent[key] = decision

    def resolve_many(
        self, items: Iterable[Item], *, summarised: bool = False
    ) -> list[Decision[DeviceT]]:
        """Resolve (name, nbytes[, shape]) items as one placement, earlier items' bytes claimed.

        `summarised`: the caller logs one summary (a file load), so each item's first
        decision is debug, not info; a fallback's first occurrence is a warning either way.
        """
        claimed: dict[Hashable, int] = {}
        decisions = []
        first_level = "debug" if summarised else "info"
        fit = self._fit.snapshot()  # one placement: each pool's free memory read once
        alike: Alike[DeviceT] = Alike()
        # What leaves carried, for rules with `axes: attached` (only where there are any).
        carried: list[tuple[Attached | None, Shape | None]] | None = (
            [] if self._attached and not self.disabled else None
        )
        facts: list[Fact] | None = [] if self._overrides is not None else None
        for item in items:
            query = make_query(fit, claimed, item)
            decision = self._resolve(query, first_level, alike)
            claim(claimed, decision, fit, query[3])  # its maps
            decisions.append(decision)
            if carried is not None:
                carried.append((query[5], query[2]))  # its attached names and shape
            if facts is not None:
                name, nbytes, shape, _, source, _, _, _ = query
                facts.append((name, nbytes, shape, source))
        if carried:
            self._attached.report(self.events, decisions, carried)
        if self._overrides is not None and facts:
            self._overrides.placed(facts, decisions)
        return decisions

    def _alike(
        self, query: Query[DeviceT], alike: Alike[DeviceT]
    ) -> tuple[Decision[DeviceT], Choice[DeviceT], Route[DeviceT]] | None:
        """The decision for `query` made like an earlier one of this placement by the same
        rule (same `maps`, shape where the rule judges it), where its route says the walk
        would end the same way (`Route.ends_again`); None: decide it in full.

        Why: a file's tensors are mostly decided by a few rules, and a walk with its
        memory judgement and a `Decision` built from it cost most of a small tensor's
        load (10,000 tensors: 10,000 walks). The rule is still matched per name.
        """
        name, nbytes, shape, maps, source, attached, fit, claimed = query
        if nbytes is None or self.disabled or type(name) is not str:
            return None
        index = self._matcher.first(name, nbytes, source)
        if index is None and self._rejects:
            return None
        route = self._default if index is None else self._routes[index]
        shaped = shape if route.judges_shape() else None
        named = attached if route.attached is not None else None
        found = alike.made.get((route, maps, shaped, named))
        if found is None:
            return None
        choice, like = found
        if not route.ends_again(choice, nbytes, fit, claimed):
            return None
        return renamed(like, name, nbytes), choice, route

    def decide(
        self,
        name: str,
        nbytes: int | None = None,
        shape: Shape | None = None,
        source: SourceFile | None = None,
        attached: Attached | None = None,
    ) -> Decision[DeviceT]:
        """Like `resolve`, but nothing is logged or cached. `attached`: the axis names the
        leaf carries, for rules with `axes: attached`."""
        item = (name, nbytes, shape, NEVER_MAPPED, source, attached)
        query = make_query(self._fit, NOTHING_CLAIMED, item)
        return self._decision(query)[0]

    def rule_for(
        self,
        name: str,
        nbytes: int | None = None,
        shape: Shape | None = None,
        source: SourceFile | None = None,
    ) -> int | None:
        """The position in `settings.rules` of the rule that takes `name`, or None for
        the default: matching only, no device looked up (lint against real names)."""
        item = (name, nbytes, shape, NEVER_MAPPED, source)
        name, nbytes, shape, _, _, _, _, _ = make_query(self._fit, NOTHING_CLAIMED, item)
        return self._matcher.first(name, nbytes, source, shape)

    def decide_many(self, items: Iterable[Item]) -> list[Decision[DeviceT] | DevicePolicyError]:
        """Like `resolve_many`, logging nothing, each failure returned in its place."""
        claimed: dict[Hashable, int] = {}
        results: list[Decision[DeviceT] | DevicePolicyError] = []
        fit = self._fit.snapshot()
        for item in items:
            query = make_query(fit, claimed, item)
            try:
                decision = self._decision(query)[0]
            except DevicePolicyError as e:
                results.append(e)
                continue
            claim(claimed, decision, fit, query[3])  # its maps
            results.append(decision)
        return results

    def explain(
        self,
        name: str,
        nbytes: int | None = None,
        shape: Shape | None = None,
        source: SourceFile | None = None,
        attached: Attached | None = None,
    ) -> Explanation[DeviceT]:
        """Every rule tried for `name` and every fallback step, from the walk that decides."""
        item = (name, nbytes, shape, NEVER_MAPPED, source, attached)
        query = make_query(self._fit, NOTHING_CLAIMED, item)
        outcome = self._outcome(query)
        name, nbytes, shape, _, _, _, _, _ = query  # as checked
        rules = self.settings.rules
        steps = tuple((rules[s.rule], s) for s in self._matcher.trace(name, nbytes, source, shape))
        error = outcome.choice
        if isinstance(error, DevicePolicyError):
            tried = error.tried if isinstance(error, DeviceUnavailableError) else ()
            return Explanation(name, nbytes, steps, tried, None, str(error))
        decision = self._build(query, outcome.rule, outcome.route, error)
        return Explanation(name, nbytes, steps, error.tried, decision, None)

    def _decision(
        self, query: Query[DeviceT]
    ) -> tuple[Decision[DeviceT], Choice[DeviceT], Route[DeviceT]]:
        """The decision (or its error, raised), the walk's end (unsized: cacheable) and
        the route walked."""
        outcome = self._outcome(query)
        if isinstance(outcome.choice, DevicePolicyError):
            raise outcome.choice
        choice = outcome.choice
        decision = self._build(query, outcome.rule, outcome.route, choice)
        return decision, choice, outcome.route

    def _outcome(self, query: Query[DeviceT]) -> _Outcome[DeviceT]:
        name, nbytes, shape, _, source, _, _, _ = query
        index = self._matcher.first(name, nbytes, source, shape)
        route = self._default if index is None else self._routes[index]
        if self.disabled:
            # The kill switch works where the policy cannot: nothing is looked up, and
            # nothing (not even `default: reject`) can fail a call.
            return _Outcome(index, route, Choice(None, route.chain[0], (), False))
        if index is None and self._rejects:
            patterns = [c.pattern for c in self._matcher.conditions]
            error = UnmatchedNameError(name, self.settings.default.origin, patterns)
            return _Outcome(None, route, error)
        try:
            choice = route.choose(query)
        except (DeviceUnavailableError, AxisNamesError, NamesNeededError) as e:
            return _Outcome(index, route, e)
        return _Outcome(index, route, choice)

    def _build(
        self,
        query: Query[DeviceT],
        index: int | None,
        route: Route[DeviceT],
        choice: Choice[DeviceT],
    ) -> Decision[DeviceT]:
        name, nbytes = query[0], query[1]
        entry = None if index is None else self.settings.rules[index]
        source: Source = "default" if entry is None else entry.source
        if self.disabled:
            source = "disabled"
        device = choice.device if choice.device is not None else self.machine.default_device()
        reason = None
        resolved = None
        target_used = choice.target
        if isinstance(target_used, Target) and target_used.is_accelerator:
            index = target_used.index or 0
            resolved = f"{target_used.platform}:{index} -> {self.machine.text(device)}"
        if choice.tried:
            passed = passed_over(choice.tried)
            used = choice.target.text if resolved is None else resolved
            reason = f"{passed}; used {used}"
            host = getattr(device, "platform", None) == "cpu"
            if choice.short_accelerator and host and nbytes is not None:
                reason += f" (the host: no accelerator in the chain can hold {format_size(nbytes)})"
        sharded: dict[str, Any] = {}
        if choice.mesh is not None and not self.disabled:
            target = choice.target
            assert isinstance(target, ShardingTarget)
            # The mesh's shape says it all; the NamedSharding exists only where its devices
            # do (None in a plan for a VirtualMachine).
            sharded = {
                "sharding": choice.sharding,
                "mesh": target.mesh,
                "spec": target.spec,
                "mesh_devices": choice.mesh.size,
                "shards": shards(target, choice.mesh.shape),
                "local_devices": choice.mesh.local,
                "axes": target.logical,
            }
        elif isinstance(device, jax.Device):
            # One sharding object per device and memory kind, shared by its decisions.
            key = (device, route.memory_kind)
            single = self._singles.get(key)
            if single is None:
                single = single_device_sharding(device, route.memory_kind)
                self._singles[key] = single
            sharded["sharding"] = single
        if route.attached is not None and not self.disabled:
            sharded["attached"] = True
        return Decision(
            name=name,
            device=device,
            device_text=choice.target.text if "mesh" in sharded else self.machine.text(device),
            memory_kind=route.memory_kind,
            requested=route.requested,
            rule=None if entry is None else entry.index,
            origin=self.settings.default.origin if entry is None else entry.origin,
            source=source,
            fallback_reason=reason,
            # A declared way taken because an accelerator could not hold the bytes is still
            # news (the data outgrew the chip): only a way taken for any other reason is.
            fallback_declared=reason is not None
            and choice.declared
            and not choice.short_accelerator,
            nbytes=nbytes,
            commit=True if entry is None else entry.spec.commit,
            is_auto=choice.device is None or self.disabled,
            mmap=False if entry is None else entry.spec.mmap,
            **sharded,
            move_inputs=entry is not None and entry.spec.inputs == "move",
            resolved=None if self.disabled else resolved,
        )


def virtual_decider(settings: Settings, machine: object, verb: str) -> Decider[VirtualDevice]:
    """A decider with `settings` for the machine `machine` describes (memory as stated).

    Raises:
        TypeError: `machine` is not a `VirtualMachine`; the message names `verb`'s call.
    """
    if not isinstance(machine, VirtualMachine):
        raise TypeError(
            f"{verb}(machine=...) takes a devpolicy.VirtualMachine, got "
            f"{type(machine).__name__} {machine!r}"
        )
    return Decider(settings, machine, machine)


def passed_over(tried: Sequence[tuple[str, str]]) -> str:
    """The targets passed over with why, each reason said once after every target passed
    over for it, in the order the walk first met it.

    Example:
        >>> passed_over([("gpu:0", "no gpu backend"), ("cpu:9", "out of range"),
        ...              ("gpu", "no gpu backend")])
        'gpu:0, gpu: no gpu backend; cpu:9: out of range'
    """
    grouped: dict[str, list[str]] = {}
    for target, why in tried:
        grouped.setdefault(why, []).append(str(target))
    return "; ".join(f"{', '.join(targets)}: {why}" for why, targets in grouped.items())
