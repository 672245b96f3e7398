"""`windows`' arguments (`devpolicy._apply.stream.arguments`): one record, written once,
the verb's and the policy method's signatures held to it, the saved state made from it,
and every fault refused at the call before anything opens."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

import devpolicy
from devpolicy._apply.stream.arguments import WindowsArguments
from tests.apply.streams import TOKEN_RULES
from tests.helpers import policy_of


class TestOneRecordOfArguments:
    def test_the_verbs_keywords_are_the_records_fields_in_order_with_their_defaults(
        self,
    ) -> None:
        verb = inspect.signature(devpolicy.windows).parameters
        given = [(n, p.default) for n, p in verb.items() if n != "policy"]
        fields = [
            (f.name, inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default)
            for f in dataclasses.fields(WindowsArguments)
        ]
        assert given == fields

    def test_the_policy_method_takes_the_same_keywords(self) -> None:
        method = inspect.signature(devpolicy.Policy.windows).parameters
        fields = [f.name for f in dataclasses.fields(WindowsArguments)]
        assert [n for n in method if n != "self"] == fields
        policy = policy_of(rules=TOKEN_RULES)
        with pytest.raises(TypeError, match="unexpected keyword argument 'sead'"):
            policy.windows(np.arange(100), 8, 2, sead=1)

    def test_the_policy_method_and_the_verb_give_the_same_batches_and_state(self) -> None:
        policy = policy_of(rules=TOKEN_RULES)
        tokens = np.arange(1000, dtype=np.uint16)
        kwargs = {"order": "shuffled", "seed": 4, "steps": 5, "report_every": None}
        with policy.windows(tokens, 8, 3, **kwargs) as by_method:
            a = [np.asarray(b) for b in by_method]
            state_a = by_method.state()
        with devpolicy.windows(tokens, 8, 3, policy=policy, **kwargs) as by_verb:  # type: ignore[arg-type]
            b = [np.asarray(x) for x in by_verb]
            state_b = by_verb.state()
        assert len(a) == len(b) == 5
        assert all((x == y).all() for x, y in zip(a, b, strict=True))
        assert state_a == state_b


class TestArgumentsRefusedBeforeAnythingOpens:
    """Issue 56's attack findings on `windows`' arguments (H1, M4, N8), each refused at
    the call, naming the argument, before a batch is cut."""

    def test_a_size_past_the_cap_is_refused_naming_size_not_grown_into(self) -> None:
        """H1: `size=10**7` placed ten million batches before the first came, growing
        memory until the process died; now a ValueError names `size` and its range."""
        tokens = np.arange(100_000, dtype=np.int32)
        with pytest.raises(
            ValueError, match=r"^windows size must be an int from 1 to 1024 .*got 10000000$"
        ):
            devpolicy.windows(
                tokens, 8, 4, order="shuffled", seed=1, size=10**7, policy=policy_of()
            )

    def test_batches_ahead_the_host_cannot_hold_are_refused_naming_size(self) -> None:
        """H1: one batch fits the host, `2 * size + 2` of them do not: refused with what
        a batch needs and how many the stream would hold, before anything is allocated."""
        from devpolicy._machine.capacity import host_available_bytes

        available = host_available_bytes()
        if available is None:
            pytest.skip("this host does not say how much memory it has available")
        window = 1000
        batch = available // (10 * window)  # a tenth of what is available, a batch
        tokens = np.zeros(window, np.uint8)
        with pytest.raises(
            ValueError, match=r"size=8 holds up to 18 batches at once: .* lower size, batch"
        ):
            devpolicy.windows(
                tokens, window, batch, order="random", seed=0, size=8, policy=policy_of()
            )
