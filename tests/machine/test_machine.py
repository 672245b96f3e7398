"""Planning for a machine you do not have: `VirtualMachine`, `plan(machine=...)`, and
`devpolicy plan --devices gpu=8x80GiB --processes 2`, all on this CPU-only machine."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import devpolicy
from devpolicy._cli.main import main
from devpolicy._document.schema import MeshSpec
from devpolicy._machine.meshes import Meshes
from tests.helpers import policy_of, write

NO_GPU = "gpu" not in devpolicy.inventory().devices
KiB = 1024

MESHES = {"fsdp": {"axes": {"data": 2, "model": -1}, "devices": "gpu"}}
POLICY_YAML = """\
version: 1
meshes:
  fsdp: {axes: {data: 2, model: -1}, devices: gpu}
rules:
  - match: 'm/*'
    sharding: {mesh: fsdp, spec: [data, model]}
    fallback: [cpu]
"""


def fsdp_policy(**rule: object) -> devpolicy.Policy:
    sharding = {"mesh": "fsdp", "spec": ["data", "model"]}
    return policy_of(
        meshes=MESHES,
        rules=[{"match": "m/*", "sharding": sharding, "fallback": ["cpu"], **rule}],
    )


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """w divides over a 2 x 8 mesh; odd's 12 columns do not divide by 8."""
    path = tmp_path / "m.safetensors"
    devpolicy.save_file(
        {"w": np.zeros((64, 1024), np.float32), "odd": np.zeros((10, 12), np.float32)}, path
    )
    return path


def exit_status(argv: list[str]) -> int | str | None:
    """The CLI's exit status, whether it returns it or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def two_hosts(memory: str = "80GiB") -> devpolicy.VirtualMachine:
    return devpolicy.VirtualMachine([f"gpu=8x{memory}"], processes=2)


class TestVirtualMachine:
    def test_a_description_gives_each_process_its_devices(self) -> None:
        """gpu=8x80GiB over 2 processes: 16 GPUs, 8 per process, each with 80 GiB; cpu=1 too."""
        vm = two_hosts()
        gpus = vm.backend_devices("gpu")
        assert isinstance(gpus, list)
        assert [(d.process_index, d.index) for d in gpus[7:9]] == [(0, 7), (1, 0)]
        assert vm.available() == ["cpu:0", *(f"gpu:{i}" for i in range(8))]
        assert vm.free_bytes(gpus[0]) == 80 * 2**30
        assert vm.memory("cpu") is None
        assert vm.default_platform == "gpu"
        assert str(vm) == "cpu=1 (memory unknown), gpu=8x80GiB; 2 processes"

    def test_aliases_and_a_stated_cpu_are_taken(self) -> None:
        """cuda is gpu; cpu=4x512GiB replaces the implicit cpu=1."""
        vm = devpolicy.VirtualMachine(["cuda=2x24GiB", "cpu=4x512GiB"])
        assert vm.platforms == ("cpu", "gpu")
        assert len(vm.local("cpu")) == 4
        assert vm.memory("cpu") == 512 * 2**30

    @pytest.mark.parametrize(
        ("text", "problem"),
        [
            ("gpu", r"not BACKEND=COUNTxSIZE"),
            ("gpux=8x80GiB", r"unknown backend 'gpux' \(did you mean 'gpu'\?\)"),
            ("gpu=0x80GiB", r"a count of 0 devices"),
            ("gpu=eightx80GiB", r"'eightx80GiB' is not COUNT or COUNTxSIZE"),
            ("gpu=8x80GB/s", r"not a size: '80GB/s'"),
        ],
    )
    def test_bad_descriptions_name_the_text_and_the_accepted_form(
        self, text: str, problem: str
    ) -> None:
        """Each bad description is a MachineSpecError with the text, the problem and the form."""
        with pytest.raises(
            devpolicy.errors.MachineSpecError, match=rf"^devices '.*': {problem}"
        ) as e:
            devpolicy.VirtualMachine([text])
        assert e.value.value == text
        assert "accepted: BACKEND=COUNTxSIZE such as gpu=8x80GiB" in str(e.value)

    def test_a_backend_described_twice_is_an_error(self) -> None:
        """gpu and cuda name one backend: describing it twice is ambiguous."""
        with pytest.raises(devpolicy.errors.MachineSpecError, match=r"gpu is described twice"):
            devpolicy.VirtualMachine(["gpu=8x80GiB", "cuda=2"])

    @pytest.mark.parametrize("processes", [0, -1, True, 1.5, "2"])
    def test_a_process_count_is_a_whole_number_of_at_least_one(self, processes: object) -> None:
        """Zero, negative, bool, float and text counts are refused, naming `processes`."""
        with pytest.raises(devpolicy.errors.MachineSpecError, match=r"^processes "):
            devpolicy.VirtualMachine(["gpu=8"], processes=processes)  # type: ignore[arg-type]

    @given(st.text(max_size=30))
    def test_any_text_is_a_machine_or_a_machine_spec_error(self, text: str) -> None:
        """The parser never raises anything but MachineSpecError."""
        outcome: object
        try:
            outcome = devpolicy.VirtualMachine([text])
        except devpolicy.errors.MachineSpecError as e:
            outcome = e
        if isinstance(outcome, devpolicy.VirtualMachine):
            assert "cpu" in outcome.platforms
        else:
            assert "accepted: BACKEND=COUNTxSIZE" in str(outcome)


class TestVirtualPlan:
    def test_a_mesh_over_gpu_spans_every_process(self, checkpoint: Path) -> None:
        """{data: 2, model: -1} over 2 x 8 GPUs: a 2 x 8 mesh of 16; w in 16 shards of 16 KiB."""
        p = devpolicy.plan(checkpoint, policy=fsdp_policy(), machine=two_hosts())
        w = next(t for t in p.tensors if t.name == "m/w")
        assert w.decision is not None
        d = w.decision
        assert (d.device_text, d.mesh, d.spec) == ("fsdp[data,model]", "fsdp", ("data", "model"))
        assert (d.mesh_devices, d.shards, d.bytes_per_device()) == (16, 16, 16 * KiB)
        assert d.fallback_reason is None
        # No sharding can be made for devices that do not exist; the arithmetic is all there.
        assert d.sharding is None
        assert [str(x) for x in d.local_devices] == [f"gpu:{i}" for i in range(8)]
        assert p.machine == "cpu=1 (memory unknown), gpu=8x80GiB; 2 processes"
        assert p.processes == 2

    def test_per_device_and_per_process_bytes(self, checkpoint: Path) -> None:
        """Each GPU holds w's 16 KiB share against 80 GiB; odd falls back to cpu:0; every
        process holds 8 shares plus odd."""
        p = devpolicy.plan(checkpoint, policy=fsdp_policy(), machine=two_hosts())
        loads = {d.device: d for d in p.devices}
        assert list(loads) == ["cpu:0", *(f"gpu:{i}" for i in range(8))]
        gpu = loads["gpu:3"]
        assert (gpu.nbytes, gpu.tensors, gpu.free, gpu.fits) == (16 * KiB, 1, 80 * 2**30, True)
        cpu = loads["cpu:0"]
        assert (cpu.nbytes, cpu.free, cpu.fits) == (480, None, True)
        assert p.bytes_per_process == 8 * 16 * KiB + 480
        assert p.fits

    def test_a_tensor_that_does_not_divide_falls_back_with_the_reason(
        self, checkpoint: Path
    ) -> None:
        """odd (10 x 12): 12 does not divide by the 8 of 'model', so the chain's cpu is used."""
        p = devpolicy.plan(checkpoint, policy=fsdp_policy(), machine=two_hosts())
        odd = next(t for t in p.tensors if t.name == "m/odd")
        assert odd.decision is not None
        assert odd.decision.device_text == "cpu:0"
        assert odd.decision.fallback_reason == (
            "fsdp[data,model]: dim 1 of 12 does not divide by axis 'model' (8); used cpu"
        )

    def test_a_mesh_the_machine_cannot_make_falls_back_with_the_reason(
        self, checkpoint: Path
    ) -> None:
        """A fixed mesh of 32 on 16 GPUs: 'needs 32 gpu devices, 16 here'."""
        meshes = {"fsdp": {"axes": {"data": 32}, "devices": "gpu"}}
        sharding = {"mesh": "fsdp", "spec": ["data"]}
        policy = policy_of(
            meshes=meshes,
            rules=[{"match": "m/*", "sharding": sharding, "fallback": ["cpu"]}],
        )
        p = devpolicy.plan(checkpoint, policy=policy, machine=two_hosts())
        reason = p.tensors[0].decision.fallback_reason  # type: ignore[union-attr]
        assert reason == (
            "fsdp[data]: mesh 'fsdp' (data=32) needs 32 gpu devices, 16 here; used cpu"
        )

    def test_too_small_devices_do_not_fit(self, checkpoint: Path) -> None:
        """Under `fits: false` (taken unjudged), 8 KiB GPUs cannot hold w's 16 KiB share:
        those devices and the plan do not fit."""
        p = devpolicy.plan(checkpoint, policy=fsdp_policy(fits=False), machine=two_hosts("8KiB"))
        assert not p.fits
        assert not any(d.fits for d in p.devices if d.device.startswith("gpu"))
        assert "DOES NOT FIT" in str(p)

    @pytest.mark.parametrize("fits", [{}, {"fits": True}])
    def test_a_sharding_judges_each_devices_share_against_its_memory(
        self, checkpoint: Path, fits: dict[str, bool]
    ) -> None:
        """`fits` written or not, a share too big for the stated memory takes the fallback."""
        p = devpolicy.plan(checkpoint, policy=fsdp_policy(**fits), machine=two_hosts("8KiB"))
        w = next(t for t in p.tensors if t.name == "m/w")
        assert w.decision is not None
        assert w.decision.device_text == "cpu:0"
        assert w.decision.fallback_reason == (
            "fsdp[data,model]: each device's share: needs 16.0 KiB, 8.0 KiB free on gpu:0, keeping 10% free; "
            "used cpu (the host: no accelerator in the chain can hold 256.0 KiB)"
        )
        assert p.fits

    def test_device_targets_name_each_processs_own_devices(self, tmp_path: Path) -> None:
        """gpu:3 is had on the planned machine; gpu:9 is out of range of its 8 local GPUs."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"a": np.zeros(4, np.float32), "b": np.zeros(4, np.float32)}, path)
        policy = policy_of(
            rules=[
                {"match": "m/a", "device": "gpu:3"},
                {"match": "m/b", "device": "gpu:9", "fallback": ["cpu"]},
            ]
        )
        p = devpolicy.plan(path, policy=policy, machine=two_hosts())
        a, b = (t.decision for t in p.tensors)
        assert a is not None
        assert b is not None
        assert a.device_text == "gpu:3"
        assert b.fallback_reason == (
            "gpu:9: index 9 out of range (8 local gpu devices: gpu:0..gpu:7); used cpu"
        )

    def test_a_backend_the_machine_lacks_names_the_description(self, tmp_path: Path) -> None:
        """A strict tpu rule has no device, saying what the planned machine has."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"a": np.zeros(4, np.float32)}, path)
        policy = policy_of(strict=True, rules=[{"match": "m/a", "device": "tpu"}])
        (t,) = devpolicy.plan(path, policy=policy, machine=two_hosts()).tensors
        assert t.decision is None
        assert t.error is not None
        assert "no tpu backend on the planned machine (cpu=1 (memory unknown)" in t.error

    def test_planning_elsewhere_leaves_the_policy_deciding_here(self, checkpoint: Path) -> None:
        """The plan's decisions are its own: the policy still decides for this process."""
        policy = fsdp_policy()
        devpolicy.plan(checkpoint, policy=policy, machine=two_hosts())
        assert policy.decide("m/w", nbytes=4, shape=(2, 2)).device_text.startswith("cpu")

    def test_machine_must_be_a_virtual_machine(self, checkpoint: Path) -> None:
        """A description as text is not guessed at: the error names the type wanted."""
        with pytest.raises(TypeError, match=r"^plan\(machine=\.\.\.\) takes a devpolicy"):
            devpolicy.plan(checkpoint, policy=fsdp_policy(), machine="gpu=8x80GiB")  # type: ignore[arg-type]

    @pytest.mark.skipif(not NO_GPU, reason="describes a machine without a GPU")
    def test_without_a_machine_the_plan_describes_this_one(self, checkpoint: Path) -> None:
        """No machine: the mesh over gpu cannot be built here, so everything goes to cpu."""
        p = devpolicy.plan(checkpoint, policy=fsdp_policy())
        assert p.machine == "this process"
        assert {t.decision.device_text for t in p.tensors if t.decision} == {"cpu:0"}
        reason = p.tensors[0].decision.fallback_reason  # type: ignore[union-attr]
        assert reason is not None
        assert "mesh 'fsdp': no gpu backend in this process" in reason


class TestPlanCommand:
    def run(self, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
        status = main(["plan", *args])
        out, err = capsys.readouterr()
        return status, out, err

    def test_json_gives_specs_and_bytes_per_device_and_process(
        self, checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--devices gpu=8x80GiB --processes 2 --json: each tensor's spec and share, each
        device's memory, each process's bytes; exit 0."""
        policy = write(tmp_path / "p.yaml", POLICY_YAML)
        status, out, _ = self.run(
            capsys, str(checkpoint), "--policy", str(policy), "--json",
            "--devices", "gpu=8x80GiB", "--processes", "2",
        )  # fmt: skip
        assert status == 0
        payload = json.loads(out)
        assert payload["machine"] == "cpu=1 (memory unknown), gpu=8x80GiB; 2 processes"
        by_name = {t["name"]: t for t in payload["tensors"]}
        w, odd = by_name["m/w"], by_name["m/odd"]
        assert (w["device"], w["spec"], w["mesh_devices"]) == (
            "fsdp[data,model]",
            ["data", "model"],
            16,
        )
        assert w["bytes_per_device"] == 16 * KiB
        assert odd["device"] == "cpu:0"
        assert "dim 1 of 12 does not divide by axis 'model' (8)" in odd["fallback_reason"]
        gpu0 = next(d for d in payload["devices"] if d["device"] == "gpu:0")
        assert (gpu0["nbytes"], gpu0["free"], gpu0["fits"]) == (16 * KiB, 80 * 2**30, True)
        assert payload["processes"] == [
            {"process": 0, "nbytes": 8 * 16 * KiB + 480},
            {"process": 1, "nbytes": 8 * 16 * KiB + 480},
        ]

    def test_table_names_the_machine_fallbacks_and_processes(
        self, checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The table says which machine, why odd fell back, and what each process holds."""
        policy = write(tmp_path / "p.yaml", POLICY_YAML)
        status, out, _ = self.run(
            capsys, str(checkpoint), "--policy", str(policy),
            "--devices", "gpu=8x80GiB", "--devices", "cpu=1x512GiB", "--processes", "2",
        )  # fmt: skip
        assert status == 0
        assert "2 tensors on cpu=1x512GiB, gpu=8x80GiB; 2 processes" in out
        assert (
            "fallback for m/odd: fsdp[data,model]: dim 1 of 12 does not divide by axis "
            "'model' (8); used cpu"
        ) in out
        assert "Per process: each of 2 processes holds 128.5 KiB on 9 devices" in out

    def test_too_small_devices_exit_1(
        self, checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Under `fits: false`, GPUs of 8 KiB cannot hold a 16 KiB share: fits false, exit 1."""
        policy = write(tmp_path / "p.yaml", POLICY_YAML + "    fits: false\n")
        status, out, _ = self.run(
            capsys, str(checkpoint), "--policy", str(policy), "--json",
            "--devices", "gpu=8x8KiB", "--processes", "2",
        )  # fmt: skip
        assert status == 1
        payload = json.loads(out)
        assert payload["fits"] is False
        assert [d["fits"] for d in payload["devices"] if d["device"].startswith("gpu")] == [
            False
        ] * 8

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["--devices", "gpu:8x80GiB"], r"argument --devices: 'gpu:8x80GiB': not BACKEND=COUNTxSIZE"),
            (["--devices", "gpus=8x80GiB"], r"argument --devices: 'gpus=8x80GiB': unknown backend 'gpus' \(did you mean 'gpu'\?\)"),
            (["--devices", "gpu=8x80GiBs"], r"argument --devices: 'gpu=8x80GiBs': unknown size unit 'GiBs'"),
            (["--devices", "gpu=8", "--devices", "cuda=2"], r"--devices 'cuda=2': gpu is described twice"),
        ],
    )  # fmt: skip
    def test_bad_devices_exit_2_with_the_accepted_form(
        self,
        checkpoint: Path,
        args: list[str],
        message: str,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """A bad --devices exits 2 naming the option, the text and BACKEND=COUNTxSIZE."""
        assert exit_status(["plan", str(checkpoint), *args]) == 2
        err = capsys.readouterr().err
        assert re.search(message, err), err
        assert "accepted: BACKEND=COUNTxSIZE such as gpu=8x80GiB" in err

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["--processes", "2"], "--processes plans a machine described by --devices"),
            (["--devices", "gpu=8", "--processes", "0"], "argument --processes: '0' is not a process count"),
            (["--devices", "gpu=8", "--capacity", "gpu:0=1GiB"], "--capacity and --devices both describe memory"),
        ],
    )  # fmt: skip
    def test_processes_and_capacity_misuse_exits_2(
        self,
        checkpoint: Path,
        args: list[str],
        message: str,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """--processes alone, a bad count, and --capacity beside --devices exit 2, saying why."""
        assert exit_status(["plan", str(checkpoint), *args]) == 2
        assert message in capsys.readouterr().err

    @pytest.mark.skipif(not NO_GPU, reason="describes a machine without a GPU")
    def test_without_devices_the_plan_describes_this_machine(
        self, checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """No --devices: this process's CPUs, their free memory, the mesh over gpu not made."""
        policy = write(tmp_path / "p.yaml", POLICY_YAML)
        status, out, _ = self.run(capsys, str(checkpoint), "--policy", str(policy), "--json")
        assert status == 3  # the policy shards, but this machine cannot build the gpu mesh
        payload = json.loads(out)
        assert payload["sharded_nothing"] is True
        assert payload["machine"] == "this process"
        assert payload["processes"] == [{"process": 0, "nbytes": 64 * KiB * 4 + 480}]
        assert [d["device"] for d in payload["devices"]] == ["cpu:0"]
        assert all(t["device"] == "cpu:0" for t in payload["tensors"])
        assert payload["devices"][0]["free"] is not None


def test_a_machine_of_too_many_devices_is_refused_before_anything_is_built() -> None:
    """`--processes 65536` of 65,536 GPUs is a typo, refused at once, not billions of objects."""
    with pytest.raises(
        devpolicy.errors.MachineSpecError, match=r"^processes 65536: .* devices in all"
    ):
        devpolicy.VirtualMachine(["gpu=65536x80GiB"], processes=65536)


def test_decide_checks_a_shape_as_resolve_does() -> None:
    """A negative or non-integer shape is a ValueError from every entry point."""
    policy = devpolicy.load_policy({"version": 1}, environ={})
    for bad in ((-4,), "ab"):
        with pytest.raises(ValueError, match=r"^shape must be None or a tuple"):
            policy.decide("s", shape=bad)  # type: ignore[arg-type]


HYBRID_YAML = """\
version: 1
meshes:
  train:
    axes: {data: 1, fsdp: -1}
    dcn: {data: -1}
    devices: gpu
rules:
  - match: 'm/*'
    sharding: {mesh: train, spec: [[data, fsdp]]}
"""


class TestHybridMeshPlans:
    def test_plan_lays_a_hybrid_mesh_out_as_jax_would_on_the_described_machine(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--devices gpu=4x16GiB --processes 2 with dcn data=-1: data=2 (a row per process)
        x fsdp=4; the plan's mesh lists the devices in the order JAX's
        create_hybrid_device_mesh(..., process_is_granule=True) gives for the same devices,
        and each tensor is cut 8 ways."""
        from dataclasses import dataclass

        from jax.experimental import mesh_utils

        @dataclass(frozen=True)
        class Gpu:
            id: int
            process_index: int
            platform: str = "gpu"
            device_kind: str = "H100"

        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"w": np.zeros((64, 16), np.float32)}, path)
        policy = write(tmp_path / "p.yaml", HYBRID_YAML)
        status = main(
            ["plan", str(path), "--policy", str(policy), "--json",
             "--devices", "gpu=4x16GiB", "--processes", "2"]
        )  # fmt: skip
        payload = json.loads(capsys.readouterr().out)
        assert status == 0
        (mesh,) = payload["meshes"]
        assert (mesh["name"], mesh["shape"], mesh["dcn"], mesh["size"]) == (
            "train",
            {"data": 2, "fsdp": 4},
            {"data": 2, "fsdp": 1},
            8,
        )
        gpus = [Gpu(p * 4 + i, p) for p in range(2) for i in range(4)]
        expected = mesh_utils.create_hybrid_device_mesh(
            (1, 4), (2, 1), gpus, process_is_granule=True
        )
        assert mesh["first_devices"] == [
            f"p{d.process_index}:gpu:{d.id - 4 * d.process_index}" for d in expected.flat
        ]
        (w,) = payload["tensors"]
        assert (w["device"], w["shards"], w["mesh_devices"]) == ("train[data+fsdp]", 8, 8)

    def test_the_table_shows_the_split_and_the_order(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The plan's text names each mesh with its slices x devices per axis and its
        devices in mesh order."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"w": np.zeros((64, 16), np.float32)}, path)
        policy = write(tmp_path / "p.yaml", HYBRID_YAML)
        main(["plan", str(path), "--policy", str(policy), "--devices", "gpu=2", "--processes", "2"])
        out = capsys.readouterr().out
        assert (
            "Mesh train: data=2 (2x1) x fsdp=2 (1x2), 4 devices in mesh order: p0:gpu:0 "
            "p0:gpu:1 p1:gpu:0 p1:gpu:1" in out
        )

    def test_a_machine_with_too_few_processes_falls_back_with_the_reason(
        self, tmp_path: Path
    ) -> None:
        """dcn data=2 on one described process: the mesh cannot be built there, said."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"w": np.zeros((64, 16), np.float32)}, path)
        policy = policy_of(
            meshes={"train": {"axes": {"fsdp": 4}, "dcn": {"fsdp": 2}, "devices": "gpu"}},
            rules=[{"match": "m/*", "sharding": {"mesh": "train", "spec": ["fsdp"]},
                    "fallback": ["cpu"]}],
        )  # fmt: skip
        vm = devpolicy.VirtualMachine(["gpu=4"], processes=1)
        (w,) = devpolicy.plan(path, policy=policy, machine=vm).tensors
        assert w.decision is not None
        assert w.decision.device_text == "cpu:0"
        assert w.decision.fallback_reason == (
            "train[fsdp]: mesh 'train' (in each slice fsdp=4; slices fsdp=2) needs 2 slices of "
            "4 gpu devices each, 1 process of 4 here (each process is a slice); used cpu"
        )


POD_YAML = """\
version: 1
meshes:
  train:
    axes: {data: 1, fsdp: -1}
    dcn: {data: -1}
    devices: tpu
rules:
  - match: 'm/*'
    sharding: {mesh: train, spec: [[data, fsdp]]}
"""
POD_MESH_SPECS = {"train": MeshSpec(axes={"data": 1, "fsdp": -1}, dcn={"data": -1}, devices="tpu")}


class TestSlices:
    def test_a_tpu_pod_of_many_hosts_is_one_slice(self) -> None:
        """A v5e pod, 64 hosts x 4 chips in one slice, is one slice as JAX sees it: a mesh
        with dcn data=-1 is data=1 x fsdp=256, not one slice per host."""
        vm = devpolicy.VirtualMachine(["tpu=4x16GiB"], processes=64)
        assert vm.slices == 1
        assert str(vm) == "cpu=1 (memory unknown), tpu=4x16GiB; 64 processes in 1 slice"
        built = Meshes(POD_MESH_SPECS, vm).build("train")
        assert not isinstance(built, str)
        assert built.shape == {"data": 1, "fsdp": 256}
        assert built.dcn == {"data": 1, "fsdp": 1}

    def test_slices_split_the_processes_evenly_as_jaxs_slice_index(self) -> None:
        """4 hosts in 2 slices: hosts 0-1 are slice 0, hosts 2-3 slice 1; data=2 x fsdp=8,
        each data row one slice's devices."""
        vm = devpolicy.VirtualMachine(["tpu=4x16GiB"], processes=4, slices=2)
        tpus = vm.backend_devices("tpu")
        assert isinstance(tpus, list)
        assert [(d.process_index, d.slice_index) for d in tpus[::4]] == [
            (0, 0), (1, 0), (2, 1), (3, 1),
        ]  # fmt: skip
        assert str(vm) == "cpu=1 (memory unknown), tpu=4x16GiB; 4 processes in 2 slices"
        built = Meshes(POD_MESH_SPECS, vm).build("train")
        assert not isinstance(built, str)
        assert built.shape == {"data": 2, "fsdp": 8}
        assert [d.slice_index for d in built.devices] == [0] * 8 + [1] * 8
        assert [d.process_index for d in built.devices[:8]] == [0] * 4 + [1] * 4

    @pytest.mark.parametrize(
        ("processes", "slices", "problem"),
        [
            (4, 3, r"4 processes do not split evenly over 3 slices"),
            (4, 8, r"more slices than the 4 processes"),
            (4, 0, r"out of range"),
            (4, True, r"not a whole number"),
            (4, 1.5, r"not a whole number"),
        ],
    )
    def test_a_bad_split_names_the_option_and_the_valid_counts(
        self, processes: int, slices: object, problem: str
    ) -> None:
        """Slices must divide the processes: a MachineSpecError naming `slices`, the problem
        and every count that would do."""
        with pytest.raises(devpolicy.errors.MachineSpecError, match=rf"^slices .*: {problem}") as e:
            devpolicy.VirtualMachine(["tpu=4"], processes=processes, slices=slices)  # type: ignore[arg-type]
        assert e.value.accepted.endswith("for 4 processes: 1, 2 or 4")

    def test_on_gpu_each_process_stays_a_slice(self) -> None:
        """GPUs have no slices (JAX's process_is_granule): each process is one, as before;
        slices other than the processes is refused, saying so."""
        vm = devpolicy.VirtualMachine(["gpu=4"], processes=2)
        assert vm.slices == 2
        assert str(vm) == "cpu=1 (memory unknown), gpu=4 (memory unknown); 2 processes"
        assert str(devpolicy.VirtualMachine(["gpu=4"], processes=2, slices=2)) == str(vm)
        with pytest.raises(devpolicy.errors.MachineSpecError, match=r"^slices 1: .*no tpu backend"):
            devpolicy.VirtualMachine(["gpu=4"], processes=2, slices=1)

    def test_plan_names_the_slices_and_plans_the_mesh_over_them(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--devices tpu=4x16GiB --processes 4 --slices 2 --json: the machine and `slices`
        say 2 slices, and the hybrid mesh has one data row per slice."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"w": np.zeros((64, 16), np.float32)}, path)
        policy = write(tmp_path / "p.yaml", POD_YAML)
        status = main(
            ["plan", str(path), "--policy", str(policy), "--json",
             "--devices", "tpu=4x16GiB", "--processes", "4", "--slices", "2"]
        )  # fmt: skip
        payload = json.loads(capsys.readouterr().out)
        assert status == 0
        assert payload["machine"] == "cpu=1 (memory unknown), tpu=4x16GiB; 4 processes in 2 slices"
        assert payload["slices"] == 2
        (mesh,) = payload["meshes"]
        assert (mesh["shape"], mesh["dcn"]) == ({"data": 2, "fsdp": 8}, {"data": 2, "fsdp": 1})
        main(["plan", str(path), "--policy", str(policy),
              "--devices", "tpu=4x16GiB", "--processes", "4"])  # fmt: skip
        out = capsys.readouterr().out
        assert "on cpu=1 (memory unknown), tpu=4x16GiB; 4 processes in 1 slice" in out
        assert "Mesh train: data=1 (1x1) x fsdp=16 (1x16)" in out

    @pytest.mark.parametrize("command", ["plan", "explain", "check"])
    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["--slices", "2"], "--slices plans a machine described by --devices"),
            (["--devices", "tpu=4", "--processes", "4", "--slices", "3"],
             "--slices 3: 4 processes do not split evenly over 3 slices"),
            (["--devices", "tpu=4", "--slices", "0"], "argument --slices: '0' is not a slice count"),
        ],
    )  # fmt: skip
    def test_bad_slices_exit_2_naming_the_option(
        self,
        tmp_path: Path,
        command: str,
        args: list[str],
        message: str,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """--slices without --devices, a split that is not even, and a bad count exit 2."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"w": np.zeros((4,), np.float32)}, path)
        policy = write(tmp_path / "p.yaml", POD_YAML)
        subject = {"plan": [str(path)], "explain": ["m/w"], "check": [str(policy)]}[command]
        more = [] if command == "check" else ["--policy", str(policy)]
        assert exit_status([command, *subject, *more, *args]) == 2
        assert message in capsys.readouterr().err

    def test_explain_decides_on_the_described_slices(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """explain --slices 2 with the spec [data]: data spans the 2 slices, so 2 pieces
        over the 16 devices (one per slice, not one per process)."""
        policy = write(tmp_path / "p.yaml", POD_YAML.replace("[[data, fsdp]]", "[data]"))
        status = main(
            ["explain", "m/w", "--policy", str(policy), "--shape", "64,16",
             "--devices", "tpu=4x16GiB", "--processes", "4", "--slices", "2"]
        )  # fmt: skip
        assert status == 0
        assert "sharded over mesh 'train': 2 pieces on 16 devices" in capsys.readouterr().out
