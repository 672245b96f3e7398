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
    >>> decision.device_text, str(next(iter(tokens.devices())))
    ('cpu:1', 'cpu:1')
"""

from importlib.metadata import PackageNotFoundError, version

from ._active import activate as activate
from ._active import active_policy as active_policy
from ._active import explain as explain
from ._active import load_file as load_file
from ._active import place as place
from ._active import plan as plan
from ._active import prefetch as prefetch
from ._active import put as put
from ._active import resolve as resolve
from ._active import scope as scope
from ._bootstrap import bootstrap as bootstrap
from ._bootstrap import runtime_settings as runtime_settings
from ._capacity import Capacity as Capacity
from ._capacity import DeviceMemory as DeviceMemory
from ._capacity import StaticCapacity as StaticCapacity
from ._decider import Decision as Decision
from ._decider import Explanation as Explanation
from ._errors import DevicePolicyError as DevicePolicyError
from ._errors import DeviceUnavailableError as DeviceUnavailableError
from ._errors import EnvOverrideError as EnvOverrideError
from ._errors import NarrowingError as NarrowingError
from ._errors import PolicyError as PolicyError
from ._errors import Problem as Problem
from ._errors import RuntimeTooLateError as RuntimeTooLateError
from ._errors import ScopeInCoroutineError as ScopeInCoroutineError
from ._errors import UnmatchedNameError as UnmatchedNameError
from ._inventory import Inventory as Inventory
from ._inventory import available_backends as available_backends
from ._inventory import get_device as get_device
from ._inventory import inventory as inventory
from ._lint import Finding as Finding
from ._lint import lint as lint
from ._load_policy import load_policy as load_policy
from ._placement import Scope as Scope
from ._policy import Policy as Policy
from ._runtime import RuntimeKnob as RuntimeKnob
from ._runtime import RuntimeSettings as RuntimeSettings
from ._safetensors import DeviceLoad as DeviceLoad
from ._safetensors import Plan as Plan
from ._safetensors import PlannedTensor as PlannedTensor
from ._schema import policy_schema as policy_schema
from ._sizes import format_size as format_size
from ._sizes import parse_size as parse_size
from ._tensorfile import SafetensorsFileError as SafetensorsFileError
from ._tensorfile import align_file as align_file
from ._tensorfile import save_file as save_file
from ._threads import ThreadPoolExecutor as ThreadPoolExecutor
from ._threads import propagate as propagate

try:
    __version__ = version("devpolicy")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = [
    "Capacity",
    "Decision",
    "DeviceLoad",
    "DeviceMemory",
    "DevicePolicyError",
    "DeviceUnavailableError",
    "EnvOverrideError",
    "Explanation",
    "Finding",
    "Inventory",
    "NarrowingError",
    "Plan",
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
    "UnmatchedNameError",
    "__version__",
    "activate",
    "active_policy",
    "align_file",
    "available_backends",
    "bootstrap",
    "explain",
    "format_size",
    "get_device",
    "inventory",
    "lint",
    "load_file",
    "load_policy",
    "parse_size",
    "place",
    "plan",
    "policy_schema",
    "prefetch",
    "propagate",
    "put",
    "resolve",
    "runtime_settings",
    "save_file",
    "scope",
]
