"""`plan_transfers`: which arguments of a jit call JAX would move, before the call."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from structlog.testing import capture_logs

import devpolicy
from devpolicy._decide.decision import single_device_sharding
from devpolicy._machine.ledger import forget_transfers
from devpolicy._policy.transfer_plans import plan_transfers
from devpolicy.errors import TransferPlanError
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
                jax.jit(lambda a: a + 1, in_shardings=single_device_sharding(cpus[0])),
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


class TestUnusedArguments:
    """JAX drops what a step does not use (keep_unused=False): the plan says so, no move."""

    def test_an_unused_argument_leaf_and_keyword_are_planned_as_unused(self) -> None:
        """Each unused one is listed unused, with no devices, direction or bytes; the used
        ones are planned as the call then reports them."""
        step = jax.jit(lambda params, batch, seed, *, mask=None: params["w"] * batch)
        args = ({"w": HOST, "b": HOST}, HOST, HOST)
        plan = plan_transfers(step, args, {"mask": HOST}, policy=policy_of(transfers=WATCH_ALL))
        assert [a.argument for a in plan.unused] == [
            "args[0]['b']",
            "args[2]",
            "kwargs['mask']",
        ]
        assert all(
            (a.devices, a.direction, a.nbytes, a.mode, a.source) == ((), None, 0, "allow", "numpy")
            for a in plan.unused
        )
        assert [a.argument for a in plan.moved] == ["args[0]['w']", "args[1]"]
        events = events_of_calling(lambda *a: step(*a, mask=HOST), *args)
        assert plan.nbytes == sum(int(e["nbytes"]) for e in events) == 2 * HOST.nbytes  # type: ignore[call-overload]

    def test_the_text_says_which_arguments_are_unused(self) -> None:
        """str() counts the unused ones and lists each as not transferred."""
        plan = plan_transfers(jax.jit(lambda a, b: a), (HOST, HOST))
        first, _moved, unused = str(plan).splitlines()
        assert first.endswith("<lambda>: 1 of 2 arguments moved, 48 bytes, 1 unused")
        assert unused == "  args[1]: float32[4, 3] numpy, unused: JAX drops it, nothing moved"

    def test_a_flax_training_step_with_unused_state_is_planned(
        self, cpus: list[jax.Device]
    ) -> None:
        """A flax nnx model split into state and jitted with an optimizer step: the state's
        leaves the step does not read (a dropout key, a counter) and an unused argument
        are unused; the rest is planned as the real call reports it."""
        import optax
        from flax import nnx

        class Model(nnx.Module):
            def __init__(self) -> None:
                self.linear = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
                self.dropout = nnx.Dropout(0.5, rngs=nnx.Rngs(dropout=1))

            def __call__(self, x: jax.Array) -> jax.Array:
                return self.linear(x)

        graphdef, params, rest = nnx.split(Model(), nnx.Param, ...)
        tx = optax.sgd(0.1)
        opt_state = tx.init(params)

        def train_step(
            params: object, opt_state: object, rest: object, batch: jax.Array, step: int
        ) -> object:
            def loss(p: object) -> jax.Array:
                return nnx.merge(graphdef, p, rest)(batch).sum()

            grads = jax.grad(loss)(params)
            updates, new_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), new_state

        step = jax.jit(train_step, in_shardings=single_device_sharding(cpus[0]))
        on_cpu1 = jax.device_put((params, opt_state, rest), cpus[1])
        call = (*on_cpu1, HOST, 7)
        plan = plan_transfers(step, call, policy=policy_of(transfers=WATCH_ALL))
        unused = [a.argument for a in plan.unused]
        assert "args[4]" in unused
        assert any("rngs" in a and "key" in a for a in unused)
        events = events_of_calling(step, *call)
        assert sorted(
            (a.direction, a.source, a.nbytes) for a in plan.moved if not a.scalar
        ) == sorted((e["direction"], e["source"], e["nbytes"]) for e in events if not e["scalar"])


class TestTypedKeys:
    def test_a_typed_prng_key_is_planned_with_its_dtype_and_bytes(
        self, cpus: list[jax.Device]
    ) -> None:
        """jax.random.key on another device: key<fry>, the bytes the call moves, as data."""
        step = jax.jit(
            lambda k: jax.random.normal(k, (3,)), in_shardings=single_device_sharding(cpus[0])
        )
        key = jax.device_put(jax.random.key(0), cpus[1])
        (argument,) = plan_transfers(step, (key,), policy=policy_of(transfers=WATCH_ALL)).arguments
        assert (argument.dtype, argument.shape, argument.source, argument.devices) == (
            "key<fry>",
            (),
            "cpu:1",
            ("cpu:0",),
        )
        assert (argument.nbytes, argument.scalar, argument.mode) == (8, False, "log")
        (event,) = events_of_calling(step, key)
        assert (event["nbytes"], event["scalar"]) == (argument.nbytes, argument.scalar)

    def test_a_shape_of_keys_is_planned_too(self, cpus: list[jax.Device]) -> None:
        """A ShapeDtypeStruct of keys with a sharding stands for keys placed there."""
        keys = jax.ShapeDtypeStruct(
            (4,), jax.random.key(0).dtype, sharding=single_device_sharding(cpus[1])
        )
        step = jax.jit(lambda k: k, in_shardings=single_device_sharding(cpus[0]))
        (argument,) = plan_transfers(step, (keys,)).arguments
        assert (argument.dtype, argument.nbytes, argument.direction) == (
            "key<fry>",
            32,
            "device_to_device",
        )


class TestDevicesAsTheEventListsThem:
    def test_a_device_that_already_holds_the_array_receives_nothing(
        self, cpus: list[jax.Device]
    ) -> None:
        """Replicated over 4 devices from cpu:0: the bytes go to cpu:1..3, as the event says;
        sharding_devices lists all four."""
        mesh = jax.make_mesh((4,), ("data",), devices=cpus)
        step = jax.jit(lambda a: a + 1, in_shardings=NamedSharding(mesh, PartitionSpec()))
        on_cpu0 = jax.device_put(HOST, cpus[0])
        plan = plan_transfers(step, (on_cpu0,), policy=policy_of(transfers=WATCH_ALL))
        (moved,) = plan.moved
        (event,) = events_of_calling(step, on_cpu0)
        assert list(moved.devices) == event["devices"] == ["cpu:1", "cpu:2", "cpu:3"]
        assert moved.sharding_devices == ("cpu:0", "cpu:1", "cpu:2", "cpu:3")
        assert moved.nbytes == event["nbytes"] == 3 * HOST.nbytes
        line = str(plan).splitlines()[1]
        assert line == (
            "  args[0]: float32[4, 3] cpu:0 -> cpu:1,cpu:2,cpu:3, device_to_device, "
            "144 bytes (cpu:0 holds it already)"
        )

    def test_for_every_case_the_devices_are_those_of_the_event(
        self, cpus: list[jax.Device]
    ) -> None:
        """Each predicted move's devices are the devices of its event in the real call."""
        for case, step, args in TestPredictionMatchesTheCall().cases(cpus):
            planned = plan_transfers(step, args, policy=policy_of(transfers=WATCH_ALL))
            events = events_of_calling(step, *args)
            assert sorted((a.source, list(a.devices)) for a in planned.moved) == sorted(
                (e["source"], e["devices"]) for e in events
            ), case


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
        step = jax.jit(lambda a: a + 1, in_shardings=single_device_sharding(cpus[0]))
        text = str(plan_transfers(step, (jax.device_put(HOST, cpus[3]),)))
        first, move = text.splitlines()
        assert first.endswith("<lambda>: 1 of 1 arguments moved, 48 bytes")
        assert move == "  args[0]: float32[4, 3] cpu:3 -> cpu:0, device_to_device, 48 bytes"


class TestThePolicysMode:
    def test_a_move_the_policy_disallows_is_listed_as_refused(self, cpus: list[jax.Device]) -> None:
        """mode says what transfers: would do; the real call is then refused as predicted."""
        p = policy_of(transfers={"device_to_device": "disallow", "host_local": "log"})
        step = jax.jit(lambda w, x: w + x, in_shardings=single_device_sharding(cpus[0]))
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
        on_cpu0 = jax.jit(lambda t: t["w"].sum(), in_shardings=single_device_sharding(cpus[0]))
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
        step = jax.jit(lambda a: a, in_shardings=single_device_sharding(cpus[0]))
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
            match=r"^plan_transfers\(.*step\): not a jitted function .*jax\.jit",
        ):
            plan_transfers(step, (HOST,))

    def test_a_str_as_the_function_is_refused_naming_it(self) -> None:
        """A name where the function belongs is no function: said, not a raw TypeError."""
        with pytest.raises(
            TransferPlanError,
            match=r"^plan_transfers\('step'\): a str is not a function; pass the jitted",
        ):
            plan_transfers("step", (HOST,))  # type: ignore[arg-type]

    def test_a_mapping_as_the_policy_is_refused_with_the_fix(self) -> None:
        """policy= takes a Policy: a dict is refused with load_policy as the way."""
        with pytest.raises(
            TransferPlanError,
            match=r"^plan_transfers\(.*<lambda>\): policy: a dict is not a Policy; .*load_policy",
        ):
            plan_transfers(jax.jit(lambda a: a), (HOST,), policy={"version": 1})  # type: ignore[arg-type]

    def test_an_array_as_args_is_refused_not_split_into_rows(self) -> None:
        """args is the tuple of arguments: one array there is refused, with (x,) as the fix."""
        with pytest.raises(
            TransferPlanError,
            match=r"^plan_transfers\(.*<lambda>\): args: a numpy\.ndarray is not a tuple .*\(x,\)",
        ):
            plan_transfers(jax.jit(lambda a: a), HOST)

    def test_keyword_arguments_that_are_no_mapping_are_refused(self) -> None:
        """kwargs is a mapping of names to arguments: a tuple there is refused."""
        with pytest.raises(
            TransferPlanError,
            match=r"^plan_transfers\(.*<lambda>\): kwargs: a tuple is not a mapping",
        ):
            plan_transfers(jax.jit(lambda a: a), (), (HOST,))  # type: ignore[arg-type]


class TestCallsThatWouldFail:
    """Where the planned call would fail, the plan says so, as devpolicy's error."""

    def test_devices_a_computation_cannot_span_are_the_plans_finding(
        self, cpus: list[jax.Device]
    ) -> None:
        """Committed to two devices: the call's failure, JAX's words kept, chained."""
        step = jax.jit(lambda a, b: a + b)
        a, b = jax.device_put(HOST, cpus[0]), jax.device_put(HOST, cpus[1])
        with pytest.raises(ValueError, match="incompatible devices"):
            step(a, b)
        with pytest.raises(
            TransferPlanError,
            match=r"^plan_transfers\(.*<lambda>\): the call would fail: Received incompatible devices",
        ) as caught:
            plan_transfers(step, (a, b))
        assert isinstance(caught.value.__cause__, ValueError)

    def test_a_deleted_array_is_reported_as_the_call_would_raise(
        self, cpus: list[jax.Device]
    ) -> None:
        """A deleted (donated) array makes the call raise: the plan names it, no move."""
        step = jax.jit(lambda p: p["w"] + 1, in_shardings=single_device_sharding(cpus[0]))
        gone = jax.device_put(HOST, cpus[1])
        gone.delete()
        with pytest.raises(RuntimeError, match="deleted"):
            step({"w": gone})
        with pytest.raises(
            TransferPlanError,
            match=r"^plan_transfers\(.*<lambda>\): args\[0\]\['w'\]: a deleted array "
            r"\(float32\[4, 3\]\): the call would raise",
        ):
            plan_transfers(step, ({"w": gone},))

    def test_a_deleted_array_the_step_does_not_use_is_unused_as_in_the_call(self) -> None:
        """JAX drops an unused argument before looking at it: the call runs, the plan too."""
        step = jax.jit(lambda a, unused: a + 1)
        gone = jax.device_put(HOST)
        gone.delete()
        step(HOST, gone)
        plan = plan_transfers(step, (HOST, gone))
        assert [a.argument for a in plan.unused] == ["args[1]"]
