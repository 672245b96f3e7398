"""Names of a public module imported on first use (PEP 562), so importing it stays light.

`devpolicy`, `devpolicy.errors`, `devpolicy.types`, `devpolicy.sizes` and
`devpolicy.threads` each list their names in `__all__` and take them from `_api.py` (which
imports JAX) only when one is first read. No JAX, pydantic or structlog here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Collection
from typing import Any


def lazy_names(
    module: str, names: Collection[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of public module `module` whose names are `names`.

    A name is imported from `devpolicy._api` on first use and then kept in the module, so
    each later use is a plain attribute read.
    """

    def getattr_(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module("devpolicy._api"), name)
        setattr(sys.modules[module], name, value)
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[module]), *names})

    return getattr_, dir_
