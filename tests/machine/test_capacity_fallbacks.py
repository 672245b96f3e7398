"""Memory-aware all the way down: with a size known, every target of a chain (`auto`, the
rule's device, each fallback) is judged against its free memory before it is taken; what
no accelerator can hold goes to the host; what nothing can hold is an error before any
allocation. `plan` and `explain` show the same."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

import devpolicy
from devpolicy._cli.main import main
from devpolicy._decide.decider import Decider
from tests.helpers import policy_of, sparse_tensor_file, write
from tests.io.test_file_rules import STORY_TOKENS

GiB = 2**30
AUTO_THEN_GPU_THEN_CPU = {"default": "auto", "fallback": ["gpu", "cpu"]}
ONE_24GIB_GPU = devpolicy.VirtualMachine(["gpu=1x24GiB"])


def exit_status(argv: list[str]) -> int | str | None:
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


class TestTheFallbackIsJudgedToo:
    def test_30gib_on_a_24gib_gpu_goes_to_the_host_not_back_to_the_gpu(self) -> None:
        """auto passed over for memory; the fallback's `gpu` is judged too, and passed
        over; the host takes it, and the decision says why."""
        e = policy_of(**AUTO_THEN_GPU_THEN_CPU).explain(
            "train/tokens", nbytes=30 * GiB, machine=ONE_24GIB_GPU
        )
        assert e.decision is not None
        assert e.decision.device_text == "cpu:0"
        why = "needs 30.0 GiB, 24.0 GiB free on gpu:0, keeping 10% free"
        assert e.fallback == (("auto", why), ("gpu", why))
        assert e.decision.fallback_reason == (
            f"auto, gpu: {why}; used cpu (the host: no accelerator in the chain can hold 30.0 GiB)"
        )

    def test_the_explain_command_decides_the_host(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`devpolicy explain train/tokens --bytes 30GiB --devices gpu=1x24GiB`: cpu:0."""
        policy = write(tmp_path / "p.yaml", "version: 1\ndefault: auto\nfallback: [gpu, cpu]\n")
        status = exit_status(
            [
                "explain",
                "train/tokens",
                "--bytes",
                "30GiB",
                "--policy",
                str(policy),
                "--devices",
                "gpu=1x24GiB",
            ]
        )
        out = capsys.readouterr().out
        assert status == 0
        assert "fallback: gpu passed over: needs 30.0 GiB, 24.0 GiB free on gpu:0" in out
        assert "decision: cpu:0" in out

    def test_a_rules_fallback_targets_are_judged_without_fits(self) -> None:
        """gpu:0 then gpu:1 then cpu, no `fits` written: each GPU is judged by its memory."""
        policy = policy_of(rules=[{"match": "*", "device": "gpu:0", "fallback": ["gpu:1", "cpu"]}])
        two_gpus = devpolicy.VirtualMachine(["gpu=2x16GiB"])
        decided = [policy.explain("w", nbytes=n * GiB, machine=two_gpus).decision for n in (1, 20)]
        assert [d.device_text for d in decided if d is not None] == ["gpu:0", "cpu:0"]

    def test_earlier_items_of_one_plan_count_against_the_fallback(self, tmp_path: Path) -> None:
        """Two 14 GiB tensors on a 24 GiB GPU: the first takes it, the second goes to the
        host, in plan as in a load (bytes given to earlier items are claimed)."""
        path = tmp_path / "m.safetensors"
        two = {"a": {"dtype": "U8", "shape": [14 * GiB], "data_offsets": [0, 14 * GiB]}}
        two["b"] = {"dtype": "U8", "shape": [14 * GiB], "data_offsets": [14 * GiB, 28 * GiB]}
        text = json.dumps(two).encode()
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            f.truncate(8 + len(text) + 28 * GiB)
        plan = policy_of(**AUTO_THEN_GPU_THEN_CPU).plan(path, machine=ONE_24GIB_GPU)
        assert [t.decision.device_text for t in plan.tensors] == ["gpu:0", "cpu:0"]  # type: ignore[union-attr]
        assert plan.fits


class TestTheHostTakesWhatNoAcceleratorCan:
    def test_the_placement_event_is_a_warning_saying_so(self) -> None:
        """Decided for a machine with a 24 GiB GPU, 30 GiB goes to the host, at warning."""
        policy = policy_of(**AUTO_THEN_GPU_THEN_CPU)
        decider = Decider(policy.settings, ONE_24GIB_GPU, ONE_24GIB_GPU)
        with capture_logs() as logs:
            decision = decider.resolve("train/tokens", 30 * GiB)
        assert decision.device_text == "cpu:0"
        (event,) = [e for e in logs if e["event"] == "placement"]
        assert event["log_level"] == "warning"
        assert "no accelerator in the chain can hold 30.0 GiB" in event["fallback_reason"]

    @settings(max_examples=60, deadline=None)
    @given(
        gpu_gib=st.integers(1, 64),
        host_gib=st.integers(1, 64),
        nbytes=st.integers(0, 128 * GiB),
    )
    def test_auto_then_gpu_then_cpu_never_decides_a_device_that_cannot_hold_the_bytes(
        self, gpu_gib: int, host_gib: int, nbytes: int
    ) -> None:
        """For any GPU, host and size: the decided device holds the bytes (with headroom),
        the GPU before the host; or no device, when neither can."""
        machine = devpolicy.VirtualMachine([f"gpu=1x{gpu_gib}GiB", f"cpu=1x{host_gib}GiB"])
        e = policy_of(**AUTO_THEN_GPU_THEN_CPU).explain("x", nbytes=nbytes, machine=machine)
        gpu_holds = nbytes <= int(gpu_gib * GiB * 0.9)
        host_holds = nbytes <= int(host_gib * GiB * 0.9)
        if gpu_holds:
            assert e.decision is not None
            assert e.decision.device_text == "gpu:0"
        elif host_holds:
            assert e.decision is not None
            assert e.decision.device_text == "cpu:0"
        else:
            assert e.decision is None
            assert e.error is not None
            assert "nothing in the chain can hold" in e.error


class TestNothingCanHoldIt:
    def test_put_raises_before_anything_is_allocated_listing_free_memory(self) -> None:
        """Every device too small: DeviceUnavailableError naming each target's free memory,
        and no array made."""
        policy = devpolicy.load_policy(
            {"version": 1, "rules": [{"match": "*", "device": "cpu:1", "fallback": ["cpu:2"]}]},
            environ={},
            capacity=devpolicy.StaticCapacity({"cpu:1": "1KiB", "cpu:2": "2KiB"}),
        )
        before = len(jax.live_arrays())
        with pytest.raises(
            devpolicy.DeviceUnavailableError,
            match=r"^no device for 'cpu:1' for name 'big' \(rule <mapping>:rules\[0\]\): nothing "
            r"in the chain can hold 64\.0 KiB\n  cpu:1: needs 64\.0 KiB, 1\.0 KiB free on cpu:1, "
            r"keeping 10% free\n  cpu:2: needs 64\.0 KiB, 2\.0 KiB free on cpu:2, keeping 10% free\n",
        ):
            policy.put("big", np.zeros(16 * 1024, np.float32))
        assert len(jax.live_arrays()) == before

    def test_load_file_raises_before_reading(self, tmp_path: Path) -> None:
        """A file no device can hold: the error comes from the decisions, before any read."""
        path = tmp_path / "w.safetensors"
        devpolicy.save_file({"w": np.zeros(4096, np.float32)}, path)
        policy = devpolicy.load_policy(
            {"version": 1, "default": "cpu:1"},
            environ={},
            capacity=devpolicy.StaticCapacity({"cpu:1": "1KiB"}),
        )
        before = len(jax.live_arrays())
        with pytest.raises(
            devpolicy.DeviceUnavailableError, match=r"nothing in the chain can hold 16\.0 KiB"
        ):
            policy.load_file(path)
        assert len(jax.live_arrays()) == before

    def test_plan_and_explain_say_the_same(self, tmp_path: Path) -> None:
        """The plan's row and explain give one reason: neither device can hold it."""
        path = sparse_tensor_file(tmp_path / "train.safetensors", STORY_TOKENS)
        machine = devpolicy.VirtualMachine(["gpu=1x16GiB", "cpu=1x16GiB"])
        policy = policy_of(**AUTO_THEN_GPU_THEN_CPU)
        (row,) = policy.plan(path, machine=machine).tensors
        e = policy.explain("train/tokens", nbytes=2 * STORY_TOKENS, machine=machine)
        assert row.decision is None
        assert row.error == e.error
        assert e.error is not None
        assert "cpu: needs 19.1 GiB, 16.0 GiB free on cpu:0, keeping 10% free" in e.error

    def test_a_mapped_tensor_takes_no_host_memory(self, tmp_path: Path) -> None:
        """The same file under a `mmap: true` host rule: mapped, so the small host holds it."""
        path = sparse_tensor_file(tmp_path / "train.safetensors", STORY_TOKENS)
        machine = devpolicy.VirtualMachine(["gpu=1x16GiB", "cpu=1x16GiB"])
        policy = policy_of(
            **AUTO_THEN_GPU_THEN_CPU,
            rules=[{"file": "train*.safetensors", "device": "cpu", "mmap": True}],
        )
        plan = policy.plan(path, machine=machine)
        assert plan.tensors[0].decision is not None
        assert plan.tensors[0].decision.device_text == "cpu:0"
        assert plan.fits
        unmapped = policy.plan(path, machine=machine, mmap=False)
        assert unmapped.tensors[0].decision is None
        assert not unmapped.fits

    def test_the_plan_command_lists_each_devices_free_memory(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`devpolicy plan` on a machine too small everywhere: every target tried, with
        its device's memory, and exit 1."""
        path = sparse_tensor_file(tmp_path / "tokens.safetensors", STORY_TOKENS)
        policy = write(tmp_path / "p.yaml", "version: 1\ndefault: auto\nfallback: [gpu, cpu]\n")
        status = exit_status(
            [
                "plan", str(path), "--policy", str(policy),
                "--devices", "gpu=1x16GiB", "--devices", "cpu=1x16GiB",
            ]
        )  # fmt: skip
        out = capsys.readouterr().out
        assert status == 1
        assert "    gpu: needs 19.1 GiB, 16.0 GiB free on gpu:0, keeping 10% free\n" in out
        assert "    cpu: needs 19.1 GiB, 16.0 GiB free on cpu:0, keeping 10% free\n" in out
