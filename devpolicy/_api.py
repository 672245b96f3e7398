"""Every public name, imported from the module that owns it.

`devpolicy/__init__.py` and the public namespaces (`errors`, `types`, `sizes`, `threads`)
load this module on the first access to one of their names, so that `import devpolicy` and
`devpolicy --help` stay light (no JAX, pydantic or structlog).
"""

import sys

from ._apply.hostview import host_view as host_view
from ._apply.jit_arguments import PlannedArgument as PlannedArgument
from ._apply.jit_arguments import TransferPlan as TransferPlan
from ._apply.scope import Scope as Scope
from ._apply.stream.owner import WindowStream as WindowStream
from ._apply.stream.prefetch import BatchStream as BatchStream
from ._apply.stream.reading import ReadOptions as ReadOptions
from ._apply.threads import ThreadPoolExecutor as ThreadPoolExecutor
from ._apply.threads import propagate as propagate
from ._base.errors import AxisNamesError as AxisNamesError
from ._base.errors import CheckpointMismatchError as CheckpointMismatchError
from ._base.errors import DevicePolicyError as DevicePolicyError
from ._base.errors import DeviceUnavailableError as DeviceUnavailableError
from ._base.errors import EnvOverrideError as EnvOverrideError
from ._base.errors import HostViewError as HostViewError
from ._base.errors import MachineSpecError as MachineSpecError
from ._base.errors import NarrowingError as NarrowingError
from ._base.errors import PolicyError as PolicyError
from ._base.errors import Problem as Problem
from ._base.errors import RuntimeTooLateError as RuntimeTooLateError
from ._base.errors import SafetensorsFileError as SafetensorsFileError
from ._base.errors import ScopeInCoroutineError as ScopeInCoroutineError
from ._base.errors import StreamEndedError as StreamEndedError
from ._base.errors import StreamStateError as StreamStateError
from ._base.errors import TransferPlanError as TransferPlanError
from ._base.errors import TransferRefusedError as TransferRefusedError
from ._base.errors import UnmatchedNameError as UnmatchedNameError
from ._base.errors import UntrustedPolicyError as UntrustedPolicyError
from ._base.sizes import format_size as format_size
from ._base.sizes import parse_size as parse_size
from ._decide.decision import Decision as Decision
from ._decide.decision import Explanation as Explanation
from ._document.schema import policy_schema as policy_schema
from ._io.planning.plan import DeviceLoad as DeviceLoad
from ._io.planning.plan import Plan as Plan
from ._io.planning.plan import PlannedFetch as PlannedFetch
from ._io.planning.plan import PlannedTensor as PlannedTensor
from ._io.reading.checkpoint_sources import read_metadata as read_metadata
from ._io.remote.errors import ObjectChangedError as ObjectChangedError
from ._io.remote.errors import RangeIgnoredError as RangeIgnoredError
from ._io.remote.errors import RemoteCacheError as RemoteCacheError
from ._io.remote.errors import RemoteExtraMissingError as RemoteExtraMissingError
from ._io.remote.errors import RemoteOfflineError as RemoteOfflineError
from ._io.remote.errors import RemoteOptionError as RemoteOptionError
from ._io.remote.errors import RemoteReadError as RemoteReadError
from ._io.remote.errors import RemoteURLError as RemoteURLError
from ._io.writing.local_files import align_file as align_file
from ._io.writing.mappable import save_chunks as save_chunks
from ._io.writing.mappable import unmappable as unmappable
from ._machine.capacity import Capacity as Capacity
from ._machine.capacity import DeviceMemory as DeviceMemory
from ._machine.capacity import StaticCapacity as StaticCapacity
from ._machine.inventory import Inventory as Inventory
from ._machine.inventory import available_backends as available_backends
from ._machine.inventory import get_device as get_device
from ._machine.inventory import inventory as inventory
from ._machine.ledger import Ledger as Ledger
from ._machine.ledger import report as report
from ._machine.machine import VirtualDevice as VirtualDevice
from ._machine.machine import VirtualMachine as VirtualMachine
from ._machine.rows import LedgerDevice as LedgerDevice
from ._machine.rows import LedgerEntry as LedgerEntry
from ._policy.active import activate as activate
from ._policy.active import active_policy as active_policy
from ._policy.bootstrap import bootstrap as bootstrap
from ._policy.bootstrap import runtime_settings as runtime_settings
from ._policy.lint import Finding as Finding
from ._policy.lint import lint as lint
from ._policy.loading import load_policy as load_policy
from ._policy.policy import Policy as Policy
from ._policy.transfer_plans import plan_transfers as plan_transfers
from ._policy.verbs import explain as explain
from ._policy.verbs import load_file as load_file
from ._policy.verbs import place as place
from ._policy.verbs import plan as plan
from ._policy.verbs import prefetch as prefetch
from ._policy.verbs import put as put
from ._policy.verbs import resolve as resolve
from ._policy.verbs import save_file as save_file
from ._policy.verbs import scope as scope
from ._policy.verbs import shardings as shardings
from ._policy.verbs import to as to
from ._policy.verbs import use_mesh as use_mesh
from ._policy.verbs import windows as windows
from ._runtime.settings import RuntimeKnob as RuntimeKnob
from ._runtime.settings import RuntimeSettings as RuntimeSettings

#: Where a public class shows it lives, first match: every error in `devpolicy.errors`
#: (the top level shares the four caught most), else the one namespace that lists it.
_HOMES = (
    "devpolicy.errors",
    "devpolicy",
    "devpolicy.types",
    "devpolicy.sizes",
    "devpolicy.threads",
)


def _show_public_modules() -> None:
    """Each public class shows the module a user reaches it by (`repr`, `help`, tracebacks,
    pickles: `devpolicy.types.Decision`), not the private one that defines it, as NumPy's
    and pandas' public classes do. Its doctests are then run by the public-surface tests
    (collecting its defining module's doctests passes it by)."""
    for home in _HOMES:
        for name in sys.modules[home].__all__:
            value = globals().get(name)
            if isinstance(value, type) and value.__module__.startswith("devpolicy._"):
                value.__module__ = home


_show_public_modules()
