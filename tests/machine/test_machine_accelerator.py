"""`accelerator`: the TPU, else the GPU, the machine has; unavailable like any missing
device where it has neither. Resolved on machines described in words (every kind) and on
this process (CPU only here: the backend name is data, not a branch)."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._machine.machine import VirtualMachine, accelerator_of
from tests.helpers import policy_of


def decide_on(
    policy: devpolicy.Policy, name: str, machine: VirtualMachine, **given: object
) -> devpolicy.types.Decision:
    """The decision `policy` makes for `name` on a machine described in words."""
    decision = policy.explain(name, machine=machine, **given).decision  # type: ignore[arg-type]
    assert decision is not None
    return decision


ON_ACCELERATOR = [{"match": "model/*", "device": "accelerator", "fallback": ["cpu"]}]


class TestResolution:
    @pytest.mark.parametrize(
        ("devices", "device"),
        [
            (["tpu=1x16GiB"], "tpu:0"),
            (["gpu=2x80GiB"], "gpu:0"),
            (["cuda=1x24GiB"], "gpu:0"),
            (["gpu=2x80GiB", "tpu=4x16GiB"], "tpu:0"),
            ([], "cpu:0"),
        ],
    )
    def test_a_described_machine_resolves_it_to_its_tpu_then_its_gpu(
        self, devices: list[str], device: str
    ) -> None:
        """TPU first, then GPU; with neither, the rule's
        fallback to the CPU is taken."""
        policy = policy_of(rules=ON_ACCELERATOR)
        decision = decide_on(policy, "model/w", VirtualMachine(devices))
        assert decision.device_text == device

    def test_the_index_is_kept_on_the_platform_it_resolves_to(self) -> None:
        """`accelerator:1` is the second GPU of a GPU machine, and out of range on one TPU."""
        policy = policy_of(rules=[{"match": "x", "device": "accelerator:1", "fallback": ["cpu"]}])
        assert decide_on(policy, "x", VirtualMachine(["gpu=2"])).device_text == "gpu:1"
        one_tpu = decide_on(policy, "x", VirtualMachine(["tpu=1"]))
        assert one_tpu.device_text == "cpu:0"
        assert "index 1 out of range (1 local tpu devices" in str(one_tpu.fallback_reason)

    def test_preference_is_tpu_then_gpu(self) -> None:
        """The order JAX prefers its backends in; none of either is None."""
        assert accelerator_of(["cpu", "gpu", "tpu"]) == "tpu"
        assert accelerator_of(["gpu", "cpu"]) == "gpu"
        assert accelerator_of(["cpu"]) is None

    def test_explain_says_what_it_resolved_to(self) -> None:
        """`explain` on a TPU machine shows `accelerator:0 -> tpu:0`."""
        policy = policy_of(rules=ON_ACCELERATOR)
        text = str(policy.explain("model/w", machine=VirtualMachine(["tpu=1x16GiB"])))
        assert "  resolved: accelerator:0 -> tpu:0\n" in text
        assert "decision: model/w -> tpu:0 by" in text

    def test_a_machine_without_one_passes_it_over_and_says_why(self) -> None:
        """This process has only CPUs: `accelerator` is unavailable, the chain goes on."""
        policy = policy_of(rules=ON_ACCELERATOR)
        decision = policy.decide("model/w")
        assert decision.device_text == "cpu:0"
        assert decision.resolved is None
        assert str(decision.fallback_reason).startswith(
            "accelerator: no accelerator (tpu or gpu backend) in this process"
        )

    def test_a_declared_fallback_to_the_cpu_is_info_not_a_warning(self) -> None:
        """The rule wrote `fallback: [cpu]`: on a laptop that is the plan, said at info."""
        policy = policy_of(rules=ON_ACCELERATOR)
        with capture_logs() as logs:
            policy.resolve("model/w")
        placement = [e for e in logs if e["event"] == "placement"]
        assert [e["log_level"] for e in placement] == ["info"]
        assert placement[0]["requested"] == "accelerator"

    def test_no_device_anywhere_raises_naming_both_platforms(self) -> None:
        """Strict, without an accelerator: the error lists why tpu and gpu are absent."""
        policy = policy_of(rules=[{"match": "x", "device": "accelerator"}], strict=True)
        with pytest.raises(devpolicy.DeviceUnavailableError) as info:
            policy.resolve("x")
        message = str(info.value)
        assert "no accelerator (tpu or gpu backend)" in message
        assert "tpu:" in message
        assert "gpu:" in message


class TestEverywhereATargetGoes:
    def test_as_the_default(self) -> None:
        """`default: accelerator` puts unmatched names on the machine's accelerator."""
        policy = policy_of(default="accelerator", fallback=["cpu"])
        assert decide_on(policy, "any", VirtualMachine(["tpu=4"])).device_text == "tpu:0"
        assert policy.decide("any").device_text == "cpu:0"

    def test_in_a_fallback_chain_with_its_resolution_said(self) -> None:
        """`fallback: [accelerator, cpu]` after a missing gpu:3 ends on tpu:0."""
        policy = policy_of(
            rules=[{"match": "x", "device": "gpu:3"}], fallback=["accelerator", "cpu"]
        )
        decision = decide_on(policy, "x", VirtualMachine(["tpu=1"]))
        assert decision.device_text == "tpu:0"
        assert str(decision.fallback_reason).endswith("used accelerator:0 -> tpu:0")

    def test_in_environment_overrides(self) -> None:
        """DEVPOLICY_RULES and DEVPOLICY_DEFAULT take it like any target."""
        environ = {"DEVPOLICY_RULES": "model/*=accelerator:1", "DEVPOLICY_DEFAULT": "accelerator"}
        policy = devpolicy.load_policy({"version": 1, "fallback": ["cpu"]}, environ=environ)
        machine = VirtualMachine(["gpu=2"])
        assert decide_on(policy, "model/w", machine).device_text == "gpu:1"
        assert decide_on(policy, "other", machine).device_text == "gpu:0"

    @pytest.mark.parametrize(("devices", "platform"), [(["tpu=4"], "tpu"), (["gpu=4"], "gpu")])
    def test_as_a_mesh_s_devices(self, devices: list[str], platform: str) -> None:
        """`devices: accelerator` spans every device of the accelerator backend."""
        policy = policy_of(
            meshes={"dp": {"axes": {"data": -1}, "devices": "accelerator"}},
            rules=[{"match": "w", "sharding": {"mesh": "dp", "spec": ["data"]}}],
        )
        decision = decide_on(policy, "w", VirtualMachine(devices), shape=(8,))
        assert decision.mesh_devices == 4
        assert decision.device.platform == platform

    def test_a_mesh_over_it_on_a_cpu_machine_says_there_is_none(self) -> None:
        """Here (CPU only) the mesh cannot be built, and the reason names the accelerator."""
        policy = policy_of(
            meshes={"dp": {"axes": {"data": -1}, "devices": "accelerator"}},
            rules=[{"match": "w", "sharding": {"mesh": "dp", "spec": ["data"]}}],
            fallback=["cpu"],
        )
        decision = policy.decide("w", shape=(8,))
        assert decision.device_text == "cpu:0"
        assert "no accelerator (tpu or gpu backend)" in str(decision.fallback_reason)

    def test_get_device_resolves_it_in_this_process(self) -> None:
        """`get_device("accelerator")` without one raises DeviceUnavailableError."""
        with pytest.raises(devpolicy.DeviceUnavailableError, match="no accelerator"):
            devpolicy.get_device("accelerator")


class TestDeclaredOrNews:
    def test_bytes_the_chip_cannot_hold_are_news_even_down_a_declared_chain(self) -> None:
        """`fallback: [cpu]` written by the rule: taken because the TPU is too small, it is
        not `fallback_declared` (a warning), unlike the same way taken for a missing chip."""
        policy = policy_of(rules=ON_ACCELERATOR)
        small_tpu = VirtualMachine(["tpu=1x1GiB"])
        decision = decide_on(policy, "model/w", small_tpu, nbytes=2 * 2**30)
        assert decision.device_text == "cpu:0"
        assert "needs 2.0 GiB, 1.0 GiB free on tpu:0" in str(decision.fallback_reason)
        assert not decision.fallback_declared
        assert decide_on(policy, "model/w", VirtualMachine([]), nbytes=2**20).fallback_declared
