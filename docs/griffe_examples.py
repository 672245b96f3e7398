"""Griffe extension for the API reference: `Example:` sections render as code.

devpolicy's docstrings title their doctested examples `Example:` (Google style). Griffe's
Google parser reads only `Examples:` as an examples section and turns `Example:` into a
prose admonition, where `>>>` lines lose their code formatting and doctest output such as
`['cpu:0', 'cpu:1']` reads as a Markdown link. This renames the title before parsing.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_TITLE = re.compile(r"^(\s*)Example:[ \t]*$", re.M)


class ExampleSections(griffe.Extension):
    """Reads a docstring's `Example:` section as `Examples:`, so its `>>>` lines are code."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _TITLE.sub(r"\1Examples:", obj.docstring.value)
