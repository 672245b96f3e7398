"""The names a checkpoint's tensors are decided under: `<prefix>/<key>`, the key's parts
joined by `/` whatever separator the file uses; one naming for the load, `into=`, the plan
and the rule-use accounting; every tensor of a checkpoint so named (`checkpoint_names`,
headers only). No JAX here.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from ..._base.locations import URLPath, is_url, shown_url
from ..._document.layers import Settings
from ..._document.schema import NamesSpec, prefix_problem, separator_problem
from ..._names.matching import SourceFile
from ..format.header import Header
from ..remote import options_of
from .checkpoint_sources import Files, Where

#: A file or checkpoint as given: a path, or a URL (text or `URLPath`).
PathLike = str | os.PathLike[str] | URLPath


def path_text(path: PathLike) -> str:
    """`path` as events and errors show it (a URL without its credentials)."""
    if isinstance(path, URLPath):
        return str(path)
    text = os.fspath(path)
    return shown_url(text) if is_url(text) else text


def tensor_names(header: Header, stem: str, names: NamesSpec) -> list[str]:
    """Each tensor's name: `<prefix>/<key>`, or the key alone under an empty prefix, the
    key's parts separated by `/` whatever the policy's `names.separator` says they are."""
    sep = names.separator
    keys = [t.key if sep == "/" else t.key.replace(sep, "/") for t in header.tensors]
    return [f"{stem}/{key}" if stem else key for key in keys]


def check_prefix(prefix: str | None) -> None:
    """Refuse a call's prefix that the policy's `names.prefix` would refuse.

    Raises:
        ValueError: naming `prefix=` and what it takes.
    """
    problem = None if prefix is None else prefix_problem(prefix)
    if problem is not None:
        raise ValueError(f"prefix= takes {problem}")


def check_mmap(verb: str, mmap: object) -> None:
    """Refuse a call's `mmap=` that is not True, False or None: `mmap="no"` is truthy, and
    mapping a file nobody asked to map is a silent miss (the same slip in YAML is refused).

    Raises:
        TypeError: naming `mmap=` and what it takes.
    """
    if mmap is not None and not isinstance(mmap, bool):
        raise TypeError(
            f"{verb} mmap= takes True (map aligned tensors), False (read them) or None "
            f"(each rule's `mmap`), got {type(mmap).__name__} {mmap!r}"
        )


def name_prefix(stem: str, prefix: str | None, names: NamesSpec) -> str:
    """The prefix of a checkpoint's names: the call's, else the policy's, else `stem`.

    Raises:
        ValueError: a call's prefix the policy's `names.prefix` would refuse.
    """
    if prefix is not None:
        check_prefix(prefix)
        return prefix
    return stem if names.prefix is None else names.prefix


def source_files(files: tuple[Any, ...], path: PathLike) -> list[SourceFile]:
    """Each file's source for `file:` rules: its own path and the path it was loaded by
    (a checkpoint's directory or index; the same file otherwise)."""
    return [SourceFile.of(file, path) for file in files]


def call_naming(names: NamesSpec, separator: str | None) -> NamesSpec:
    """The policy's `names`, with the call's separator where one is given.

    Raises:
        ValueError: a separator the policy's `names.separator` would refuse.
    """
    if separator is None:
        return names
    problem = separator_problem(separator)
    if problem is not None:
        raise ValueError(f"separator= takes {problem}")
    return names.model_copy(update={"separator": separator})


def checkpoint_names(
    path: PathLike, settings: Settings, prefix: str | None = None
) -> list[tuple[str, int | None, tuple[int, ...] | None, SourceFile | None]]:
    """Every tensor of a checkpoint (local, or at a URL) as `load_file` and `plan` name it
    (prefix, the policy's `names:`), with its size, shape and file; only headers are read
    (a URL: never through the cache)."""
    options = replace(options_of(settings.remote_values), cache_dir=None)
    where = Where.of(path)
    with Files(options) as files:
        checkpoint = files.checkpoint(where)
        headers = [files.header(file) for file in checkpoint.files]
    checkpoint.check(headers)
    stem = name_prefix(checkpoint.stem, prefix, settings.names)
    sources = source_files(checkpoint.files, where.place)
    return [
        (name, t.nbytes, t.shape, source)
        for header, source in zip(headers, sources, strict=True)
        for name, t in zip(tensor_names(header, stem, settings.names), header.tensors, strict=True)
    ]
