"""Logical axis names resolved to mesh axes by an ordered table of rules. No JAX here.

A model names each dimension of a parameter in its own terms (`vocab`, `embed`, `mlp`);
one short table, `axis_rules`, says which mesh axes each name shards over. The semantics
are flax's `logical_to_mesh_axes` (what MaxText and t5x use), so a table ported from
either gives the same spec:

- the rules are pairs `(logical name, mesh axes)` tried in order;
- a pair applies to the dimension carrying its logical name when that dimension is not yet
  assigned and none of the pair's mesh axes is already used by another dimension;
- mesh axes `null` (or `[]`) assign the dimension to no axis: it is replicated, and later
  pairs for the same name no longer apply;
- a dimension no pair assigns (a name absent from the table, or every candidate taken)
  is not sharded; a dimension named `null` is never sharded.
"""

from __future__ import annotations

from collections.abc import Sequence

#: A pair's mesh axes after validation: one axis, several (sharded over their product),
#: or None (replicated).
MeshAxes = str | tuple[str, ...] | None
#: One rule of the table: a logical name and the mesh axes it takes when they are free.
AxisRule = tuple[str, MeshAxes]
#: One resolved spec entry, as `_targets.SpecEntry`: an axis, a tuple of axes, or None.
Entry = str | tuple[str, ...] | None


def axes_of(entry: MeshAxes) -> tuple[str, ...]:
    """The mesh axes an entry names, in order (none for None)."""
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else entry


def normalised(entry: MeshAxes) -> Entry:
    """An entry in its one canonical form: `()` is None, a one-axis tuple its axis."""
    axes = axes_of(entry)
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


_UNASSIGNED = object()


def resolve_axes(logical: Sequence[str | None], rules: Sequence[AxisRule]) -> tuple[Entry, ...]:
    """The mesh spec for a parameter whose dimensions carry the `logical` names.

    Raises:
        ValueError: a logical name given to more than one dimension.

    Example:
        >>> rules = [("mlp", ("tensor",)), ("embed", ("fsdp", "tensor")), ("embed", "fsdp")]
        >>> resolve_axes(["embed", "mlp"], rules)
        ('fsdp', 'tensor')
        >>> resolve_axes(["embed", "vocab", None], rules)
        (('fsdp', 'tensor'), None, None)
    """
    named = [n for n in logical if n is not None]
    repeated = sorted({n for n in named if named.count(n) > 1})
    if repeated:
        raise ValueError(
            f"logical axis {repeated[0]!r} names more than one dimension of {list(logical)}; "
            "each dimension needs its own name"
        )
    result: list[object] = [_UNASSIGNED if n is not None else None for n in logical]
    used: set[str] = set()
    for name, mesh_axes in rules:
        if name not in named:
            continue
        position = logical.index(name)
        wanted = axes_of(mesh_axes)
        if result[position] is _UNASSIGNED and used.isdisjoint(wanted):
            result[position] = mesh_axes
            used.update(wanted)
    return tuple(
        None if entry is _UNASSIGNED else normalised(entry)  # type: ignore[arg-type]
        for entry in result
    )


def logical_text(logical: Sequence[str | None]) -> str:
    """Logical names as text: `(vocab, embed)`, `-` for an unnamed dimension.

    Example:
        >>> logical_text(["vocab", None])
        '(vocab, -)'
    """
    return "(" + ", ".join("-" if n is None else n for n in logical) + ")"


#: `sharding: {axes: attached}`: each leaf's own names, as its framework attached them.
ATTACHED = "attached"


class Attached:
    """The axis names a framework attached to one leaf (flax `LogicallyPartitioned` or
    `Partitioned`, nnx sharding metadata, haliax axes), one entry per dimension.

    Hashable and compared by value: decisions are cached by it.

    Attributes:
        names: Per dimension: a name, None (not named), or for mesh axes a tuple of axes.
        mesh_axes: Whether the names are mesh axes already (flax `Partitioned`), used as the
            spec as they are; else logical names, resolved by `axis_rules`.
    """

    __slots__ = ("_hash", "mesh_axes", "names")

    def __init__(self, names: Sequence[Entry], mesh_axes: bool = False) -> None:
        self.names: tuple[Entry, ...] = tuple(names)
        self.mesh_axes = mesh_axes
        self._hash = hash((self.names, mesh_axes))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is Attached
            and self.names == other.names
            and self.mesh_axes == other.mesh_axes
        )

    def __repr__(self) -> str:
        kind = ", mesh_axes=True" if self.mesh_axes else ""
        return f"Attached({self.names!r}{kind})"

    @property
    def text(self) -> str:
        """`(embed, mlp)`: the names as `explain` shows them (`a+b` for several axes)."""
        parts = ["-" if n is None else n if isinstance(n, str) else "+".join(n) for n in self.names]
        return "(" + ", ".join(parts) + ")"


def resolve_attached(
    attached: Attached, rules: Sequence[AxisRule], mesh_axes: Sequence[str]
) -> tuple[tuple[Entry, ...], tuple[str | None, ...] | None] | str:
    """The spec for a leaf's attached names on a mesh with `mesh_axes`, and the logical
    names it was resolved from (None for mesh axes), or why there is none.

    Logical names resolve by `rules` as `resolve_axes` does; mesh axes are the spec.

    Example:
        >>> rules = [("embed", "fsdp"), ("mlp", "tensor")]
        >>> resolve_attached(Attached(("embed", "mlp")), rules, ["fsdp", "tensor"])
        (('fsdp', 'tensor'), ('embed', 'mlp'))
        >>> resolve_attached(Attached(("data", None), mesh_axes=True), rules, ["data"])
        (('data', None), None)
        >>> resolve_attached(Attached(("embed", "embed")), rules, ["fsdp"])
        "attached axes (embed, embed): logical axis 'embed' names more than one dimension"
    """
    if attached.mesh_axes:
        spec = tuple(normalised(n) for n in attached.names)
        logical: tuple[str | None, ...] | None = None
        named = [a for e in spec for a in axes_of(e)]
        if len(set(named)) != len(named):
            return f"attached mesh axes {attached.text}: an axis shards one dimension at most"
    else:
        names: list[str | None] = []
        for entry in attached.names:
            one = axes_of(entry)
            if len(one) > 1:
                return (
                    f"attached axes {attached.text}: a dimension holds several names "
                    f"({', '.join(one)}); logical axes name one per dimension"
                )
            names.append(one[0] if one else None)
        logical = tuple(names)
        named = [n for n in logical if n is not None]
        repeated = sorted({n for n in named if named.count(n) > 1})
        if repeated:
            return (
                f"attached axes {attached.text}: logical axis {repeated[0]!r} names more than "
                "one dimension"
            )
        spec = resolve_axes(logical, rules)
    for position, entry in enumerate(spec):
        for axis in axes_of(entry):
            if axis not in mesh_axes:
                via = "" if logical is None else f" ({logical[position]!r} by axis_rules)"
                return (
                    f"attached axes {attached.text}: mesh axis {axis!r}{via} is not an axis of "
                    f"the mesh ({', '.join(mesh_axes)})"
                )
    return spec, logical
