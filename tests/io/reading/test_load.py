"""devpolicy.load_file and plan: each tensor to its own device, exact, lean, logged."""

from __future__ import annotations

import io
import json
import os
import re
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file as reference_save
from structlog.testing import capture_logs

import devpolicy
from tests.helpers import policy_of


def where(x: jax.Array) -> str:
    (device,) = x.devices()
    return devpolicy.inventory().text(device)


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "ckpt.safetensors"
    reference_save(
        {
            "tokens": np.arange(4096, dtype=np.uint16),
            "w": np.ones((16, 16), np.float32),
            "b": np.zeros(16, np.float32),
        },
        str(path),
    )
    return path


ROUTING_RULES = [
    {"match": "*/tokens", "device": "cpu:1"},
    {"match": "ckpt/w", "device": "cpu:2"},
    {"match": "*", "device": "cpu:3"},
]
ROUTING = policy_of(rules=ROUTING_RULES)


class TestRouting:
    def test_one_file_loads_to_several_devices(self, checkpoint: Path) -> None:
        """Each tensor goes to its own rule's device in one call, committed."""
        out = devpolicy.load_file(checkpoint, policy=ROUTING)
        assert {k: where(v) for k, v in out.items()} == {
            "tokens": "cpu:1",
            "w": "cpu:2",
            "b": "cpu:3",
        }
        assert all(v.committed for v in out.values())
        assert np.array_equal(np.asarray(out["tokens"]), np.arange(4096, dtype=np.uint16))

    def test_prefix_names_tensors(self, checkpoint: Path) -> None:
        """Names are <prefix>/<key>; the prefix defaults to the file's stem; '' means none."""
        policy = policy_of(
            rules=[
                {"match": "data/tokens", "device": "cpu:2"},
                {"match": "tokens", "device": "cpu:3"},
            ]
        )
        assert (
            where(devpolicy.load_file(checkpoint, policy=policy, prefix="data")["tokens"])
            == "cpu:2"
        )
        assert where(devpolicy.load_file(checkpoint, policy=policy, prefix="")["tokens"]) == "cpu:3"

    def test_size_rules_see_each_tensors_bytes(self, checkpoint: Path) -> None:
        """min_bytes applies per tensor: only the 8 KiB tokens tensor is large."""
        policy = policy_of(
            default="cpu:1", rules=[{"match": "*", "min_bytes": "4KiB", "device": "cpu:2"}]
        )
        out = devpolicy.load_file(checkpoint, policy=policy)
        assert (where(out["tokens"]), where(out["w"]), where(out["b"])) == (
            "cpu:2",
            "cpu:1",
            "cpu:1",
        )

    def test_active_policy_is_used_by_default(self, checkpoint: Path) -> None:
        """Without policy=, the active policy decides."""
        with devpolicy.activate(policy_of(default="cpu:3")):
            assert where(devpolicy.load_file(checkpoint)["w"]) == "cpu:3"

    def test_policy_method_matches_function(self, checkpoint: Path) -> None:
        """Policy.load_file is the same loader."""
        assert where(ROUTING.load_file(checkpoint)["w"]) == "cpu:2"

    def test_nothing_lands_on_the_default_device_first(self, checkpoint: Path) -> None:
        """Loading under a scope on cpu:0 never creates arrays there (transfer guard on)."""
        with jax.transfer_guard("disallow"):
            out = devpolicy.load_file(checkpoint, policy=ROUTING)
        assert where(out["b"]) == "cpu:3"


class TestZeroCopy:
    def test_host_tensors_adopt_the_read_buffer(self, tmp_path: Path) -> None:
        """The buffer the file was read into becomes the array: 64-byte aligned, no second copy."""
        devpolicy.save_file({"t": np.arange(2**20, dtype=np.uint16)}, tmp_path / "t.safetensors")
        out = devpolicy.load_file(tmp_path / "t.safetensors", policy=policy_of(default="cpu:1"))
        assert out["t"].unsafe_buffer_pointer() % 64 == 0

    def test_mmap_maps_aligned_tensors_from_the_file(self, tmp_path: Path) -> None:
        """With mmap the array is the file's mapping: changing the file shows through."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"t": np.zeros(4096, np.uint8)}, path)
        with capture_logs() as logs:
            out = devpolicy.load_file(path, policy=policy_of(default="cpu:1"), mmap=True)
        summary = next(e for e in logs if e["event"] == "load_file")
        assert summary["mapped"] == 1
        assert where(out["t"]) == "cpu:1"

    def test_a_mapped_tensor_is_bytes_mapped_and_a_read_one_bytes_read(
        self, tmp_path: Path
    ) -> None:
        """`bytes_read` counts only bytes copied out of the file; a mapped tensor's are
        `bytes_mapped`: the same file mapped, then read."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"t": np.zeros(4096, np.uint8)}, path)
        policy = policy_of(rules=[{"match": "*", "device": "cpu:1"}])
        fields = ("mapped", "bytes_mapped", "bytes_read")
        for mmap, expected in ((True, (1, 4096, 0)), (False, (0, 0, 4096))):
            with capture_logs() as logs:
                devpolicy.load_file(path, policy=policy, mmap=mmap)
            summary = next(e for e in logs if e["event"] == "load_file")
            assert tuple(summary[f] for f in fields) == expected

    def test_rule_mmap_flag_is_honoured(self, tmp_path: Path) -> None:
        """`mmap: true` on the rule maps without a loader option; unaligned tensors are read."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file(
            {
                "a": np.zeros(4096, np.uint8),
                "b": np.zeros(5, np.uint8),
                "odd": np.zeros(3, np.uint8),
            },
            path,
        )
        policy = policy_of(rules=[{"match": "*", "device": "cpu:1", "mmap": True}])
        with capture_logs() as logs:
            out = devpolicy.load_file(path, policy=policy)
        assert next(e for e in logs if e["event"] == "load_file")["mapped"] == 2
        assert np.asarray(out["odd"]).tolist() == [0, 0, 0]


class TestNarrowing:
    def test_int64_that_fits_is_narrowed_and_logged(self, tmp_path: Path) -> None:
        """Position ids 0..511 in int64 load as int32, with a `narrowed` event."""
        reference_save({"pos": np.arange(512, dtype=np.int64)}, str(tmp_path / "p.safetensors"))
        with capture_logs() as logs:
            out = devpolicy.load_file(tmp_path / "p.safetensors", policy=policy_of())
        assert out["pos"].dtype == np.int32
        assert np.asarray(out["pos"]).tolist() == list(range(512))
        narrowed = [e for e in logs if e["event"] == "narrowed"]
        assert [
            (e["name"], e["from_dtype"], e["to_dtype"], e["min"], e["max"]) for e in narrowed
        ] == [("p/pos", "I64", "int32", 0, 511)]

    @pytest.mark.parametrize(
        ("array", "message"),
        [
            (
                np.array([0, 2**40], np.int64),
                r"tensor 'x': values 0\.\.1099511627776 do not fit int32 \(-2147483648\.\.2147483647\)",
            ),
            (np.array([2**33], np.uint64), r"values 8589934592\.\.8589934592 do not fit uint32"),
            (
                np.array([0.5, 0.1], np.float64),
                r"1 values lose precision in float32 \(first at flat index 1: 0\.1 -> 0\.10000000149011612\)",
            ),
        ],
    )
    def test_lossy_narrowing_raises_with_the_way_out(
        self, tmp_path: Path, array: np.ndarray, message: str
    ) -> None:
        """A value that would change stops the load, naming tensor, range and the fixes."""
        reference_save({"x": array}, str(tmp_path / "x.safetensors"))
        with pytest.raises(devpolicy.errors.NarrowingError, match=message) as info:
            devpolicy.load_file(tmp_path / "x.safetensors", policy=policy_of())
        assert "jax_enable_x64" in str(info.value)
        assert "narrow='lossy'" in str(info.value)

    def test_float64_with_nan_and_inf_that_survive_narrow(self, tmp_path: Path) -> None:
        """NaN and infinities are exact in float32 too."""
        reference_save(
            {"x": np.array([np.nan, np.inf, -0.0, 1.5])}, str(tmp_path / "x.safetensors")
        )
        out = devpolicy.load_file(tmp_path / "x.safetensors", policy=policy_of())
        assert out["x"].dtype == np.float32

    def test_lossy_opt_in_narrows_with_a_warning(self, tmp_path: Path) -> None:
        """narrow='lossy' accepts the change and logs it at warning."""
        reference_save({"x": np.array([2**40], np.int64)}, str(tmp_path / "x.safetensors"))
        with capture_logs() as logs:
            out = devpolicy.load_file(
                tmp_path / "x.safetensors", policy=policy_of(), narrow="lossy"
            )
        assert out["x"].dtype == np.int32
        assert [e["log_level"] for e in logs if e["event"] == "narrowed"] == ["warning"]

    def test_bad_narrow_option(self, checkpoint: Path) -> None:
        """Only 'exact' and 'lossy' are accepted."""
        with pytest.raises(ValueError, match=r"^narrow must be 'exact' or 'lossy', got 'yes'$"):
            devpolicy.load_file(checkpoint, policy=policy_of(), narrow="yes")  # type: ignore[arg-type]


class TestBadFiles:
    def test_truncated_file_raises_and_returns_nothing(self, checkpoint: Path) -> None:
        """Cutting the file short is caught from the header, before any data is read."""
        data = checkpoint.read_bytes()
        checkpoint.write_bytes(data[:-10])
        with pytest.raises(devpolicy.SafetensorsFileError, match=r"truncated\?"):
            devpolicy.load_file(checkpoint, policy=ROUTING)

    def test_missing_file(self, tmp_path: Path) -> None:
        """A missing file names the path."""
        with pytest.raises(
            devpolicy.SafetensorsFileError, match=r"missing\.safetensors: no such file"
        ):
            devpolicy.load_file(tmp_path / "missing.safetensors", policy=ROUTING)

    def test_unplaceable_tensor_stops_before_reading(self, checkpoint: Path) -> None:
        """Decisions are all made first: a strict miss raises before any array exists."""
        policy = policy_of(strict=True, rules=[{"match": "ckpt/b", "device": "cpu:9"}])
        with (
            capture_logs() as logs,
            pytest.raises(devpolicy.DeviceUnavailableError, match="for name 'ckpt/b'"),
        ):
            devpolicy.load_file(checkpoint, policy=policy)
        assert not [e for e in logs if e["event"] == "load_file"]


class TestMappedTensorsAndMemory:
    @pytest.mark.parametrize(
        ("rule_mmap", "mmap", "expected"),
        [
            (True, None, "cpu:1"),
            (False, True, "cpu:1"),
            (False, None, "cpu:2"),
            (True, False, "cpu:2"),
        ],
        ids=["rule-maps", "load-maps", "read", "mmap-off"],
    )
    def test_fits_does_not_count_what_will_be_mapped(
        self, tmp_path: Path, rule_mmap: bool, mmap: bool | None, expected: str
    ) -> None:
        """A tensor mapped from its file takes no host memory: a `fits` rule keeps it on the
        host even when free memory is smaller; a tensor that will be read falls back."""
        path = tmp_path / "d.safetensors"
        devpolicy.save_file({"tokens": np.zeros(4096, np.uint16)}, path)
        policy = devpolicy.load_policy(
            {
                "version": 1,
                "headroom": 0,
                "rules": [
                    {
                        "match": "*",
                        "device": "cpu:1",
                        "fits": True,
                        "mmap": rule_mmap,
                        "fallback": ["cpu:2"],
                    },
                ],
            },
            environ={},
            capacity=devpolicy.StaticCapacity({"cpu:1": 1000}),
        )
        out = devpolicy.load_file(path, policy=policy, mmap=mmap)
        assert where(out["tokens"]) == expected
        planned = devpolicy.plan(path, policy=policy, mmap=mmap)
        assert planned.tensors[0].decision is not None
        assert planned.tensors[0].decision.device_text == expected


class TestFailuresNameTheFile:
    def test_a_file_that_shrinks_before_it_is_mapped_is_refused(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Rewritten in place mid-load: a clear error, never short buffers or SIGBUS later."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"w": np.zeros(4096, np.float32)}, path)
        real = devpolicy._io.reading.checkpoint_sources.read_header_from  # type: ignore[attr-defined]

        def then_truncate(f: io.BufferedReader, where: Path) -> object:
            header = real(f, where)
            os.truncate(path, 100)
            return header

        monkeypatch.setattr(
            devpolicy._io.reading.checkpoint_sources, "read_header_from", then_truncate
        )  # type: ignore[attr-defined]
        with pytest.raises(devpolicy.SafetensorsFileError, match=r"m\.safetensors.*changed size"):
            devpolicy.load_file(path, policy=policy_of(), mmap=True)

    @pytest.mark.parametrize("big", [True, False], ids=["large tensor", "small tensors"])
    def test_out_of_memory_names_the_file_and_tensor(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, big: bool
    ) -> None:
        """ENOMEM while allocating a host buffer is a SafetensorsFileError naming both."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"w": np.zeros(2**19 if big else 16, np.float32)}, path)

        def no_memory(nbytes: int) -> None:
            raise OSError(12, "Cannot allocate memory")

        monkeypatch.setattr(devpolicy._io.reading.buffers, "aligned_empty", no_memory)  # type: ignore[attr-defined]
        with pytest.raises(
            devpolicy.SafetensorsFileError, match=r"m\.safetensors.*'w'.*not enough memory"
        ):
            devpolicy.load_file(path, policy=policy_of())

    def test_a_bad_align_is_refused_before_any_array_is_converted(self, tmp_path: Path) -> None:
        """save_file checks `align` first: a huge value allocates nothing, a float is clear."""
        for align in (2**30, 64.0):
            with pytest.raises(ValueError, match=r"^align must be a power of two"):
                devpolicy.save_file({"w": object()}, tmp_path / "x.safetensors", align=align)  # type: ignore[arg-type]
        assert list(tmp_path.iterdir()) == []


class TestEvents:
    def test_each_tensor_is_debug_and_the_file_is_one_info_summary(self, checkpoint: Path) -> None:
        """Per-tensor decisions of a load are debug; one info summary per file says where."""
        policy = policy_of(rules=ROUTING_RULES, logging={"level": "debug"})
        with capture_logs() as logs:
            devpolicy.load_file(checkpoint, policy=policy)
        placements = {
            e["name"]: (e["device"], e["nbytes"], e["log_level"])
            for e in logs
            if e["event"] == "placement"
        }
        assert placements == {
            "ckpt/tokens": ("cpu:1", 8192, "debug"),
            "ckpt/w": ("cpu:2", 1024, "debug"),
            "ckpt/b": ("cpu:3", 64, "debug"),
        }
        summary = next(e for e in logs if e["event"] == "load_file")
        assert summary["log_level"] == "info"
        assert (summary["tensors"], summary["nbytes"], summary["devices"]) == (
            3,
            9280,
            "cpu:1 8.0 KiB (1 tensor), cpu:2 1.0 KiB (1 tensor), cpu:3 64 B (1 tensor)",
        )
        assert summary["rules"] == (
            "<mapping>:rules[0] x1, <mapping>:rules[1] x1, <mapping>:rules[2] x1"
        )
        assert (summary["fallbacks"], summary["file_backed"]) == (0, False)
        assert summary["seconds"] >= 0

    def test_at_info_a_load_logs_only_its_summary(self, checkpoint: Path) -> None:
        """However many tensors, a load at the default level is one line."""
        with capture_logs() as logs:
            devpolicy.load_file(checkpoint, policy=policy_of(rules=ROUTING_RULES))
        assert [e["event"] for e in logs] == ["load_file"]

    def test_a_fallback_is_one_warning_per_rule_not_per_tensor(self, tmp_path: Path) -> None:
        """Many tensors falling back by one rule down the policy's chain: one warning naming
        the first, and the count."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({f"w{i}": np.zeros(4, np.float32) for i in range(20)}, path)
        policy = policy_of(fallback=["cpu:1"], rules=[{"match": "m/*", "device": "cpu:9"}])
        with capture_logs() as logs:
            devpolicy.load_file(path, policy=policy)
        warnings = [(e["event"], e["log_level"]) for e in logs]
        assert warnings == [("placement", "warning"), ("load_file", "warning")]
        assert logs[0]["fallback_reason"].startswith("cpu:9: index 9 out of range")
        assert logs[1]["fallbacks"] == 20

    def test_a_fallback_the_rule_declared_is_info(self, tmp_path: Path) -> None:
        """The rule's own `fallback:` is the way it asked for: said at info, still counted."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({f"w{i}": np.zeros(4, np.float32) for i in range(20)}, path)
        policy = policy_of(rules=[{"match": "m/*", "device": "cpu:9", "fallback": ["cpu:1"]}])
        with capture_logs() as logs:
            devpolicy.load_file(path, policy=policy)
        assert [(e["event"], e["log_level"]) for e in logs] == [
            ("placement", "info"),
            ("load_file", "info"),
        ]
        assert logs[1]["fallbacks"] == 20

    def test_no_progress_bar_when_not_a_terminal(
        self, checkpoint: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """progress=True still draws nothing when stderr is not a terminal."""
        devpolicy.load_file(checkpoint, policy=policy_of(logging={"level": "error"}), progress=True)
        assert capsys.readouterr().err == ""


class TestPlan:
    def test_plan_reads_only_the_header_and_logs_nothing(self, checkpoint: Path) -> None:
        """plan() lists each tensor's device and the totals, without placement events."""
        with capture_logs() as logs:
            planned = devpolicy.plan(checkpoint, policy=ROUTING)
        assert logs == []
        assert sorted(
            (t.name, t.dtype, t.shape, t.nbytes, t.decision.device_text if t.decision else None)
            for t in planned.tensors
        ) == [
            ("ckpt/b", "F32", (16,), 64, "cpu:3"),
            ("ckpt/tokens", "U16", (4096,), 8192, "cpu:1"),
            ("ckpt/w", "F32", (16, 16), 1024, "cpu:2"),
        ]
        assert [(d.device, d.nbytes, d.tensors) for d in planned.devices] == [
            ("cpu:1", 8192, 1),
            ("cpu:2", 1024, 1),
            ("cpu:3", 64, 1),
        ]

    def test_plan_flags_a_device_that_is_too_small(self, checkpoint: Path) -> None:
        """With stated capacities, an over-full device is flagged (its rule takes it
        unjudged: `fits: false`; judged, the tensor would have no device instead)."""
        policy = devpolicy.load_policy(
            {"version": 1, "rules": [{"match": "*", "device": "cpu:1", "fits": False}]},
            environ={},
            capacity=devpolicy.StaticCapacity({"cpu:1": "4KiB"}),
        )
        planned = devpolicy.plan(checkpoint, policy=policy)
        assert [(d.device, d.free, d.fits) for d in planned.devices] == [("cpu:1", 4096, False)]
        assert not planned.fits

    def test_plan_records_unplaceable_tensors(self, checkpoint: Path) -> None:
        """A tensor without a device is listed with the reason instead of raising."""
        planned = devpolicy.plan(checkpoint, policy=policy_of(strict=True, default="cpu:9"))
        assert all(t.decision is None for t in planned.tensors)
        assert planned.tensors[0].error is not None
        assert planned.tensors[0].error.startswith("no device for 'cpu:9'")


class TestProgress:
    class _Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    def test_progress_bar_on_a_terminal(
        self, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """On a terminal, progress=True draws a bar naming the file (rich, on stderr)."""
        terminal = self._Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        monkeypatch.setenv("TERM", "xterm")
        devpolicy.load_file(checkpoint, policy=policy_of(logging={"level": "error"}), progress=True)
        assert "ckpt.safetensors" in terminal.getvalue()

    def test_small_files_show_no_bar_by_default(
        self, checkpoint: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Below 256 MiB the bar stays off unless asked for; progress=False always silences it."""
        terminal = self._Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        policy = policy_of(logging={"level": "error"})
        devpolicy.load_file(checkpoint, policy=policy)
        devpolicy.load_file(checkpoint, policy=policy, progress=False)
        assert terminal.getvalue() == ""


class TestReviewRegressions:
    def test_mmap_uses_one_map_and_no_descriptor_per_tensor(self, tmp_path: Path) -> None:
        """Mapping many tensors opens nothing per tensor: one read-only map of the file."""
        path = tmp_path / "many.safetensors"
        devpolicy.save_file({f"t{i}": np.full(64, i % 256, np.uint8) for i in range(300)}, path)
        fds_before = len(os.listdir("/proc/self/fd"))
        out = devpolicy.load_file(path, policy=policy_of(logging={"level": "error"}), mmap=True)
        assert len(os.listdir("/proc/self/fd")) <= fds_before + 1
        assert [int(np.asarray(out[f"t{i}"])[0]) for i in (0, 150, 299)] == [0, 150, 299 % 256]

    def test_one_file_cannot_overfill_a_device(self, tmp_path: Path) -> None:
        """Two 600-byte tensors against 1000 free bytes: the second goes down the chain."""
        path = tmp_path / "two.safetensors"
        devpolicy.save_file({"a": np.zeros(600, np.uint8), "b": np.zeros(600, np.uint8)}, path)
        policy = devpolicy.load_policy(
            {
                "version": 1,
                "headroom": 0,
                "rules": [{"match": "*", "device": "cpu:1", "fits": True, "fallback": ["cpu:2"]}],
            },
            environ={},
            capacity=devpolicy.StaticCapacity({"cpu:1": 1000}),
        )
        out = devpolicy.load_file(path, policy=policy)
        assert sorted(where(v) for v in out.values()) == ["cpu:1", "cpu:2"]
        planned = devpolicy.plan(path, policy=policy)
        assert sorted(d.device for d in planned.devices) == ["cpu:1", "cpu:2"]
        tree = policy.put("x", {"a": np.zeros(600, np.uint8), "b": np.zeros(600, np.uint8)})
        assert sorted(where(v) for v in tree.values()) == ["cpu:1", "cpu:2"]

    def test_plan_records_unmatched_names_under_reject(self, checkpoint: Path) -> None:
        """plan() lists every tensor even when some have no rule under `default: reject`."""
        planned = devpolicy.plan(
            checkpoint,
            policy=policy_of(default="reject", rules=[{"match": "*/w", "device": "cpu"}]),
        )
        errors = {t.key: t.error for t in planned.tensors}
        assert errors["w"] is None
        assert errors["tokens"] is not None
        assert errors["tokens"].startswith("no rule matches 'ckpt/tokens'")

    def test_overflowing_float64_is_a_narrowing_error_not_a_warning(self, tmp_path: Path) -> None:
        """1e300 does not fit float32: NarrowingError, even with warnings as errors."""
        reference_save({"x": np.array([1e300])}, str(tmp_path / "x.safetensors"))
        with pytest.raises(
            devpolicy.errors.NarrowingError, match=r"1 values lose precision in float32"
        ):
            devpolicy.load_file(tmp_path / "x.safetensors", policy=policy_of())
        out = devpolicy.load_file(tmp_path / "x.safetensors", policy=policy_of(), narrow="lossy")
        assert np.isinf(np.asarray(out["x"])[0])

    def test_written_files_get_the_usual_permissions(self, tmp_path: Path) -> None:
        """save_file gives files the mode open() would (0644 under umask 022), not 0600."""
        old = os.umask(0o022)
        try:
            devpolicy.save_file({"a": np.zeros(1)}, tmp_path / "m.safetensors")
        finally:
            os.umask(old)
        assert (tmp_path / "m.safetensors").stat().st_mode & 0o777 == 0o644

    def test_bad_metadata_is_refused_before_writing(self, tmp_path: Path) -> None:
        """Metadata must map strings to strings, as the format requires."""
        with pytest.raises(
            ValueError, match=r"^metadata must map strings to strings, got \{'step': 100\}$"
        ):
            devpolicy.save_file(
                {"a": np.zeros(1)}, tmp_path / "m.safetensors", metadata={"step": 100}
            )  # type: ignore[dict-item]
        assert list(tmp_path.iterdir()) == []

    def test_alignment_that_would_break_the_format_is_refused(self, tmp_path: Path) -> None:
        """An alignment past the limit (its padding would exceed the header limit) fails first."""
        source = tmp_path / "in.safetensors"
        devpolicy.save_file({"a": np.zeros(4, np.uint8)}, source)
        before = source.read_bytes()
        with pytest.raises(
            ValueError,
            match=r"^align must be a power of two from 1 to 16777216 \(an int\), got 134217728$",
        ):
            devpolicy.align_file(source, source, align=2**27)
        assert source.read_bytes() == before

    def test_null_metadata_complex_and_big_endian_are_handled(self, tmp_path: Path) -> None:
        """What safetensors itself accepts: null metadata, C64 tensors, big-endian input arrays."""
        path = tmp_path / "c.safetensors"
        devpolicy.save_file(
            {"c": np.array([1 + 2j], np.complex64), "be": np.arange(3, dtype=">i4")}, path
        )
        out = devpolicy.load_file(path, policy=policy_of())
        assert np.asarray(out["c"]).tolist() == [1 + 2j]
        assert np.asarray(out["be"]).tolist() == [0, 1, 2]
        header = json.dumps(
            {"__metadata__": None, "t": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}
        ).encode()
        path.write_bytes(len(header).to_bytes(8, "little") + header + b"\x01\x02")
        assert np.asarray(devpolicy.load_file(path, policy=policy_of())["t"]).tolist() == [1, 2]


class TestPlanMapped:
    """Tensors `load_file` would map take no anonymous memory, and the plan says so."""

    def test_mapped_tensors_are_file_backed_not_counted_against_free_memory(
        self, tmp_path: Path
    ) -> None:
        """A token file 4x the stated free memory, under an `mmap: true` rule: it fits."""
        path = tmp_path / "train.safetensors"
        devpolicy.save_file({"tokens": np.zeros(4096, np.uint16)}, path)
        rules = [{"match": "*/tokens", "device": "cpu:0", "mmap": True}]
        policy = devpolicy.load_policy(
            {"version": 1, "rules": rules},
            capacity=devpolicy.StaticCapacity({"cpu:0": "2KiB"}),
            environ={},
        )
        (load,) = policy.plan(path).devices
        assert (load.nbytes, load.file_backed, load.pool_nbytes, load.fits) == (8192, 8192, 0, True)
        unmapped = policy.plan(path, mmap=False)
        assert not unmapped.fits

    def test_unaligned_tensors_are_not_file_backed(self, tmp_path: Path) -> None:
        """A tensor at an offset that is not 64-byte aligned is read, so it takes memory."""
        path = tmp_path / "odd.safetensors"
        reference_save({"a": np.zeros(3, np.uint8), "b": np.zeros(4096, np.uint8)}, str(path))
        plan = devpolicy.plan(path, policy=policy_of(default="cpu:1"), mmap=True)
        offsets = {t.key: t.offset % 64 for t in plan.tensors}
        (load,) = plan.devices
        assert load.file_backed == sum(
            t.nbytes for t in plan.tensors if offsets[t.key] == 0 and t.nbytes
        )
        assert load.file_backed < load.nbytes


class TestMmapArgument:
    @pytest.mark.parametrize("mmap", ["no", "false", 0, 1, "yes"])
    def test_mmap_that_is_not_a_bool_is_refused_naming_it(
        self, tmp_path: Path, mmap: object
    ) -> None:
        """N7: `mmap="no"` mapped the file, as any truthy value did; the same slip in YAML
        is refused. Nothing is read."""
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"t": np.zeros(4096, np.uint8)}, path)
        message = rf"^load_file mmap= takes True \(map aligned tensors\), False \(read them\) or None \(each rule's `mmap`\), got {type(mmap).__name__} {re.escape(repr(mmap))}$"
        with capture_logs() as logs, pytest.raises(TypeError, match=message):
            devpolicy.load_file(path, policy=policy_of(default="cpu:1"), mmap=mmap)  # type: ignore[arg-type]
        assert not [e for e in logs if e["event"] in ("load_file", "placement")]
        with pytest.raises(TypeError, match=r"^plan mmap= takes True"):
            devpolicy.plan(path, policy=policy_of(), mmap=mmap)  # type: ignore[arg-type]
