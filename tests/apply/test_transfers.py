"""Implicit transfers (`transfers:`): seen with the user's line, counted, refused, per thread."""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import SingleDeviceSharding
from structlog.testing import capture_logs

import devpolicy
from devpolicy._base import compat
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
        on_cpu0 = jax.jit(lambda a: a + 1, in_shardings=SingleDeviceSharding(cpus[0]))
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
        sharding = SingleDeviceSharding(cpus[3])
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
