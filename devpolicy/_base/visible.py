"""Untrusted text made safe to show: control characters appear as escapes, never obeyed.

Tensor names, file names, metadata and policy text come from files someone else may have
written. Shown raw, an escape sequence in one (`\\x1b[2J`) clears or rewrites the terminal,
a `\\r` overwrites the line it is on, a newline forges a log line, and a bidirectional
override reorders what is read. Every output (the command line, devpolicy's own log
renderers, `print`/`rich.print` of a `Decision`, `Explanation` or `Plan`) goes through
here. A leaf: no JAX, no rich.
"""

from __future__ import annotations

import re

# C0 controls (tab and newline included: a name or a log value is one line), DEL, C1
# controls, and the bidirectional embeddings, overrides and isolates that reorder text.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    # Python's own escape: \r, \n, \t, \x1b, \x9b, \u202e.
    return repr(match.group())[1:-1]


def visible(text: object) -> str:
    """`text` as one line with every control character shown as an escape.

    Example:
        >>> print(visible("a\\x1b[31mb\\r\\nc\\u202e"))
        a\\x1b[31mb\\r\\nc\\u202e
        >>> visible("layer.0/w é [red]")
        'layer.0/w é [red]'
    """
    return _CONTROL.sub(_escape, str(text))


def visible_lines(text: object) -> str:
    """`text` with its lines kept and every other control character shown as an escape.

    For messages that are several lines by design (an error listing what was tried).

    Example:
        >>> print(visible_lines("no device\\n  gpu:0: a\\x1bb"))
        no device
          gpu:0: a\\x1bb
    """
    return "\n".join(visible(line) for line in str(text).split("\n"))
