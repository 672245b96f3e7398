"""The ready policies in policies/: documented, editor-ready, valid, and doing what they say."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import devpolicy
from devpolicy._cli.main import main
from tests.conftest import REPO

POLICIES = sorted((REPO / "policies").glob("*.yaml"))
NAMES = [p.name for p in POLICIES]


def test_the_promised_policies_exist() -> None:
    """Every ready policy the docs list is there."""
    assert set(NAMES) >= {
        "cpu-only.yaml",
        "dataset-on-host.yaml",
        "single-gpu.yaml",
        "multi-gpu.yaml",
        "strict-debug.yaml",
        "fsdp-sharded.yaml",
    }


@pytest.mark.parametrize("path", POLICIES, ids=NAMES)
class TestEachPolicy:
    def test_starts_with_the_schema_line_and_a_header_comment(self, path: Path) -> None:
        """Editors complete and check it; a comment says what it is for."""
        lines = path.read_text().splitlines()
        assert lines[0] == "# yaml-language-server: $schema=./devpolicy.schema.json"
        assert sum(line.startswith("#") for line in lines[:12]) >= 4

    def test_validates_against_the_json_schema_properties(self, path: Path) -> None:
        """Its top-level keys are the schema's properties."""
        import yaml

        schema = json.loads((REPO / "policies" / "devpolicy.schema.json").read_text())
        assert set(yaml.safe_load(path.read_text())) <= set(schema["properties"])

    def test_loads_and_lints_without_errors(self, path: Path) -> None:
        """No error findings here (warnings for absent GPUs are expected)."""
        policy = devpolicy.load_policy(path, environ={})
        assert [f for f in devpolicy.lint(policy) if f.severity == "error"] == []


class TestBehaviour:
    def test_cpu_only_puts_everything_on_the_cpu(self) -> None:
        """Whatever the name, the CPU."""
        policy = devpolicy.load_policy(REPO / "policies" / "cpu-only.yaml", environ={})
        assert {policy.resolve(n).device.platform for n in ("model/w", "x", "dataset/t")} == {"cpu"}

    def test_dataset_on_host_keeps_tokens_on_the_cpu(self) -> None:
        """Tokens and datasets stay on the host and may be mapped."""
        policy = devpolicy.load_policy(REPO / "policies" / "dataset-on-host.yaml", environ={})
        d = policy.resolve("train/tokens", nbytes=10)
        assert (d.device.platform, d.mmap) == ("cpu", True)

    def test_multi_gpu_splits_layers(self) -> None:
        """Layers 0-11 ask for accelerator:0, layers 12-23 for accelerator:1."""
        policy = devpolicy.load_policy(REPO / "policies" / "multi-gpu.yaml", environ={})
        assert policy.resolve("model/layers/3/w").requested == "accelerator:0"
        assert policy.resolve("model/layers/17/w").requested == "accelerator:1"
        assert policy.resolve("model/head").requested == "accelerator:1"
        assert policy.resolve("dataset/train").device.platform == "cpu"

    @pytest.mark.parametrize(
        ("devices", "first", "second"),
        [
            (["gpu=2x80GiB"], "gpu:0", "gpu:1"),
            (["tpu=8x16GiB"], "tpu:0", "tpu:1"),
            (["tpu=1x16GiB"], "tpu:0", "tpu:0"),
            ([], "cpu:0", "cpu:0"),
        ],
    )
    def test_multi_gpu_splits_layers_over_whichever_accelerators_there_are(
        self, devices: list[str], first: str, second: str
    ) -> None:
        """The same file on two GPUs, a TPU VM, one chip (the second half falls back to the
        first) and a laptop."""
        policy = devpolicy.load_policy(REPO / "policies" / "multi-gpu.yaml", environ={})
        machine = devpolicy.VirtualMachine(devices)
        placed = [
            policy.explain(name, machine=machine).decision
            for name in ("model/layers/3/w", "model/layers/17/w")
        ]
        assert [d.device_text if d is not None else None for d in placed] == [first, second]

    @pytest.mark.parametrize("name", ["dataset-on-host.yaml", "single-gpu.yaml"])
    @pytest.mark.parametrize(
        ("devices", "device"),
        [(["tpu=1x16GiB"], "tpu:0"), (["gpu=1x80GiB"], "gpu:0"), ([], "cpu:0")],
    )
    def test_the_accelerator_policies_use_the_chip_of_every_kind_of_machine(
        self, name: str, devices: list[str], device: str
    ) -> None:
        """The model goes to the TPU on a TPU VM, the GPU on a GPU box, the CPU on a
        laptop: one file for the three."""
        policy = devpolicy.load_policy(REPO / "policies" / name, environ={})
        decision = policy.explain(
            "model/w", nbytes=2**20, machine=devpolicy.VirtualMachine(devices)
        ).decision
        assert decision is not None
        assert decision.device_text == device

    def test_a_tpu_plan_of_the_demo_policy_puts_the_model_on_the_chip(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`devpolicy plan --devices tpu=1x16GiB` with the shipped demo policy: the model's
        tensors on tpu:0, not on the host."""
        path = tmp_path / "model.safetensors"
        devpolicy.save_file({"embed": np.zeros((64, 8), np.float32)}, path)
        policy = REPO / "policies" / "dataset-on-host.yaml"
        argv = ["plan", str(path), "--policy", str(policy), "--devices", "tpu=1x16GiB", "--json"]
        assert main(argv) == 0
        (tensor,) = json.loads(capsys.readouterr().out)["tensors"]
        assert (tensor["name"], tensor["device"]) == ("model/embed", "tpu:0")

    def test_single_gpu_sends_what_does_not_fit_to_the_host(self) -> None:
        """With a stated 1 GiB free on the accelerator (here cpu:0 stands in), 2 GiB goes elsewhere."""
        policy = devpolicy.load_policy(
            REPO / "policies" / "single-gpu.yaml",
            environ={},
            overrides={
                "rules": [
                    {
                        "match": "weights/*",
                        "min_bytes": 1,
                        "device": "cpu:0",
                        "fits": True,
                        "fallback": ["cpu:1"],
                    }
                ]
            },
            capacity=devpolicy.StaticCapacity({"cpu:0": "1GiB"}),
        )
        assert policy.resolve("weights/big", nbytes=2 * 2**30).device_text == "cpu:1"
        assert policy.resolve("weights/small", nbytes=2**20).device_text == "cpu:0"

    def test_fsdp_sharded_falls_back_here_and_shards_where_there_are_gpus(self) -> None:
        """Without GPUs every sharding rule falls back to the CPU, saying why; planned for
        a pod, kernels are sharded over all its devices."""
        path = REPO / "policies" / "fsdp-sharded.yaml"
        policy = devpolicy.load_policy(path, environ={})
        if "gpu" not in devpolicy.inventory().devices:
            d = policy.resolve("model/layer0/kernel", nbytes=4096, shape=(32, 32))
            assert d.device.platform == "cpu"
            assert "mesh 'fsdp'" in (d.fallback_reason or "")
        assert policy.resolve("dataset/train", nbytes=8).device.platform == "cpu"

    def test_fsdp_sharded_shards_every_matrix_of_a_hugging_face_llama_checkpoint(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`devpolicy plan llama-2-7b/` (two shards and an index, Hugging Face names) for
        2 processes of 8 GPUs: every weight matrix sharded on `data` x `model`, every norm
        and rotary table replicated over the mesh, nothing left to the default, exit 0."""
        checkpoint = hf_llama_checkpoint(tmp_path / "llama-2-7b")
        policy = REPO / "policies" / "fsdp-sharded.yaml"
        argv = ["plan", str(checkpoint), "--policy", str(policy), "--devices", "gpu=8x80GiB"]
        assert main([*argv, "--processes", "2", "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        tensors = plan["tensors"]
        assert len(tensors) == 3 + 32 * 10
        assert sum(t["nbytes"] for t in tensors) == pytest.approx(12.55 * 2**30, rel=1e-3)
        for t in tensors:
            assert (t["error"], t["fallback_reason"]) == (None, None), t["name"]
            assert t["mesh_devices"] == 16, t["name"]
            assert t["spec"] == (["data", "model"] if len(t["shape"]) == 2 else []), t["name"]
        up = "llama-2-7b/model/layers/0/mlp/up_proj/weight"
        assert next(t for t in tensors if t["name"] == up)["bytes_per_device"] == 11008 * 256 * 2
        assert plan["rules"][-1]["tensors"] == 0  # the default took nothing
        assert plan["warnings"] == []
        assert all(d["nbytes"] < 2**30 for d in plan["devices"])

    def test_strict_debug_rejects_unplanned_names(self) -> None:
        """Anything not listed is an error."""
        policy = devpolicy.load_policy(REPO / "policies" / "strict-debug.yaml", environ={})
        with pytest.raises(devpolicy.errors.UnmatchedNameError):
            policy.resolve("surprise")
        assert policy.resolve("dataset/x").device.platform == "cpu"


def hf_llama_checkpoint(
    folder: Path, vocab: int = 32000, hidden: int = 4096, inter: int = 11008, layers: int = 32
) -> Path:
    """A Hugging Face LLaMA-2 checkpoint folder as `save_pretrained` writes it: two
    float16 shards (headers only, sparse) and `model.safetensors.index.json`; each layer
    keeps its `rotary_emb.inv_freq` buffer, as the published 7B checkpoint does (323 tensors)."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        layer = f"model.layers.{i}"
        for proj in ("q", "k", "v", "o"):
            shapes[f"{layer}.self_attn.{proj}_proj.weight"] = (hidden, hidden)
        shapes[f"{layer}.self_attn.rotary_emb.inv_freq"] = (64,)
        shapes[f"{layer}.mlp.gate_proj.weight"] = (inter, hidden)
        shapes[f"{layer}.mlp.up_proj.weight"] = (inter, hidden)
        shapes[f"{layer}.mlp.down_proj.weight"] = (hidden, inter)
        shapes[f"{layer}.input_layernorm.weight"] = (hidden,)
        shapes[f"{layer}.post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    folder.mkdir()
    keys = list(shapes)
    weight_map: dict[str, str] = {}
    total = 0
    for n, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2 :]), 1):
        file = f"model-{n:05d}-of-00002.safetensors"
        header: dict[str, object] = {}
        offset = 0
        for key in part:
            nbytes = 2 * int(np.prod(shapes[key]))
            header[key] = {
                "dtype": "F16",
                "shape": list(shapes[key]),
                "data_offsets": [offset, offset + nbytes],
            }
            offset += nbytes
            weight_map[key] = file
        text = json.dumps(header).encode()
        with open(folder / file, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            f.truncate(8 + len(text) + offset)
        total += offset
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder
