"""`bootstrap()`: load the policy, put its `runtime:` settings into effect, activate it."""

from __future__ import annotations

import os
from collections.abc import Mapping

from .._runtime.settings import RuntimeSettings, apply_runtime, plan_runtime, with_state
from .active import activate, active_policy
from .loading import PolicyInput, load_policy
from .policy import Policy


def bootstrap(source: PolicyInput | None = None, *, required: bool | None = None) -> activate:
    """Load the policy, apply its `runtime:` section, and activate it; call it first thing.

    JAX reads most runtime knobs once, when its first backend starts (some already at
    `import jax`), so call this before any JAX computation. Environment variables the
    user has set win over the policy (reported with `source=env`). One `runtime` event
    names the policy file applied and how it was found, every variable set
    (`set=["JAX_PLATFORMS=cpu", ...]`), and each knob's effective value and source; it is
    a warning where the environment contradicts itself or the policy's `platforms` hides
    an accelerator installed here (`hidden`, naming it and the policy's line).

    All or nothing: if a value cannot be applied (JAX refuses it), or a backend is already
    running and a knob differs from what it runs with, this raises and the environment
    and `jax.config` are as they were; knobs that can still change (`x64`) are applied.
    A discovered policy file must pass the trust check (README, "Trust").

    Args:
        source: A policy file or mapping; None discovers as `load_policy` does.
        required: Whether discovery finding no policy raises (`required=True`) rather
            than warning once (`no_policy`) and going on with an empty policy; None:
            `DEVPOLICY_REQUIRE` decides. For jobs where no policy is a mistake (a run
            started from another directory).

    Returns:
        The activation: the policy stays active for the program (as `devpolicy.activate`);
        use it in a `with` block to deactivate on exit. Its `.policy` is the policy.

    Raises:
        PolicyError, EnvOverrideError: the policy or a `DEVPOLICY_*` variable is malformed,
            or no policy was found and one is required.
        UntrustedPolicyError: discovery found a policy file others could have written.
        RuntimeTooLateError: a backend already runs with other settings; names each knob,
            its wanted and running values, and the fix.

    Example:
        >>> import devpolicy
        >>> with devpolicy.bootstrap({"version": 1, "runtime": {"x64": False}}) as policy:
        ...     knob = devpolicy.runtime_settings(policy).knobs[0]
        >>> knob.knob, knob.variable, knob.text, knob.source
        ('x64', 'JAX_ENABLE_X64', 'false', 'policy')
    """
    policy = load_policy(source, required=required)
    plan = apply_runtime(plan_runtime(policy.settings.runtime, os.environ), os.environ)
    settings = policy.settings
    if settings.file is not None or plan.knobs or plan.conflicts or settings.transfers:
        level = "warning" if plan.conflicts or plan.hidden else "info"
        fields = plan.applied_fields(settings.file, policy.found)
        if settings.transfers:  # `transfers:` and DEVPOLICY_TRANSFERS, as they take effect
            fields["transfers"] = [
                f"{field}={s.value} ({s.source}: {s.origin})"
                for field, s in settings.transfers.items()
            ]
        policy.events.emit(level, "runtime", fields)
    return activate(policy)


def runtime_settings(
    policy: Policy | None = None, *, environ: Mapping[str, str] | None = None
) -> RuntimeSettings:
    """Each runtime knob of a policy (effective value, source, origin, state now) and
    conflicts in the environment.

    Changes nothing. `state` is `pending` before JAX has started a backend; after, it
    says whether the running backend has the value (`in effect`), cannot be affected by
    it (`inert (...)`), or runs otherwise (`differs (...)`).

    Args:
        policy: The policy (default: the active policy, as `bootstrap()` leaves it).
        environ: The environment to weigh (default `os.environ`).

    Example:
        >>> import devpolicy
        >>> p = devpolicy.load_policy({"version": 1, "runtime": {"preallocate": False}})
        >>> knob = devpolicy.runtime_settings(p, environ={}).knobs[0]
        >>> knob.variable, knob.text, knob.source, knob.origin
        ('XLA_PYTHON_CLIENT_PREALLOCATE', 'false', 'policy', '<mapping>:runtime.preallocate')
    """
    policy = active_policy() if policy is None else policy
    env = os.environ if environ is None else environ
    return with_state(plan_runtime(policy.settings.runtime, env), env)
