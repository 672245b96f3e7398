"""A rule's sharding checked against the document's meshes, once every layer is known.

What a rule's `sharding` (or a sharding in its `fallback`) says that its mesh contradicts
cannot be checked field by field: the meshes may come from another layer. `documents`
checks one document, `layers` the merged settings; each problem is reported at the
models' own field location (`rules[3].sharding.spec[0]`). No JAX.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from .._base.errors import did_you_mean
from .axes import ATTACHED, resolve_axes
from .schema import MeshSpec, RuleSpec, ShardingSpec
from .targets import parse_sharding


def sharding_problems(
    rules: list[RuleSpec], meshes: dict[str, MeshSpec]
) -> list[tuple[tuple[str | int, ...], str]]:
    """What a rule's `sharding` (or a sharding in its `fallback`) says that its mesh
    contradicts, as (field location, message).

    Checked once every part of a document is known: an unknown mesh, an axis the mesh
    lacks, one axis used twice in a spec, logical `axes` with no `axis_rules` to resolve
    them or resolving to an axis the mesh lacks.
    """
    found: list[tuple[tuple[str | int, ...], str]] = []
    for i, rule in enumerate(rules):
        if rule.sharding is not None:
            found += _sharding_problems(("rules", i, "sharding"), rule.sharding, meshes)
        for j, item in enumerate(rule.fallback or []):
            if "[" in item:
                target = parse_sharding(item)
                entries = [list(e) if isinstance(e, tuple) else e for e in target.spec]
                fallback = ShardingSpec(mesh=target.mesh, spec=entries)
                found += [
                    (("rules", i, "fallback", j), message)
                    for _, message in _sharding_problems((), fallback, meshes)
                ]
    return found


def _sharding_problems(
    where: tuple[str | int, ...], sharding: ShardingSpec, meshes: dict[str, MeshSpec]
) -> list[tuple[tuple[str | int, ...], str]]:
    mesh = meshes.get(sharding.mesh)
    if mesh is None:
        hint = did_you_mean(sharding.mesh, meshes)
        listed = ", ".join(meshes) or "none (add a `meshes:` section)"
        return [((*where, "mesh"), f"unknown mesh {sharding.mesh!r}{hint}; meshes: {listed}")]
    if sharding.axes == ATTACHED:
        # Names are known per leaf: one the table lacks, or resolving to an axis the mesh
        # lacks, is a reason when placing (lint warns about a missing table).
        return []
    if sharding.axes is not None:
        return _logical_problems(where, sharding, mesh)
    found: list[tuple[tuple[str | int, ...], str]] = []
    used: list[str] = []
    for j, axis in _named_axes(sharding.spec):
        if axis not in mesh.axes:
            hint = did_you_mean(axis, mesh.axes)
            found.append(
                (
                    (*where, "spec", j),
                    f"mesh {sharding.mesh!r} has no axis {axis!r}{hint}; "
                    f"axes: {', '.join(mesh.axes)}",
                )
            )
        elif axis in used:
            found.append(
                (
                    (*where, "spec", j),
                    f"axis {axis!r} is used twice in one spec; an axis shards one "
                    "dimension at most",
                )
            )
        used.append(axis)
    return found


def _logical_problems(
    where: tuple[str | int, ...], sharding: ShardingSpec, mesh: MeshSpec
) -> list[tuple[tuple[str | int, ...], str]]:
    """Logical axes need a table, and the table must name only axes the mesh has."""
    assert isinstance(sharding.axes, list)
    if not mesh.axis_rules:
        return [
            (
                (*where, "axes"),
                f"logical axes {sharding.axes} but neither mesh {sharding.mesh!r} nor the policy "
                "has `axis_rules` to turn them into mesh axes, e.g. "
                "`axis_rules: [[embed, fsdp], [mlp, tensor]]`",
            )
        ]
    spec = resolve_axes(sharding.axes, mesh.axis_rules)
    found: list[tuple[tuple[str | int, ...], str]] = []
    for j, axis in _named_axes(spec):
        if axis not in mesh.axes:
            hint = did_you_mean(axis, mesh.axes)
            found.append(
                (
                    (*where, "axes", j),
                    f"logical axis {sharding.axes[j]!r} resolves by axis_rules to mesh axis "
                    f"{axis!r}, which mesh {sharding.mesh!r} lacks{hint}; "
                    f"axes: {', '.join(mesh.axes)}",
                )
            )
    return found


def _named_axes(spec: Sequence[str | Sequence[str] | None]) -> Iterator[tuple[int, str]]:
    """Each mesh axis `spec` names, with the dimension it shards."""
    for j, entry in enumerate(spec):
        for axis in [entry] if isinstance(entry, str) else entry or []:
            yield j, axis
