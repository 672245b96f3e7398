"""Target text (`cpu`, `gpu:1`, `auto`) parsed into platform and index. No JAX here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .._base.errors import did_you_mean
from .axes import Attached, AxisRule, resolve_attached

#: Platforms devpolicy knows, in the order `devpolicy devices` lists them.
KNOWN_PLATFORMS = ("cpu", "gpu", "tpu")
#: Spellings accepted for a platform, mapped to JAX's platform name.
PLATFORM_ALIASES = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}
#: The accelerator-neutral target: the first of `ACCELERATOR_PLATFORMS` this machine has.
ACCELERATOR = "accelerator"
#: What `accelerator` may resolve to, in order: a TPU, then a GPU (a machine has one or the other).
ACCELERATOR_PLATFORMS = ("tpu", "gpu")
AUTO = "auto"
#: Only as a default: names no rule matches raise instead of being placed.
REJECT = "reject"
MAX_INDEX = 65535
TARGET_FORMS = (
    "auto, or cpu, gpu, tpu, cuda, rocm, accelerator (the machine's TPU, else its GPU) "
    "optionally followed by :N (e.g. gpu:1, accelerator:1)"
)
TARGET_PATTERN = r"^(auto|(accelerator|cpu|gpu|tpu|cuda|rocm)(:(0|[1-9][0-9]{0,4}))?)$"
#: A mesh axis name: what `jax.sharding.PartitionSpec` entries name.
AXIS_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
_TARGET = re.compile(r"([a-z]+)(?::(0|[1-9][0-9]*))?")


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed target.

    Attributes:
        text: The text as written (`cuda:1`).
        platform: JAX's platform name (`gpu`), `accelerator` (the machine resolves it to
            the first of `ACCELERATOR_PLATFORMS` it has), or `auto`.
        index: Index into the platform's process-local devices; None means the first.
    """

    text: str
    platform: str
    index: int | None

    @property
    def is_auto(self) -> bool:
        """Whether this target defers to JAX's own default device."""
        return self.platform == AUTO

    @property
    def is_accelerator(self) -> bool:
        """Whether this target names the accelerator the machine has, whichever it is."""
        return self.platform == ACCELERATOR

    def on(self, platform: str) -> Target:
        """This target on `platform` (what `accelerator:1` resolves to on a machine whose
        accelerator is `platform`).

        Example:
            >>> parse_target("accelerator:1").on("tpu")
            Target(text='tpu:1', platform='tpu', index=1)
        """
        text = platform if self.index is None else f"{platform}:{self.index}"
        return Target(text, platform, self.index)

    def __str__(self) -> str:
        return self.text


def parse_target(text: object) -> Target:
    """Parse target text.

    Raises:
        ValueError: naming the bad text and the accepted forms.

    Example:
        >>> parse_target("cuda:1")
        Target(text='cuda:1', platform='gpu', index=1)
        >>> parse_target("accelerator").platform
        'accelerator'
    """
    if not isinstance(text, str):
        raise ValueError(
            f"expected a target string, got {type(text).__name__} {text!r}; "
            f"accepted: {TARGET_FORMS}"
        )
    if text == AUTO:
        return Target(text, AUTO, None)
    m = _TARGET.fullmatch(text)
    if m is None:
        raise ValueError(f"not a target: {text!r}{_meant(text)}; accepted: {TARGET_FORMS}")
    name, index = m.groups()
    if name == AUTO:
        raise ValueError(f"{text!r}: `auto` takes no device index; accepted: {TARGET_FORMS}")
    platform = ACCELERATOR if name == ACCELERATOR else PLATFORM_ALIASES.get(name)
    if platform is None:
        hint = did_you_mean(name, [AUTO, ACCELERATOR, *PLATFORM_ALIASES])
        raise ValueError(
            f"unknown platform {name!r} in target {text!r}{hint}; accepted: {TARGET_FORMS}"
        )
    idx = None if index is None else int(index)
    if idx is not None and idx > MAX_INDEX:
        raise ValueError(f"device index {idx} in {text!r} is out of range (0..{MAX_INDEX})")
    return Target(text, platform, idx)


# A platform and an index with something else than `:` between them (`cpu;1`, `gpu.0`,
# `tpu 1`, `cpu1`); never `-`, which would turn `gpu:-1` into a guess of `gpu:1`.
_SLIPPED_INDEX = re.compile(r"([A-Za-z]+)[\s;.,/|=_:]*([0-9]+)")


def _meant(text: str) -> str:
    """` (did you mean 'cpu:1'?)` for text that is no target: the target a slip of its
    `:` meant where it has an index, else the platform its head is close to ("" where
    the head is a platform already: the bare platform is not what was meant)."""
    slipped = _SLIPPED_INDEX.fullmatch(text.strip())
    if slipped is not None:
        name, index = slipped.groups()
        try:
            return f" (did you mean {parse_target(f'{name.lower()}:{int(index)}').text!r}?)"
        except ValueError:
            pass  # not a platform, or an index out of range: no guess from the index
    head = text.split(":", 1)[0].strip()
    choices = [AUTO, ACCELERATOR, *PLATFORM_ALIASES]
    return "" if head in choices else did_you_mean(head, choices)


def check_default(text: object) -> str:
    """Check a policy's `default`: target text, or `reject`.

    Raises:
        ValueError: naming the bad text, the accepted forms and `reject`, with a hint.

    Example:
        >>> check_default("reject"), check_default("gpu:1")
        ('reject', 'gpu:1')
    """
    if text == REJECT:
        return REJECT
    try:
        parse_target(text)
    except ValueError as e:
        hint = did_you_mean(text, [REJECT]) if isinstance(text, str) else ""
        raise ValueError(f"{e}; or {REJECT} (names no rule matches raise){hint}") from None
    assert isinstance(text, str)  # parse_target accepted it
    return text


#: One spec entry: an axis, several axes (sharded over their product), or None.
SpecEntry = str | tuple[str, ...] | None
SHARDING_FORMS = "MESH[ENTRY,...] where ENTRY is an axis, axis+axis, or - (e.g. fsdp[data,-])"
_SHARDING = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\[([^\]]*)\]")
#: Sharding text, for the JSON schema (the parser says what is wrong inside the brackets).
SHARDING_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*\[[^\]]*\]$"
_AXIS = re.compile(AXIS_NAME_PATTERN)


class _OnAMesh:
    """What every mesh target answers alike."""

    __slots__ = ()

    @property
    def is_auto(self) -> bool:
        """Never: a sharding names its devices."""
        return False

    @property
    def platform(self) -> str:
        """Not a platform: the mesh decides."""
        return "mesh"


@dataclass(frozen=True, slots=True)
class ShardingTarget(_OnAMesh):
    """A rule's sharding: a mesh by name and one spec entry per array dimension.

    Attributes:
        mesh: The mesh's name in the policy's `meshes`.
        spec: Per dimension: an axis, a tuple of axes, or None (not sharded).
        logical: The logical axis names the spec was resolved from (a rule's `axes`), or
            None for a spec written as mesh axes.
        indivisible: What a dimension that does not divide over its axes does:
            `fallback` (the whole sharding is passed over for the next target of the
            chain) or `replicate` (only that dimension gives up axes, see `divisible`).
    """

    mesh: str
    spec: tuple[SpecEntry, ...]
    logical: tuple[str | None, ...] | None = None
    indivisible: str = "fallback"

    @property
    def text(self) -> str:
        """`fsdp[data,model]`; `-` for an unsharded dimension, `a+b` for several axes."""
        return f"{self.mesh}[{','.join(spec_entry_text(e) for e in self.spec)}]"

    @property
    def described(self) -> str:
        """The text, with the logical axes it was resolved from (`tp[-,data] from axes
        (vocab, embed)`)."""
        if self.logical is None:
            return self.text
        names = ", ".join("-" if n is None else n for n in self.logical)
        return f"{self.text} from axes ({names})"

    def replicated(self) -> ShardingTarget:
        """The same mesh, every dimension replicated (`mesh[]`)."""
        return ShardingTarget(self.mesh, (), None, self.indivisible)

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class AttachedTarget(_OnAMesh):
    """A rule's sharding by each leaf's own axis names (`axes: attached`): what to shard
    over is known only per leaf, so the walk asks `resolved` for each leaf's names.

    Attributes:
        mesh: The mesh's name in the policy's `meshes`.
        rules: The mesh's (or policy's) `axis_rules`, in order.
        mesh_axes: The mesh's axis names, in order.
        indivisible: As `ShardingTarget.indivisible`.

    Example:
        >>> from devpolicy._document.axes import Attached
        >>> t = AttachedTarget("mt", (("embed", "fsdp"),), ("fsdp", "tensor"))
        >>> t.text, t.resolved(Attached(("embed", "vocab"))).described
        ('mt[attached]', 'mt[fsdp,-] from axes (embed, vocab)')
    """

    mesh: str
    rules: tuple[AxisRule, ...]
    mesh_axes: tuple[str, ...]
    indivisible: str = "fallback"
    _resolved: dict[Attached, ShardingTarget | str] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def text(self) -> str:
        """`mt[attached]`."""
        return f"{self.mesh}[attached]"

    described = text

    @property
    def known(self) -> frozenset[str]:
        """The logical names `rules` gives mesh axes (or `null`) to."""
        return frozenset(name for name, _ in self.rules)

    def unnamed(self) -> ShardingTarget:
        """What a leaf that carries no names gets: replicated over the mesh (`mt[]`)."""
        return ShardingTarget(self.mesh, (), None, self.indivisible)

    def resolved(self, attached: Attached) -> ShardingTarget | str:
        """The sharding for a leaf carrying `attached` names, or why there is none (a
        name on two dimensions, a mesh axis the mesh lacks); worked out once per names."""
        found = self._resolved.get(attached)
        if found is None:
            spec = resolve_attached(attached, self.rules, self.mesh_axes)
            if isinstance(spec, str):
                found = spec
            else:
                found = ShardingTarget(self.mesh, spec[0], spec[1], self.indivisible)
            if len(self._resolved) >= _RESOLVED_KEPT:
                self._resolved.clear()  # made-up names without end: start over
            self._resolved[attached] = found
        return found

    def __str__(self) -> str:
        return self.text


#: How many distinct sets of attached names one rule keeps resolved (a model has a few).
_RESOLVED_KEPT = 4096


def spec_entry_text(entry: SpecEntry | list[str]) -> str:
    """One spec entry as text (a tuple of names, or the list the schema holds):
    `data`, `data+model`, or `-`."""
    if entry is None:
        return "-"
    return entry if isinstance(entry, str) else "+".join(entry)


def parse_sharding(text: str) -> ShardingTarget:
    """Parse sharding text such as `fsdp[data,-]` or `dp[data+model]` (`[]` replicates).

    Raises:
        ValueError: naming the bad text and the accepted form.

    Example:
        >>> parse_sharding("fsdp[data+model,-]").spec
        (('data', 'model'), None)
    """
    m = _SHARDING.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"not a sharding: {text!r}; accepted: {SHARDING_FORMS}")
    mesh, body = m.groups()
    spec: list[SpecEntry] = []
    for part in body.split(",") if body.strip() else []:
        part = part.strip()
        if part == "-":
            spec.append(None)
            continue
        axes = tuple(a.strip() for a in part.split("+"))
        bad = [a for a in axes if not _AXIS.fullmatch(a)]
        if bad:
            raise ValueError(
                f"not an axis name: {bad[0]!r} in sharding {text!r}; accepted: {SHARDING_FORMS}"
            )
        spec.append(axes[0] if len(axes) == 1 else axes)
    return ShardingTarget(mesh, tuple(spec))


#: A chain item meaning "the rule's own mesh, every dimension replicated".
REPLICATE = "replicate"
#: What a dimension that does not divide may do (`sharding.indivisible`).
INDIVISIBLE = ("fallback", "replicate")
CHAIN_FORMS = f"{TARGET_FORMS}; replicate (over the rule's mesh); or {SHARDING_FORMS}"


def parse_chain_item(text: str, mesh: str | None) -> Target | ShardingTarget | None:
    """One item of a fallback chain: a target, a sharding, or `replicate` over `mesh` (the
    mesh of the chain's sharding rule); None for `replicate` in a chain with no mesh (a
    rule that places on a device: there is nothing to replicate over, the item is skipped).

    Raises:
        ValueError: naming the bad text and the accepted forms.

    Example:
        >>> parse_chain_item("replicate", "tp")
        ShardingTarget(mesh='tp', spec=(), logical=None, indivisible='fallback')
        >>> parse_chain_item("tp[-,data]", None).text
        'tp[-,data]'
    """
    if text == REPLICATE:
        return None if mesh is None else ShardingTarget(mesh, ())
    if "[" in text:
        return parse_sharding(text)
    try:
        return parse_target(text)
    except ValueError as e:
        hint = did_you_mean(text, [REPLICATE])
        if hint:
            raise ValueError(f"not a target: {text!r}{hint}; accepted: {CHAIN_FORMS}") from None
        raise ValueError(f"{e}; or {REPLICATE}, or a sharding {SHARDING_FORMS}") from None


def check_chain_item(text: object) -> str:
    """Check one item of a `fallback` list: a target, `replicate`, or sharding text.

    Raises:
        ValueError: naming the bad text and every accepted form.

    Example:
        >>> check_chain_item("replicate"), check_chain_item("fsdp[data]")
        ('replicate', 'fsdp[data]')
    """
    if not isinstance(text, str):
        raise ValueError(
            f"expected a target string, got {type(text).__name__} {text!r}; accepted: {CHAIN_FORMS}"
        )
    parse_chain_item(text, "")
    return text
