"""Target text: platforms, aliases and process-local indices."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devpolicy._document.targets import Target, parse_target


class TestParseTarget:
    @pytest.mark.parametrize(
        ("text", "platform", "index"),
        [
            ("auto", "auto", None),
            ("cpu", "cpu", None),
            ("cpu:3", "cpu", 3),
            ("gpu", "gpu", None),
            ("gpu:1", "gpu", 1),
            ("cuda", "gpu", None),
            ("cuda:0", "gpu", 0),
            ("rocm:2", "gpu", 2),
            ("tpu:7", "tpu", 7),
            ("accelerator", "accelerator", None),
            ("accelerator:1", "accelerator", 1),
        ],
    )
    def test_platforms_aliases_and_indices(
        self, text: str, platform: str, index: int | None
    ) -> None:
        """`cuda` and `rocm` are the gpu platform; the index is optional."""
        assert parse_target(text) == Target(text, platform, index)

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("CPU", r"did you mean 'cpu'\?"),
            ("gpuu", r"did you mean 'gpu'\?"),
            ("accelerater", r"did you mean 'accelerator'\?"),
            ("accel:0", r"^unknown platform 'accel'.*accelerator"),
            ("gpu:-1", r"^not a target: 'gpu:-1'; accepted"),
            ("gpu:01", r"^not a target: 'gpu:01'"),
            ("gpu: 1", r"^not a target"),
            ("cpu:1:2", r"^not a target"),
            ("auto:1", r"`auto` takes no device index"),
            ("npu", r"^unknown platform 'npu' in target 'npu'"),
            ("", r"^not a target: ''"),
            ("gpu:99999999999999999999", r"out of range \(0\.\.65535\)"),
            # A slip of the `:` before the index: the target meant, not the bare platform.
            ("cpu;1", r"^not a target: 'cpu;1' \(did you mean 'cpu:1'\?\)"),
            ("gpu.0", r"^not a target: 'gpu\.0' \(did you mean 'gpu:0'\?\)"),
            ("gpu 1", r"^not a target: 'gpu 1' \(did you mean 'gpu:1'\?\)"),
            ("tpu1", r"\(did you mean 'tpu:1'\?\)"),
            ("CPU;1", r"\(did you mean 'cpu:1'\?\)"),
            ("accelerator;1", r"\(did you mean 'accelerator:1'\?\)"),
        ],
    )
    def test_rejects_bad_targets_listing_the_accepted_forms(self, text: str, message: str) -> None:
        """Every rejection names the text and lists the accepted forms."""
        with pytest.raises(ValueError, match=message) as info:
            parse_target(text)
        assert "accepted: auto, or cpu, gpu, tpu, cuda, rocm" in str(info.value) or "range" in str(
            info.value
        )

    def test_non_strings_are_rejected(self) -> None:
        """A YAML number or list in a target field is an error, not a crash."""
        with pytest.raises(ValueError, match=r"^expected a target string, got int 1"):
            parse_target(1)

    @given(st.text(max_size=16))
    def test_any_text_parses_or_raises_value_error(self, text: str) -> None:
        """Random text either parses to a known platform or raises ValueError."""
        try:
            target = parse_target(text)
        except ValueError:
            return
        assert target.platform in ("auto", "cpu", "gpu", "tpu")
        assert target.text == text

    @given(st.sampled_from(["cpu", "gpu", "tpu", "cuda", "rocm"]), st.integers(0, 65535))
    def test_every_platform_index_pair_parses(self, platform: str, index: int) -> None:
        """`platform:N` parses for every platform spelling and index in range."""
        assert parse_target(f"{platform}:{index}").index == index


class TestAcceleratorTarget:
    def test_the_neutral_target_takes_a_platform_keeping_its_index(self) -> None:
        """`accelerator:1` on a TPU machine is `tpu:1`; without an index it stays without."""
        assert parse_target("accelerator:1").on("tpu") == Target("tpu:1", "tpu", 1)
        assert parse_target("accelerator").on("gpu") == Target("gpu", "gpu", None)

    def test_only_the_neutral_target_says_it_is_one(self) -> None:
        """`is_accelerator` is true for `accelerator` alone, not for a platform's name."""
        assert parse_target("accelerator:0").is_accelerator
        assert not any(parse_target(t).is_accelerator for t in ("tpu", "gpu", "cuda", "auto"))
