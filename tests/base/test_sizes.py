"""Byte sizes: integers and unit strings, parsed exactly or rejected with the accepted forms."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devpolicy.sizes import format_size, parse_size


class TestParseSize:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            (0, 0),
            (512, 512),
            ("512", 512),
            ("512B", 512),
            ("512MiB", 512 * 2**20),
            ("4GiB", 4 * 2**30),
            ("4gib", 4 * 2**30),
            ("1.5GB", 1_500_000_000),
            ("1.5 GB", 1_500_000_000),
            ("2KB", 2000),
            ("1TiB", 2**40),
            ("0.5KiB", 512),
            (1e9, 1_000_000_000),
        ],
    )
    def test_accepts_integers_and_unit_strings(self, text: object, expected: int) -> None:
        """Integers, plain digit strings and decimal or binary units give exact byte counts."""
        assert parse_size(text) == expected

    @pytest.mark.parametrize(
        ("value", "message"),
        [
            (-1, r"^size out of range: -1; accepted: a non-negative integer"),
            ("-1GB", r"^not a size: '-1GB'; accepted:"),
            ("4 gigs", r"^unknown size unit 'gigs' in '4 gigs'.*accepted units: B, KB"),
            ("4GIBB", r"^unknown size unit 'GIBB'"),
            ("1.5B", r"^'1.5B' is not a whole number of bytes"),
            ("", r"^not a size: ''"),
            ("GiB", r"^not a size: 'GiB'"),
            (True, r"^expected a size, got the boolean True"),
            ([1], r"^expected a size, got list"),
            (float("nan"), r"^size must be finite"),
            (0.5, r"^size must be a whole, non-negative number of bytes"),
            (2**64, r"^size out of range"),
        ],
    )
    def test_rejects_bad_sizes_naming_the_accepted_forms(self, value: object, message: str) -> None:
        """Bad sizes raise ValueError that says what was wrong and what is accepted."""
        with pytest.raises(ValueError, match=message):
            parse_size(value)

    def test_unit_typo_gets_a_hint(self) -> None:
        """A near miss of a unit name suggests the unit."""
        with pytest.raises(ValueError, match=r"did you mean 'GiB'\?"):
            parse_size("4GiBs")

    @given(
        st.integers(min_value=0, max_value=2**32),
        st.sampled_from(["B", "KiB", "MiB", "GiB", "KB", "MB"]),
    )
    def test_whole_numbers_with_any_unit_round_trip(self, number: int, unit: str) -> None:
        """`N<unit>` is N times the unit's factor, for every N."""
        factor = {"B": 1, "KiB": 1024, "MiB": 2**20, "GiB": 2**30, "KB": 1000, "MB": 10**6}[unit]
        assert parse_size(f"{number}{unit}") == number * factor

    @given(st.text(max_size=12))
    def test_any_text_parses_or_raises_value_error(self, text: str) -> None:
        """No input makes the parser raise anything but ValueError."""
        with contextlib.suppress(ValueError):
            assert parse_size(text) >= 0


class TestFormatSize:
    @pytest.mark.parametrize(
        ("nbytes", "text"),
        [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.0 KiB"),
            (20_508_468_838, "19.1 GiB"),
            (2**60, "1024.0 PiB"),
        ],
    )
    def test_uses_binary_units_with_one_decimal(self, nbytes: int, text: str) -> None:
        """Sizes read as people write them in logs and tables."""
        assert format_size(nbytes) == text
