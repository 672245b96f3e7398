"""`plan_transfers`: which arguments of a jit call JAX would move, before the call."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding
from structlog.testing import capture_logs

import devpolicy
from devpolicy._machine.ledger import forget_transfers
from devpolicy._policy.transfer_plans import plan_transfers
from tests.helpers import policy_of

WATCH_ALL = {"host_to_device": "log", "device_to_device": "log", "host_local": "log"}
HOST = np.arange(12, dtype=np.float32).reshape(4, 3)


@pytest.fixture(autouse=True)
def _counts() -> Iterator[None]:
    forget_transfers()
    yield
    forget_transfers()


def events_of_calling(step: object, *args: object) -> list[dict[str, object]]:
    """The transfer events of really calling `step(*args)` under a policy watching all
    (at debug: a repeat at the same line is an event too)."""
    watching = policy_of(transfers=WATCH_ALL, logging={"level": "debug"})
    with capture_logs() as logs, devpolicy.activate(watching):
        step(*args)  # type: ignore[operator]
    return [e for e in logs if e["event"] == "transfer"]


class TestPredictionMatchesTheCall:
    """Each prediction is what the transfer events of the real call then say."""

    def cases(self, cpus: list[jax.Device]) -> list[tuple[str, object, tuple[object, ...]]]:
        mesh = jax.make_mesh((2,), ("data",), devices=cpus[:2])
        committed = jax.device_put(HOST, cpus[1])
        return [
            ("numpy into a jit", jax.jit(lambda a: a * 2), (HOST,)),
            (
                "committed into another device's jit",
                jax.jit(lambda a: a + 1, in_shardings=SingleDeviceSharding(cpus[0])),
                (committed,),
            ),
            (
                "numpy into a 2-device NamedSharding",
                jax.jit(lambda a: a + 1, in_shardings=NamedSharding(mesh, PartitionSpec("data"))),
                (HOST,),
            ),
            (
                "numpy into 2 replicas",
                jax.jit(lambda a: a + 1, in_shardings=NamedSharding(mesh, PartitionSpec())),
                (HOST,),
            ),
            (
                "uncommitted with committed",
                jax.jit(lambda a, b: a * b),
                (jnp.ones((4, 3), jnp.float32), committed),
            ),
        ]

    def test_direction_devices_and_bytes_are_those_the_call_reports(
        self, cpus: list[jax.Device]
    ) -> None:
        """For every case, each predicted move is one event of the real call, field by field."""
        for case, step, args in self.cases(cpus):
            planned = plan_transfers(step, args, policy=policy_of(transfers=WATCH_ALL))
            events = events_of_calling(step, *args)
            predicted = sorted(
                (a.direction, a.source, a.nbytes, list(a.shape)) for a in planned.moved
            )
            seen = sorted((e["direction"], e["source"], e["nbytes"], e["shape"]) for e in events)
            assert predicted == seen, case
            assert planned.nbytes == sum(int(e["nbytes"]) for e in events), case  # type: ignore[call-overload]

    def test_an_argument_already_where_the_jit_takes_it_is_not_moved(
        self, cpus: list[jax.Device]
    ) -> None:
        """A committed array into a jit without in_shardings stays: no move, no bytes."""
        step = jax.jit(lambda a: a * 2)
        committed = jax.device_put(HOST, cpus[2])
        (argument,) = plan_transfers(step, (committed,)).arguments
        assert (argument.direction, argument.nbytes, argument.source) == (None, 0, "cpu:2")
        assert argument.devices == ("cpu:2",)
        assert events_of_calling(step, committed) == []


class TestWhatItSays:
    def test_each_argument_is_named_by_its_place_in_the_call(self) -> None:
        """Leaves of trees and keyword arguments are named as JAX writes tree paths."""
        step = jax.jit(lambda params, *, batch: params["w"] * batch)
        plan = plan_transfers(step, ({"w": HOST},), {"batch": HOST})
        assert [a.argument for a in plan.arguments] == ["args[0]['w']", "kwargs['batch']"]

    def test_static_arguments_keep_their_positions(self, cpus: list[jax.Device]) -> None:
        """A static argument is no move, and the arguments after it keep their index."""
        step = jax.jit(lambda a, n, b: a * n + b, static_argnums=(1,))
        plan = plan_transfers(step, (HOST, 3, HOST))
        assert [a.argument for a in plan.arguments] == ["args[0]", "args[2]"]

    def test_host_data_counts_as_jax_sends_it(self) -> None:
        """float64 numpy goes as float32 (x64 off), a Python scalar as a 0-d scalar move."""
        plan = plan_transfers(jax.jit(lambda a, s: a * s), (HOST.astype(np.float64), 2.0))
        array, scalar = plan.arguments
        assert (array.dtype, array.nbytes) == ("float32", 48)
        assert (scalar.dtype, scalar.shape, scalar.scalar) == ("float32", (), True)

    def test_the_text_lists_each_move_and_the_total(self, cpus: list[jax.Device]) -> None:
        """str() gives one line per moved argument, source to destination, with bytes."""
        step = jax.jit(lambda a: a + 1, in_shardings=SingleDeviceSharding(cpus[0]))
        text = str(plan_transfers(step, (jax.device_put(HOST, cpus[3]),)))
        first, move = text.splitlines()
        assert first.endswith("<lambda>: 1 of 1 arguments moved, 48 bytes")
        assert move == "  args[0]: float32[4, 3] cpu:3 -> cpu:0, device_to_device, 48 bytes"


class TestThePolicysMode:
    def test_a_move_the_policy_disallows_is_listed_as_refused(self, cpus: list[jax.Device]) -> None:
        """mode says what transfers: would do; the real call is then refused as predicted."""
        p = policy_of(transfers={"device_to_device": "disallow", "host_local": "log"})
        step = jax.jit(lambda w, x: w + x, in_shardings=SingleDeviceSharding(cpus[0]))
        w = jax.device_put(HOST, cpus[1])
        plan = plan_transfers(step, (w, HOST), policy=p)
        assert [(a.argument, a.mode) for a in plan.arguments] == [
            ("args[0]", "disallow"),
            ("args[1]", "log"),
        ]
        assert [a.argument for a in plan.refused] == ["args[0]"]
        with devpolicy.activate(p), pytest.raises(devpolicy.errors.TransferRefusedError):
            step(w, HOST)

    def test_the_active_policy_is_used_when_none_is_given(self) -> None:
        """Without policy=, the modes are the active policy's."""
        with devpolicy.activate(policy_of(transfers={"host_local": "disallow"})):
            (argument,) = plan_transfers(jax.jit(lambda a: a), (HOST,)).arguments
        assert argument.mode == "disallow"

    def test_without_transfers_every_mode_is_allow(self) -> None:
        """A policy without transfers: refuses and logs nothing, so every mode is allow."""
        (argument,) = plan_transfers(jax.jit(lambda a: a), (HOST,), policy=policy_of()).arguments
        assert (argument.direction, argument.mode) == ("host_to_device", "allow")


class TestPlannedBeforeLoading:
    def test_a_tree_of_the_policys_shardings_is_planned_without_arrays(
        self, cpus: list[jax.Device]
    ) -> None:
        """ShapeDtypeStructs carrying devpolicy.shardings stand for the arrays placed there."""
        p = policy_of(rules=[{"match": "params/*", "device": "cpu:1"}])
        abstract = {"w": jax.ShapeDtypeStruct((256, 4), np.float32)}
        with devpolicy.activate(p):
            where = devpolicy.shardings("params", abstract)
        planned = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, where
        )
        on_cpu0 = jax.jit(lambda t: t["w"].sum(), in_shardings=SingleDeviceSharding(cpus[0]))
        (argument,) = plan_transfers(on_cpu0, (planned,)).arguments
        assert (argument.source, argument.devices, argument.nbytes) == ("cpu:1", ("cpu:0",), 4096)
        assert plan_transfers(jax.jit(lambda t: t["w"].sum()), (planned,)).moved == ()

    def test_a_shape_without_a_sharding_is_unknown_never_a_move(self) -> None:
        """Nothing says where such an argument will be: source unknown, no direction."""
        (argument,) = plan_transfers(
            jax.jit(lambda a: a), (jax.ShapeDtypeStruct((4,), np.float32),)
        ).arguments
        assert (argument.source, argument.direction, argument.nbytes) == ("unknown", None, 0)


class TestNothingHappens:
    def test_nothing_is_logged_moved_or_counted(self, cpus: list[jax.Device]) -> None:
        """A plan logs no event, adds no transfer to report(), and leaves the arrays alone."""
        w = jax.device_put(HOST, cpus[1])
        step = jax.jit(lambda a: a, in_shardings=SingleDeviceSharding(cpus[0]))
        with capture_logs() as logs, devpolicy.activate(policy_of(transfers=WATCH_ALL)):
            plan_transfers(step, (w,))
        assert logs == []
        assert devpolicy.report().transfers == ()
        assert w.devices() == {cpus[1]}


class TestBadInput:
    def test_a_function_that_is_not_jitted_is_refused_with_the_fix(self) -> None:
        """A plain function has no compiled shardings: the error says to wrap it in jax.jit."""

        def step(a: jax.Array) -> jax.Array:
            return a

        with pytest.raises(
            devpolicy.DevicePolicyError,
            match=r"^plan_transfers: .*step is not a jitted function .*jax\.jit",
        ):
            plan_transfers(step, (HOST,))

    def test_arguments_the_call_would_refuse_raise_what_the_call_raises(
        self, cpus: list[jax.Device]
    ) -> None:
        """Committed to devices a computation cannot span: JAX's own error, as the call."""
        step = jax.jit(lambda a, b: a + b)
        a, b = jax.device_put(HOST, cpus[0]), jax.device_put(HOST, cpus[1])
        with pytest.raises(ValueError, match="incompatible devices"):
            plan_transfers(step, (a, b))
