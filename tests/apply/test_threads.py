"""Threads, executors and asyncio: scopes never leak, and can be carried on purpose."""

from __future__ import annotations

import asyncio
import functools
import random
import threading
from concurrent.futures import ThreadPoolExecutor as PlainExecutor

import jax
import jax.numpy as jnp
import pytest

import devpolicy
from devpolicy._apply import transfers
from tests.helpers import policy_of, run_threads

POLICY = policy_of(rules=[{"match": f"d{i}", "device": f"cpu:{i}"} for i in range(4)])


def where(x: jax.Array) -> jax.Device:
    (device,) = x.devices()
    return device


class TestRawJaxIsThreadLocal:
    def test_a_plain_executor_does_not_see_the_scope(self, cpus: list[jax.Device]) -> None:
        """The bug devpolicy.propagate exists for: workers start on JAX's default device."""
        with POLICY.scope("d2"), PlainExecutor(1) as pool:
            assert where(pool.submit(lambda: jnp.zeros(1)).result()) == cpus[0]


class TestPropagate:
    def test_propagated_function_runs_in_the_callers_scope(self, cpus: list[jax.Device]) -> None:
        """A thread running a propagated callable places arrays on the caller's device."""
        with POLICY.scope("d3"):
            fn = devpolicy.propagate(lambda: jnp.zeros(1))
        out: list[jax.Array] = []
        t = threading.Thread(target=lambda: out.append(fn()))
        t.start()
        t.join()
        assert where(out[0]) == cpus[3]

    def test_propagate_carries_the_active_policy(self) -> None:
        """Activation (a context variable) travels with the callable."""
        with devpolicy.activate(policy_of(default="cpu:2")):
            fn = devpolicy.propagate(lambda: devpolicy.resolve("x").device_text)
        with PlainExecutor(1) as pool:
            assert pool.submit(fn).result() == "cpu:2"

    def test_workers_end_on_their_own_default(self) -> None:
        """After a propagated call the worker thread is back on its default device."""
        with POLICY.scope("d1"):
            fn = devpolicy.propagate(lambda: None)
        with PlainExecutor(1) as pool:
            pool.submit(fn).result()
            assert pool.submit(lambda: jax.config.jax_default_device).result() is None

    def test_one_propagated_callable_runs_in_many_threads_at_once(
        self, cpus: list[jax.Device]
    ) -> None:
        """Each call gets its own copy of the context, so concurrent calls work."""
        barrier = threading.Barrier(4)

        def work() -> jax.Device:
            barrier.wait(5)
            return where(jnp.zeros(1))

        with POLICY.scope("d1"):
            fn = devpolicy.propagate(work)
        with PlainExecutor(4) as pool:
            assert {f.result() for f in [pool.submit(fn) for _ in range(4)]} == {cpus[1]}

    def test_to_thread_with_propagate(self, cpus: list[jax.Device]) -> None:
        """asyncio.to_thread copies context variables but not JAX's device; propagate does both."""

        @POLICY.place("d2")
        async def main() -> tuple[jax.Device, jax.Device]:
            plain = await asyncio.to_thread(lambda: where(jnp.zeros(1)))
            carried = await asyncio.to_thread(devpolicy.propagate(lambda: where(jnp.zeros(1))))
            return plain, carried

        assert asyncio.run(main()) == (cpus[0], cpus[2])


class TestExecutor:
    def test_submit_and_map_carry_the_submitters_scope(self, cpus: list[jax.Device]) -> None:
        """devpolicy.threads.ThreadPoolExecutor is a drop-in pool whose tasks see the scope."""
        with devpolicy.threads.ThreadPoolExecutor(2) as pool:
            with POLICY.scope("d3"):
                submitted = pool.submit(jnp.zeros, 2)
                mapped = list(pool.map(lambda i: jnp.full(1, i), range(4)))
            outside = pool.submit(jnp.zeros, 1)
        assert where(submitted.result()) == cpus[3]
        assert {where(x) for x in mapped} == {cpus[3]}
        assert where(outside.result()) == cpus[0]


class TestCoroutines:
    @pytest.mark.parametrize("watching", [False, True], ids=["plain", "with transfers:"])
    def test_scope_written_in_an_async_body_is_rejected(self, watching: bool) -> None:
        """`with scope()` in a coroutine would leak across awaits: a clear error says what
        to do; a policy with `transfers:` makes the same check (issue 42, M2): nothing is
        entered, nothing watched."""
        policy = policy_of(transfers={"host_local": "log"}) if watching else POLICY

        async def main() -> None:
            with policy.scope("d1"):
                await asyncio.sleep(0)

        with pytest.raises(
            devpolicy.errors.ScopeInCoroutineError,
            match=r"Decorate the async function with @devpolicy\.place\('d1'\)",
        ):
            asyncio.run(main())
        assert jax.config.jax_default_device is None
        assert transfers.current_watch() is None

    def test_scope_in_a_plain_function_called_from_a_coroutine_is_fine(
        self, cpus: list[jax.Device]
    ) -> None:
        """Sync code cannot await, so a scope there is safe even under an event loop."""

        def load() -> jax.Array:
            with POLICY.scope("d1"):
                return jnp.zeros(1)

        async def main() -> jax.Array:
            return load()

        assert where(asyncio.run(main())) == cpus[1]

    def test_interleaved_tasks_keep_their_devices_and_leave_nothing(
        self, cpus: list[jax.Device]
    ) -> None:
        """Many decorated tasks interleaving at awaits each see only their own device."""

        def task_for(i: int) -> object:
            @POLICY.place(f"d{i}")
            async def task() -> set[jax.Device]:
                seen = set()
                for _ in range(10):
                    seen.add(where(jnp.zeros(1)))
                    await asyncio.sleep(0)
                return seen

            return task

        async def main() -> list[set[jax.Device]]:
            return list(await asyncio.gather(*(task_for(i % 4)() for i in range(12))))  # type: ignore[operator]

        results = asyncio.run(main())
        assert results == [{cpus[i % 4]} for i in range(12)]
        assert jax.config.jax_default_device is None

    def test_cancelled_task_leaves_no_device(self) -> None:
        """Cancellation at an await runs cleanup inside the scope and leaves the thread clean."""

        @POLICY.place("d3")
        async def slow() -> None:
            await asyncio.sleep(10)

        async def main() -> None:
            task = asyncio.create_task(slow())
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        assert jax.config.jax_default_device is None


class TestStress:
    @pytest.mark.slow
    def test_sixteen_threads_by_a_thousand_scopes_with_random_exceptions(
        self, cpus: list[jax.Device]
    ) -> None:
        """Every array lands on its thread's decided device; every thread ends on its default."""
        failures: list[str] = []
        ended: list[object] = []

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(1000):
                i = rng.randrange(4)
                try:
                    with POLICY.scope(f"d{i}") as decision:
                        if where(jnp.zeros(1)) != decision.device or decision.device != cpus[i]:
                            failures.append(f"thread {seed}: wanted cpu:{i}")
                        if rng.random() < 0.2:
                            raise ValueError("random failure")
                        if rng.random() < 0.2:
                            with POLICY.scope(f"d{(i + 1) % 4}"):
                                if where(jnp.zeros(1)) != cpus[(i + 1) % 4]:
                                    failures.append(f"thread {seed}: nested")
                            if where(jnp.zeros(1)) != cpus[i]:
                                failures.append(f"thread {seed}: not restored after nesting")
                except ValueError:
                    pass
            ended.append(jax.config.jax_default_device)

        run_threads(*(functools.partial(worker, seed) for seed in range(16)))
        assert failures == []
        assert ended == [None] * 16


class TestSharedScopeObjects:
    def test_two_threads_entering_one_scope_at_once_each_restore_their_own_device(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`policy.scope("x")` hands every thread the same object; interleaved entries (a
        thread switch forced between reading and recording the entry) still pair up."""
        import threading
        import time

        import jax
        import jax.numpy as jnp

        from devpolicy._apply import scope as _scope
        from tests.helpers import policy_of

        real = _scope.get_device

        def slow_read() -> object:
            time.sleep(0.005)  # give the other thread the GIL here
            return real()

        monkeypatch.setattr(_scope, "get_device", slow_read)
        policy = policy_of(default="cpu:1")
        shared = policy.scope("x")
        results: dict[int, object] = {}
        barrier = threading.Barrier(2)

        def run(i: int) -> None:
            before = jax.config.jax_default_device
            barrier.wait()
            with shared:
                inside = next(iter(jnp.zeros(1).devices()))
            results[i] = (
                devpolicy.inventory().text(inside),
                jax.config.jax_default_device == before,
            )

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert results == {0: ("cpu:1", True), 1: ("cpu:1", True)}
