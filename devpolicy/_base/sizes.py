"""Byte sizes: parse `512MiB`, `4GiB`, `1.5GB` or an integer; format for people."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from .errors import did_you_mean

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
}
UNIT_NAMES = ("B", "KB", "MB", "GB", "TB", "PB", "KiB", "MiB", "GiB", "TiB", "PiB")
SIZE_FORMS = "a non-negative integer of bytes, or a number with a unit: " + ", ".join(UNIT_NAMES)
SIZE_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGTP]i?)?B?\s*$"
MAX_BYTES = 2**63 - 1
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")


def parse_size(value: object) -> int:
    """Return the number of bytes `value` stands for.

    Units are case-insensitive: `KB`/`MB`/`GB`... are powers of 1000, `KiB`/`MiB`/`GiB`...
    powers of 1024. The result must be a whole number of bytes.

    Raises:
        ValueError: with a message naming the accepted forms.

    Example:
        >>> parse_size("1.5GB"), parse_size("4GiB"), parse_size(512)
        (1500000000, 4294967296, 512)
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size, got the boolean {value!r}; accepted: {SIZE_FORMS}")
    if isinstance(value, int):
        if not 0 <= value <= MAX_BYTES:
            raise ValueError(f"size out of range: {value}; accepted: {SIZE_FORMS}")
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"size must be finite, got {value!r}; accepted: {SIZE_FORMS}")
        if value < 0 or not value.is_integer():
            raise ValueError(f"size must be a whole, non-negative number of bytes, got {value!r}")
        return parse_size(int(value))
    if not isinstance(value, str):
        raise ValueError(f"expected a size, got {type(value).__name__}; accepted: {SIZE_FORMS}")
    m = _SIZE.fullmatch(value)
    if m is None:
        raise ValueError(f"not a size: {value!r}; accepted: {SIZE_FORMS}")
    number, unit = m.groups()
    # Past these lengths the size is out of range whatever the unit (and Decimal overflows).
    if len(number.split(".")[0].lstrip("0")) > 30 or len(number) > 200:
        raise ValueError(
            f"size out of range: a number of {len(number)} characters; accepted: {SIZE_FORMS}"
        )
    factor = _UNITS.get(unit.lower())
    if factor is None:
        hint = did_you_mean(unit, UNIT_NAMES)
        raise ValueError(
            f"unknown size unit {unit!r} in {value!r}{hint}; accepted units: "
            + ", ".join(UNIT_NAMES)
        )
    try:
        exact = Decimal(number) * factor
    except InvalidOperation as e:  # pragma: no cover - the regex admits only plain decimals
        raise ValueError(f"not a size: {value!r}") from e
    if exact != exact.to_integral_value():
        raise ValueError(f"{value!r} is not a whole number of bytes ({exact})")
    return parse_size(int(exact))


def format_size(nbytes: int) -> str:
    """Format a byte count with binary units.

    Example:
        >>> format_size(20_508_468_838), format_size(512)
        ('19.1 GiB', '512 B')
    """
    if nbytes < 1024:
        return f"{nbytes} B"
    size = float(nbytes)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        size /= 1024
        if size < 1024 or unit == "PiB":
            return f"{size:.1f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover
