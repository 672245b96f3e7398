"""What differs between jax versions: each difference decided by version, in one place."""

from __future__ import annotations

import importlib.metadata

import jax
import pytest

from devpolicy._base import compat as _compat
from devpolicy._runtime import knobs as _runtime


class TestRelease:
    @pytest.mark.parametrize(
        ("version", "expected"),
        [
            ("0.10.2", (0, 10, 2)),
            ("0.12.0.1", (0, 12, 0, 1)),
            ("0.7.1.dev20250701", (0, 7, 1)),
            ("0.11.0rc1", (0, 11, 0)),
        ],
    )
    def test_release_numbers_drop_suffixes(
        self, monkeypatch: pytest.MonkeyPatch, version: str, expected: tuple[int, ...]
    ) -> None:
        """A version's release numbers, without dev or rc suffixes."""
        monkeypatch.setattr(importlib.metadata, "version", lambda name: version)
        assert _compat.release("jaxlib") == expected

    def test_a_missing_distribution_has_no_release(self) -> None:
        """A distribution that is not installed gives None, not an error."""
        assert _compat.release("no-such-distribution-here") is None


class TestAllocators:
    @pytest.mark.parametrize(
        ("jaxlib", "expected"),
        [
            ((0, 6, 0), ("default", "platform", "bfc", "cuda_async")),
            ((0, 9, 2), ("default", "platform", "bfc", "cuda_async")),
            ((0, 10, 0), ("default", "platform", "bfc", "cuda_async", "vmm")),
            ((0, 10, 2), ("default", "platform", "bfc", "cuda_async", "vmm")),
            ((0, 11, 0), ("default", "platform", "bfc", "cuda_async", "vmm", "address")),
            ((0, 12, 0, 1), ("default", "platform", "bfc", "cuda_async", "vmm", "address")),
            (None, ("default", "platform", "bfc", "cuda_async", "vmm", "address")),
        ],
    )
    def test_allocators_follow_the_jaxlib_version(
        self, jaxlib: tuple[int, ...] | None, expected: tuple[str, ...]
    ) -> None:
        """`vmm` from jaxlib 0.10, `address` from 0.11; without jaxlib, the newest list."""
        assert _compat.allocators(jaxlib) == expected

    def test_the_policy_accepts_what_the_installed_jaxlib_accepts(self) -> None:
        """`runtime.allocator` is checked against the installed jaxlib's list."""
        assert _compat.allocators(_compat.release("jaxlib")) == _runtime.ALLOCATORS


def test_the_mesh_context_is_the_installed_jax_s() -> None:
    """`jax.set_mesh` where jax has it, else `jax.sharding.use_mesh`."""
    expected = getattr(jax, "set_mesh", None) or jax.sharding.use_mesh  # type: ignore[attr-defined]
    assert _compat.mesh_context() is expected
