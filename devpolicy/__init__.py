"""devpolicy: declared, overridable and logged device placement for JAX.

Write a YAML policy once (names to devices, with fallbacks and size conditions), then
apply it with `@place`, `scope` and `put`. Every decision is a structlog `placement`
event, and `DEVPOLICY_*` environment variables override the policy without code changes.
The top level holds what you write in code; every error is in `devpolicy.errors`, the records
the verbs give back in `devpolicy.types`, and two helpers not about placement in
`devpolicy.sizes` and `devpolicy.threads`.

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
import warnings
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from . import errors as errors
from . import sizes as sizes
from . import threads as threads
from . import types as types
from ._lazy import lazy_names

if TYPE_CHECKING:
    from ._api import *  # noqa: F403

try:
    __version__ = version("devpolicy")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

# What a user writes in code: the policy, the verbs, the inputs a user builds, the errors
# caught most. Records are in `types`, every error in `errors`, helpers in `sizes`/`threads`.
__all__ = [
    "Capacity",
    "DevicePolicyError",
    "DeviceUnavailableError",
    "Policy",
    "PolicyError",
    "ReadOptions",
    "SafetensorsFileError",
    "StaticCapacity",
    "VirtualMachine",
    "__version__",
    "activate",
    "active_policy",
    "align_file",
    "bootstrap",
    "explain",
    "get_device",
    "host_view",
    "inventory",
    "lint",
    "load_file",
    "load_policy",
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
    "save_chunks",
    "save_file",
    "scope",
    "shardings",
    "to",
    "unmappable",
    "use_mesh",
    "windows",
]

# Names that left the top level: each still resolves, with a FutureWarning naming where it
# lives now (not a DeprecationWarning, which Python hides when the old spelling is in an
# imported module: NumPy and pandas warn users of removals the same way). Not in `__all__`
# or `dir()`.
_MOVED = {
    **{name: "devpolicy.errors" for name in errors.__all__ if name not in __all__},
    **dict.fromkeys(types.__all__, "devpolicy.types"),
    **dict.fromkeys(sizes.__all__, "devpolicy.sizes"),
    **dict.fromkeys(threads.__all__, "devpolicy.threads"),
}
_REPLACED = {"available_backends": "devpolicy.inventory().devices"}

# `__dir__` lists the top level only: the moved names are found but not offered.
_public_getattr, __dir__ = lazy_names(__name__, __all__)


def __getattr__(name: str) -> Any:
    # PEP 562: the API (and with it JAX) is imported on first use, not at `import devpolicy`.
    if name in __all__:
        return _public_getattr(name)
    if name in _MOVED or name in _REPLACED:
        # Imported before the warning: importing JAX changes the warning filters, which
        # would let the same warning show twice for one `from devpolicy import X`.
        value = getattr(importlib.import_module("devpolicy._api"), name)
        new = _REPLACED.get(name) or f"{_MOVED[name]}.{name}"
        warnings.warn(f"devpolicy.{name} is deprecated: use {new}", FutureWarning, stacklevel=2)
        return value
    if name.startswith("_") and not name.startswith("__"):
        try:
            return importlib.import_module(f"devpolicy.{name}")
        except ModuleNotFoundError:
            pass
    raise AttributeError(f"module 'devpolicy' has no attribute {name!r}")
