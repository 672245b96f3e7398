"""The policy's meshes (`_machine/meshes.py`): hybrid (multi-slice) meshes laid out as
JAX's `create_hybrid_device_mesh` lays them out, and a mesh the program built."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import devpolicy
from devpolicy._document.schema import MeshSpec
from devpolicy._machine.machine import VirtualMachine, hybrid_order
from devpolicy._machine.meshes import Meshes
from tests.helpers import policy_of, write


@dataclass(frozen=True)
class FakeDevice:
    """What JAX's mesh_utils reads of a device off TPU: enough to ask it for a layout."""

    id: int
    process_index: int
    platform: str = "cpu"
    device_kind: str = "cpu"


JAX_VERSION = jax.__version_info__


def layout(order: Any) -> list[tuple[int, int]]:
    """(process, id) of each device, in mesh order."""
    return [(d.process_index, d.id) for d in order]


class TestHybridOrder:
    @pytest.mark.parametrize(
        ("processes", "per_process", "sizes", "dcn"),
        [
            (2, 2, (2, 2), (2, 1)),
            (2, 2, (2, 2), (1, 2)),
            (2, 4, (2, 4), (2, 1)),
            (2, 4, (2, 2, 2), (1, 1, 2)),
            (4, 2, (4, 2), (2, 2)),
            (4, 2, (2, 4), (2, 2)),
            (3, 2, (3, 2), (3, 1)),
        ],
    )
    def test_the_order_is_jaxs_create_hybrid_device_mesh(
        self, processes: int, per_process: int, sizes: tuple[int, ...], dcn: tuple[int, ...]
    ) -> None:
        """For every split tried, the order devpolicy computes without JAX (for a machine
        described in words) is the one JAX's own function gives, process as the slice."""
        devices = [
            FakeDevice(p * per_process + i, p) for p in range(processes) for i in range(per_process)
        ]
        ici = tuple(s // d for s, d in zip(sizes, dcn, strict=True))
        expected = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=True)
        assert expected.shape == sizes
        assert layout(hybrid_order(devices, sizes, dcn)) == layout(expected.flat)

    def test_gpu_slices_are_ordered_by_id_as_jax_orders_them(self) -> None:
        """A GPU slice listed out of id order is laid out by id; JAX lays it out so from
        0.10.2 on (older JAX keeps the list order, which on a VirtualMachine is id order)."""
        devices = [FakeDevice(i, i // 2, "gpu", "H100") for i in (1, 0, 3, 2)]
        order = layout(hybrid_order(devices, (2, 2), (2, 1)))
        assert order == [(0, 0), (0, 1), (1, 2), (1, 3)]
        if JAX_VERSION >= (0, 10, 2):
            expected = mesh_utils.create_hybrid_device_mesh(
                (1, 2), (2, 1), devices, process_is_granule=True
            )
            assert order == layout(expected.flat)

    def test_slices_that_do_not_match_dcn_are_refused(self) -> None:
        """Two slices for a dcn of 4: a ValueError saying both counts."""
        devices = [FakeDevice(i, i // 2) for i in range(4)]
        with pytest.raises(ValueError, match=r"^2 slices for dcn \(4, 1\) \(4 slices\)$"):
            hybrid_order(devices, (4, 1), (4, 1))


HYBRID = MeshSpec(axes={"data": 1, "fsdp": -1}, dcn={"data": -1}, devices="cpu")


class TestHybridMeshes:
    def test_a_described_machine_lays_a_hybrid_mesh_out_process_by_process(self) -> None:
        """Two processes of 4 CPUs, dcn data=-1 and fsdp=-1 within: data=2 (2 slices) x
        fsdp=4, each row one process's devices; process 0 holds the first row."""
        vm = VirtualMachine(["cpu=4"], processes=2)
        built = Meshes({"h": HYBRID}, vm).build("h")
        assert not isinstance(built, str)
        assert built.shape == {"data": 2, "fsdp": 4}
        assert built.dcn == {"data": 2, "fsdp": 1}
        assert built.described == "data=2 (2x1) x fsdp=4 (1x4)"
        assert [(d.process_index, d.index) for d in built.devices] == [
            (p, i) for p in range(2) for i in range(4)
        ]
        assert [(d.process_index, d.index) for d in built.local] == [(0, i) for i in range(4)]
        assert built.mesh is None

    def test_an_axis_across_slices_and_within_interleaves_the_processes(self) -> None:
        """fsdp=2 within each slice and 2 slices along it: fsdp=4 holds process 0's two
        devices, then process 1's, as the hybrid layout blocks them."""
        spec = MeshSpec(axes={"fsdp": 2, "tensor": 2}, dcn={"fsdp": 2}, devices="cpu")
        built = Meshes({"h": spec}, VirtualMachine(["cpu=4"], processes=2)).build("h")
        assert not isinstance(built, str)
        assert built.shape == {"fsdp": 4, "tensor": 2}
        assert [(d.process_index, d.index) for d in built.devices] == [
            (0, 0),
            (0, 1),
            (0, 2),
            (0, 3),
            (1, 0),
            (1, 1),
            (1, 2),
            (1, 3),
        ]

    def test_this_process_builds_a_real_hybrid_mesh_with_jax(self, cpus: list[jax.Device]) -> None:
        """One process is one slice: dcn data=1 over the 4 CPU devices is JAX's hybrid mesh
        of them, device for device, with Auto axes."""
        spec = MeshSpec(axes={"data": 2, "fsdp": 2}, dcn={"data": 1}, devices="cpu")
        mesh = Meshes({"h": spec}, devpolicy.inventory()).build("h")
        assert not isinstance(mesh, str)
        assert mesh.mesh is not None
        expected = mesh_utils.create_hybrid_device_mesh(
            (2, 2), (1, 1), cpus, process_is_granule=True
        )
        assert list(mesh.mesh.devices.flat) == list(expected.flat)
        assert mesh.mesh.axis_names == ("data", "fsdp")

    def test_too_few_slices_is_a_reason_that_says_what_it_needs(self) -> None:
        """dcn data=2 with one process: the rule's fallback is taken with the reason, which
        names the slices needed and those here."""
        policy = policy_of(
            meshes={"g": {"axes": {"data": 1, "fsdp": 4}, "dcn": {"data": 2}, "devices": "cpu"}},
            rules=[
                {"match": "w", "sharding": {"mesh": "g", "spec": ["fsdp"]}, "fallback": ["cpu:1"]}
            ],
        )
        decision = policy.decide("w", shape=(8,))
        assert decision.device_text == "cpu:1"
        assert decision.fallback_reason == (
            "g[fsdp]: mesh 'g' (in each slice data=1 x fsdp=4; slices data=2) needs 2 slices "
            "of 4 cpu devices each, 1 process of 4 here (each process is a slice); used cpu:1"
        )


class TestHybridMeshesInThePolicy:
    def test_a_maxtext_style_mesh_is_one_entry(self, tmp_path: Path) -> None:
        """dcn_data_parallelism=-1, ici_fsdp_parallelism=-1 and the rest 1, as one mesh
        entry: loads, and shards on this one-slice machine."""
        path = write(
            tmp_path / "p.yaml",
            "version: 1\n"
            "meshes:\n"
            "  train:\n"
            "    axes: {data: 1, fsdp: -1, tensor: 1}\n"
            "    dcn: {data: -1}\n"
            "    devices: cpu\n"
            "rules:\n"
            "  - {match: 'params/*', sharding: {mesh: train, spec: [fsdp]}}\n",
        )
        decision = devpolicy.load_policy(path, environ={}).decide("params/w", shape=(8, 2))
        assert decision.device_text == "train[fsdp]"
        assert decision.sharding is not None
        assert dict(decision.sharding.mesh.shape) == {"data": 1, "fsdp": 4, "tensor": 1}

    @pytest.mark.parametrize(
        ("mesh", "message"),
        [
            (
                "{axes: {data: 1, fsdp: 4}, dcn: {dta: 2}}",
                r"`dcn` names axis 'dta' \(did you mean 'data'\?\), which `axes` lacks; "
                r"axes: data, fsdp",
            ),
            (
                "{axes: {data: 1, fsdp: 4}, dcn: {data: -1, fsdp: -1}}",
                r"only one `dcn` size may be -1 \(the slices left over\)",
            ),
            ("{axes: {data: 1}, dcn: {}}", r"`dcn` names how many slices each axis spans"),
            ("{axes: {data: 1}, dcn: {data: 0}}", r"an axis size is a whole number >= 1, or -1"),
            (
                "{axes: {data: 1}, dcn: [data]}",
                r"`dcn` \(slices per axis\) is a mapping of axis name to size, e.g. `{data: 2}`",
            ),
        ],
    )
    def test_bad_dcn_is_a_located_error(self, tmp_path: Path, mesh: str, message: str) -> None:
        """Each `dcn` mistake names the file, line and mesh, and what is accepted."""
        path = write(tmp_path / "p.yaml", f"version: 1\nmeshes:\n  grid: {mesh}\n")
        with pytest.raises(devpolicy.PolicyError, match=rf"^p\.yaml:3: meshes\.grid.*{message}"):
            devpolicy.load_policy(path, environ={})


MESH_POLICY = {
    "meshes": {"train": {"axes": {"data": 2, "model": -1}}},
    "rules": [
        {"match": "params/*", "sharding": {"mesh": "train", "spec": ["data"]}},
        {"match": "batch", "device": "cpu:1", "fallback": ["train[model]"]},
    ],
}


def program_mesh(cpus: list[jax.Device]) -> Mesh:
    """A mesh as a program builds its own: devices in an order devpolicy would not pick."""
    return Mesh(np.array(cpus[::-1]).reshape(2, 2), ("data", "model"))


class TestAMeshYouAlreadyHave:
    def test_every_rule_naming_the_mesh_uses_the_given_mesh_itself(
        self, cpus: list[jax.Device]
    ) -> None:
        """After use_mesh, decisions and put's arrays shard over that very Mesh object."""
        policy = policy_of(**MESH_POLICY)
        mesh = program_mesh(cpus)
        policy.use_mesh("train", mesh)
        decision = policy.resolve("params/w", shape=(4, 4))
        assert decision.sharding is not None
        assert decision.sharding.mesh is mesh
        placed = policy.put("params", {"w": np.ones((4, 4), np.float32)})
        assert placed["w"].sharding.mesh is mesh
        assert placed["w"].sharding == NamedSharding(mesh, PartitionSpec("data"))

    def test_decisions_made_before_are_forgotten(self, cpus: list[jax.Device]) -> None:
        """A name decided over the policy's mesh is decided over the given one after."""
        policy = policy_of(**MESH_POLICY)
        before = policy.resolve("params/w")
        mesh = program_mesh(cpus)
        policy.use_mesh("train", mesh)
        after = policy.resolve("params/w")
        assert before.sharding is not None
        assert after.sharding is not None
        assert before.sharding.mesh is not mesh
        assert after.sharding.mesh is mesh

    def test_shardings_and_the_module_level_form_use_it(self, cpus: list[jax.Device]) -> None:
        """devpolicy.use_mesh registers on the active policy; shardings() then builds over
        the given mesh."""
        policy = policy_of(**MESH_POLICY)
        mesh = program_mesh(cpus)
        with devpolicy.activate(policy):
            devpolicy.use_mesh("train", mesh)
            tree = devpolicy.shardings("params", {"w": jax.ShapeDtypeStruct((4, 4), np.float32)})
        assert tree["w"].mesh is mesh

    def test_a_mesh_the_policy_does_not_declare_is_refused(self, cpus: list[jax.Device]) -> None:
        """The message names the mesh, the policy's meshes and how to declare it."""
        policy = policy_of(**MESH_POLICY)
        with pytest.raises(
            ValueError,
            match=r"^use_mesh\('trian', \.\.\.\): the policy declares no mesh 'trian' \(did you "
            r"mean 'train'\?\); meshes: train\. Declare it under `meshes:` with its axes, e\.g\. "
            r"`trian: \{axes: \{data: 2, model: 2\}\}`",
        ):
            policy.use_mesh("trian", program_mesh(cpus))

    def test_other_axis_names_are_refused(self, cpus: list[jax.Device]) -> None:
        """Rules name axes by the declared names: a mesh with others cannot serve them."""
        policy = policy_of(**MESH_POLICY)
        mesh = Mesh(np.array(cpus).reshape(2, 2), ("batch", "model"))
        with pytest.raises(
            ValueError,
            match=r"the mesh has axes \(batch, model\), the policy declares \(data, model\)",
        ):
            policy.use_mesh("train", mesh)

    def test_a_stated_size_the_mesh_does_not_have_is_refused(self, cpus: list[jax.Device]) -> None:
        """data: 2 in the policy, 4 in the mesh: refused, saying both and the -1 way out."""
        policy = policy_of(**MESH_POLICY)
        mesh = Mesh(np.array(cpus).reshape(4, 1), ("data", "model"))
        with pytest.raises(
            ValueError,
            match=r"axis 'data' has 4 devices in the mesh, 2 in the policy; .* write -1",
        ):
            policy.use_mesh("train", mesh)

    def test_not_a_mesh_is_a_type_error(self) -> None:
        """A list of devices is not a Mesh."""
        with pytest.raises(TypeError, match=r"takes a jax.sharding.Mesh, got list"):
            policy_of(**MESH_POLICY).use_mesh("train", [])  # type: ignore[arg-type]

    def test_a_fallback_naming_the_mesh_uses_it_too(self, cpus: list[jax.Device]) -> None:
        """`train[model]` in a chain shards over the given mesh."""
        policy = policy_of(
            **{
                **MESH_POLICY,
                "rules": [{"match": "batch", "device": "gpu:0", "fallback": ["train[model]"]}],
            }
        )
        mesh = program_mesh(cpus)
        policy.use_mesh("train", mesh)
        decision = policy.decide("batch", shape=(4,))
        assert decision.sharding is not None
        assert decision.sharding.mesh is mesh
