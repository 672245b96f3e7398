"""Implicit transfers (`transfers:`): seen with the user's line, counted, refused, per thread."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._apply import transfers as transfers_module
from devpolicy._base import compat
from devpolicy._decide.decision import single_device_sharding
from devpolicy._machine.ledger import forget_transfers
from tests import transfers_reference
from tests.helpers import policy_of

WATCH_ALL = {"host_to_device": "log", "device_to_device": "log", "host_local": "log"}
HOST = np.arange(12, dtype=np.float32).reshape(4, 3)
TWICE = jax.jit(lambda a: a * 2)


@pytest.fixture(autouse=True)
def _counts() -> Iterator[None]:
    forget_transfers()
    yield
    forget_transfers()


def here(ahead: int = 1) -> str:
    """`test_transfers.py:LINE` of the caller's line `ahead` lines below this call."""
    frame = inspect.currentframe()
    assert frame is not None
    assert frame.f_back is not None
    return f"{Path(__file__).name}:{frame.f_back.f_lineno + ahead}"


def transfers(logs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [e for e in logs if e["event"] == "transfer"]


def guard_levels() -> tuple[object, object, object]:
    state, _ = compat.transfer_guard_state()
    return state.host_to_device, state.device_to_device, state.device_to_host


class TestEvents:
    def test_a_numpy_argument_of_a_jit_is_an_event_at_the_users_line(self) -> None:
        """The event names this file's line, the function, numpy as source and the bytes."""
        p = policy_of(transfers=WATCH_ALL)
        with capture_logs() as logs, devpolicy.activate(p):
            site = here()
            TWICE(HOST)
        (event,) = transfers(logs)
        assert str(event["site"]).endswith(site)
        assert event["direction"] == "host_to_device"
        assert event["source"] == "numpy"
        assert event["devices"] == ["cpu:0"]
        assert (event["nbytes"], event["shape"], event["dtype"]) == (48, [4, 3], "float32")
        assert event["function"] == (
            "TestEvents.test_a_numpy_argument_of_a_jit_is_an_event_at_the_users_line"
        )
        assert event["log_level"] == "info"

    def test_repeats_are_debug_and_counted_in_the_report(self) -> None:
        """Once per site at info; each repeat at debug; report() counts them all by site."""
        p = policy_of(transfers=WATCH_ALL, logging={"level": "debug"})
        with capture_logs() as logs, devpolicy.activate(p):
            for _ in range(3):
                site = here()
                TWICE(HOST)
        levels = [e["log_level"] for e in transfers(logs)]
        assert levels == ["info", "debug", "debug"]
        (row,) = [s for s in devpolicy.report().transfers if s.site.endswith(site)]
        assert (row.count, row.nbytes, row.direction, row.devices) == (
            3,
            144,
            "host_to_device",
            ("cpu:0",),
        )
        assert "implicit transfers: 3 transfers" in str(devpolicy.report())

    def test_an_array_copied_into_another_devices_jit_is_device_to_device(
        self, cpus: list[jax.Device]
    ) -> None:
        """The source is the device it was on, the destination the jit's."""
        on_cpu0 = jax.jit(lambda a: a + 1, in_shardings=single_device_sharding(cpus[0]))
        x = jax.device_put(HOST, cpus[2])
        with capture_logs() as logs, devpolicy.activate(policy_of(transfers=WATCH_ALL)):
            on_cpu0(x)
        (event,) = transfers(logs)
        assert (event["direction"], event["source"], event["devices"]) == (
            "device_to_device",
            "cpu:2",
            ["cpu:0"],
        )
        assert event["nbytes"] == 48

    def test_a_scope_reports_its_rule_as_the_transfers_rule(self) -> None:
        """Inside `policy.scope(name)` the event carries the origin of the deciding rule."""
        p = policy_of(rules=[{"match": "x", "device": "cpu:1"}], transfers=WATCH_ALL)
        doubled = jax.jit(lambda a: a * 2)
        with capture_logs() as logs, p.scope("x"):
            doubled(HOST)
        (event,) = transfers(logs)
        assert event["rule"] == "<mapping>:rules[0]"
        assert event["devices"] == ["cpu:1"]

    def test_host_data_into_a_cpu_device_is_allowed_unless_host_local_says(self) -> None:
        """`transfers: log` alone leaves numpy -> CPU device (host_local) alone."""
        with capture_logs() as logs, devpolicy.activate(policy_of(transfers="log")):
            TWICE(HOST)
        assert transfers(logs) == []
        assert devpolicy.report().transfers == ()

    def test_events_do_not_depend_on_jaxs_cpp_logging(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """TF_CPP_MIN_LOG_LEVEL silences JAX's own guard log, not devpolicy's event."""
        monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
        with capture_logs() as logs, devpolicy.activate(policy_of(transfers=WATCH_ALL)):
            TWICE(HOST)
        assert len(transfers(logs)) == 1


class TestRefused:
    def test_disallow_raises_transfer_refused_naming_site_direction_and_policy_line(
        self, tmp_path: Path
    ) -> None:
        """The error is a DevicePolicyError naming file:line, direction, source, devices,
        bytes, the policy's line and the fix."""
        path = tmp_path / "p.yaml"
        path.write_text("version: 1\ntransfers:\n  host_local: disallow\n")
        p = devpolicy.load_policy(path)
        with devpolicy.activate(p):
            site = here(2)
            with pytest.raises(devpolicy.errors.TransferRefusedError) as caught:
                TWICE(HOST)
        e = caught.value
        assert isinstance(e, devpolicy.DevicePolicyError)
        assert e.site.endswith(site)
        assert (e.direction, e.source, e.devices, e.nbytes) == (
            "host_to_device",
            "numpy",
            ("cpu:0",),
            48,
        )
        assert re.search(
            rf"{re.escape(site)}: implicit host_to_device transfer of float32\[4, 3\] "
            rf"\(48 bytes\) from numpy to cpu:0 refused by transfers.host_local: disallow "
            r"\((.*/)?p\.yaml:3\)\. Fix: jax.device_put it explicitly",
            str(e),
        )

    def test_scalars_and_indices_are_never_refused(self, cpus: list[jax.Device]) -> None:
        """An index or a Python scalar is not data: counted apart, never refused."""
        x = jax.device_put(HOST, cpus[1])
        p = policy_of(transfers={"host_to_device": "disallow", "host_local": "disallow"})
        with devpolicy.activate(p):
            x[1]
            x + 1
        directions = {s.direction for s in devpolicy.report().transfers}
        assert directions == {"host_to_device:scalar"}

    def test_explicit_placements_are_never_refused_or_counted(self, cpus: list[jax.Device]) -> None:
        """jax.device_put/device_get and devpolicy.put/to pass a policy refusing everything."""
        p = policy_of(
            rules=[{"match": "w*", "device": "cpu:2"}],
            transfers={"host_to_device": "disallow", "device_to_device": "disallow",
                       "host_local": "disallow"},
        )  # fmt: skip
        with devpolicy.activate(p):
            a = jax.device_put(HOST, cpus[1])
            jax.device_get(a)
            b = devpolicy.put("w", HOST)
            c = devpolicy.to(a, "w")
            d = p.put("w", {"k": HOST})
        assert b.devices() == c.devices() == d["k"].devices() == {cpus[2]}
        assert devpolicy.report().transfers == ()

    def test_jaxs_own_placement_helpers_are_explicit(self, cpus: list[jax.Device]) -> None:
        """make_array_from_callback places on purpose (JAX's guard says implicit: jax#40285)."""
        p = policy_of(transfers={"host_to_device": "disallow", "host_local": "disallow"})
        sharding = single_device_sharding(cpus[3])
        with devpolicy.activate(p):
            x = jax.make_array_from_callback(HOST.shape, sharding, lambda index: HOST[index])
            with pytest.raises(devpolicy.errors.TransferRefusedError):
                TWICE(HOST)  # an argument transfer is still refused
        assert x.devices() == {cpus[3]}
        assert devpolicy.report().transfers == ()

    def test_a_guard_the_user_set_is_left_to_jax(self) -> None:
        """Outside any watching policy, JAX's own disallow raises JAX's own error."""
        with jax.transfer_guard("disallow"), pytest.raises(Exception, match="Disallowed"):
            TWICE(HOST)
        assert devpolicy.report().transfers == ()


class TestWhereItApplies:
    def test_without_transfers_nothing_of_jax_changes(self) -> None:
        """A policy with no `transfers:` leaves JAX's guard as it was, in scopes too."""
        before = guard_levels()
        p = policy_of(rules=[{"match": "x", "device": "cpu:1"}])
        assert p.watch is None
        with devpolicy.activate(p), p.scope("x"):
            assert guard_levels() == before
        assert type(p.scope("x")) is devpolicy.types.Scope

    def test_the_guard_is_restored_when_the_policy_is_left(self) -> None:
        """activate and scope arm JAX's guard on entry and restore it on exit."""
        before = guard_levels()
        p = policy_of(transfers=WATCH_ALL)
        with devpolicy.activate(p):
            assert guard_levels() != before
        assert guard_levels() == before
        with p.scope("x"):
            assert guard_levels() != before
        assert guard_levels() == before

    def test_a_policy_without_transfers_activated_inside_stops_the_watch(self) -> None:
        """Watching applies while the watching policy is the active one, nowhere else."""
        before = guard_levels()
        with capture_logs() as logs, devpolicy.activate(policy_of(transfers=WATCH_ALL)):
            with devpolicy.activate(policy_of()):
                assert guard_levels() == (None, None, None)
                TWICE(HOST)
            TWICE(HOST)
        assert len(transfers(logs)) == 1
        assert guard_levels() == before

    def test_place_watches_each_call(self) -> None:
        """A function decorated by a policy with `transfers:` is watched while it runs."""
        p = policy_of(transfers=WATCH_ALL)

        @p.place("step")
        def step(batch: np.ndarray) -> jax.Array:
            return TWICE(batch)

        with capture_logs() as logs:
            step(HOST)
            TWICE(HOST)  # outside the call: not watched
        assert len(transfers(logs)) == 1

    def test_another_thread_is_not_watched(self) -> None:
        """JAX's guard is per thread: a thread the policy is not active in is not watched."""
        with capture_logs() as logs, devpolicy.activate(policy_of(transfers=WATCH_ALL)):
            t = threading.Thread(target=lambda: TWICE(HOST))
            t.start()
            t.join()
        assert transfers(logs) == []

    def test_propagate_carries_the_watch_into_a_thread(self) -> None:
        """devpolicy.propagate carries the watching policy with the scope."""
        with capture_logs() as logs, devpolicy.activate(policy_of(transfers=WATCH_ALL)):
            site = here()
            t = threading.Thread(target=devpolicy.propagate(lambda: TWICE(HOST)))
            t.start()
            t.join()
        (event,) = transfers(logs)
        assert str(event["site"]).endswith(site)


def guard_sees(transfer: Callable[[], object]) -> bool:
    """Whether JAX's own guard refuses `transfer` (what it cannot see, nobody can)."""
    with jax.transfer_guard("disallow"):
        try:
            transfer()
        except Exception:
            return True
    return False


class TestReferenceProgram:
    def test_every_site_the_guard_can_see_is_reported(self, cpus: list[jax.Device]) -> None:
        """Each marked line of tests/transfers_reference.py is reported with its line,
        direction and devices; bytes sum to what it moves."""
        source = Path(transfers_reference.__file__)
        marked = {}
        for number, line in enumerate(source.read_text().splitlines(), 1):
            m = re.search(r"# implicit: (.+), (\w+)$", line)
            if m:
                marked[number] = (m.group(1), m.group(2))
        assert len(marked) >= 10
        with devpolicy.activate(policy_of(transfers=WATCH_ALL)):
            kept = transfers_reference.run(cpus)
        assert kept
        sites = {}
        for row in devpolicy.report().transfers:
            path, _, line = row.site.rpartition(":")
            assert path.endswith("transfers_reference.py"), row
            sites[int(line)] = row
        if not guard_sees(lambda: jnp.asarray(HOST)):  # jax 0.6: jnp.asarray is no transfer
            marked = {n: m for n, m in marked.items() if m[0] != "jnp.asarray of numpy"}
        assert set(sites) == set(marked)
        for number, (kind, direction) in marked.items():
            row = sites[number]
            assert row.direction.split(":")[0] == direction, kind
            expected = transfers_reference.EXPECTED_BYTES[kind]
            if expected is None:
                assert row.direction.endswith(":scalar"), kind
            else:
                assert row.nbytes == expected, kind
            assert row.devices, kind


#: JAX's own refusal (jaxlib may prefix its status code).
REFUSED_BY_JAX = r"^(INVALID_ARGUMENT: )?Disallowed host-to-device transfer"


class TestTheUsersOwnGuard:
    """A watching policy never turns off a guard the user set in JAX (issue 42, M1)."""

    @pytest.fixture
    def global_disallow(self) -> Iterator[None]:
        jax.config.update("jax_transfer_guard", "disallow")
        try:
            yield
        finally:
            jax.config.update("jax_transfer_guard", None)

    @pytest.mark.parametrize(
        "watch",
        [{"host_to_device": "log"}, {"host_local": "log"}, {"device_to_device": "disallow"}],
        ids=["not-watched", "logged", "other-direction"],
    )
    @pytest.mark.usefixtures("global_disallow")
    def test_a_global_disallow_still_raises_jaxs_error(self, watch: dict[str, str]) -> None:
        """With `jax_transfer_guard=disallow` set globally, a policy that logs the direction
        or does not watch it leaves JAX's refusal standing, and reports nothing."""
        with (
            capture_logs() as logs,
            devpolicy.activate(policy_of(transfers=watch)),
            pytest.raises(Exception, match=REFUSED_BY_JAX),
        ):
            TWICE(HOST)
        assert transfers(logs) == []
        assert devpolicy.report().transfers == ()

    def test_a_users_thread_guard_inside_a_watched_block_still_refuses(self) -> None:
        """`with jax.transfer_guard("disallow")` inside a logging scope is the user's: it
        refuses with JAX's error."""
        p = policy_of(transfers={"host_local": "log"})
        with (
            capture_logs() as logs,
            p.scope("x"),
            jax.transfer_guard("disallow"),
            pytest.raises(Exception, match=REFUSED_BY_JAX),
        ):
            TWICE(HOST)
        assert transfers(logs) == []

    @pytest.mark.usefixtures("global_disallow")
    def test_devpolicys_own_disallow_is_still_its_own_error(self) -> None:
        """Where the policy refuses too, the error is devpolicy's, which names the site."""
        with (
            devpolicy.activate(policy_of(transfers={"host_local": "disallow"})),
            pytest.raises(devpolicy.errors.TransferRefusedError),
        ):
            TWICE(HOST)

    def test_a_users_log_level_is_kept_when_the_policy_logs_too(self) -> None:
        """The transfer reported by devpolicy runs at the user's own level (here allow):
        nothing of theirs is replaced by devpolicy's."""
        p = policy_of(transfers={"host_local": "log"})
        with capture_logs() as logs, devpolicy.activate(p):
            TWICE(HOST)
        assert len(transfers(logs)) == 1


class TestArmedOnlyWhereSomethingCanBeReported:
    """Watching costs nothing where every outcome is allow (issue 42, T1)."""

    SCRIPT = """
import sys, time
import numpy as np
import devpolicy, jax
from devpolicy._base import compat
policy = devpolicy.load_policy({"version": 1, "transfers": "log"}, environ={})
assert not compat.backends_started()
step = jax.jit(lambda b: b * 2)
batch = np.ones((4, 3), np.float32)
with devpolicy.activate(policy):
    step(batch)
    state, _ = compat.transfer_guard_state()
    print(state.host_to_device, state.device_to_device, state.device_to_host)
    with policy.scope("x"):
        print(state.host_to_device, state.device_to_device, state.device_to_host)
print(len(devpolicy.report().transfers))
"""

    @pytest.mark.slow
    def test_a_policy_activated_before_jax_starts_arms_nothing_on_one_cpu(
        self, tmp_path: Path
    ) -> None:
        """`transfers: log` activated before JAX's backends start, on a machine of one CPU
        device: after the first call nothing is armed (numpy into the CPU is host_local,
        allowed; there is no other device and no accelerator), so the loop keeps JAX's
        fast path; nothing is reported."""
        script = tmp_path / "early.py"
        script.write_text(self.SCRIPT)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVPOLICY_", "XLA_"))}
        env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
        out = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, check=False
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[:3] == ["None None None", "None None None", "0"]

    def test_several_cpu_devices_arm_device_to_device_only(self) -> None:
        """With four CPU devices (this suite's), `transfers: log` arms device_to_device
        (an array can be copied between them) and neither host direction."""
        _state, level = compat.transfer_guard_state()
        with devpolicy.activate(policy_of(transfers="log")):
            assert guard_levels() == (None, level.DISALLOW, None)


SITE_PACKAGE = """
import jax

DOUBLE = jax.jit(lambda a: a * 2)


def double(x):
    return DOUBLE(x)
"""


class TestSitesInLibraries:
    """A transfer is attributed to the user's line, not the library's (issue 42, T3)."""

    @pytest.fixture
    def library(self, tmp_path: Path) -> Iterator[Any]:
        packages = tmp_path / "lib" / "python3" / "site-packages"
        packages.mkdir(parents=True)
        (packages / "fakelib_t3.py").write_text(SITE_PACKAGE)
        sys.path.insert(0, str(packages))
        try:
            yield importlib.import_module("fakelib_t3")
        finally:
            sys.path.remove(str(packages))
            sys.modules.pop("fakelib_t3", None)

    def test_a_transfer_inside_an_installed_package_names_the_users_line(
        self, library: Any
    ) -> None:
        """The event's `site` is the line here that called the library, `function` this
        test; `library_site` the library's own line (its path inside site-packages)."""
        with capture_logs() as logs, devpolicy.activate(policy_of(transfers=WATCH_ALL)):
            site = here()
            library.double(HOST)
        (event,) = transfers(logs)
        assert str(event["site"]).endswith(site)
        assert event["function"] == (
            "TestSitesInLibraries.test_a_transfer_inside_an_installed_package_names_the_users_line"
        )
        assert event["library_site"] == "fakelib_t3.py:8"
        (row,) = devpolicy.report().transfers
        assert row.site.endswith(site)

    def test_a_transfer_in_the_users_own_code_has_no_library_site(self) -> None:
        """Where the user's line made the transfer itself, `library_site` is None."""
        with capture_logs() as logs, devpolicy.activate(policy_of(transfers=WATCH_ALL)):
            TWICE(HOST)
        (event,) = transfers(logs)
        assert event["library_site"] is None

    def test_a_refusal_inside_a_library_names_the_users_line(self, library: Any) -> None:
        """TransferRefusedError's site is the user's line too."""
        with devpolicy.activate(policy_of(transfers={"host_local": "disallow"})):
            site = here(2)
            with pytest.raises(devpolicy.errors.TransferRefusedError) as refused:
                library.double(HOST)
        assert refused.value.site.endswith(site)


def held(scope: Any) -> Iterator[None]:
    """A generator holding `scope` open across its pause."""
    with scope:
        yield


class TestExitsThatDoNotPairUp:
    """Scopes closed in another order than opened leave nothing watched (issue 42, M3)."""

    def test_generators_closed_first_opened_first_leave_no_watch(self) -> None:
        """Two watching scopes held by generators, the first closed first: the second
        still watches, and once both are closed the thread is as before (numpy allowed,
        nothing watched)."""
        before = guard_levels()
        p = policy_of(transfers={"host_local": "disallow"})
        first, second = held(p.scope("a")), held(p.scope("b"))
        next(first)
        next(second)
        first.close()
        with pytest.raises(devpolicy.errors.TransferRefusedError):
            TWICE(HOST)  # the second scope is still open
        second.close()
        assert guard_levels() == before
        assert transfers_module.current_watch() is None
        TWICE(HOST)

    def test_a_watching_scope_closed_after_a_plain_activation_restores_the_thread(
        self,
    ) -> None:
        """A watch held by a generator, closed after the policy entered later: the thread
        is left as before the first entry."""
        before = guard_levels()
        watching = policy_of(transfers={"host_local": "disallow"})
        other = policy_of(transfers={"device_to_device": "log"})
        first, second = held(watching.scope("a")), held(other.scope("b"))
        next(first)
        next(second)
        first.close()
        second.close()
        assert guard_levels() == before
        assert transfers_module.current_watch() is None
