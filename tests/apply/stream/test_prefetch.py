"""prefetch: batches placed by the policy, transferred ahead of use."""

from __future__ import annotations

from collections.abc import Iterator

import jax
import numpy as np
import pytest

import devpolicy
from tests.helpers import policy_of

POLICY = policy_of(rules=[{"match": "batch*", "device": "cpu:2"}])


def where(x: jax.Array) -> str:
    (device,) = x.devices()
    return devpolicy.inventory().text(device)


class TestPrefetch:
    def test_every_element_is_placed_by_the_rule(self) -> None:
        """Each batch lands on the rule's device, committed, in order."""
        out = list(devpolicy.prefetch((np.full(3, i) for i in range(5)), policy=POLICY))
        assert [int(x[0]) for x in out] == [0, 1, 2, 3, 4]
        assert {where(x) for x in out} == {"cpu:2"}
        assert all(x.committed for x in out)

    def test_transfers_run_ahead_by_size(self) -> None:
        """While batch i is used, batches up to i + size - 1 have been put already."""
        pulled: list[int] = []

        def source() -> Iterator[np.ndarray]:
            for i in range(6):
                pulled.append(i)
                yield np.full(2, i)

        stream = devpolicy.prefetch(source(), size=3, policy=POLICY)
        first = next(stream)
        assert int(first[0]) == 0
        assert pulled == [0, 1, 2, 3]

    def test_pytrees_are_named_by_path(self) -> None:
        """A dict batch's leaves are decided as batch/<key>."""
        policy = policy_of(
            rules=[{"match": "batch/x", "device": "cpu:1"}, {"match": "batch/y", "device": "cpu:3"}]
        )
        (batch,) = devpolicy.prefetch([{"x": np.zeros(2), "y": np.ones(2)}], policy=policy)
        assert (where(batch["x"]), where(batch["y"])) == ("cpu:1", "cpu:3")

    def test_active_policy_at_call_time(self) -> None:
        """Without policy=, the policy active when prefetch is called decides."""
        with devpolicy.activate(POLICY):
            stream = devpolicy.prefetch([np.zeros(1)])
        assert where(next(stream)) == "cpu:2"

    @pytest.mark.parametrize("size", [0, -1, 1.5, True, 1025, 10**7])
    def test_bad_size_is_rejected_at_once(self, size: object) -> None:
        """size must be an int from 1 to 1,024 (a deeper queue hides no more latency and
        fills the host with arrays); the error comes at the call, not at first use."""
        with pytest.raises(ValueError, match=r"^prefetch size must be an int from 1 to 1024"):
            devpolicy.prefetch([], size=size, policy=POLICY)  # type: ignore[arg-type]

    def test_empty_iterable_yields_nothing(self) -> None:
        """An empty source is an empty stream."""
        assert list(devpolicy.prefetch([], policy=POLICY)) == []


def test_a_failing_source_delivers_what_came_before_then_raises() -> None:
    """Batches placed before the source failed are used first, as with plain iteration."""

    def source() -> Iterator[np.ndarray]:
        for i in range(4):
            yield np.full(1, i)
        raise OSError("disk gone")

    seen: list[int] = []

    def consume() -> None:
        for batch in devpolicy.prefetch(source(), policy=POLICY):
            seen.append(int(batch[0]))

    with pytest.raises(OSError, match=r"^disk gone$"):
        consume()
    assert seen == [0, 1, 2, 3]


class TestClose:
    def test_close_closes_the_source_iterator(self) -> None:
        """Closing the stream closes its source (its `finally` runs: files closed), even
        while the caller still holds the source."""
        events: list[str] = []

        def source() -> Iterator[np.ndarray]:
            try:
                for i in range(10):
                    yield np.full(1, i)
            finally:
                events.append("source closed")

        held = source()
        stream = devpolicy.prefetch(held, size=2, policy=POLICY)
        assert int(next(stream)[0]) == 0
        stream.close()
        assert events == ["source closed"]
        assert list(stream) == []

    def test_close_before_the_first_batch_closes_the_source(self) -> None:
        """A stream closed before it was read still closes its source."""
        closed: list[bool] = []

        class Source:
            def __iter__(self) -> Source:
                return self

            def __next__(self) -> np.ndarray:
                return np.zeros(1)

            def close(self) -> None:
                closed.append(True)

        stream = devpolicy.prefetch(Source(), policy=POLICY)
        stream.close()
        assert closed == [True]

    def test_closing_twice_is_harmless(self) -> None:
        """close() may be called again, and on an exhausted stream; `with` closes it too."""
        with devpolicy.prefetch([np.zeros(1)], policy=POLICY) as stream:
            assert len(list(stream)) == 1
        stream.close()
