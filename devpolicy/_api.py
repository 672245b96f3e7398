"""Every public name, imported from the module that owns it.

`devpolicy/__init__.py` loads this module on the first access to a public name, so that
`import devpolicy` and `devpolicy --help` stay light (no JAX, pydantic or structlog).
"""

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
from ._active import to as to
from ._active import windows as windows
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
from ._errors import HostViewError as HostViewError
from ._errors import MachineSpecError as MachineSpecError
from ._errors import NarrowingError as NarrowingError
from ._errors import PolicyError as PolicyError
from ._errors import Problem as Problem
from ._errors import RuntimeTooLateError as RuntimeTooLateError
from ._errors import SafetensorsFileError as SafetensorsFileError
from ._errors import ScopeInCoroutineError as ScopeInCoroutineError
from ._errors import UnmatchedNameError as UnmatchedNameError
from ._errors import UntrustedPolicyError as UntrustedPolicyError
from ._hostview import host_view as host_view
from ._inventory import Inventory as Inventory
from ._inventory import available_backends as available_backends
from ._inventory import get_device as get_device
from ._inventory import inventory as inventory
from ._ledger import Ledger as Ledger
from ._ledger import LedgerDevice as LedgerDevice
from ._ledger import LedgerEntry as LedgerEntry
from ._ledger import report as report
from ._lint import Finding as Finding
from ._lint import lint as lint
from ._load_policy import load_policy as load_policy
from ._machine import VirtualDevice as VirtualDevice
from ._machine import VirtualMachine as VirtualMachine
from ._placement import Scope as Scope
from ._policy import Policy as Policy
from ._prefetch import BatchStream as BatchStream
from ._runtime import RuntimeKnob as RuntimeKnob
from ._runtime import RuntimeSettings as RuntimeSettings
from ._safetensors import DeviceLoad as DeviceLoad
from ._safetensors import Plan as Plan
from ._safetensors import PlannedTensor as PlannedTensor
from ._schema import policy_schema as policy_schema
from ._sizes import format_size as format_size
from ._sizes import parse_size as parse_size
from ._tensorfile import align_file as align_file
from ._tensorfile import read_metadata as read_metadata
from ._tensorfile import save_file as save_file
from ._threads import ThreadPoolExecutor as ThreadPoolExecutor
from ._threads import propagate as propagate
