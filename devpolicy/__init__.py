"""devpolicy: declared, overridable and logged device placement for JAX.

Write a YAML policy once (names to devices, with fallbacks and size conditions), then
apply it with `@place`, `scope` and `put`. Every decision is a structlog `placement`
event, and `DEVPOLICY_*` environment variables override the policy without code changes.

Example:
    >>> import devpolicy, jax.numpy as jnp
    >>> rules = [{"match": "dataset/*", "device": "cpu:1"}]
    >>> policy = devpolicy.load_policy({"version": 1, "rules": rules})
    >>> with devpolicy.activate(policy), devpolicy.scope("dataset/train") as decision:
    ...     tokens = jnp.zeros(8)
    >>> decision.device_text, devpolicy.inventory().text(*tokens.devices())
    ('cpu:1', 'cpu:1')
"""

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._api import *  # noqa: F403

try:
    __version__ = version("devpolicy")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = [
    "AxisNamesError",
    "BatchStream",
    "Capacity",
    "CheckpointMismatchError",
    "Decision",
    "DeviceLoad",
    "DeviceMemory",
    "DevicePolicyError",
    "DeviceUnavailableError",
    "EnvOverrideError",
    "Explanation",
    "Finding",
    "HostViewError",
    "Inventory",
    "Ledger",
    "LedgerDevice",
    "LedgerEntry",
    "MachineSpecError",
    "NarrowingError",
    "Plan",
    "PlannedFetch",
    "PlannedTensor",
    "Policy",
    "PolicyError",
    "Problem",
    "RuntimeKnob",
    "RuntimeSettings",
    "RuntimeTooLateError",
    "SafetensorsFileError",
    "Scope",
    "ScopeInCoroutineError",
    "StaticCapacity",
    "ThreadPoolExecutor",
    "TransferRefusedError",
    "UnmatchedNameError",
    "UntrustedPolicyError",
    "VirtualDevice",
    "VirtualMachine",
    "__version__",
    "activate",
    "active_policy",
    "align_file",
    "available_backends",
    "bootstrap",
    "explain",
    "format_size",
    "get_device",
    "host_view",
    "inventory",
    "lint",
    "load_file",
    "load_policy",
    "parse_size",
    "place",
    "plan",
    "plan_transfers",
    "policy_schema",
    "prefetch",
    "propagate",
    "put",
    "read_metadata",
    "report",
    "resolve",
    "runtime_settings",
    "save_file",
    "scope",
    "shardings",
    "to",
    "use_mesh",
    "windows",
]


def __getattr__(name: str) -> Any:
    # PEP 562: the API (and with it JAX) is imported on first use, not at `import devpolicy`.
    if name in __all__:
        value = getattr(importlib.import_module("devpolicy._api"), name)
        globals()[name] = value
        return value
    if name.startswith("_") and not name.startswith("__"):
        try:
            return importlib.import_module(f"devpolicy.{name}")
        except ModuleNotFoundError:
            pass
    raise AttributeError(f"module 'devpolicy' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
