"""Safe YAML reading that remembers the line of every field and rejects duplicate keys."""

from __future__ import annotations

from typing import Any

import yaml

from ._errors import PolicyError

#: Field path (as a tuple of keys and indices) mapped to its 1-based line.
LineMap = dict[tuple[str | int, ...], int]

# Aliases let a small document expand enormously ("billion laughs"); a policy never needs this many.
_MAX_NODES = 100_000


_PLAIN_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


class _Loader(yaml.SafeLoader):
    """SafeLoader: only plain YAML types; never constructs Python objects."""


def read_yaml(text: str, file: str) -> tuple[Any, LineMap]:
    """Parse one YAML document into plain data plus the line of every field.

    Raises:
        PolicyError: for syntax errors, duplicate keys, several documents, unsafe tags
            or recursive aliases, with the file and line.
    """
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        raise PolicyError.single(
            file, line, "", f"invalid YAML: {e.reason} (character {e.character!r})"
        ) from None
    try:
        node = loader.get_single_node()
        lines: LineMap = {(): 1 if node is None else node.start_mark.line + 1}
        data = _Builder(loader, file, lines).build(node, ())
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = mark.line + 1 if mark is not None else None
        problem = " ".join(p for p in (e.context, e.problem) if p) or str(e)
        raise PolicyError.single(file, where, "", f"invalid YAML: {problem}") from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        raise PolicyError.single(
            file, line, "", f"invalid YAML: {e.reason} (character {e.character!r})"
        ) from None
    except yaml.YAMLError as e:  # pragma: no cover - every other yaml error carries a mark
        raise PolicyError.single(file, None, "", f"invalid YAML: {e}") from None
    finally:
        loader.dispose()
    return data, lines


class _Builder:
    def __init__(self, loader: _Loader, file: str, lines: LineMap) -> None:
        self._loader = loader
        self._file = file
        self._lines = lines
        self._open: set[int] = set()
        self._count = 0

    def build(self, node: yaml.Node | None, path: tuple[str | int, ...]) -> Any:
        if node is None:
            return None
        self._count += 1
        if self._count > _MAX_NODES:
            raise PolicyError.single(
                self._file,
                node.start_mark.line + 1,
                "",
                "document too large (aliases expand too far)",
            )
        if id(node) in self._open:
            raise PolicyError.single(
                self._file, node.start_mark.line + 1, field_path(path), "recursive alias"
            )
        if isinstance(node, yaml.ScalarNode):
            return self._loader.construct_object(node, deep=True)
        if node.tag not in _PLAIN_TAGS:
            raise PolicyError.single(
                self._file,
                node.start_mark.line + 1,
                field_path(path),
                f"unsupported YAML tag {node.tag!r}",
            )
        self._open.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                items = []
                for i, item in enumerate(node.value):
                    self._lines.setdefault((*path, i), item.start_mark.line + 1)
                    items.append(self.build(item, (*path, i)))
                return items
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, path)
        finally:
            self._open.discard(id(node))
        raise PolicyError.single(  # pragma: no cover - yaml has only these three node kinds
            self._file, node.start_mark.line + 1, field_path(path), "unsupported YAML node"
        )

    def _forget(self, prefix: tuple[str | int, ...]) -> None:
        for loc in [loc for loc in self._lines if _prefixed(loc, prefix)]:
            del self._lines[loc]

    def _mapping(self, node: yaml.MappingNode, path: tuple[str | int, ...]) -> dict[Any, Any]:
        explicit = {id(k) for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"}
        # Merged-in keys come first and later ones win, as in PyYAML; only two keys written
        # in this mapping itself are a duplicate.
        self._loader.flatten_mapping(node)
        result: dict[Any, Any] = {}
        first_line: dict[Any, int] = {}
        written: set[Any] = set()
        for key_node, value_node in node.value:
            key = self.build(key_node, path)
            line = key_node.start_mark.line + 1
            try:
                hash(key)
            except TypeError:
                raise PolicyError.single(
                    self._file, line, field_path(path), "mapping keys must be plain scalars"
                ) from None
            if key in written and id(key_node) in explicit:
                raise PolicyError.single(
                    self._file,
                    line,
                    field_path((*path, key)),
                    f"duplicate key {key!r} (first given on line {first_line[key]})",
                )
            if id(key_node) in explicit:
                written.add(key)
                first_line[key] = line
                if key in result:  # overrides a merged-in value: forget where that one was
                    self._forget((*path, key))
                self._lines[(*path, key)] = line
            else:
                self._lines.setdefault((*path, key), line)
            result[key] = self.build(value_node, (*path, key))
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
