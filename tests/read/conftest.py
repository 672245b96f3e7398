"""The read engine's tests share the stream's fixture of the ways of reading by position
(`tests/apply/conftest.py`): one `preadv` a window, a plain io_uring, a polled one."""

from __future__ import annotations

from tests.apply.conftest import by_position

__all__ = ["by_position"]
