"""Safe YAML reading that remembers the line of every field and rejects duplicate keys."""

from __future__ import annotations

from typing import Any

import yaml

from .._base.errors import PolicyError, Problem

#: Field path (as a tuple of keys and indices) mapped to its 1-based line.
LineMap = dict[tuple[str | int, ...], int]

# Aliases let a small document expand enormously ("billion laughs"); a policy never needs this many.
_MAX_NODES = 100_000
# PyYAML composes recursively: deep nesting would end in RecursionError. A policy is 4 deep.
_MAX_DEPTH = 64


_PLAIN_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


class _Loader(yaml.SafeLoader):
    """SafeLoader: only plain YAML types; never constructs Python objects.

    It also bounds nesting, and remembers the line of each alias (`- *rule`): PyYAML
    hands back the anchored node itself, whose marks are the anchor's.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        #: (id of the parent node, index or id of the key node) -> line of the alias there.
        self.alias_lines: dict[tuple[int, int], int] = {}

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) and parent is not None and event.start_mark:
            slot = index if isinstance(index, int) else id(index)
            self.alias_lines[(id(parent), slot)] = event.start_mark.line + 1
        self.depth += 1
        try:
            if self.depth > _MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {_MAX_DEPTH} levels deep", event.start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def read_yaml(text: str, file: str) -> tuple[Any, LineMap, list[Problem]]:
    """Parse one YAML document into plain data, the line of every field, and its problems.

    Problems that leave the document readable (duplicate keys, unusable scalars) are
    returned, all of them, so the caller can report them beside validation errors.

    Raises:
        PolicyError: for syntax errors, several documents, unsafe tags, recursive aliases
            or excessive size or nesting, with the file and line.
    """
    try:
        # The reader checks characters both when made and as it reads on: one handler.
        loader = _Loader(text)
        return _read(loader, file, text)
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        raise PolicyError.single(
            file, line, "", f"invalid YAML: {e.reason} (character {e.character!r})"
        ) from None


def _read(loader: _Loader, file: str, text: str) -> tuple[Any, LineMap, list[Problem]]:
    last_line = max(1, len(text.rstrip().splitlines()))
    try:
        node = loader.get_single_node()
        lines: LineMap = {(): 1 if node is None else node.start_mark.line + 1}
        builder = _Builder(loader, file, lines)
        data = builder.build(node, ())
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        if mark is not None and mark.line + 1 > last_line and e.context_mark is not None:
            mark = e.context_mark  # "unexpected end of stream": where the unclosed thing opened
        # At the end of the input the mark is past the last line: say the last line instead.
        where = min(mark.line + 1, last_line) if mark is not None else None
        problem = " ".join(p for p in (e.context, e.problem) if p) or str(e)
        if where is not None:
            problem += _indentation_hint(e, text, where)
        raise PolicyError.single(file, where, "", f"invalid YAML: {problem}") from None
    except RecursionError:  # pragma: no cover - nesting is bounded above; a last guard
        raise PolicyError.single(file, None, "", "invalid YAML: nested too deeply") from None
    except yaml.YAMLError as e:  # pragma: no cover - every other yaml error carries a mark
        raise PolicyError.single(file, None, "", f"invalid YAML: {e}") from None
    finally:
        loader.dispose()
    return data, lines, builder.problems


# What PyYAML says of a line indented unlike the block it is in, by the block's kind.
_BLOCKS = {"while parsing a block mapping": "mapping", "while parsing a block collection": "list"}


def _indentation_hint(error: yaml.MarkedYAMLError, text: str, line: int) -> str:
    """What to look at when PyYAML's words describe an indentation slip (its parser's
    tokens, such as "expected <block end>, but found '<block mapping start>'"), else "":
    the line's column, and the column of the mapping or list it breaks.
    """
    lines = text.splitlines()
    shown = lines[line - 1] if line <= len(lines) else ""
    column = len(shown) - len(shown.lstrip(" ")) + 1
    near = f"; check the indentation near line {line} (it starts at column {column})"
    problem, context, opened = error.problem or "", error.context or "", error.context_mark
    if problem.startswith("expected <block end>") and context in _BLOCKS and opened is not None:
        kind = _BLOCKS[context]
        return (
            f"{near}: the {'keys' if kind == 'mapping' else 'dashes'} of one {kind} start in "
            f"one column, and the {kind} it breaks opens at line {opened.line + 1}, column "
            f"{opened.column + 1}"
        )
    if problem == "mapping values are not allowed here":
        return f"{near}, or quote a value that holds ': '"
    if "'\\t'" in problem and error.problem_mark is not None:
        # YAML indents with spaces only; PyYAML names the tab but not what to do.
        return (
            f"; line {line} has a tab at column {error.problem_mark.column + 1}: YAML "
            "indents with spaces only (replace each tab with spaces, in the column of the "
            "keys or dashes around it)"
        )
    return ""


class _Builder:
    def __init__(self, loader: _Loader, file: str, lines: LineMap) -> None:
        self._loader = loader
        self._file = file
        self._lines = lines
        self._open: set[int] = set()
        self._count = 0
        self._seen: set[int] = set()
        self._aliased = False
        self.problems: list[Problem] = []

    def _line(self, node: yaml.Node, at: int | None) -> int:
        return at if at is not None else node.start_mark.line + 1

    def build(
        self, node: yaml.Node | None, path: tuple[str | int, ...], at: int | None = None
    ) -> Any:
        """Plain data of `node`; `at` is the line of the alias it was reached through, if any
        (everything under an alias is reported where the alias is written)."""
        if node is None:
            return None
        self._count += 1
        if id(node) in self._seen:
            self._aliased = True
        self._seen.add(id(node))
        if self._count > _MAX_NODES:
            why = "aliases expand too far" if self._aliased else "a policy is far smaller"
            raise PolicyError.single(
                self._file,
                self._line(node, at),
                "",
                f"document too large: more than {_MAX_NODES} values ({why})",
            )
        if id(node) in self._open:
            raise PolicyError.single(
                self._file, self._line(node, at), field_path(path), "recursive alias"
            )
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path, at)
        if node.tag not in _PLAIN_TAGS:
            raise PolicyError.single(
                self._file,
                self._line(node, at),
                field_path(path),
                f"unsupported YAML tag {node.tag!r}",
            )
        self._open.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                items = []
                for i, item in enumerate(node.value):
                    item_at = self._loader.alias_lines.get((id(node), i), at)
                    self._lines.setdefault((*path, i), self._line(item, item_at))
                    items.append(self.build(item, (*path, i), item_at))
                return items
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, path, at)
        finally:
            self._open.discard(id(node))
        raise PolicyError.single(  # pragma: no cover - yaml has only these three node kinds
            self._file, self._line(node, at), field_path(path), "unsupported YAML node"
        )

    def _scalar(self, node: yaml.ScalarNode, path: tuple[str | int, ...], at: int | None) -> Any:
        try:
            return self._loader.construct_object(node, deep=True)
        except yaml.MarkedYAMLError:
            raise
        except (ValueError, ArithmeticError, RecursionError) as e:
            # `!!int one`, an integer of thousands of digits, `!!float x`: not a usable value.
            shown = (
                node.value
                if len(node.value) <= 40
                else f"{node.value[:20]}...({len(node.value)} characters)"
            )
            tag = node.tag.rsplit(":", 1)[-1]
            detail = "too many digits" if "digits" in str(e) else f"not a valid {tag}"
            self.problems.append(
                Problem(self._file, self._line(node, at), field_path(path), f"{detail}: {shown!r}")
            )
            return None

    def _forget(self, prefix: tuple[str | int, ...]) -> None:
        for loc in [loc for loc in self._lines if _prefixed(loc, prefix)]:
            del self._lines[loc]

    def _mapping(
        self, node: yaml.MappingNode, path: tuple[str | int, ...], at: int | None
    ) -> dict[Any, Any]:
        explicit = {id(k) for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"}
        # Merged-in keys come first and later ones win, as in PyYAML; only two keys written
        # in this mapping itself are a duplicate.
        self._loader.flatten_mapping(node)
        result: dict[Any, Any] = {}
        first_line: dict[Any, int] = {}
        written: set[Any] = set()
        for key_node, value_node in node.value:
            key = self.build(key_node, path, at)
            line = self._line(key_node, at)
            try:
                hash(key)
            except TypeError:
                raise PolicyError.single(
                    self._file, line, field_path(path), "mapping keys must be plain scalars"
                ) from None
            if key in written and id(key_node) in explicit:
                self.problems.append(
                    Problem(
                        self._file,
                        line,
                        field_path((*path, key)),
                        f"duplicate key {key!r} (first given on line {first_line[key]})",
                    )
                )
                continue
            if id(key_node) in explicit:
                written.add(key)
                first_line[key] = line
                if key in result:  # overrides a merged-in value: forget where that one was
                    self._forget((*path, key))
                self._lines[(*path, key)] = line
            else:
                self._lines.setdefault((*path, key), line)
            value_at = self._loader.alias_lines.get((id(node), id(key_node)), at)
            result[key] = self.build(value_node, (*path, key), value_at)
        return result


def _prefixed(loc: tuple[Any, ...], prefix: tuple[Any, ...]) -> bool:
    return loc[: len(prefix)] == prefix


def field_path(loc: tuple[Any, ...]) -> str:
    """Render a location tuple as a field path: `rules[2].device`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out
