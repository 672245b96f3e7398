"""Where a checkpoint's files are, on this machine or at a URL: the checkpoint chosen, each
file's header read, and its bytes opened for the data.

A local path goes to `checkpoints` (the choice of files) and `sources`/`reopening` (each file
opened for its header, then again for its data, unchanged). A URL (`s3://`, `gs://`,
`hf://`, `https://`) goes to `remote`: a folder is listed (S3, GCS, the Hub; a web server
is asked for the index, then `model.safetensors`) and chosen from by the same rule as a
local folder, an index names the files beside it, and each file is opened once (one
metadata request) and its header read with one small ranged read. Its connections are let
go while the other headers are read, and the same source then reads its data, so every
byte comes from the version whose header was read. No JAX here.

The path is parsed once (`Where.of`): where it is, whether it names a folder, and for a
URL its parts as its scheme's backend reads them; that value flows down to the listing
and to the object's opening, and nothing below parses the path again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..._base.errors import SafetensorsFileError
from ..._base.locations import FilePath, URLPath, is_url, location
from ..format.header import Header, read_header_from
from ..format.sources import ByteSource, open_tensor_file
from ..remote import (
    CachedFile,
    RemoteObject,
    RemoteOptions,
    RemoteReadError,
    RemoteURL,
    open_remote,
    options_of,
    parse_url,
    resolve_options,
)
from ..remote.listing import list_folder
from ..remote.source import Emit
from .checkpoints import (
    INDEX_SUFFIX,
    MAX_INDEX_BYTES,
    Checkpoint,
    choose,
    from_index,
    is_index,
    open_checkpoint,
)
from .reopening import reopen_tensor_file

#: What a web server is asked for, in turn, when a folder at an https:// URL is named (it
#: cannot be listed): the index, then the single file, as transformers asks the Hub.
WEB_FOLDER_FILES = ("model" + INDEX_SUFFIX, "model.safetensors")


@dataclass(frozen=True, slots=True)
class Where:
    """The path a load, a plan or a name list names, parsed once.

    Attributes:
        place: Where it is: a `Path`, or a `URLPath` (shown without its credentials).
        folder: Whether a URL names a folder (ending in `/`, or its last part without
            a `.`): its files are chosen as a local folder's are.
        url: A URL's parts as its scheme's backend reads them (a folder's as a folder's),
            or None for a local path.
    """

    place: FilePath
    folder: bool = False
    url: RemoteURL | None = None

    @classmethod
    def of(cls, path: Any) -> Where:
        """`path` (text, a path or a `URLPath`) parsed.

        Raises:
            TypeError: `path` is neither text, a path nor a `URLPath`.
            RemoteURLError: a URL that cannot be read (unknown scheme, malformed part).
        """
        place = location(path)
        if isinstance(place, Path):
            return cls(place)
        text = str(path) if isinstance(path, str) else place.url
        folder = text.endswith("/") or "." not in place.name
        return cls(place, folder, parse_url(place.url, folder=folder))


class Files:
    """The files of one load, plan or metadata read: the checkpoint chosen, each file opened
    for its header, then handed over for its data.

    Args:
        options: How URLs are read (the policy's `remote:` and the call's `remote=`).
        emit: Where remote sources send their events (`remote_retry`).
        environ: Where credentials and endpoints are read (default: `os.environ`).
    """

    def __init__(
        self,
        options: RemoteOptions | None = None,
        emit: Emit | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.options = options or RemoteOptions()
        self._emit = emit
        self._environ = os.environ if environ is None else environ
        self._remote: dict[FilePath, RemoteObject | CachedFile] = {}
        self._urls: dict[FilePath, RemoteURL] = {}  # the URLs parsed already, by place

    # -- the checkpoint --------------------------------------------------------------

    def checkpoint(self, where: Where) -> Checkpoint:
        """A file, a folder or an index, local or at a URL (see `open_checkpoint`).

        A folder at a URL (`where.folder`) has its files chosen as a local folder's are
        (index, else `model.safetensors`, else one complete set of shards or its plain
        files).

        Raises:
            SafetensorsFileError: as `open_checkpoint`, naming the path or URL.
            RemoteReadError: a URL cannot be read or listed (naming the URL, never a
                credential).
        """
        place = where.place
        if isinstance(place, Path):
            return open_checkpoint(place)
        assert where.url is not None
        if where.folder:
            return self._folder(place, where.url)
        self._urls[place] = where.url
        if is_index(place.name):
            return from_index(place, _stem_of(place.parent), self._small(place))
        return Checkpoint((place,), place.stem)

    def _folder(self, folder: URLPath, url: RemoteURL) -> Checkpoint:
        stem = _stem_of(folder)
        names = list_folder(url, self._environ, self.options)
        if names is None:
            return self._web_folder(folder, stem)
        files = [folder / n for n in names if n.endswith(".safetensors") and not n.startswith(".")]
        indexes = [folder / n for n in names if n.endswith(INDEX_SUFFIX)]
        if not files and not indexes:
            raise SafetensorsFileError(
                folder,
                "a folder without a checkpoint: no *.safetensors.index.json, no "
                f"model.safetensors, no .safetensors files ({len(names)} other files)",
            )
        return choose(folder, stem, lambda _unreadable: files, indexes, self._small)

    def _web_folder(self, folder: URLPath, stem: str) -> Checkpoint:
        for name in WEB_FOLDER_FILES:
            try:
                if name.endswith(".json"):
                    index = folder / name
                    return from_index(index, stem, self._small(index))
                source = self._open(folder / name)
            except RemoteReadError as e:
                if e.status == 404:
                    continue
                raise
            self._remote[folder / name] = source
            return Checkpoint((folder / name,), stem)
        raise SafetensorsFileError(
            folder,
            f"a web server's folder cannot be listed, and it has neither {WEB_FOLDER_FILES[0]} "
            f"nor {WEB_FOLDER_FILES[1]}: name the file or the index",
        )

    def _small(self, file: FilePath) -> bytes:
        """A small file at a URL read whole (an index), never through the cache."""
        assert isinstance(file, URLPath)
        source = open_remote(
            self._url(file), environ=self._environ,
            options=replace(self.options, cache_dir=None), emit=self._emit,
        )  # fmt: skip
        try:
            if source.size > MAX_INDEX_BYTES:
                raise SafetensorsFileError(
                    file, f"{source.size} bytes: larger than an index may be ({MAX_INDEX_BYTES})"
                )
            raw = bytearray(source.size)
            source.read_into(0, memoryview(raw))
            return bytes(raw)
        finally:
            source.close()

    # -- each file ---------------------------------------------------------------------

    def _url(self, file: FilePath) -> RemoteURL | str:
        """The parsed URL of `file` where it was parsed already (the path the call named),
        else its text: a file a folder or an index names is parsed as it is opened."""
        assert isinstance(file, URLPath)
        return self._urls.pop(file, None) or file.url

    def _open(self, file: URLPath) -> RemoteObject | CachedFile:
        # The options are final here: the environment was weighed with the policy's layers.
        return open_remote(self._url(file), environ=self._environ, options=self.options,
                           emit=self._emit)  # fmt: skip

    def header(self, file: FilePath) -> Header:
        """Read `file`'s header (a URL: opened, the header fetched with one small read)."""
        if isinstance(file, Path):
            with open_tensor_file(file) as f:
                return read_header_from(f, file)
        source = self._remote.get(file)
        if source is None:
            source = self._remote[file] = self._open(file)
        header = read_header_from(source, file)
        if isinstance(source, RemoteObject):
            source.release()
        return header

    def maps(self, file: FilePath) -> bool:
        """Whether `file`'s tensors can be mapped (see `can_map`)."""
        return can_map(file, self.options)

    def data(self, header: Header) -> ByteSource:
        """A source of the data of the file `header` came from, the caller's to close: a
        local file opened again (the same file, unchanged), or the remote source its
        header was read from."""
        if isinstance(header.path, Path):
            return reopen_tensor_file(header)
        return self._remote.pop(header.path)

    def close(self) -> None:
        """Close every remote source not handed over."""
        sources, self._remote = self._remote, {}
        for source in sources.values():
            source.close()

    def __enter__(self) -> Files:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def fetched(source: ByteSource) -> dict[str, Any]:
    """What reading `source` cost, as event fields (`requests`, `retries`, `bytes_fetched`,
    `fetch_seconds`; with a cache, `cached`); empty for a local file."""
    if isinstance(source, RemoteObject):
        return source.counters.as_fields()
    if isinstance(source, CachedFile):
        return {**source.counters.as_fields(), "cached": str(source.path)}
    return {}


def can_map(file: FilePath, options: RemoteOptions) -> bool:
    """Whether `file`'s tensors can be mapped: a local file, or one at a URL read through
    the cache (the cached file is mapped); otherwise every tensor is read."""
    return isinstance(file, Path) or options.cache_dir is not None


def _stem_of(folder: URLPath) -> str:
    """The name prefix of a folder's tensors: its name (a Hub repository's top: the
    repository's name, without `@revision`)."""
    name = folder.name
    return name.split("@", 1)[0] if folder.scheme == "hf" else name


def read_metadata(
    path: str | os.PathLike[str], *, remote: Mapping[str, object] | None = None
) -> dict[str, str]:
    """A safetensors file's `__metadata__` (`{}` when it has none), reading its header only.

    `path` may be a URL (`s3://`, `gs://`, `hf://`, `https://`): then one metadata request
    and one small ranged read. `remote` sets how URLs are read for this call, as a policy's
    `remote:` does (defaults < `DEVPOLICY_REMOTE_*` < `remote`). For every file of a
    checkpoint at once, see `Plan.metadata`.

    Raises:
        SafetensorsFileError: the file is missing, not a regular file, or malformed.
        RemoteReadError: a URL cannot be read (naming it, never a credential).

    Example:
        >>> import devpolicy, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
        >>> devpolicy.save_file({"w": np.zeros(2)}, path, metadata={"format": "pt"})
        >>> devpolicy.read_metadata(path)
        {'format': 'pt'}
    """
    file = location(path)
    if isinstance(file, Path):
        with open_tensor_file(file) as f:
            return dict(read_header_from(f, file).metadata or {})
    options = options_of({}, remote, base=resolve_options())
    with Files(replace(options, cache_dir=None)) as files:
        return dict(files.header(file).metadata or {})


__all__ = ["Files", "Where", "can_map", "fetched", "is_url", "read_metadata"]
