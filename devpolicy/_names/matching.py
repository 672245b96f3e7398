"""Name matching: rules' patterns compiled once, first match wins. Never imports JAX."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import re2

from .._base.locations import URLPath, is_url
from .._base.sizes import format_size
from .dialect import REGEX_LIMITS, to_re2
from .prefixes import PrefixIndex


def _slashed(path: str) -> str:
    return path.replace(os.sep, "/") if os.sep != "/" else path


@dataclass(frozen=True, slots=True)
class SourceFile:
    """Where a tensor comes from, as `file:` conditions see it: each path as written
    (normalised: no `./`, no doubled `/`) and as resolved (absolute, links followed).

    For a checkpoint's tensor the paths are its member file's and the checkpoint's own
    (the directory or index it was loaded through). Hashable: decisions are cached by it.

    Attributes:
        shown: The tensor's file as written, for messages.
        paths: Every path a glob with `/` is tried against.
        names: Their last components, which a glob without `/` is tried against.

    Example:
        >>> src = SourceFile.of("data/./train.safetensors")
        >>> src.shown, src.paths[0], src.names[0]
        ('data/train.safetensors', 'data/train.safetensors', 'train.safetensors')
    """

    shown: str
    paths: tuple[str, ...]
    names: tuple[str, ...] = field(compare=False)

    @classmethod
    def of(
        cls, path: str | os.PathLike[str] | URLPath, *also: str | os.PathLike[str] | URLPath
    ) -> SourceFile:
        """The source for a file at `path` (and, for a checkpoint's member, the
        checkpoint's own path in `also`). A URL (`s3://bucket/ckpt/m.safetensors`, a
        `URLPath`) is tried as shown (no credentials) and as its object's path in its
        bucket, repository or host (`/ckpt/m.safetensors`)."""
        if isinstance(path, URLPath) or is_url(path):
            shown = _url_forms(path)[0]
        else:
            shown = _slashed(os.path.normpath(os.fspath(path)))
        forms: list[str] = []
        for given in (path, *also):
            if isinstance(given, URLPath) or is_url(given):
                forms += [f for f in _url_forms(given) if f not in forms]
                continue
            text = os.fspath(given)
            for form in (os.path.normpath(text), os.path.realpath(text)):
                form = _slashed(form)
                if form not in forms:
                    forms.append(form)
        names = tuple(dict.fromkeys(f.rsplit("/", 1)[-1] for f in forms))
        return cls(shown, tuple(forms), names)

    def __str__(self) -> str:
        return self.shown


def _url_forms(url: object) -> list[str]:
    """A URL's forms for `file:` globs: as shown, and its object's path."""
    located = url if isinstance(url, URLPath) else URLPath(str(url))
    return [str(located), located.object_path]


def source_file(
    file: str | os.PathLike[str] | URLPath | SourceFile | None,
) -> SourceFile | None:
    """A `file=` argument as a `SourceFile` (None stays None).

    Raises:
        TypeError: `file` is not a path.

    Example:
        >>> source_file("x/../train.safetensors").shown
        'train.safetensors'
    """
    if file is None or isinstance(file, SourceFile):
        return file
    if isinstance(file, URLPath):
        return SourceFile.of(file)
    if not isinstance(file, str | os.PathLike):
        raise TypeError(
            f"file must be a path (str or os.PathLike), got {type(file).__name__} {file!r}"
        )
    return SourceFile.of(file)


def compile_file_glob(glob: str) -> Callable[[SourceFile], bool]:
    """A `file:` glob as a test of a `SourceFile`.

    A glob without `/` is matched against each path's last component (the file's or
    directory's name: `train*.safetensors`). A glob with `/` is matched against each
    whole path, and when it does not start with `/` also against every tail of it that
    follows a `/` (`data/*.safetensors` matches `/home/me/data/train.safetensors`). As in
    `match`, `*` also matches `/`; case-sensitive.

    Example:
        >>> test = compile_file_glob("train*.safetensors")
        >>> test(SourceFile.of("/d/train.safetensors")), test(SourceFile.of("val.safetensors"))
        (True, False)
        >>> compile_file_glob("data/*.safetensors")(SourceFile.of("/home/me/data/x.safetensors"))
        True
    """
    if "/" not in glob:
        by_name = re.compile(fnmatch.translate(glob)).match
        return lambda source: any(by_name(n) for n in source.names)
    # The optional `.../` before a relative glob: it matches from any component on.
    lead = "" if glob.startswith("/") else "(?s:.*/)?"
    by_path = re.compile(lead + fnmatch.translate(glob)).match
    return lambda source: any(by_path(p) for p in source.paths)


@dataclass(frozen=True, slots=True)
class ShapeTest:
    """A rule's conditions on an array's rank and element count (`ndim`,
    `min_elements`, `max_elements`), judged only where the shape is known.

    Example:
        >>> t = ShapeTest(ndim=(0, 1), max_elements=1)
        >>> t.problem((1,)), t.problem((2, 3)), t.problem((3,))
        (None, 'ndim 2 is not 0 or 1', '3 elements > max_elements 1')
    """

    ndim: tuple[int, ...] | None = None
    min_elements: int | None = None
    max_elements: int | None = None

    @property
    def active(self) -> bool:
        """Whether there is any condition at all."""
        return not (self.ndim is None and self.min_elements is None and self.max_elements is None)

    def problem(self, shape: tuple[int, ...] | None) -> str | None:
        """Why `shape` fails these conditions, or None when it passes (or there are none)."""
        if not self.active:
            return None
        if shape is None:
            return "shape unknown, and the rule has a rank or element condition"
        if self.ndim is not None and len(shape) not in self.ndim:
            wanted = " or ".join(map(str, self.ndim))
            return f"ndim {len(shape)} is not {wanted}"
        count = 1
        for d in shape:
            count *= d
        if self.min_elements is not None and count < self.min_elements:
            return f"{count:,} elements < min_elements {self.min_elements:,}"
        if self.max_elements is not None and count > self.max_elements:
            return f"{count:,} elements > max_elements {self.max_elements:,}"
        return None


NO_SHAPE_TEST = ShapeTest()


@dataclass(frozen=True, slots=True)
class Condition:
    """What one rule asks of a name, a size, a shape and (with `file`) the file it comes
    from.

    `pattern` and `is_regex` are the form the name is matched in (a `search:` pattern as
    its equivalent full-match regex, see `search_as_regex`); `kind` and `written` are how
    the rule wrote it, for messages.
    """

    pattern: str
    is_regex: bool
    min_bytes: int | None
    max_bytes: int | None
    test: Callable[[str], object]
    file: str | None = None
    file_test: Callable[[SourceFile], bool] | None = None
    shape_test: ShapeTest = NO_SHAPE_TEST
    kind: str = ""
    written: str = ""

    @property
    def sized(self) -> bool:
        """Whether the rule has a size condition (and so needs a known size)."""
        return self.min_bytes is not None or self.max_bytes is not None

    @property
    def conditional(self) -> bool:
        """Whether a matching name may still fail the rule (a size, shape or file condition)."""
        return self.sized or self.file is not None or self.shape_test.active

    @property
    def shown(self) -> str:
        """The pattern as the rule wrote it, with its kind: `glob 'model/*'`."""
        kind = self.kind or ("regex" if self.is_regex else "glob")
        return f"{kind} {(self.written or self.pattern)!r}"

    def file_problem(self, source: SourceFile | None) -> str | None:
        """Why `source` fails the file condition, or None when it passes (or there is none)."""
        if self.file is None or self.file_test is None:
            return None
        if source is None:
            return (
                f"file {self.file!r}: no file given (the rule matches only tensors "
                "loaded from a file: load_file, plan, or explain --file)"
            )
        if self.file_test(source):
            return None
        return f"file {self.file!r} does not match {source.shown}"

    def problem(
        self, nbytes: int | None, source: SourceFile | None, shape: tuple[int, ...] | None = None
    ) -> str | None:
        """Why a matching name fails this rule's other conditions, or None."""
        return (
            self.file_problem(source) or self.size_problem(nbytes) or self.shape_test.problem(shape)
        )

    def size_problem(self, nbytes: int | None) -> str | None:
        """Why `nbytes` fails the size condition, or None when it passes."""
        if not self.sized:
            return None
        if nbytes is None:
            return "size unknown, and the rule has a size condition"
        if self.min_bytes is not None and nbytes < self.min_bytes:
            return f"{format_size(nbytes)} < min_bytes {format_size(self.min_bytes)}"
        if self.max_bytes is not None and nbytes > self.max_bytes:
            return f"{format_size(nbytes)} > max_bytes {format_size(self.max_bytes)}"
        return None


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # RE2 would print every rejected pattern to stderr


def _re2(pattern: str) -> Any:
    """`pattern`, read as Python's `re` reads it (ASCII mode), compiled by RE2 with that
    meaning (see `dialect`)."""
    translated = to_re2(pattern)
    try:
        return re2.compile(translated, _RE2_OPTIONS)
    except re2.error as e:
        reason = e.args[0].decode() if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ValueError(
            f"unsupported regular expression {pattern!r}: {reason}; {REGEX_LIMITS}"
        ) from None


def compile_regex(pattern: str) -> Callable[[str], object]:
    """Compile a rule's regex for full matching in linear time.

    The pattern means what it means to Python's `re` in ASCII mode (the documented
    dialect, see `dialect`), and RE2 matches it, with no backtracking.

    Raises:
        ValueError: saying why the pattern cannot be used, and what to write instead.

    Example:
        >>> compile_regex("(a+)+$")("a" * 10_000 + "b") is None
        True
        >>> bool(compile_regex("x{,3}")("xx")), bool(compile_regex(r"a\\sb")("a\\x0bb"))
        (True, True)
    """
    return _re2(pattern).fullmatch  # type: ignore[no-any-return]


# Global inline flags (`(?i)`, `(?s)`...) must open a Python pattern: they are moved in
# front of the `.*` a search pattern is wrapped in.
_LEADING_FLAGS = re.compile(r"\A((?:\(\?[aiLmsux]+\))*)")


def search_as_regex(pattern: str) -> str:
    """The full-match regex equivalent to `re.search(pattern, name)`: any text, the
    pattern, any text. Anchors keep their meaning (`^` and `\\A` still match only where
    the name starts, `$` only where it ends: in the dialect `$` never matches before a
    final newline), so a name matches one exactly when it matches the other.

    Example:
        >>> search_as_regex("attention/(wq|wk)/kernel")
        '(?s:.*)(?:attention/(wq|wk)/kernel)(?s:.*)'
        >>> search_as_regex("(?i)LM_head")
        '(?i)(?s:.*)(?:LM_head)(?s:.*)'
    """
    flags = _LEADING_FLAGS.match(pattern)
    lead = flags.group(1) if flags else ""
    return f"{lead}(?s:.*)(?:{pattern[len(lead) :]})(?s:.*)"


def compile_search(pattern: str) -> Callable[[str], object]:
    """Compile a rule's `search:` pattern: true where `re.search(pattern, name, re.ASCII)`
    would find a match anywhere in the name (EasyLM's and EasyDeL's rule tables), in
    linear time (RE2, in the dialect of `compile_regex`).

    Raises:
        ValueError: saying why the pattern cannot be used, and what RE2 lacks.

    Example:
        >>> test = compile_search("attention/(wq|wk|wv)/kernel")
        >>> bool(test("params/transformer/h/0/attention/wq/kernel")), bool(test("wq/kernel"))
        (True, False)
    """
    search = _re2(pattern).search  # errors name the pattern as written
    _re2(search_as_regex(pattern))  # the form lint and the prefix index see must compile too
    return search  # type: ignore[no-any-return]


def compile_condition(
    pattern: str,
    is_regex: bool,
    min_bytes: int | None = None,
    max_bytes: int | None = None,
    file: str | None = None,
    *,
    search: str | None = None,
    shape_test: ShapeTest = NO_SHAPE_TEST,
) -> Condition:
    """Compile a glob (fnmatch, case-sensitive, `*` crosses `/`), a full-match regex or
    (with `search`, `pattern` then being `search_as_regex(search)`) a search pattern, with
    an optional `file:` glob (see `compile_file_glob`) and rank and element conditions.

    Regexes and search patterns run on RE2 (linear time, see `compile_regex`); globs on
    Python's `re`, whose fnmatch translations never backtrack catastrophically.

    Example:
        >>> c = compile_condition(search_as_regex("wo/kernel"), True, search="wo/kernel")
        >>> bool(c.test("params/h/0/attention/wo/kernel")), c.shown
        (True, "search 'wo/kernel'")
    """
    if search is not None:
        test: Callable[[str], object] = compile_search(search)
        kind, written = "search", search
    elif is_regex:
        test = compile_regex(pattern)
        kind, written = "regex", pattern
    else:
        test = re.compile(fnmatch.translate(pattern)).match
        kind, written = "glob", pattern
    file_test = None if file is None else compile_file_glob(file)
    return Condition(
        pattern, is_regex, min_bytes, max_bytes, test, file, file_test, shape_test, kind, written
    )


@dataclass(frozen=True, slots=True)
class Step:
    """One rule tried for one name: whether it matched, and why not if it did not."""

    rule: int
    matched: bool
    reason: str


class Matcher:
    """First-match-wins lookup over an ordered list of conditions.

    Uncached: the decider caches whole decisions, so a name reaches the matcher once.

    Example:
        >>> m = Matcher([compile_condition("dataset/*", False), compile_condition("*", False)])
        >>> m.first("dataset/train", None), m.first("model/w", None)
        (0, 1)
    """

    def __init__(self, conditions: Sequence[Condition]) -> None:
        self._conditions = tuple(conditions)
        # Only rules whose literal prefix starts the name can match it: a cold lookup costs
        # in proportion to those, not to every rule.
        self._index = PrefixIndex((c.pattern, c.is_regex) for c in self._conditions)

    @property
    def conditions(self) -> tuple[Condition, ...]:
        """The compiled conditions, in rule order."""
        return self._conditions

    def candidates(self, name: str) -> tuple[int, ...]:
        """Rules whose pattern matches `name`, in order, up to the first unconditional one."""
        hits = []
        conditions = self._conditions
        for i in self._index.candidates(name):
            condition = conditions[i]
            if condition.test(name):
                hits.append(i)
                if not condition.conditional:
                    break
        return tuple(hits)

    def first(
        self,
        name: str,
        nbytes: int | None,
        source: SourceFile | None = None,
        shape: tuple[int, ...] | None = None,
    ) -> int | None:
        """The first rule matching `name` with size `nbytes` and `shape` from file
        `source`, or None."""
        for i in self.candidates(name):
            if self._conditions[i].problem(nbytes, source, shape) is None:
                return i
        return None

    def trace(
        self,
        name: str,
        nbytes: int | None,
        source: SourceFile | None = None,
        shape: tuple[int, ...] | None = None,
    ) -> list[Step]:
        """Every rule tried for `name`, in order, up to the one `first` picks."""
        hits = self.candidates(name)
        chosen = self.first(name, nbytes, source, shape)
        last = len(self._conditions) - 1 if chosen is None else chosen
        steps = []
        for i in range(last + 1):
            condition = self._conditions[i]
            what = condition.shown
            if i not in hits:
                steps.append(Step(i, False, f"{what} does not match"))
                continue
            every_name = condition.file is not None and what == "glob '*'"
            if i != chosen:
                problem = condition.problem(nbytes, source, shape)
                why = problem if every_name else f"{what} matches but {problem}"
                steps.append(Step(i, False, str(why)))
            elif condition.file is None:
                steps.append(Step(i, True, f"{what} matches"))
            else:
                matched = f"file {condition.file!r} matches {source}"
                steps.append(Step(i, True, matched if every_name else f"{what} and {matched}"))
        return steps
