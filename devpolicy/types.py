"""The records devpolicy gives back: what a call decided, planned, found or holds.

A user reads these and annotates with them, and never builds one: `resolve` gives a
`Decision`, `explain` an `Explanation`, `plan` a `Plan`, `plan_transfers` a
`TransferPlan` (of `PlannedArgument`s), `report` a `Ledger`, `inventory` an
`Inventory`, `lint` `Finding`s, `runtime_settings` `RuntimeSettings`, `scope` a `Scope`,
`prefetch` a `BatchStream` and `windows` a `WindowStream` (one that can say where it
is); `PolicyError.problems` holds `Problem`s; `DeviceMemory` is the `Capacity` devpolicy
uses when none is given; a `VirtualMachine`'s devices are `VirtualDevice`s.

Example:
    >>> import devpolicy
    >>> from devpolicy.types import Decision
    >>> isinstance(devpolicy.load_policy({"version": 1}).decide("x"), Decision)
    True
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_names

if TYPE_CHECKING:
    from ._api import BatchStream as BatchStream
    from ._api import Decision as Decision
    from ._api import DeviceLoad as DeviceLoad
    from ._api import DeviceMemory as DeviceMemory
    from ._api import Explanation as Explanation
    from ._api import Finding as Finding
    from ._api import Inventory as Inventory
    from ._api import Ledger as Ledger
    from ._api import LedgerDevice as LedgerDevice
    from ._api import LedgerEntry as LedgerEntry
    from ._api import Plan as Plan
    from ._api import PlannedArgument as PlannedArgument
    from ._api import PlannedFetch as PlannedFetch
    from ._api import PlannedTensor as PlannedTensor
    from ._api import Problem as Problem
    from ._api import RuntimeKnob as RuntimeKnob
    from ._api import RuntimeSettings as RuntimeSettings
    from ._api import Scope as Scope
    from ._api import TransferPlan as TransferPlan
    from ._api import VirtualDevice as VirtualDevice
    from ._api import WindowStream as WindowStream

__all__ = [
    "BatchStream",
    "Decision",
    "DeviceLoad",
    "DeviceMemory",
    "Explanation",
    "Finding",
    "Inventory",
    "Ledger",
    "LedgerDevice",
    "LedgerEntry",
    "Plan",
    "PlannedArgument",
    "PlannedFetch",
    "PlannedTensor",
    "Problem",
    "RuntimeKnob",
    "RuntimeSettings",
    "Scope",
    "TransferPlan",
    "VirtualDevice",
    "WindowStream",
]

# Hidden from type checkers, so that a misspelt name is an error there rather than `Any`.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_names(__name__, __all__)
