"""Which files make a checkpoint: one file, a directory's files, or an index's.

A directory's files are chosen as transformers chooses them (its index, else
`model.safetensors`, else one complete set of shards or its plain files), never merged
by accident; every other `*.safetensors` file is left out with the reason. Only names
and the index are read here: headers are `header`'s. No JAX here.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..._base.errors import SafetensorsFileError
from ..._base.files import FileRefused, read_capped, why_unopenable
from ..._base.locations import FilePath
from ..format.header import Header, RepeatedKeys, json_object

#: The index file of a sharded Hugging Face checkpoint.
INDEX_SUFFIX = ".safetensors.index.json"
#: The largest index read (a checkpoint of a million tensors has an index of about 64 MiB).
MAX_INDEX_BYTES = 64 << 20
#: Index names: `model.safetensors.index.json`, a variant's `model.safetensors.index.fp16.json`.
_INDEX = re.compile(r".+\.safetensors\.index(\.[A-Za-z0-9_]+)?\.json")
#: A shard of a checkpoint without an index: `model-00001-of-00003.safetensors`.
_SHARD = re.compile(r"(?P<stem>.+)-(?P<number>\d{5})-of-(?P<total>\d{5})\.safetensors")
#: A variant, as transformers and diffusers name them: `model.fp16.safetensors`,
#: `model.fp16-00001-of-00002.safetensors`.
_VARIANT = re.compile(r"(?P<base>[^.]+)\.(?P<variant>[A-Za-z0-9_]+)(-\d{5}-of-\d{5})?\.safetensors")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """What `load_file` and `plan` read: one file, or every file of a checkpoint.

    Attributes:
        files: The safetensors files, in the order their tensors are listed.
        stem: The default name prefix: a file's stem, or a checkpoint directory's name
            (for a Hugging Face cache snapshot, the repository's name: see `default_prefix`).
        index: The index file, if the checkpoint has one.
        expected: Per file, the tensors the index puts in it (empty without an index).
        left_out: The directory's other `*.safetensors` files, each with why it is not
            part of the checkpoint (see `open_checkpoint`).
    """

    files: tuple[FilePath, ...]
    stem: str
    index: FilePath | None = None
    expected: tuple[frozenset[str], ...] = ()
    left_out: tuple[tuple[FilePath, str], ...] = ()

    def only(self, kept: list[bool]) -> Checkpoint:
        """The checkpoint less the files whose `kept` is False (with an index: the files
        and what the index puts in each, still paired)."""
        files = tuple(f for f, keep in zip(self.files, kept, strict=True) if keep)
        expected = tuple(e for e, keep in zip(self.expected, kept, strict=False) if keep)
        return Checkpoint(files, self.stem, self.index, expected, self.left_out)

    def check(self, headers: list[Header]) -> None:
        """Raise unless the files hold what the index says, each tensor in one file only."""
        seen: dict[str, FilePath] = {}
        for header in headers:
            for entry in header.tensors:
                other = seen.setdefault(entry.key, header.path)
                if other != header.path:
                    raise SafetensorsFileError(
                        header.path,
                        f"also in {other}: a checkpoint holds each tensor once",
                        tensor=entry.key,
                    )
        for header, wanted in zip(headers, self.expected, strict=False):
            held = {t.key for t in header.tensors}
            missing = sorted(wanted - held)
            if missing:
                raise SafetensorsFileError(
                    header.path,
                    f"{self.index} puts {len(missing)} tensor(s) here that the file lacks: "
                    + ", ".join(repr(k) for k in missing[:5]),
                )
            unlisted = [t.key for t in header.tensors if t.key not in wanted]
            if unlisted:
                raise SafetensorsFileError(
                    header.path,
                    f"holds {len(unlisted)} tensor(s) that {self.index} does not list: "
                    + ", ".join(repr(k) for k in unlisted[:5])
                    + " (the index and its files must agree: is the index out of date?)",
                )


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """A safetensors file, a checkpoint directory, or a checkpoint index.

    A directory's files are chosen as transformers chooses them, never merged by accident:

    1. its index (`*.safetensors.index.json`, as Hugging Face writes large checkpoints):
       the files it names;
    2. else `model.safetensors` alone;
    3. else its `*.safetensors` files (regular, not hidden: see `_checkpoint_files`)
       less a PEFT adapter (`adapter_model*.safetensors`) and variants
       (`model.fp16.safetensors`, and `X.v.safetensors` beside an `X.safetensors`); if
       shards (`X-00001-of-00003.safetensors`) remain, exactly one complete set of them;
       else all that remain (one file, or parts such as `train.safetensors` and
       `valid.safetensors`).

    Every other `*.safetensors` file is in `left_out` with the reason. A variant or an
    adapter loads when named: the file itself, or a variant's index
    (`model.safetensors.index.fp16.json`).

    Raises:
        SafetensorsFileError: naming the path and what is wrong with it: several
            indexes, shards of several checkpoints or a shard missing, nothing to load.

    Example:
        >>> import devpolicy, numpy as np, tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> devpolicy.save_file({"a": np.zeros(2)}, os.path.join(d, "part1.safetensors"))
        >>> devpolicy.save_file({"b": np.zeros(2)}, os.path.join(d, "part2.safetensors"))
        >>> c = open_checkpoint(d)
        >>> [f.name for f in c.files], c.stem == os.path.basename(d)
        (['part1.safetensors', 'part2.safetensors'], True)
        >>> devpolicy.save_file({"a": np.zeros(2)}, os.path.join(d, "model.safetensors"))
        >>> c = open_checkpoint(d)
        >>> [f.name for f in c.files], [f.name for f, why in c.left_out]
        (['model.safetensors'], ['part1.safetensors', 'part2.safetensors'])
        >>> c.left_out[0][1]
        'model.safetensors is the checkpoint (no index): name the file to load it'
    """
    given = Path(path)
    if given.is_dir():
        return _choose(given, default_prefix(given, given.name))
    if is_index(given.name):
        stem = default_prefix(given.parent, given.parent.resolve().name)
        return from_index(given, stem, _read_local_index(given))
    return Checkpoint((given,), given.name.removesuffix(".safetensors"))


def _choose(directory: Path, stem: str) -> Checkpoint:
    """A local directory's checkpoint files by the rule `open_checkpoint` gives."""
    indexes = sorted(directory.glob("*" + INDEX_SUFFIX))

    def files(unreadable: list[tuple[FilePath, str]] | None) -> tuple[FilePath, ...]:
        found: list[tuple[Path, str]] | None = [] if unreadable is not None else None
        listed = _checkpoint_files(directory, found)
        if unreadable is not None and found is not None:
            unreadable += found
        return listed

    return choose(directory, stem, files, list(indexes), _read_local_index)


def _read_local_index(index: FilePath) -> bytes:
    assert isinstance(index, Path)
    try:
        return read_capped(index, MAX_INDEX_BYTES, "a checkpoint index")
    except FileRefused as e:
        raise SafetensorsFileError(index, e.reason) from None


def choose(
    directory: FilePath,
    stem: str,
    list_files: Callable[[list[tuple[FilePath, str]] | None], Sequence[FilePath]],
    indexes: Sequence[FilePath],
    read_index: Callable[[FilePath], bytes],
) -> Checkpoint:
    """A folder's checkpoint by the rule `open_checkpoint` gives, from what the folder holds:
    its `*.safetensors` files (`list_files`: with a list, each that cannot be examined goes
    there with why instead of raising) and its `*.safetensors.index.json` files (for a
    folder at a URL, its listing), an index read by `read_index`.

    Raises:
        SafetensorsFileError: as `open_checkpoint`, naming the folder.
    """
    if len(indexes) > 1:
        names = ", ".join(i.name for i in indexes)
        raise SafetensorsFileError(
            directory, f"holds several checkpoint indexes ({names}): name one"
        )
    if indexes:
        # The index names the files: one it names is opened (and its absence named) only
        # when read, so a shard no one reads may be missing; the others are left out.
        checkpoint = from_index(indexes[0], stem, read_index(indexes[0]))
        named = set(checkpoint.files)
        why = f"not in {indexes[0].name}, the checkpoint's index: name the file to load it"
        unreadable: list[tuple[FilePath, str]] = []
        others = [(f, why) for f in list_files(unreadable) if f not in named]
        others += [(f, reason) for f, reason in unreadable if f not in named]
        others.sort(key=lambda item: (str(item[0]), item[1]))
        return Checkpoint(
            checkpoint.files, stem, checkpoint.index, checkpoint.expected, tuple(others)
        )
    files = list_files(None)
    model = next((f for f in files if f.name == "model.safetensors"), None)
    if model is not None:
        why = "model.safetensors is the checkpoint (no index): name the file to load it"
        return Checkpoint((model,), stem, left_out=tuple((f, why) for f in files if f != model))
    file_names = {f.name for f in files}
    bases = {n.removesuffix(".safetensors") for n in file_names} | {
        m["stem"] for n in file_names if (m := _SHARD.fullmatch(n))
    }
    kept: list[FilePath] = []
    left_out: list[tuple[FilePath, str]] = []
    for f in files:
        variant = _VARIANT.fullmatch(f.name)
        if f.name.startswith("adapter_model"):
            left_out.append(
                (f, "a PEFT adapter, not the model's weights: name the file to load it")
            )
        elif variant and (variant["base"] == "model" or variant["base"] in bases):
            left_out.append(
                (
                    f,
                    f"variant {variant['variant']!r} of {variant['base']}: name the file (or its "
                    "index) to load it",
                )
            )
        else:
            kept.append(f)
    shards: dict[tuple[str, int], dict[int, FilePath]] = {}
    for f in kept:
        if m := _SHARD.fullmatch(f.name):
            shards.setdefault((m["stem"], int(m["total"])), {})[int(m["number"])] = f
    if len(shards) > 1:
        sets = ", ".join(f"{s}-*-of-{t:05d}" for s, t in sorted(shards))
        raise SafetensorsFileError(
            directory, f"holds shards of several checkpoints ({sets}) and no index: name one"
        )
    if shards:
        (((shard_stem, total), numbered),) = shards.items()
        missing = [n for n in range(1, total + 1) if n not in numbered]
        if missing or set(numbered) - set(range(1, total + 1)):
            lacking = ", ".join(
                f"{shard_stem}-{n:05d}-of-{total:05d}.safetensors" for n in missing[:3]
            )
            raise SafetensorsFileError(
                directory,
                f"shards of {shard_stem} are not a complete set of {total}"
                + (f": {len(missing)} missing ({lacking})" if missing else "")
                + "; a checkpoint missing a file never loads as a smaller one",
            )
        chosen = [numbered[n] for n in range(1, total + 1)]
        why = f"not a shard of {shard_stem}, which is the checkpoint: name the file to load it"
        left_out += [(f, why) for f in kept if f not in chosen]
        kept = chosen
    if not kept:
        detail = "; ".join(f"{f.name}: {why}" for f, why in left_out)
        raise SafetensorsFileError(
            directory,
            "a directory without a checkpoint: no *.safetensors.index.json, no model.safetensors"
            + (
                f", and every other file is left out ({detail})"
                if detail
                else ", no .safetensors files"
            ),
        )
    left_out.sort(key=lambda item: (str(item[0]), item[1]))
    return Checkpoint(tuple(kept), stem, left_out=tuple(left_out))


def default_prefix(directory: Path, otherwise: str) -> str:
    """The name prefix of a checkpoint directory's tensors: its name, except in a Hugging
    Face cache snapshot (`.../models--ORG--NAME/snapshots/<commit>`), whose name is a
    commit hash: there the repository's `NAME`; elsewhere `otherwise`.

    Example:
        >>> default_prefix(Path("hub/models--org--tiny-llama/snapshots/0123abcd"), "x")
        'tiny-llama'
        >>> default_prefix(Path("checkpoints/step-100"), "step-100")
        'step-100'
    """
    for form in (directory.absolute(), directory.resolve()):
        parent = form.parent
        if parent.name == "snapshots" and "--" in parent.parent.name:
            kind, _, repo = parent.parent.name.partition("--")
            if kind in ("models", "datasets", "spaces") and repo:
                return repo.rsplit("--", 1)[-1]
    return otherwise


def _checkpoint_files(
    directory: Path, unreadable: list[tuple[Path, str]] | None = None
) -> tuple[Path, ...]:
    """The checkpoint files of a directory: its `*.safetensors` regular files, not hidden.

    Hidden files (`._model.safetensors`, the resource forks macOS leaves on other disks;
    a `.name.safetensors` of any tool) are not part of a checkpoint, nor is anything that
    is not a regular file once symlinks are followed (a directory or FIFO so named). A
    dangling symlink is an error: a checkpoint missing a file must not load as a smaller
    one. Where an index says which files count, each that cannot be examined is added
    to `unreadable` with why instead.
    """
    files = []
    for candidate in sorted(directory.glob("*.safetensors")):
        if candidate.name.startswith("."):
            continue
        try:
            info = os.stat(candidate)
        except OSError as e:
            if unreadable is not None:
                unreadable.append((candidate, f"cannot be read: {why_unopenable(candidate, e)}"))
                continue
            raise SafetensorsFileError(
                candidate,
                f"cannot be read as part of the checkpoint: {why_unopenable(candidate, e)}",
            ) from None
        if stat.S_ISREG(info.st_mode):
            files.append(candidate)
    return tuple(files)


def is_index(name: str) -> bool:
    """Whether a file name is a checkpoint index's (`model.safetensors.index.json`, a
    variant's `model.safetensors.index.fp16.json`)."""
    return _INDEX.fullmatch(name) is not None


def from_index(index: FilePath, stem: str, raw: bytes) -> Checkpoint:
    """The checkpoint an index names: its files beside it, each with the tensors it holds.

    Raises:
        SafetensorsFileError: `raw` is not an index (JSON with a `weight_map` of tensor
            names to plain file names), naming the index.
    """
    try:
        weight_map = json.loads(raw, object_pairs_hook=json_object)["weight_map"]
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise SafetensorsFileError(
            index, f"not a checkpoint index (expected JSON with a `weight_map`): {reason}"
        ) from None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise SafetensorsFileError(index, "`weight_map` must map tensor names to file names")
    if isinstance(weight_map, RepeatedKeys) and weight_map.duplicates:
        raise SafetensorsFileError(
            index,
            "listed twice in `weight_map`: each tensor is in one file",
            tensor=weight_map.duplicates[0],
        )
    by_file: dict[str, set[str]] = {}
    for tensor, file in weight_map.items():
        if not file or "\0" in file or file in (".", "..") or Path(file).name != file:
            raise SafetensorsFileError(
                index,
                f"file name {file!r} in `weight_map` is not a file of the index's directory "
                "(a plain name like 'model-00001-of-00002.safetensors')",
                tensor=tensor,
            )
        by_file.setdefault(file, set()).add(tensor)
    if not by_file:
        raise SafetensorsFileError(index, "`weight_map` lists no tensors")
    files = tuple(index.parent / name for name in sorted(by_file))
    expected = tuple(frozenset(by_file[name]) for name in sorted(by_file))
    return Checkpoint(files, stem, index, expected)
