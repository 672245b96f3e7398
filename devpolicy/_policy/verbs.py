"""The module-level verbs (`devpolicy.put`, `place`, `scope`, `load_file`, ...): each decides
by the active policy (`active`), or by its `policy=` argument, and hands the work to the
layer that does it in one line.

One concept past 650 lines: the code is a line a verb; the rest is each verb's docstring,
the public reference (arguments, examples run as doctests) that `api.md` renders. Split,
the reference would be split, not the code.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar, overload

import jax

from .._apply import put as _put
from .._apply.calls import Inputs
from .._apply.moves import move_to
from .._apply.scope import Scope, make_place
from .._apply.stream import arguments as _arguments
from .._apply.stream import owner as _owner
from .._apply.stream import prefetch as _prefetch
from .._apply.stream import windows as _windows
from .._apply.stream.reading import ReadOptions
from .._apply.transfers import explicitly
from .._decide.decider import Decider
from .._decide.decision import Decision, Explanation
from .._io.format.layout import DEFAULT_ALIGN
from .._io.planning import plan as _planning
from .._io.planning.plan import Plan, PlanOptions
from .._io.reading import load as _safetensors
from .._io.writing import saving as _saving
from .._machine.machine import VirtualMachine
from .._names.matching import source_file
from .active import ACTIVE_DECIDER, ACTIVE_SCOPES, events_for_writing
from .policy import Policy, attached_of, options_record

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
# The repeat `scope(name)`'s one lookup, bound once.
_SCOPE_OF = ACTIVE_SCOPES.by_name.get


def resolve(
    name: str,
    *,
    nbytes: int | None = None,
    shape: tuple[int, ...] | None = None,
    file: str | os.PathLike[str] | None = None,
) -> Decision:
    """Decide where `name` goes by the active policy, and log the decision.

    Args:
        name: What is being placed (`dataset/train`).
        nbytes: Its size, if known; size conditions apply only when given.
        shape: Its shape, if known: whether it divides over a sharding rule's mesh.
        file: The file it comes from, if any: rules with `file:` match only then.

    Returns:
        The Decision: device, rule, origin, source, fallback reason.

    Raises:
        DeviceUnavailableError: no device for the target or its fallbacks (or strict).

    Example:
        >>> import devpolicy
        >>> with devpolicy.activate(devpolicy.load_policy({"version": 1, "default": "cpu:1"})):
        ...     devpolicy.resolve("dataset/train").device_text
        'cpu:1'
    """
    return ACTIVE_DECIDER.decider().resolve(name, nbytes, shape, source_file(file))


def explain(
    name: str,
    *,
    nbytes: int | None = None,
    shape: tuple[int, ...] | None = None,
    file: str | os.PathLike[str] | None = None,
    axes: Sequence[str | None] | None = None,
) -> Explanation:
    """Every rule tried for `name` by the active policy, and every fallback step; no event.

    `file`: the file the array comes from (rules with `file:` match only with one).
    `axes`: the names the model attaches to its dimensions, for `axes: attached` rules
    (without them such a rule says it needs them); see `Policy.explain`.

    Example:
        >>> import devpolicy
        >>> with devpolicy.activate(devpolicy.load_policy({"version": 1})):
        ...     devpolicy.explain("x").decision.source
        'default'
    """
    return ACTIVE_DECIDER.decider().explain(
        name, nbytes, shape, source_file(file), attached_of(axes)
    )


def scope(name: str, *, nbytes: int | None = None) -> Scope:
    """Context manager: `jax.default_device` set to where `name` goes; yields the Decision.

    The decision is made by the policy active when the scope is entered, before anything
    changes; the previous default device comes back on exit and on exceptions. Scopes
    nest, and one scope object may be entered again. `jax.default_device` is
    thread-local, so the scope holds in the entering thread only.

    Example:
        >>> import devpolicy, jax.numpy as jnp
        >>> with devpolicy.activate(devpolicy.load_policy({"version": 1, "default": "cpu:2"})):
        ...     with devpolicy.scope("dataset/train") as decision:
        ...         x = jnp.zeros(3)
        >>> decision.device_text, x.devices() == {decision.device}
        ('cpu:2', True)
    """
    if nbytes is None:
        # The repeat `with devpolicy.scope(name)`: one dictionary lookup, no further call.
        try:
            found = _SCOPE_OF(name)
        except TypeError:  # unhashable: Scopes makes a scope whose entry says what is wrong
            found = None
        if found is not None:
            return found
    return ACTIVE_SCOPES.make(name, nbytes)


@overload
def place(name: F, /, *, commit: bool | None = None, inputs: Inputs = None) -> F: ...
@overload
def place(
    name: str | None = None, /, *, commit: bool | None = None, inputs: Inputs = None
) -> Callable[[F], F]: ...
def place(name: Any = None, /, *, commit: bool | None = None, inputs: Inputs = None) -> Any:
    """Decorator: run the function inside the scope for `name` (default `module.qualname`).

    `@place` and `@place("name")` both work. The policy is looked up at each call, so
    decorating at import time and activating later is fine. With `commit` (the rule's
    `commit`, default true; this argument overrides it), single-device `jax.Array` leaves
    of the result on the decided device are committed to it, without a copy, so they
    cannot migrate later; leaves on another device give a `placement_mismatch` warning.
    Generators and coroutines get the scope around each step, never across a pause.

    JAX runs a jitted function where its committed inputs are, and refuses inputs
    committed to different devices. For a model split over devices, `inputs="move"` (or
    the rule's `inputs: move`) moves each committed `jax.Array` argument (pytree leaves
    included) found on another single device to the decided device before the call: the
    activations of the layer before follow to this layer's device. Each move is a debug
    `input_moved` event, and each call that moves is an `inputs_moved` event (info the
    first time). `inputs="keep"` never moves; None (default) does what the rule says.

    Example:
        >>> import devpolicy, jax.numpy as jnp
        >>> @devpolicy.place("dataset/train")
        ... def load():
        ...     return jnp.arange(4)
        >>> with devpolicy.activate(devpolicy.load_policy({"version": 1, "default": "cpu:1"})):
        ...     x = load()
        >>> devpolicy.inventory().text(*x.devices()), x.committed
        ('cpu:1', True)
    """
    return make_place(ACTIVE_DECIDER, name, commit, inputs)


def to(x: T, name: str) -> T:
    """`x`'s `jax.Array` leaves moved to the device the active policy decides for `name`.

    The one-line form of `@place(name, inputs="move")`: each array leaf elsewhere (or
    uncommitted) is put on the decided device, committed, in one transfer; other leaves
    are returned as they are. Moves of committed arrays are logged like `@place`'s.

    Example:
        >>> import devpolicy, jax, jax.numpy as jnp
        >>> p = devpolicy.load_policy({"version": 1, "rules": [
        ...     {"match": "model/layer2", "device": "cpu:2"}]})
        >>> h = jax.device_put(jnp.ones(3), devpolicy.get_device("cpu:1"))
        >>> with devpolicy.activate(p):
        ...     h2 = devpolicy.to(h, "model/layer2")
        >>> devpolicy.inventory().text(*h2.devices()), h2.committed
        ('cpu:2', True)
    """
    return explicitly(move_to, ACTIVE_DECIDER.decider(), x, name)


def put(name: str, x: T, *, narrow: Literal["exact", "lossy"] = "exact") -> T:
    """Place an array or pytree by the active policy, its size known; the result is committed.

    Pytree leaves are named `name/<path>` (`params/layer0/w`); each is decided on its
    own, and all decisions are made before any array moves.

    With x64 disabled JAX holds 64-bit data in 32 bits. `narrow="exact"` (the default)
    narrows int64/uint64/float64/complex128 leaves only when every value survives (each
    with a `narrowed` event), else raises `NarrowingError` listing every leaf that would
    change, before anything moves; `narrow="lossy"` accepts the change (a `narrowed`
    warning with `exact=False`).

    Raises:
        NarrowingError: a 64-bit leaf would change (x64 disabled, `narrow="exact"`).
        DeviceUnavailableError: a leaf's target and fallbacks cannot be had.

    Example:
        >>> import devpolicy, numpy as np
        >>> p = devpolicy.load_policy({"version": 1, "rules": [
        ...     {"match": "params/*", "min_bytes": 1024, "device": "cpu:3"}]})
        >>> with devpolicy.activate(p):
        ...     tree = devpolicy.put("params", {"big": np.zeros(1024), "small": np.zeros(2)})
        >>> [devpolicy.inventory().text(*tree[key].devices()) for key in ("big", "small")]
        ['cpu:3', 'cpu:0']
        >>> try:
        ...     p.put("ids", np.array([2**40, 7]))
        ... except devpolicy.errors.NarrowingError as e:
        ...     print(e.problems)
        (('ids', 'values 7..1099511627776 do not fit int32 (-2147483648..2147483647)'),)
    """
    return explicitly(_put.put, ACTIVE_DECIDER.decider(), name, x, narrow)


def shardings(name: str, tree: T) -> T:
    """The tree of shardings the active policy decides for `put(name, tree)`'s leaves.

    Leaves may be arrays or `jax.ShapeDtypeStruct`s (only shape and dtype are read), so a
    model can be created sharded from the start: `jax.jit(init, out_shardings=...)` with
    the tree from `jax.eval_shape(init)`. Leaves are named as `put` names them
    (`params/layer0/w`) and decided as one placement (sizes, shapes, memory), exactly as
    `put` would; a sharding rule's leaf gets its `NamedSharding`, any other a
    `SingleDeviceSharding`. Nothing is created or moved.

    Raises:
        DeviceUnavailableError: a leaf's target and fallbacks cannot be had.
        UnmatchedNameError: under `default: reject`, a leaf no rule matches.

    Example:
        >>> import devpolicy, jax, jax.numpy as jnp
        >>> p = devpolicy.load_policy({"version": 1,
        ...     "meshes": {"tp": {"axes": {"fsdp": 2, "tensor": 2}, "devices": "cpu"}},
        ...     "axis_rules": [["vocab", "tensor"], ["embed", "fsdp"]],
        ...     "rules": [
        ...         {"match": "params/embed",
        ...          "sharding": {"mesh": "tp", "axes": ["vocab", "embed"]}},
        ...         {"match": "params/*", "sharding": {"mesh": "tp", "spec": [None]}}]})
        >>> def init():
        ...     return {"embed": jnp.ones((32000, 64)), "step": jnp.zeros((), jnp.int32)}
        >>> with devpolicy.activate(p):
        ...     out = devpolicy.shardings("params", jax.eval_shape(init))
        >>> tuple(out["embed"].spec), tuple(out["step"].spec)  # a 0-d leaf: replicated
        (('tensor', 'fsdp'), ())
        >>> params = jax.jit(init, out_shardings=out)()
        >>> params["embed"].addressable_shards[0].data.shape
        (16000, 32)
    """
    return _put.shardings(ACTIVE_DECIDER.decider(), name, tree)


def use_mesh(name: str, mesh: jax.sharding.Mesh, *, policy: Policy | None = None) -> None:
    """Use a mesh the program built as the policy's mesh `name`: every rule naming `name`
    (its `sharding`, a fallback `name[...]`, `DEVPOLICY_RULES`) shards over `mesh` itself,
    not one devpolicy builds. For a codebase that makes its own mesh (MaxText's
    `create_device_mesh`, a hybrid mesh, a `jax.make_mesh` with its own device order) and
    adopts devpolicy for placement only.

    The policy still declares the mesh under `meshes:` with the same axis names, so that
    its rules can be checked without the program (`devpolicy check`); a size there other
    than -1 must be the mesh's. Its `devices:` are not used once a mesh is given. The
    decisions made before are forgotten: the next one uses `mesh`.

    Args:
        name: The mesh's name in the policy's `meshes`.
        mesh: The `jax.sharding.Mesh`.
        policy: The policy to give it to (default: the active policy).

    Raises:
        TypeError: `mesh` is not a `jax.sharding.Mesh`.
        ValueError: the policy declares no mesh `name` (the message lists its meshes), or
            one with other axis names or sizes.

    Example:
        >>> import devpolicy, jax
        >>> meshes = {"train": {"axes": {"data": 2, "model": 2}}}
        >>> rules = [{"match": "params/*", "sharding": {"mesh": "train", "spec": ["data"]}}]
        >>> p = devpolicy.load_policy({"version": 1, "meshes": meshes, "rules": rules})
        >>> mesh = jax.make_mesh((2, 2), ("data", "model"), devices=jax.devices("cpu"))
        >>> with devpolicy.activate(p):
        ...     devpolicy.use_mesh("train", mesh)
        ...     decision = devpolicy.resolve("params/w", shape=(8, 8))
        >>> decision.sharding.mesh is mesh, decision.device_text
        (True, 'train[data]')
    """
    _decider_of(policy).use_mesh(name, mesh)


def _decider_of(policy: Policy | None) -> Decider:
    if policy is None:
        return ACTIVE_DECIDER.decider()
    if not isinstance(policy, Policy):
        raise TypeError(f"policy= takes a Policy (from devpolicy.load_policy), got {policy!r}")
    return policy.decider


@overload
def load_file(
    path: str | os.PathLike[str],
    *,
    prefix: str | None = None,
    policy: Policy | None = None,
    mmap: bool | None = None,
    narrow: Literal["exact", "lossy"] = "exact",
    progress: bool | None = None,
    into: None = None,
    strict: bool = True,
    separator: str | None = None,
    remote: Mapping[str, object] | None = None,
) -> dict[str, jax.Array]: ...


@overload
def load_file(
    path: str | os.PathLike[str],
    *,
    prefix: str | None = None,
    policy: Policy | None = None,
    mmap: bool | None = None,
    narrow: Literal["exact", "lossy"] = "exact",
    progress: bool | None = None,
    into: T,
    strict: bool = True,
    separator: str | None = None,
    remote: Mapping[str, object] | None = None,
) -> T: ...


def load_file(
    path: str | os.PathLike[str],
    *,
    prefix: str | None = None,
    policy: Policy | None = None,
    mmap: bool | None = None,
    narrow: Literal["exact", "lossy"] = "exact",
    progress: bool | None = None,
    into: Any = None,
    strict: bool = True,
    separator: str | None = None,
    remote: Mapping[str, object] | None = None,
) -> Any:
    """Load a safetensors file, each tensor sent straight to the device its rule names.

    Every tensor is named `<prefix>/<key>` (prefix defaults to the file's stem) and resolved
    with its size known, so size rules apply; one file may load to several devices. Nothing
    is first made on the default device. Host-bound tensors are read into 64-byte-aligned
    buffers that `device_put` adopts without a copy; accelerator-bound ones are read one
    ahead of their transfer and sent without waiting, at most 512 MiB of host bytes in
    flight, so host memory does not grow with the file. Results are committed.

    Args:
        path: The file, folder or index: a local path or a URL ([Loading from object
            storage and the Hub](loading.md#loading-from-object-storage-and-the-hub)).
        prefix: Name prefix (default: the file name without `.safetensors`; "" for none).
        policy: Policy to decide by (default: the active one).
        mmap: True maps every tensor whose file offset is 64-byte aligned (zero-copy; the
            array stays backed by the file), False never maps, None maps where the rule
            says `mmap: true`.
        narrow: With x64 disabled, JAX holds I64/U64/F64 in 32 bits. "exact" narrows only
            when every value survives (and logs it), else raises NarrowingError; "lossy"
            always narrows.
        progress: A progress bar on a terminal; None shows one for files over 256 MiB.
        into: A tree to fill (`nnx.state(model)`, flax params, `jax.eval_shape(init)`):
            its leaves arrays or `jax.ShapeDtypeStruct`s, each filled from the tensor
            whose key is the leaf's name as `put` names it less the first part
            (`layers/0/kernel`, what `save_file(tree, path)` writes), of the same shape
            and dtype. Names given to rules are `<prefix>/<leaf name>`: pass
            `prefix="params"` to place them by the rules written for `put("params", tree)`.
        strict: With `into`, whether tensors no leaf takes are an error (True) or left
            unread (False, counted in an `into_skipped` event).
        separator: The character between the parts of the file's keys (`.` for
            `model.layers.0.mlp.up_proj.weight`), in place of the policy's
            `names.separator` for this call.
        remote: How URLs are read here, over the policy's `remote:` (`{"cache": DIR}`).

    Returns:
        Tensor keys (not prefixed) to committed arrays, in header order; with `into`, a
        tree of the same structure holding the committed arrays.

    Raises:
        SafetensorsFileError: the file is missing, truncated or malformed.
        CheckpointMismatchError: with `into`, leaves no tensor fills, tensors no leaf takes
            (with `strict`), shapes or dtypes that differ: all listed, nothing loaded.
        NarrowingError: a 64-bit tensor would change.
        DeviceUnavailableError: a tensor's target and fallbacks cannot be had.

    Example:
        >>> import devpolicy, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "train.safetensors")
        >>> devpolicy.save_file({"tokens": np.arange(8, dtype=np.uint16)}, path)
        >>> rules = [{"match": "*/tokens", "device": "cpu:1"}]
        >>> p = devpolicy.load_policy({"version": 1, "rules": rules})
        >>> out = devpolicy.load_file(path, policy=p)
        >>> devpolicy.inventory().text(*out["tokens"].devices()), out["tokens"].committed
        ('cpu:1', True)

        A tree saved with `save_file` and filled back, placed by the rules for its names:

        >>> import jax
        >>> params = {"dense": {"kernel": np.ones((2, 3), np.float32)}, "step": np.int32(7)}
        >>> devpolicy.save_file(params, path)
        >>> p = devpolicy.load_policy({"version": 1, "rules": [
        ...     {"match": "params/dense/*", "device": "cpu:2"}]})
        >>> shapes = jax.eval_shape(lambda: params)
        >>> out = devpolicy.load_file(path, into=shapes, prefix="params", policy=p)
        >>> devpolicy.inventory().text(*out["dense"]["kernel"].devices()), int(out["step"])
        ('cpu:2', 7)
    """
    given = options_record(_safetensors.LoadOptions, locals())  # first: only the keywords
    return explicitly(_safetensors.load_file, path, _decider_of(policy), given)


def save_file(
    tensors: Any,
    path: str | os.PathLike[str],
    *,
    align: int = DEFAULT_ALIGN,
    metadata: Mapping[str, str] | None = None,
    timeout: float = _saving.JOINT_TIMEOUT,
    policy: Policy | None = None,
) -> None:
    """Write arrays (numpy or JAX) as a safetensors file laid out for zero-copy loading.

    `tensors` is a mapping of keys to arrays (written under those keys), or any pytree:
    nested dicts, flax params, `nnx.state(model)`, each leaf written under its name as
    `put` names it, less the first part (`layers/0/kernel`; no `/value`), so that
    `load_file(path, into=tree)` fills the same tree back.

    The header is padded and tensors ordered so the largest start at `align`-byte file
    offsets (the format allows no holes between tensors). Any safetensors reader reads it.
    Written to a temporary file and renamed: an error leaves nothing behind.

    When arrays span the processes of a `jax.distributed` job, every process calls it with
    the same tree and path (a filesystem they all see) and writes only its own shards
    (replica 0 of each slice) into the file one process would write; one process failing
    fails it on all (docs: Saving from many processes).

    `path` may be an `s3://bucket/key` URL (S3 and S3-compatible stores, credentials and
    endpoint as botocore finds them; the `remote` extra): the file goes up as one
    multipart upload, from this process or from every process of the job, and the object
    appears only once the upload completes.

    Args:
        align: Alignment of the largest tensors' file offsets (a power of two).
        metadata: The header's `__metadata__` (strings to strings).
        timeout: Seconds each process of a multi-process save waits for the others at
            each step before failing the save (a process killed or stuck never hangs it).
        policy: Whose logging the `save_file` event follows (default: the active one;
            where discovery finds none, the defaults, with no `no_policy` warning:
            writing places nothing).

    Raises:
        SafetensorsFileError: `path` is a URL of another scheme than s3://, or exists but
            is not a regular file (a device, a FIFO, a directory), or cannot be written (or
            uploaded), or another process of a multi-process save failed or did not answer
            in `timeout` seconds; nothing is written.
        ValueError: a bad `align`, `timeout`, dtype, name or metadata; two leaves of the
            same name.
        TypeError: a leaf that is not an array or number.

    Example:
        >>> import devpolicy, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
        >>> devpolicy.save_file({"w": np.ones((4, 4), np.float32)}, path)
        >>> from safetensors.numpy import load_file
        >>> float(load_file(path)["w"].sum())
        16.0
        >>> devpolicy.save_file({"layers": [{"w": np.ones(2)}], "step": np.int32(3)}, path)
        >>> sorted(load_file(path))
        ['layers/0/w', 'step']
    """
    _saving.save_file(
        tensors,
        path,
        events_for_writing() if policy is None else _decider_of(policy).events,
        align=align,
        metadata=metadata,
        timeout=timeout,
    )


def plan(
    path: str | os.PathLike[str],
    *,
    prefix: str | None = None,
    policy: Policy | None = None,
    mmap: bool | None = None,
    machine: VirtualMachine | None = None,
    separator: str | None = None,
    into: Any = None,
    axes: Mapping[str, Sequence[str | None]] | None = None,
    strict: bool = True,
    remote: Mapping[str, object] | None = None,
) -> Plan:
    """Where every tensor of a file would go, reading only its header; nothing is logged.

    `prefix` and `separator` name the tensors as `load_file` does; a URL's fetch is predicted.

    A rule with `axes: attached` shards each tensor by the axis names the model attaches
    to its leaf, which a header does not carry: give the model's abstract tree as `into`
    (matched to the tensors as `load_file(path, into=tree)` matches it, `strict` alike),
    or `axes`, the names by tensor name (`{"m/up/kernel": ["embed", "mlp"]}`; `[]`: the
    leaf carries none). Without either, such a tensor is not decided (`decision` None, its
    `error` saying so), never counted as sharded.

    Per device: the bytes planned, of them the bytes `load_file` would map from the file
    (`file_backed`: host devices, the rule's `mmap` or `mmap=True`, 64-byte-aligned offset;
    they take no anonymous memory), and whether the rest fits its free memory. Devices
    that share one memory (every CPU device of a process, in host RAM) are judged
    together: bytes planned for one count against all.

    `machine` plans for a machine you do not have (`VirtualMachine(["gpu=8x80GiB"],
    processes=2)`): the policy's rules, fallbacks and meshes are walked against its
    devices, exactly as they would be there, and each device's stated memory is the
    capacity judged by (in place of the policy's). Its decisions carry the mesh, spec,
    shards and bytes per device, but no sharding (its devices do not exist here);
    `Plan.devices` lists process 0's devices, and every process holds alike.

    Example:
        >>> import devpolicy, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
        >>> devpolicy.save_file({"w": np.zeros(256, np.float32)}, path)
        >>> policy = devpolicy.load_policy({"version": 1, "default": "cpu:2"})
        >>> p = devpolicy.plan(path, policy=policy)
        >>> [(t.name, t.nbytes, t.decision.device_text) for t in p.tensors]
        [('m/w', 1024, 'cpu:2')]

        The same file on two processes of 8 GPUs each, sharded over all 16:

        >>> meshes = {"fsdp": {"axes": {"data": 2, "model": -1}, "devices": "gpu"}}
        >>> rules = [{"match": "m/*", "sharding": {"mesh": "fsdp", "spec": [["data", "model"]]},
        ...           "fallback": ["cpu"]}]
        >>> policy = devpolicy.load_policy({"version": 1, "meshes": meshes, "rules": rules})
        >>> vm = devpolicy.VirtualMachine(["gpu=8x80GiB"], processes=2)
        >>> (t,) = devpolicy.plan(path, policy=policy, machine=vm).tensors
        >>> t.decision.device_text, t.decision.mesh_devices, t.decision.bytes_per_device()
        ('fsdp[data+model]', 16, 64)
    """
    given = options_record(PlanOptions, locals())  # first: only the keywords
    return _planning.plan(path, _decider_of(policy), given)


def prefetch(
    iterable: Iterable[T],
    name: str = "batch",
    size: int = 2,
    *,
    policy: Policy | None = None,
    narrow: Literal["exact", "lossy"] = "exact",
) -> _prefetch.BatchStream[T]:
    """Yield each element placed by the rule for `name`, with up to `size` transfers in flight.

    Each element (an array or pytree) is `put` as `name` (pytree leaves as `name/<path>`).
    JAX transfers are asynchronous, so while you compute on one batch the next `size` are
    already on their way (`size=2` keeps two in flight; memory holds `size + 1` batches).
    An error from the source is raised after the batches placed before it are used. The policy is
    the one active when `prefetch` is called, unless given. `narrow` is `put`'s: 64-bit
    batches are narrowed only when exact, else `NarrowingError`.

    The result is a `BatchStream`: an iterator whose `close()` (or the end of a `with`
    block) drops the batches in flight and closes the source, so a generator reading a
    file closes it at once.

    Raises:
        ValueError: if `size` is less than 1.

    Example:
        >>> import devpolicy, numpy as np
        >>> rules = [{"match": "batch", "device": "cpu:2"}]
        >>> p = devpolicy.load_policy({"version": 1, "rules": rules})
        >>> batches = (np.full(4, i) for i in range(3))
        >>> stream = devpolicy.prefetch(batches, policy=p)
        >>> [devpolicy.inventory().text(*b.devices()) for b in stream]
        ['cpu:2', 'cpu:2', 'cpu:2']
    """
    return _prefetch.prefetch(iterable, _decider_of(policy), name, size, narrow)


def windows(
    tokens: Any,
    length: int,
    batch: int,
    *,
    name: str = "batch",
    order: Literal["sequential", "random", "shuffled"] = "sequential",
    seed: int | None = None,
    stride: int | None = None,
    steps: int | None = None,
    epochs: int | None = None,
    weights: Mapping[str, float] | None = None,
    separator: int | None = None,
    separator_is: Literal["eos", "bos"] = "eos",
    fields: Mapping[str, str] | None = None,
    reads: ReadOptions | Literal["auto", "keep", "budget", "file"] | None = None,
    size: int = 2,
    policy: Policy | None = None,
    narrow: Literal["exact", "lossy"] = "exact",
    start: int = 0,
    resume: Mapping[str, Any] | str | None = None,
    report_every: float | None = 60.0,
    pack: Literal["first_fit"] | None = None,
    pad: int | None = None,
    open_rows: int | None = None,
    index: str | os.PathLike[str] | None = None,
) -> _owner.WindowStream:
    """Batches of windows cut from a host array, each placed as `name` ahead of use.

    The story's loop: a token dataset on the host (`load_file` with a host rule, mapped
    from its file), the model on the accelerator, and each step a batch of windows sent
    to the device the policy decides for `name`. The windows are cut from a zero-copy
    numpy view of `tokens` (`host_view`), so any offset works, past 2**31 included, with
    x64 disabled; only the batch is copied, never the array. Each batch has shape
    `(batch, length, *tokens.shape[1:])`. The stream is decided once, like
    `put(name, ...)` (one `placement` event, and one `stream_ended` event with its counts
    when it ends or is closed); small batches are sent up to 8 to a `device_put`, so at
    least `size` and at most `size + 7` batches are in flight.

    Args:
        tokens: A `jax.Array` on one host device, or a numpy array (a memmap is fine).
            Windows run along its first dimension. A list or tuple of 1-D such arrays of
            one dtype (shards: files `load_file` mapped, `np.memmap`s of raw `.bin` or
            `.npy` files) is one source, their concatenation in order, never copied: a
            window may span two shards; an empty shard adds nothing. A mapping of names
            to arrays or lists (one dtype and row shape) is a mixture: each row of a
            batch comes from a source allotted by `weights` (docs/training-data.md).
        length: Rows per window (for a language model, the context length plus one).
        batch: Windows per batch (this process's, under several processes).
        name: The name each batch is placed as (its rule decides the device).
        order: "sequential": windows at 0, stride, 2*stride, ... for one pass, the last
            batch possibly smaller. "random": each window starts at an offset drawn
            uniformly, with replacement, from every offset it fits at; until `steps`
            if given, else for `2**63` steps. "shuffled": epochs of the windows at 0,
            stride, 2*stride, ..., each window once an epoch, in an order drawn anew
            each epoch; batches run on across an epoch's end; until `epochs` or `steps`.
        seed: Seed of the random or shuffled order, an int from 0 to `2**64 - 1`
            (None: fresh entropy, drawn once and kept in the stream's `state()`). Step
            k's windows depend on the seed and k alone.
        stride: Distance between sequential or shuffled windows (default `length`: no
            overlap; 1: every start).
        steps: Stop after this many batches (where the stream ends first, a sequential
            pass or `epochs=`, a `stream_steps_past_end` warning says so).
        epochs: Stop a shuffled stream (of one array) after this many epochs; the last
            batch holds what is left of the last epoch.
        weights: A mixture's weights, by source name (any positive numbers: their
            shares are what counts). Each source's rows of a batch are allotted by them
            exactly over every few rows, and drawn from that source by `order` ("random",
            or "shuffled": each source's own epochs). `stream_ended` and `streams()` say
            how many windows came from each source.
        separator: A token id that separates documents: each batch is then a dict of
            "tokens", "segment_ids" (1, 2, ... for the documents of each window) and
            "positions" (0 at each document's first token), int32, placed together.
        separator_is: "eos" (the separator ends a document, and belongs to it) or "bos"
            (it starts one).
        fields: A batch's keys renamed to the ones a model wants: a mapping from
            "tokens" (and, with `separator`, "segment_ids" and "positions") to names,
            e.g. flax's lm1b `{"tokens": "inputs", "segment_ids": "inputs_segmentation",
            "positions": "inputs_position"}`; a key left out keeps its name. With
            `fields`, each batch is a dict (without `separator`, of the tokens alone).
        reads: How the windows of a file mapping are read: a `devpolicy.ReadOptions`,
            or a path's name ("auto", "keep", "budget", "file"). The default, "auto",
            starts on the rules' guess and, where both reading the file by position and
            keeping its mapping are safe, times both on the stream's own groups and keeps
            the faster (`stream_ended`'s `reads_why` says what it measured).
        size: Batches in flight ahead of use, from 1 to 1,024 (`prefetch`'s `size`); the
            host must hold about `2 * size + 2` batches at once.
        policy: Policy to decide by (default: the active one at this call).
        narrow: `put`'s, for 64-bit tokens with x64 disabled.
        start: The first batch to yield (from 0 to `2**63 - 1`): the stream yields
            exactly the batches an uninterrupted one yields from batch `start` on, at
            once (no batch before it is drawn or read), for either order.
        resume: A stream's `state()` (or its JSON text), saved beside a checkpoint: the
            stream resumes at its step, once every argument that decides the batches
            (order, seed, length, stride, steps, epochs, the tokens' rows, row shape and
            dtype, a mixture's sources and weights, the shards' count and sizes) matches
            the saved one. A state saved
            by N processes resumes on M (each process's `batch` the global batch over M);
            a random, shuffled, mixed or packed stream also at another global batch,
            from the same global row (a sequential pass at its own batch only).
        report_every: Seconds between `stream_progress` lines at info, each saying how
            the loop goes (the seconds it waited inside `next()` and between pulls, the
            waited share, batches a second); None or 0 for none. The same figures are in
            `stream_ended` and `devpolicy.report()`.
        pack: "first_fit": each batch is `batch` rows of whole documents (the spans
            between `separator` tokens) instead of windows: the documents, in the
            file's order (`order="sequential"`, one pass) or shuffled each epoch
            (`order="shuffled"`), each once an epoch, go first-fit into the oldest of
            at most `open_rows` open rows they fit; a document longer than `length` is
            cut into pieces of `length`; a row's rest is `pad` with segment id 0 and
            position 0. Batches are dicts of tokens, segment ids (1, 2, ... for a row's
            documents) and positions, as with `separator`. The documents are found from
            an index built in one pass (a progress bar) and, for a token file, kept
            beside it (or in `index`) for reuse, rebuilt whenever the file changed. The
            last batch of a finite order is filled with rows of padding. `resume` is
            exact from any step (at another global batch too); `start` is refused.
            `stream_ended` and `report()` say the padding share and documents a row.
        pad: The token that fills the rest of each packed row (needed with `pack`).
        open_rows: Rows open to documents at once (default 16: padding about 0.9% at
            length 2,048 for documents of 500 tokens on average; more pads less).
        index: Where the document index of a token file is kept: a folder, or the
            index file's path (default: beside the token file).

    Returns:
        A `WindowStream` of placed batches; `close()` ends it, `state()` says where it
        is. Each step is handed out once, in order, exactly; threads may share it; a
        `KeyboardInterrupt` inside `next()` skips nothing (docs/host-arrays.md, "What a
        stream promises").

    Raises:
        HostViewError: `tokens` is not on a host device (or sharded): it would be copied.
        TypeError: `tokens` (or a shard, `tokens[i]`) is not an array of numbers (a
            list of token ids, or objects, strings, dates or records).
        ValueError: a bad `length`, `batch`, `stride`, `steps`, `epochs`, `weights`,
            `separator`, `fields`, `size`, `order`, `seed` or `start`, `pack` without
            `separator` or `pad`, a `pad` outside the tokens' dtype, fewer rows than
            `length`, an empty list of shards or shards not 1-D or of mixed dtypes (the
            shard named), or batches ahead the host cannot hold.
        StreamStateError: `resume` is not a saved state, is damaged (every field at
            fault named), or was saved by a stream with other arguments (it would draw
            other batches; every one that differs named).

    Example:
        >>> import devpolicy, numpy as np
        >>> p = devpolicy.load_policy({"version": 1, "rules": [
        ...     {"match": "batch", "device": "cpu:1"}]})
        >>> tokens = np.arange(10, dtype=np.uint16)
        >>> [b.tolist() for b in devpolicy.windows(tokens, 3, 2, policy=p)]
        [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8]]]
        >>> (b,) = devpolicy.windows(tokens, 4, 8, order="random", seed=0, steps=1, policy=p)
        >>> b.shape, devpolicy.inventory().text(*b.devices())
        ((8, 4), 'cpu:1')
        >>> epoch = devpolicy.windows(tokens, 2, 5, order="shuffled", seed=1, epochs=1, policy=p)
        >>> sorted(w[0] for b in epoch for w in b.tolist())  # each window once
        [0, 2, 4, 6, 8]
        >>> mixed = devpolicy.windows({"web": tokens, "code": tokens + 100}, 2, 10,
        ...     order="random", seed=0, weights={"web": 0.7, "code": 0.3}, policy=p)
        >>> sum(w[0] >= 100 for w in next(mixed).tolist())  # 3 rows of 10 from "code"
        3
        >>> mixed.close()
        >>> shards = [tokens[:3], tokens[3:4], tokens[4:]]  # np.memmap of each file, say
        >>> [b.tolist() for b in devpolicy.windows(shards, 3, 2, policy=p)]  # as one array
        [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8]]]
        >>> docs = devpolicy.windows(np.array([5, 0, 6, 7, 0, 8], np.uint16), 6, 1,
        ...     separator=0, policy=p)
        >>> b = next(docs)
        >>> b["segment_ids"].tolist(), b["positions"].tolist()
        ([[1, 1, 2, 2, 2, 3]], [[0, 1, 0, 1, 2, 0]])
        >>> lm1b = {"tokens": "inputs", "segment_ids": "inputs_segmentation",
        ...     "positions": "inputs_position"}
        >>> sorted(next(devpolicy.windows(tokens, 4, 2, separator=0, fields=lm1b, policy=p)))
        ['inputs', 'inputs_position', 'inputs_segmentation']
        >>> text = np.array([5, 5, 5, 0, 6, 0, 7, 7, 0], np.uint16)  # 3 documents
        >>> rows = devpolicy.windows(text, 4, 2, pack="first_fit", separator=0, pad=9,
        ...     policy=p)
        >>> b = next(rows)
        >>> b["tokens"].tolist(), b["segment_ids"].tolist()  # whole documents, padded
        ([[5, 5, 5, 0], [6, 0, 9, 9]], [[1, 1, 1, 1], [1, 1, 0, 0]])
        >>> next(rows)["tokens"].tolist()  # the last batch filled with a row of padding
        [[7, 7, 0, 9], [9, 9, 9, 9]]
    """
    given = options_record(_arguments.WindowsArguments, locals())  # first: the arguments
    return _windows.windows(_decider_of(policy), given)
