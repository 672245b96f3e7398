"""Where a transfer was asked for: the user's line on the live stack, and the library's.

A frame is JAX's machinery (JAX, jaxlib, numpy, devpolicy: never a site), a library's (an
installed package, found by its `site-packages` or `dist-packages` folder wherever that
is, or the standard library), or the user's. The site is the innermost frame of the
user's code; the innermost library frame below it is kept beside it, so a transfer made
inside flax names the user's line that called flax, and flax's own.
"""

from __future__ import annotations

import os
import site
import sysconfig
from typing import Any

from .._base import compat

# Frames in these folders (JAX, jaxlib, numpy, devpolicy) are the machinery of a transfer:
# never its site, nor its library site.
_SKIPPED: tuple[str, ...] = ()
# Folders of code that is not the user's own: installed packages and the standard library.
# A frame there is a transfer's `library_site`; its site is the user's line that called in.
_LIBRARIES: tuple[str, ...] = ()
# Where installed packages live, whatever interpreter, venv or `sys.path` entry holds them.
_PACKAGE_FOLDERS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
# Both caches hold one entry per source file seen (a program's files: a few hundred).
_FILES_LIMIT = 4096
# co_filename -> what a frame there is: _MACHINERY, _LIBRARY or _USER.
_MACHINERY, _LIBRARY, _USER = 0, 1, 2
_kinds: dict[str, int] = {}
# co_filename -> the path shown (relative to the working directory where inside it; a
# library's inside its site-packages folder).
_shown_files: dict[str, str] = {}


def _find_folders() -> None:
    """Work out the machinery's and the libraries' folders (once: they do not move)."""
    global _SKIPPED, _LIBRARIES
    ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    _LIBRARIES = _library_folders()
    _SKIPPED = (*compat.package_dirs(), ours)


def site_of(frame: Any) -> tuple[str, str, str | None]:
    """Where a transfer was asked for: `path/file.py:LINE` and the function of the
    innermost frame of the user's code (outside JAX, numpy, devpolicy, installed packages
    and the standard library), and the innermost library frame below it where there is
    one (`flax/nnx/variablelib.py:2318`), else None. With no user frame on the stack the
    library frame is the site."""
    if not _SKIPPED:
        _find_folders()
    library: tuple[str, str] | None = None
    while frame is not None:
        code = frame.f_code
        kind = _kinds.get(code.co_filename)
        if kind is None:
            kind = _kind(code.co_filename)
        if kind == _USER:
            return (
                f"{_shown(code.co_filename)}:{frame.f_lineno}",
                _function(code),
                None if library is None else library[0],
            )
        if kind == _LIBRARY and library is None:
            library = f"{_shown(code.co_filename)}:{frame.f_lineno}", _function(code)
        frame = frame.f_back
    if library is not None:
        return library[0], library[1], None
    return "<unknown>", "<unknown>", None


def _kind(filename: str) -> int:
    """Whether code in `filename` is JAX's machinery, a library's or the user's (cached)."""
    if len(_kinds) >= _FILES_LIMIT:
        _kinds.clear()  # code made up without end (exec): start over
    if filename.startswith(_SKIPPED):
        kind = _MACHINERY
    elif (
        filename.startswith(_LIBRARIES)
        or any(folder in filename for folder in _PACKAGE_FOLDERS)
        or filename.startswith("<frozen ")
    ):
        kind = _LIBRARY
    else:
        kind = _USER
    _kinds[filename] = kind
    return kind


def _library_folders() -> tuple[str, ...]:
    """The standard library's folders and this interpreter's package folders."""
    paths = sysconfig.get_paths()
    folders = {paths[name] for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    folders.update(site.getsitepackages() if hasattr(site, "getsitepackages") else ())
    return tuple(os.path.join(os.path.abspath(f), "") for f in sorted(folders) if f)


def _shown(filename: str) -> str:
    shown = _shown_files.get(filename)
    if shown is None:
        inside = _inside_packages(filename)
        if inside is not None:
            shown = inside
        else:
            try:
                relative = os.path.relpath(filename)
                shown = filename if relative.startswith("..") else relative
            except ValueError:  # another drive (Windows)
                shown = filename
        if len(_shown_files) >= _FILES_LIMIT:
            _shown_files.clear()
        _shown_files[filename] = shown
    return shown


def _inside_packages(filename: str) -> str | None:
    """`flax/nnx/variablelib.py` of a file in a package folder, or of the standard
    library (`json/decoder.py`); None for any other file."""
    for folder in _PACKAGE_FOLDERS:
        at = filename.rfind(folder)
        if at >= 0:
            return filename[at + len(folder) :]
    for folder in _LIBRARIES:
        if filename.startswith(folder):
            return filename[len(folder) :]
    return None


def _function(code: Any) -> str:
    return str(getattr(code, "co_qualname", code.co_name))
