"""`DEVPOLICY_TRANSFERS` takes a bare mode followed by overrides (issue 43, N10):
`log,host_local=log` is "everything log, host_local too"; every bad form still names the
variable, the item and the valid choices."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

import devpolicy
from devpolicy._document.environment import TRANSFERS_FORMS, read_env
from devpolicy._document.fields import TRANSFER_DIRECTIONS, TRANSFER_FIELDS, TRANSFER_MODES


def _transfers(value: str) -> dict[str, str]:
    return dict(read_env({"DEVPOLICY_TRANSFERS": value}).transfers)


def test_a_bare_mode_then_an_override_is_every_direction_and_the_override() -> None:
    """The issue's value: the three directions at `log`, and `host_local` too."""
    assert _transfers("log,host_local=log") == dict.fromkeys(TRANSFER_FIELDS, "log")


def test_an_override_wins_over_the_bare_mode_for_its_field() -> None:
    expected = {**dict.fromkeys(TRANSFER_DIRECTIONS, "disallow"), "device_to_host": "log"}
    assert _transfers("disallow, device_to_host=log") == expected


_spaces = st.sampled_from(["", " ", "  "])


@given(
    bare=st.none() | st.sampled_from(TRANSFER_MODES),
    overrides=st.dictionaries(st.sampled_from(TRANSFER_FIELDS), st.sampled_from(TRANSFER_MODES)),
    order=st.randoms(use_true_random=False),
    space=_spaces,
)
def test_any_bare_mode_and_overrides_read_as_written(
    bare: str | None, overrides: dict[str, str], order: object, space: str
) -> None:
    """Whatever the mode, the fields, their order and the spaces around them: the bare
    mode sets the three directions, each override then sets its field."""
    items = list(overrides.items())
    order.shuffle(items)  # type: ignore[attr-defined]
    texts = ([bare] if bare is not None else []) + [f"{k}{space}={space}{v}" for k, v in items]
    if not texts:
        return
    expected = dict.fromkeys(TRANSFER_DIRECTIONS, bare) if bare is not None else {}
    expected |= overrides
    assert _transfers(f"{space},{space}".join(texts)) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("host_local=log,log", r"item 'log': a bare mode comes first, before the overrides"),
        ("log,allow", r"item 'allow': a bare mode comes first, before the overrides"),
        ("log,host_local=lots", r"item 'host_local=lots': unknown mode 'lots'"),
        ("lg,host_local=log", r"item 'lg': unknown transfer mode 'lg' \(did you mean 'log'\?\)"),
        ("log,hots_local=log", r"item 'hots_local=log': unknown field \(did you mean"),
        ("log,host_local=log,host_local=allow", r"host_local is given twice"),
        ("log,", r"item 1 is empty"),
    ],
)
def test_a_bad_form_names_the_variable_the_item_and_the_choices(value: str, message: str) -> None:
    with pytest.raises(devpolicy.errors.EnvOverrideError, match=message) as caught:
        _transfers(value)
    error = caught.value
    assert error.variable == "DEVPOLICY_TRANSFERS"
    assert error.accepted == TRANSFERS_FORMS
    assert re.search(r"MODE\[,field=mode\.\.\.\]", error.accepted)
    assert str(error).startswith(f"DEVPOLICY_TRANSFERS={value!r}: ")
