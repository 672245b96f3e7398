"""A stream's tokens (`devpolicy._apply.stream.sources`): one array or a mixture's named
sources, each a host view of numbers; anything else refused naming it, nothing opened."""

from __future__ import annotations

import re

import numpy as np
import pytest

import devpolicy
from tests.helpers import policy_of


class TestTokenSources:
    @pytest.mark.parametrize(
        "tokens",
        [
            np.array(["a", "b", "c", "d"] * 10),
            np.array([object()] * 40),
            np.zeros(40, [("id", np.int32), ("w", np.float32)]),
            np.zeros(40, "datetime64[s]"),
        ],
        ids=["str", "object", "structured", "datetime"],
    )
    def test_tokens_that_are_not_numbers_are_refused_naming_tokens_and_dtype(
        self, tokens: np.ndarray
    ) -> None:
        """M4: such tokens were accepted and the first pull raised numpy's or JAX's
        TypeError, naming neither `windows` nor `tokens`."""
        with pytest.raises(
            TypeError, match=rf"^windows tokens are {re.escape(str(tokens.dtype))}: .*numbers"
        ):
            devpolicy.windows(tokens, 4, 2, policy=policy_of())

    def test_numbers_of_every_kind_jax_takes_are_accepted(self) -> None:
        """The dtype check refuses nothing a stream could place: bool, ints, floats and
        ml_dtypes' bfloat16."""
        import ml_dtypes

        for dtype in (np.bool_, np.uint16, np.int32, np.float16, ml_dtypes.bfloat16):
            (batch,) = devpolicy.windows(np.zeros(8, dtype), 4, 2, steps=1, policy=policy_of())
            assert batch.dtype == np.dtype(dtype)

    @pytest.mark.parametrize(
        ("tokens", "got"), [(list(range(5000)), "list"), (tuple(range(50)), "tuple")]
    )
    def test_a_python_list_of_tokens_is_refused_naming_windows_and_tokens(
        self, tokens: object, got: str
    ) -> None:
        """N8: the error named `host_view()`, a function the user never called; a list is
        shards, so one of numbers says what it takes."""
        with pytest.raises(
            TypeError,
            match=rf"^windows tokens must be a jax\.Array .*or a list of them \(shards: their "
            rf"concatenation\), got a {got} of int: pass np\.asarray",
        ):
            devpolicy.windows(tokens, 10, 2, policy=policy_of())

    def test_a_mixture_source_that_is_a_list_is_named(self) -> None:
        with pytest.raises(TypeError, match=r"^windows tokens\['code'\] must be a jax\.Array"):
            devpolicy.windows(
                {"web": np.arange(100), "code": list(range(100))},
                4,
                2,
                order="random",
                weights={"web": 1, "code": 1},
                policy=policy_of(),
            )
