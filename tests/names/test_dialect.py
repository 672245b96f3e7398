"""The regex dialect: rules mean what Python's `re` (ASCII mode) means, matched by RE2."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import devpolicy
from devpolicy._names.dialect import POSIX_CLASSES, to_re2
from devpolicy._names.matching import compile_regex, compile_search
from tests.helpers import write


def matches(pattern: str, name: str) -> bool:
    return bool(compile_regex(pattern)(name))


def found(pattern: str, name: str) -> bool:
    return bool(compile_search(pattern)(name))


class TestWhereTheEnginesDiffered:
    @pytest.mark.parametrize(
        ("name", "expected"),
        [("", True), ("x", True), ("xxx", True), ("xxxx", False), ("x{,3}", False)],
    )
    def test_an_omitted_lower_repeat_count_is_zero(self, name: str, expected: bool) -> None:
        """`x{,3}` is zero to three `x`, as Python reads it (RE2 read the text `x{,3}`)."""
        assert matches("x{,3}", name) is expected
        assert (re.fullmatch("x{,3}", name, re.ASCII) is not None) is expected

    @pytest.mark.parametrize("char", ["\t", "\n", "\x0b", "\x0c", "\r", " "])
    def test_backslash_s_is_pythons_whitespace_vertical_tab_included(self, char: str) -> None:
        """`\\s` is [\\t\\n\\v\\f\\r ] (RE2's own `\\s` lacks `\\v`, U+000B)."""
        assert matches(r"a\sb", f"a{char}b")
        assert not matches(r"a\Sb", f"a{char}b")
        assert matches(r"a[\s]b", f"a{char}b")

    def test_backslash_s_takes_no_other_space(self) -> None:
        """ASCII mode: no-break space, NEL and U+001C are not `\\s`."""
        for char in ("\xa0", "\x85", "\x1c", "\u2003"):
            assert not matches(r"\s", char)
            assert matches(r"\S", char)

    @pytest.mark.parametrize(
        ("pattern", "name", "expected"),
        [
            (r"\bkernel", "ékernel", True),  # é is no word character: a boundary before k
            (r"\Bkernel", "ékernel", False),
            (r"\bkernel", "wkernel", False),
            (r"é\b", "é", False),  # no word character on either side
            (r"\w+", "kernél", False),
            (r"\w+", "kernel_0", True),
        ],
    )
    def test_word_boundaries_and_word_characters_are_ascii(
        self, pattern: str, name: str, expected: bool
    ) -> None:
        """`\\b`, `\\B` and `\\w` know ASCII letters, digits and `_` only, on any name
        (searched; `\\w+` matched in full)."""
        if pattern == r"\w+":
            assert matches(pattern, name) is expected
            assert (re.fullmatch(pattern, name, re.ASCII) is not None) is expected
        else:
            assert found(pattern, name) is expected
            assert (re.search(pattern, name, re.ASCII) is not None) is expected

    @pytest.mark.parametrize(
        ("pattern", "name", "expected"),
        [
            ("(?i)k", "K", True),
            ("(?i)k", "\u212a", False),  # the Kelvin sign: RE2's own (?i) took it for k
            ("(?i)s", "\u017f", False),  # long s
            ("(?i)é", "É", False),  # only ASCII letters fold
            ("(?i)[a-c]+", "AbC", True),
            ("(?i)[^a]", "A", False),
        ],
    )
    def test_case_folding_is_ascii(self, pattern: str, name: str, expected: bool) -> None:
        """`(?i)` folds A-Z and a-z only, as Python's `re` in ASCII mode."""
        assert matches(pattern, name) is expected
        assert (re.fullmatch(pattern, name, re.ASCII) is not None) is expected

    @pytest.mark.parametrize(
        ("pattern", "name"),
        [
            (r"layer\Z", "layer"),
            (r"caf\u00e9", "café"),
            (r"caf\N{LATIN SMALL LETTER E WITH ACUTE}", "café"),
            ("(?x) model / w  # verbose", "model/w"),
            (r"a\x0bb", "a\x0bb"),
        ],
    )
    def test_python_spellings_re2_lacks_are_accepted(self, pattern: str, name: str) -> None:
        """`\\Z`, `\\u....`, `\\N{...}` and `(?x)` are Python syntax, so they work (RE2
        refused each)."""
        assert matches(pattern, name)

    def test_dollar_matches_only_at_the_very_end_of_the_name(self) -> None:
        """Documented exception: `$` never matches before a final newline (Python's
        does), so `a$` is not found in "a\\n"."""
        assert re.search("a$", "a\n", re.ASCII)
        assert not found("a$", "a\n")
        assert found("a$", "xa")
        assert found("(?m)a$", "a\nb")  # multi-line: before any newline, as Python

    def test_non_boundary_matches_the_empty_name(self) -> None:
        """Documented exception: `\\B` matches the empty name, as RE2 and Python 3.14 do
        (earlier Pythons do not)."""
        assert matches(r"\B", "")
        assert (re.fullmatch(r"\B", "") is not None) is (sys.version_info >= (3, 14))


class TestRefusals:
    @pytest.mark.parametrize("posix", sorted(POSIX_CLASSES))
    def test_a_posix_class_is_refused_with_the_portable_spelling(self, posix: str) -> None:
        """`[[:digit:]]` is a digit to RE2 and grep but characters to Python: refused,
        naming the class and what to write instead (which then works)."""
        spelling = POSIX_CLASSES[posix]
        for pattern in (f"[[:{posix}:]]", f"x[a[:{posix}:]]"):
            with pytest.raises(
                ValueError,
                match=rf"^unsupported regular expression .*\[:{posix}:\] is a POSIX class "
                rf"to RE2, grep and PCRE, but Python's re has none .*; write {re.escape(spelling)}$",
            ):
                compile_regex(pattern)
        compile_regex(spelling.split(" (or ")[0])
        assert matches(r"\[:digit:\]", "[:digit:]")  # escaped, it is the text

    @pytest.mark.parametrize("pattern", ["[[a]", "[a--b]x", "[a&&b]", "[a||b]", "[a~~b]"])
    def test_sets_a_future_python_reads_as_set_operations_are_refused(self, pattern: str) -> None:
        """What Python's `re` warns it will read differently is refused, saying to
        escape the characters (a `[` or `--` meant as characters)."""
        with pytest.raises(ValueError, match=r"regular expression .*(escape|bad character range)"):
            compile_regex(pattern)

    @pytest.mark.parametrize(
        ("pattern", "what"),
        [
            ("(a)\\1", r"a backreference"),
            ("(?P<x>a)(?P=x)", r"a backreference"),
            ("(?=a)a", r"a lookahead"),
            ("(?!b)a", r"a negative lookahead"),
            ("(?<=a)b", r"a lookbehind"),
            ("(?<!a)b", r"a negative lookbehind"),
            ("(?>a)", r"an atomic group"),
            ("a*+", r"a possessive repeat"),
            ("a{2}+", r"a possessive repeat"),
            ("(a)?(?(1)b|c)", r"a conditional group"),
            ("a{1001}", r"a repeat count above 1000 \(1001\)"),
            ("(?u)a", r"the u flag"),
        ],
    )
    def test_what_re2_cannot_match_is_refused_by_name(self, pattern: str, what: str) -> None:
        """Each construct without a linear-time equivalent is named in the error."""
        with pytest.raises(ValueError, match=rf"^unsupported regular expression .*: {what}"):
            compile_regex(pattern)

    @pytest.mark.parametrize("field", ["regex", "search"])
    def test_a_policy_names_the_rule_field_and_the_construct(
        self, tmp_path: Path, field: str
    ) -> None:
        """At load: file, line, `rules[0].regex` (or `.search`), the construct and the fix."""
        path = write(
            tmp_path / "p.yaml",
            f"version: 1\nrules:\n  - {field}: 'layers/[[:digit:]]+'\n    device: cpu\n",
        )
        with pytest.raises(
            devpolicy.PolicyError,
            match=rf"^p\.yaml:3: rules\[0\]\.{field}: unsupported regular expression "
            r"'layers/\[\[:digit:\]\]\+': \[:digit:\] is a POSIX class .*write \[0-9\] \(or \\d\)",
        ):
            devpolicy.load_policy(path, environ={})


# Patterns built from the constructs where the engines could differ, and names from the
# characters that tell them apart (\v, é, the Kelvin sign, the long s, newline...).
_CHARS = "abkKé\u212a\u017fs_/. \t\x0b\n0"
_ATOMS = st.one_of(
    st.sampled_from([re.escape(c) for c in _CHARS]),
    st.sampled_from(
        [".", r"\d", r"\D", r"\w", r"\W", r"\s", r"\S", r"\b", r"\B", "^", "$", r"\A", r"\Z"]
    ),
    st.builds(
        lambda neg, items: "[" + ("^" if neg else "") + "".join(items) + "]",
        st.booleans(),
        st.lists(
            st.sampled_from(
                [*(re.escape(c) for c in _CHARS), "a-k", "A-Z", "\\x00-\\x1f", r"\s", r"\w", r"\D"]
            ),
            min_size=1,
            max_size=3,
        ),
    ),
)
_QUANTIFIERS = st.sampled_from(
    ["", "", "*", "+", "?", "{2}", "{1,2}", "{,2}", "{2,}", "*?", "{,1}?"]
)


def _patterns() -> st.SearchStrategy[str]:
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        group = st.builds(
            lambda kind, body: f"{kind}{body})",
            st.sampled_from(["(", "(?:", "(?i:", "(?s:", "(?m:", "(?-i:"]),
            inner,
        )
        return st.one_of(
            st.builds(lambda a, b: a + b, inner, inner),
            st.builds(lambda a, b: f"{a}|{b}", inner, inner),
            st.builds(lambda g, q: g + q, group, _QUANTIFIERS),
        )

    body = st.recursive(st.builds(lambda a, q: a + q, _ATOMS, _QUANTIFIERS), extend, max_leaves=6)
    return st.builds(
        lambda flags, b: flags + b, st.sampled_from(["", "(?i)", "(?s)", "(?m)"]), body
    )


def _python(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern, re.ASCII)
    except (re.error, ValueError, OverflowError):
        return None


def _refusal(pattern: str) -> str | None:
    try:
        to_re2(pattern)
    except ValueError as e:
        return str(e)
    return None


class TestAgainstPython:
    @pytest.mark.slow
    @settings(max_examples=400, deadline=None)
    @given(_patterns(), st.text(alphabet=_CHARS, max_size=6))
    @example("x{,3}", "xx")
    @example(r"\s", "\x0b")
    @example(r"\bk", "ék")
    @example("(?i)k", "\u212a")
    @example(r"\B", "0\xe90")
    def test_every_pattern_matches_what_python_ascii_mode_matches(
        self, pattern: str, name: str
    ) -> None:
        """For patterns mixing classes, anchors, repeats, groups and flags, and names of
        the characters that tell the engines apart: a full match and a search each agree
        with Python's `re` in ASCII mode (apart from the three documented exceptions)."""
        python = _python(pattern)
        assume(python is not None)
        assert python is not None
        assume(not ("$" in pattern and "\n" in name))  # `$` before a final newline
        assume(not (r"\B" in pattern and name == ""))  # `\B` on the empty name
        refused = _refusal(pattern)
        if refused is not None:  # only what the dialect documents as refused
            assert re.search(r"repeat count|escape the characters|POSIX class", refused)
            return
        assert matches(pattern, name) is (python.fullmatch(name) is not None)
        if r"\B" in pattern and not name.isascii():
            return  # a search may find `\B` between two bytes of a non-ASCII character
        assert found(pattern, name) is (python.search(name) is not None)
