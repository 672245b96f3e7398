"""Every error devpolicy raises, each a `DevicePolicyError`.

`except devpolicy.DevicePolicyError` catches them all. Each error also derives from the
built-in exception its kind of failure calls for (`ValueError`, `RuntimeError`, `OSError`,
`LookupError`, `ImportError`), so code written for those keeps working. The four met most
(`DevicePolicyError`, `PolicyError`, `DeviceUnavailableError`, `SafetensorsFileError`) are
also at the top level, the same classes. Each class's docstring says when it is raised.

Example:
    >>> import devpolicy
    >>> from devpolicy.errors import RemoteURLError
    >>> try:
    ...     devpolicy.load_file("s3://")
    ... except RemoteURLError as e:
    ...     print(e.part)
    bucket
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_names

if TYPE_CHECKING:
    from ._api import AxisNamesError as AxisNamesError
    from ._api import CheckpointMismatchError as CheckpointMismatchError
    from ._api import DevicePolicyError as DevicePolicyError
    from ._api import DeviceUnavailableError as DeviceUnavailableError
    from ._api import EnvOverrideError as EnvOverrideError
    from ._api import HostViewError as HostViewError
    from ._api import MachineSpecError as MachineSpecError
    from ._api import NarrowingError as NarrowingError
    from ._api import ObjectChangedError as ObjectChangedError
    from ._api import PolicyError as PolicyError
    from ._api import RangeIgnoredError as RangeIgnoredError
    from ._api import RemoteCacheError as RemoteCacheError
    from ._api import RemoteExtraMissingError as RemoteExtraMissingError
    from ._api import RemoteOfflineError as RemoteOfflineError
    from ._api import RemoteOptionError as RemoteOptionError
    from ._api import RemoteReadError as RemoteReadError
    from ._api import RemoteURLError as RemoteURLError
    from ._api import RuntimeTooLateError as RuntimeTooLateError
    from ._api import SafetensorsFileError as SafetensorsFileError
    from ._api import ScopeInCoroutineError as ScopeInCoroutineError
    from ._api import StreamEndedError as StreamEndedError
    from ._api import StreamStateError as StreamStateError
    from ._api import TransferPlanError as TransferPlanError
    from ._api import TransferRefusedError as TransferRefusedError
    from ._api import UnmatchedNameError as UnmatchedNameError
    from ._api import UntrustedPolicyError as UntrustedPolicyError

__all__ = [
    "AxisNamesError",
    "CheckpointMismatchError",
    "DevicePolicyError",
    "DeviceUnavailableError",
    "EnvOverrideError",
    "HostViewError",
    "MachineSpecError",
    "NarrowingError",
    "ObjectChangedError",
    "PolicyError",
    "RangeIgnoredError",
    "RemoteCacheError",
    "RemoteExtraMissingError",
    "RemoteOfflineError",
    "RemoteOptionError",
    "RemoteReadError",
    "RemoteURLError",
    "RuntimeTooLateError",
    "SafetensorsFileError",
    "ScopeInCoroutineError",
    "StreamEndedError",
    "StreamStateError",
    "TransferPlanError",
    "TransferRefusedError",
    "UnmatchedNameError",
    "UntrustedPolicyError",
]

# Hidden from type checkers, so that a misspelt name is an error there rather than `Any`.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_names(__name__, __all__)
