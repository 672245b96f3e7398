"""A group placed (`devpolicy._apply.stream.placing`): decided once per shape by the rule
for the stream's name, sharded over a mesh where the rule says so, a plain `device_put`
under DEVPOLICY_DISABLE."""

from __future__ import annotations

import jax
import numpy as np

import devpolicy
from devpolicy._apply.stream.groups import every_window
from devpolicy._apply.stream.placing import GroupPlacer
from devpolicy._apply.stream.reads.memory import MemoryGather
from tests.apply.streams import where
from tests.helpers import policy_of


class TestPlacing:
    """A group placed as the policy decides its batch: sharded by the rule, or as JAX puts
    it where devpolicy is disabled."""

    def test_batches_are_sharded_over_a_mesh_by_the_rule(self) -> None:
        """A sharded batch rule: each batch split by rows over the 4 devices, values
        exact, the last smaller batch decided for its own shape."""
        mesh = {"grid": {"axes": {"data": 4}, "devices": "cpu"}}
        rule = {"match": "batch", "sharding": {"mesh": "grid", "spec": ["data"]}}
        policy = policy_of(meshes=mesh, rules=[rule], fallback=["cpu:3"])
        tokens = np.arange(40 * 8, dtype=np.int32).reshape(40, 8)
        out = list(devpolicy.windows(tokens, 4, 8, stride=3, policy=policy))
        assert [b.shape for b in out] == [(8, 4, 8)] * 1 + [(5, 4, 8)]
        assert out[0].sharding.spec == jax.sharding.PartitionSpec("data")
        assert len(out[0].sharding.device_set) == 4
        starts = [s for b in out for s in np.asarray(b)[:, 0, 0].tolist()]
        assert starts == [8 * 3 * i for i in range(13)]

    def test_under_devpolicy_disable_batches_are_a_plain_device_put(self) -> None:
        """DEVPOLICY_DISABLE: batches land where `jax.device_put` puts them (the default
        device, uncommitted), as `put` does, values unchanged."""
        policy = devpolicy.load_policy(
            {"version": 1, "default": "cpu:3"}, environ={"DEVPOLICY_DISABLE": "1"}
        )
        out = list(devpolicy.windows(np.arange(20, dtype=np.int32), 5, 2, policy=policy))
        assert {where(b) for b in out} == {"cpu:0"}
        assert not any(b.committed for b in out)
        assert np.asarray(out[1]).tolist() == [[10, 11, 12, 13, 14], [15, 16, 17, 18, 19]]


class TestThePlacer:
    def test_a_shape_is_decided_once_and_the_first_decision_is_the_streams(self) -> None:
        policy = policy_of(rules=[{"match": "placed", "device": "cpu:2"}])
        placer = GroupPlacer(policy.decider, "placed", "exact", np.dtype(np.int32), (4,))
        assert placer.decided is None
        tokens = np.arange(100, dtype=np.int32)
        path = MemoryGather(every_window(tokens, 4), None)
        placed, nbytes = placer.place(np.array([[0, 10], [20, 30]]), None, path)
        assert [np.asarray(b)[:, 0].tolist() for b in placed] == [[0, 10], [20, 30]]
        assert {where(b) for b in placed} == {"cpu:2"}
        assert nbytes == 2 * 2 * 4 * 4
        assert placer.decided is not None
        first = placer.decided
        placer.place(np.array([[5]]), None, path)  # another shape: its own plan
        assert placer.decided is first

    def test_one_process_draws_every_row_of_its_batch(self) -> None:
        policy = policy_of(rules=[{"match": "placed", "device": "cpu:2"}])
        placer = GroupPlacer(policy.decider, "placed", "exact", np.dtype(np.int32), (4,))
        rows = placer.process_rows(6)
        assert (rows.own.tolist(), rows.per_step) == (list(range(6)), 6)
        assert jax.process_count() == 1
