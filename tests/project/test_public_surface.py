"""The public surface: the top level and its namespaces name exactly these, each documented.

A name added, removed or moved fails here first, so that the change is made on purpose and
docs/api.md follows it.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
import warnings
from types import ModuleType

import pytest

import devpolicy
import devpolicy.errors
import devpolicy.sizes
import devpolicy.threads
import devpolicy.types
from devpolicy.errors import DevicePolicyError
from tests.conftest import REPO

#: What a user writes in code: the policy, the verbs, the inputs a user builds, and the
#: errors caught most.
TOP = [
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

ERRORS = [
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

TYPES = [
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

NAMESPACES: dict[str, tuple[ModuleType, list[str]]] = {
    "devpolicy.errors": (devpolicy.errors, ERRORS),
    "devpolicy.types": (devpolicy.types, TYPES),
    "devpolicy.sizes": (devpolicy.sizes, ["format_size", "parse_size"]),
    "devpolicy.threads": (devpolicy.threads, ["ThreadPoolExecutor"]),
}

#: Errors that never reach a caller as themselves, each with why.
INTERNAL_ERRORS = {
    "ValueRefusedError": "the shared base of EnvOverrideError, MachineSpecError and "
    "RemoteOptionError; never raised itself",
    "NamesNeededError": "caught by the decider: explain and plan report an undecided tensor",
    "SourceEndedError": "a SafetensorsFileError (caught as one); the readers catch it to "
    "say how much of a tensor they got",
    "_UnfinishedFileGoneError": "a SafetensorsFileError (caught as one); a multi-process "
    "save catches it to ask whether process 0 failed, and other processes are told its "
    "public name",
}

#: Every public spelling of every public object, `devpolicy.errors.PolicyError` and
#: `devpolicy.PolicyError` both.
SPELLINGS = [f"devpolicy.{name}" for name in TOP if name != "__version__"] + [
    f"{namespace}.{name}" for namespace, (_, names) in NAMESPACES.items() for name in names
]

#: The spellings that left the top level, and what each deprecation names instead.
MOVED = {
    **{
        name: f"{namespace}.{name}"
        for namespace, (_, names) in NAMESPACES.items()
        for name in names
        if name not in TOP
    },
    "available_backends": "devpolicy.inventory().devices",
}

API_PAGE = (REPO / "docs" / "api.md").read_text(encoding="utf-8")


def _resolve(spelling: str) -> object:
    module, _, name = spelling.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _every_error_class() -> set[type[DevicePolicyError]]:
    for info in pkgutil.walk_packages(devpolicy.__path__, "devpolicy."):
        if info.name != "devpolicy.__main__":
            importlib.import_module(info.name)
    found: set[type[DevicePolicyError]] = set()
    todo: list[type[DevicePolicyError]] = [DevicePolicyError]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("devpolicy.") and cls not in found:
            found.add(cls)
            todo.extend(cls.__subclasses__())
    return found


class TestNames:
    def test_the_top_level_names_exactly_what_a_user_writes(self) -> None:
        """`devpolicy.__all__` is this list, alphabetised, and `dir()` shows each name."""
        assert devpolicy.__all__ == TOP
        assert set(TOP) <= set(dir(devpolicy))

    @pytest.mark.parametrize("namespace", sorted(NAMESPACES))
    def test_each_namespace_names_exactly_its_list(self, namespace: str) -> None:
        """Each namespace's `__all__` is its list, alphabetised; each name resolves and
        `dir()` shows it; a misspelt name is an AttributeError naming the module."""
        module, names = NAMESPACES[namespace]
        assert module.__all__ == names
        for name in names:
            assert getattr(module, name) is not None
        assert set(names) <= set(dir(module))
        with pytest.raises(
            AttributeError, match=rf"^module '{namespace}' has no attribute 'Nope'$"
        ):
            module.Nope  # noqa: B018

    def test_an_object_has_one_home_but_the_top_level_errors(self) -> None:
        """No record, helper or error stands in two namespaces; the top level shares only
        the four errors caught most with `devpolicy.errors`, the same classes."""
        homes: dict[str, list[str]] = {}
        for namespace, (_, names) in NAMESPACES.items():
            for name in names:
                homes.setdefault(name, []).append(namespace)
        assert all(len(places) == 1 for places in homes.values())
        shared = sorted(set(TOP) & set(homes))
        assert shared == [
            "DevicePolicyError",
            "DeviceUnavailableError",
            "PolicyError",
            "SafetensorsFileError",
        ]
        for name in shared:
            assert getattr(devpolicy, name) is getattr(devpolicy.errors, name)

    def test_a_star_import_brings_only_the_top_level(self) -> None:
        """`from devpolicy import *` binds `__all__` and nothing else: no
        ThreadPoolExecutor over the standard library's, no `types` over the module."""
        scope: dict[str, object] = {}
        exec("from devpolicy import *", scope)
        assert sorted(k for k in scope if k != "__builtins__") == sorted(TOP)


class TestErrors:
    def test_every_error_devpolicy_defines_is_listed_or_said_internal(self) -> None:
        """Each DevicePolicyError subclass in the package is in `devpolicy.errors`, or is
        one of the few that never reach a caller as themselves."""
        names = {cls.__name__ for cls in _every_error_class()}
        assert names - set(INTERNAL_ERRORS) == set(ERRORS)
        assert set(INTERNAL_ERRORS) <= names

    @pytest.mark.parametrize("name", ERRORS)
    def test_each_error_is_a_devpolicy_error_that_says_when_it_is_raised(self, name: str) -> None:
        """Each error derives from DevicePolicyError and its docstring says when it is
        raised; the API page's table has a row for it."""
        error = getattr(devpolicy.errors, name)
        assert issubclass(error, DevicePolicyError)
        assert re.search(r"\b(Raised|Never raised)\b", error.__doc__ or ""), name
        assert re.search(rf"^\| `{name}` \|", API_PAGE, re.M), f"{name}: no row in the table"


class TestDocumented:
    @pytest.mark.parametrize("spelling", SPELLINGS)
    def test_each_public_object_is_on_the_api_page_once(self, spelling: str) -> None:
        """docs/api.md documents each public object under exactly one public spelling."""
        documented = re.findall(r"^::: (devpolicy\.[\w.]+)$", API_PAGE, re.M)
        target = _resolve(spelling)
        assert [s for s in documented if _resolve(s) is target] != [], spelling
        assert len([s for s in documented if _resolve(s) is target]) == 1, spelling

    def test_the_api_page_uses_no_deprecated_spelling(self) -> None:
        """Every `:::` entry of the API page is a public spelling, none a deprecated one."""
        documented = re.findall(r"^::: (devpolicy\.[\w.]+)$", API_PAGE, re.M)
        assert set(documented) <= set(SPELLINGS)

    @pytest.mark.parametrize("spelling", SPELLINGS)
    def test_each_public_object_has_a_docstring_and_a_function_an_example(
        self, spelling: str
    ) -> None:
        """Each public object has a docstring; each function shows a `>>>` example."""
        target = _resolve(spelling)
        assert target.__doc__, spelling
        if callable(target) and not isinstance(target, type):
            assert ">>>" in target.__doc__, spelling

    @pytest.mark.parametrize("namespace", sorted(NAMESPACES))
    def test_each_namespace_has_its_section_and_a_runnable_example(self, namespace: str) -> None:
        """Each namespace module says what it holds, with an example (its doctest runs in
        test_docs), and the API page has a section for it."""
        module, _ = NAMESPACES[namespace]
        assert ">>>" in (module.__doc__ or "")
        section = namespace.removeprefix("devpolicy.").capitalize()
        assert re.search(rf"^## {section}$", API_PAGE, re.M)


class TestDeprecated:
    @pytest.mark.parametrize("name", sorted(MOVED))
    def test_a_moved_name_warns_naming_its_new_spelling_and_is_the_same_object(
        self, name: str
    ) -> None:
        """`devpolicy.<moved>` still gives the object, with a FutureWarning that names
        where it lives now; it is absent from `__all__` and `dir()`."""
        new = MOVED[name]
        with pytest.warns(
            FutureWarning, match=rf"^devpolicy\.{name} is deprecated: use {re.escape(new)}$"
        ):
            old = getattr(devpolicy, name)
        if name == "available_backends":
            assert old() == {p: list(d) for p, d in devpolicy.inventory().devices.items()}
        else:
            assert old is _resolve(new)
        assert name not in devpolicy.__all__
        assert name not in dir(devpolicy)

    def test_the_warning_points_at_the_line_that_used_the_old_spelling(self) -> None:
        """The warning is reported at the user's line (so `-W error::FutureWarning`
        and the warnings filters by module act on the right code), and every use warns."""
        for _ in range(2):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                devpolicy.Plan  # noqa: B018
            assert [w.filename for w in caught] == [__file__]

    @pytest.mark.slow
    def test_a_from_import_of_a_moved_name_warns_once(self) -> None:
        """`from devpolicy import NarrowingError` in a fresh process shows one warning at
        the importing line, though Python reads the name twice and JAX loads between."""
        result = subprocess.run(
            [sys.executable, "-W", "default", "-c", "from devpolicy import NarrowingError"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        shown = [line for line in result.stderr.splitlines() if "FutureWarning" in line]
        assert shown == [
            "<string>:1: FutureWarning: devpolicy.NarrowingError is deprecated: "
            "use devpolicy.errors.NarrowingError"
        ]

    def test_a_current_name_does_not_warn(self) -> None:
        """The names that stay, and every namespace spelling, warn about nothing."""
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for spelling in SPELLINGS:
                _resolve(spelling)


def test_the_namespaces_import_no_jax() -> None:
    """Importing `devpolicy` and every namespace loads neither JAX, pydantic nor structlog:
    their names are imported on first use."""
    probe = (
        "import sys, devpolicy, devpolicy.errors, devpolicy.types, devpolicy.sizes, "
        "devpolicy.threads; print(sorted({'jax', 'pydantic', 'structlog'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip().splitlines()[-1] == "[]"
