"""Name matching: rules' patterns compiled once, first match wins. Never imports JAX."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import re2

from ._prefixes import PrefixIndex
from ._sizes import format_size


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
    def of(cls, path: str | os.PathLike[str], *also: str | os.PathLike[str]) -> SourceFile:
        """The source for a file at `path` (and, for a checkpoint's member, the
        checkpoint's own path in `also`)."""
        shown = _slashed(os.path.normpath(os.fspath(path)))
        forms: list[str] = []
        for given in (path, *also):
            text = os.fspath(given)
            for form in (os.path.normpath(text), os.path.realpath(text)):
                form = _slashed(form)
                if form not in forms:
                    forms.append(form)
        names = tuple(dict.fromkeys(f.rsplit("/", 1)[-1] for f in forms))
        return cls(shown, tuple(forms), names)

    def __str__(self) -> str:
        return self.shown


def source_file(file: str | os.PathLike[str] | SourceFile | None) -> SourceFile | None:
    """A `file=` argument as a `SourceFile` (None stays None).

    Raises:
        TypeError: `file` is not a path.

    Example:
        >>> source_file("x/../train.safetensors").shown
        'train.safetensors'
    """
    if file is None or isinstance(file, SourceFile):
        return file
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
class Condition:
    """What one rule asks of a name, a size and (with `file`) the file it comes from."""

    pattern: str
    is_regex: bool
    min_bytes: int | None
    max_bytes: int | None
    test: Callable[[str], object]
    file: str | None = None
    file_test: Callable[[SourceFile], bool] | None = None

    @property
    def sized(self) -> bool:
        """Whether the rule has a size condition (and so needs a known size)."""
        return self.min_bytes is not None or self.max_bytes is not None

    @property
    def conditional(self) -> bool:
        """Whether a matching name may still fail the rule (a size or a file condition)."""
        return self.sized or self.file is not None

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

    def problem(self, nbytes: int | None, source: SourceFile | None) -> str | None:
        """Why a matching name fails this rule's other conditions, or None."""
        return self.file_problem(source) or self.size_problem(nbytes)

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


REGEX_LIMITS = (
    "regexes are matched by RE2, in time linear in the name, so no rule can stall a program "
    "(Python's `re` can take seconds or years on patterns like '(a+)+$'); RE2 has no "
    "backreferences (\\1, (?P=name)), lookaround ((?=...), (?!...), (?<=...), (?<!...)), "
    "atomic groups, possessive repeats, conditionals or \\Z (write \\z or $), repeat counts "
    "above 1000, and \\d, \\w, \\s match ASCII only"
)
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # RE2 would print every rejected pattern to stderr


def compile_regex(pattern: str) -> Callable[[str], object]:
    """Compile a rule's regex for full matching in linear time.

    The pattern must be valid for Python's `re` (the documented syntax, so it means what
    Python users expect) and for RE2 (the engine that matches it, with no backtracking).

    Raises:
        ValueError: saying why the pattern cannot be used, and what RE2 lacks.

    Example:
        >>> compile_regex("(a+)+$")("a" * 10_000 + "b") is None
        True
    """
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"invalid regular expression {pattern!r}: {e}") from None
    except OverflowError:
        raise ValueError(
            f"invalid regular expression {pattern!r}: a repeat count is too large"
        ) from None
    except RecursionError:
        raise ValueError(
            f"invalid regular expression {pattern!r}: groups nested too deeply"
        ) from None
    try:
        compiled = re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as e:
        reason = e.args[0].decode() if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ValueError(
            f"unsupported regular expression {pattern!r}: {reason}; {REGEX_LIMITS}"
        ) from None
    return compiled.fullmatch  # type: ignore[no-any-return]


def compile_condition(
    pattern: str,
    is_regex: bool,
    min_bytes: int | None = None,
    max_bytes: int | None = None,
    file: str | None = None,
) -> Condition:
    """Compile a glob (fnmatch, case-sensitive, `*` crosses `/`) or a full-match regex,
    with an optional `file:` glob (see `compile_file_glob`).

    Regexes run on RE2 (linear time, see `compile_regex`); globs on Python's `re`, whose
    fnmatch translations never backtrack catastrophically.
    """
    if is_regex:
        test: Callable[[str], object] = compile_regex(pattern)
    else:
        test = re.compile(fnmatch.translate(pattern)).match
    file_test = None if file is None else compile_file_glob(file)
    return Condition(pattern, is_regex, min_bytes, max_bytes, test, file, file_test)


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

    def first(self, name: str, nbytes: int | None, source: SourceFile | None = None) -> int | None:
        """The first rule matching `name` with size `nbytes` from file `source`, or None."""
        for i in self.candidates(name):
            if self._conditions[i].problem(nbytes, source) is None:
                return i
        return None

    def trace(self, name: str, nbytes: int | None, source: SourceFile | None = None) -> list[Step]:
        """Every rule tried for `name`, in order, up to the one `first` picks."""
        hits = self.candidates(name)
        chosen = self.first(name, nbytes, source)
        last = len(self._conditions) - 1 if chosen is None else chosen
        steps = []
        for i in range(last + 1):
            condition = self._conditions[i]
            kind = "regex" if condition.is_regex else "glob"
            what = f"{kind} {condition.pattern!r}"
            if i not in hits:
                steps.append(Step(i, False, f"{what} does not match"))
                continue
            every_name = condition.file is not None and what == "glob '*'"
            if i != chosen:
                problem = condition.problem(nbytes, source)
                why = problem if every_name else f"{what} matches but {problem}"
                steps.append(Step(i, False, str(why)))
            elif condition.file is None:
                steps.append(Step(i, True, f"{what} matches"))
            else:
                matched = f"file {condition.file!r} matches {source}"
                steps.append(Step(i, True, matched if every_name else f"{what} and {matched}"))
        return steps
