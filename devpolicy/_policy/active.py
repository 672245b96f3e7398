"""The active policy: which policy module-level calls decide by, and `activate`.

A policy activated in this context (a `ContextVar`, reset with its token), else the
earliest outermost activation still open in any thread, else the discovered policy,
loaded once. `ACTIVE_DECIDER` and `ACTIVE_SCOPES` are how the module-level verbs
(`verbs`) and placement find it at each call without calling up into this module.
"""

from __future__ import annotations

import os
import threading
from contextvars import ContextVar, Token
from types import TracebackType

from .._apply.calls import Active
from .._apply.scope import Scopes
from .._apply.transfers import arm, disarm, suspend
from .._base.events import EventLog
from .._decide.decider import Decider
from .loading import forget_nothing_found, load_policy, load_settings, loaded_files
from .policy import Policy

_ACTIVE: ContextVar[Policy | None] = ContextVar("devpolicy_active_policy", default=None)
_lock = threading.Lock()
# Outermost activations still open, in the order made. The earliest (usually the
# program's own, made before it starts workers) serves threads that activated none.
# A list, not one slot: tasks and threads exit in any order.
_outermost: list[activate] = []
_discovered: Policy | None = None


def active_policy() -> Policy:
    """The policy module-level calls use now.

    In order: the policy activated in this context; else the earliest outermost
    activation still open in any thread; else the discovered policy, loaded once on
    first use.

    The discovered policy, when discovery finds none, is an empty policy (every name to
    JAX's default device), said once per process by a `no_policy` warning that names
    where discovery looked; with `DEVPOLICY_REQUIRE=1` it is an error instead.

    Raises:
        PolicyError, EnvOverrideError: if the discovered policy is malformed, or none is
            found and `DEVPOLICY_REQUIRE` asks for one.

    Example:
        >>> import devpolicy
        >>> p = devpolicy.load_policy({"version": 1})
        >>> with devpolicy.activate(p):
        ...     devpolicy.active_policy() is p
        True
    """
    policy = _ACTIVE.get()
    return policy if policy is not None else _inactive_policy()


def _inactive_policy() -> Policy:
    """The policy for a context that activated nothing (see `active_policy`)."""
    for earliest in _outermost[:1]:  # a slice: another thread may empty the list meanwhile
        return earliest.policy
    return _discovered_checked()


def events_for_writing() -> EventLog:
    """Whose logging a verb that places nothing (`save_file`) follows: the active policy's,
    as `active_policy` finds it, except that a discovery finding no policy is neither
    said (`no_policy` is about where arrays go, and writing sends none anywhere) nor
    kept: the first call that places discovers again, and warns."""
    if _ACTIVE.get() is None and not _outermost and _discovered is None:
        loaded = load_settings()
        if loaded.nothing_found is not None:
            settings = loaded.settings
            return EventLog(settings.log_level.value, settings.log_format.value)
    return active_policy().events


def _inactive_decider() -> Decider:
    """The decider for a context that activated nothing (see `active_policy`)."""
    return _inactive_policy().decider


def _discovered_checked() -> Policy:
    """The discovered policy, after warning if a policy file loaded since is not it."""
    policy = _discover()
    if loaded_files:  # a policy file was loaded since the last look: is it this one?
        _not_active(policy)
    return policy


def _not_active(discovered: Policy) -> None:
    """Warn once per pair when a loaded policy file is not the discovered one deciding.

    `p = load_policy("minilm.yaml")` followed by `devpolicy.put(...)` decides by the
    discovered policy, not `p`: `activate` is what makes a policy the module-level one.
    """
    with _lock:
        pending = loaded_files[:]
        loaded_files.clear()
    deciding = discovered.file
    deciding_path = os.path.abspath(deciding) if deciding is not None else None
    for path, shown in pending:
        if path == deciding_path or not discovered.events.first_time(("not_active", path)):
            continue
        discovered.events.emit(
            "warning",
            "policy_not_active",
            {
                "loaded": shown,
                "deciding": deciding or "none found (an empty policy: JAX's default device)",
                "found": discovered.found,
                "fix": f"devpolicy.activate(policy) to decide module-level calls by {shown}, "
                "or call the policy's own methods (policy.put, policy.place, ...)",
            },
        )


# How placement and the module-level verbs find the active decider at each call without
# calling up into this module.
ACTIVE_DECIDER = Active(_ACTIVE.get, _inactive_decider)
ACTIVE_SCOPES = Scopes(ACTIVE_DECIDER)


def _discover() -> Policy:
    global _discovered
    if _discovered is None:
        with _lock:
            if _discovered is None:
                _discovered = load_policy()
    return _discovered


def forget_discovered() -> None:
    """Drop the discovered policy so the next module-level call discovers again (and
    forget which policy files were loaded: nothing is compared with the next one, and
    that no policy was found: a discovery that finds none says so again)."""
    global _discovered
    with _lock:
        _discovered = None
        loaded_files.clear()
    forget_nothing_found()


class activate:  # noqa: N801 - used as a function: devpolicy.activate(policy)
    """Make `policy` the active policy for module-level calls.

    Takes effect at once. Used as `with devpolicy.activate(p):`, the previous policy
    comes back on exit. The activation holds in this context (thread or asyncio task and
    what it starts with a copied context); the earliest outermost activation still open
    also serves threads that have activated none. A policy with `transfers:` watches JAX's
    implicit transfers in the activating thread until it exits (see
    [Transfers](transfers.md)).

    Example:
        >>> import devpolicy
        >>> p = devpolicy.load_policy({"version": 1, "default": "cpu:3"})
        >>> with devpolicy.activate(p):
        ...     devpolicy.resolve("anything").device_text
        'cpu:3'
    """

    def __init__(self, policy: Policy) -> None:
        if not isinstance(policy, Policy):
            raise TypeError(
                "activate() takes a Policy (from devpolicy.load_policy), "
                f"got {type(policy).__name__}"
            )
        self.policy = policy
        # `transfers:` watches this thread while the policy is active (JAX's guard is
        # per thread; `propagate` carries it into workers); a policy without it, activated
        # inside one with it, stops the watch until it exits.
        self._watched = arm(policy.watch) if policy.watch is not None else suspend()
        self._outermost = _ACTIVE.get() is None
        self._token: Token[Policy | None] = _ACTIVE.set(policy)
        if self._outermost:
            with _lock:
                _outermost.append(self)

    def __enter__(self) -> Policy:
        return self.policy

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            _ACTIVE.reset(self._token)
        except ValueError as e:
            raise RuntimeError(
                "devpolicy.activate() was exited in a different context than it was entered "
                "(for example an async fixture torn down in another task); enter and exit it "
                "in the same task or thread"
            ) from e
        finally:
            if self._watched is not None:
                disarm(self._watched)
                self._watched = None
            if self._outermost:
                with _lock:
                    if self in _outermost:
                        _outermost.remove(self)
