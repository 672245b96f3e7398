"""Byte sizes as devpolicy reads and writes them (`4GiB`, `512MB`, `1.5 GiB`).

A policy's sizes (`if: {min_size: 1GiB}`, `headroom`, `StaticCapacity({"cpu:1": "2GiB"})`)
are read by `parse_size` and shown by `format_size`; use them for the same text in your own
code. Not about placement, so not at the top level.

Example:
    >>> from devpolicy.sizes import format_size, parse_size
    >>> parse_size("4GiB"), format_size(3 * 2**30)
    (4294967296, '3.0 GiB')
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_names

if TYPE_CHECKING:
    from ._api import format_size as format_size
    from ._api import parse_size as parse_size

__all__ = ["format_size", "parse_size"]

# Hidden from type checkers, so that a misspelt name is an error there rather than `Any`.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_names(__name__, __all__)
