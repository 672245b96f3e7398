"""Files that are not safetensors, named as what they are: a NumPy `.npy` or `.npz`, a
PyTorch checkpoint (`torch.save`'s zip, or its older pickle), any other pickle or zip, a
GGUF or HDF5 file; each with what to do instead.

Asked only once a header has failed to read (`format.read_header_from`), from the file's
first bytes and, for a zip, the names of its members (its central directory, at the end):
a safetensors file never pays for it. Nothing is unpickled or decompressed. No JAX here.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable

from .sources import ByteSource

#: The first bytes read to tell a file's kind.
_SNIFF = 16
#: How many member names a message shows.
_SHOWN = 3
# `torch.save`'s legacy format (before PyTorch 1.6) starts with a pickle (protocol 2) of
# its magic number 0x1950a86a20f9469cfc6c as a LONG1: 10 bytes, little-endian.
_LEGACY_TORCH = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
_TO_SAFETENSORS = (
    "convert it once: `safetensors.torch.save_file(torch.load(path, weights_only=True), "
    "'model.safetensors')` for a state dict of tensors (`safetensors.torch.save_model` for "
    "a model whose tensors share memory), then load that"
)


def what_it_is(source: ByteSource) -> str | None:
    """What a file that is not safetensors is, and what to do with it, as the problem of
    a `SafetensorsFileError`; None when it is none of the kinds known here.

    Example:
        >>> import numpy as np, tempfile, os
        >>> from devpolicy._io.format.sources import open_tensor_file
        >>> path = os.path.join(tempfile.mkdtemp(), "w.npy")
        >>> np.save(path, np.zeros(3))
        >>> with open_tensor_file(path) as f:
        ...     print(what_it_is(f).split(";")[0])
        is a NumPy .npy file (one array), not a safetensors file
    """
    try:
        head = bytearray(min(_SNIFF, source.size))
        source.read_into(0, memoryview(head))
    except OSError:
        return None  # the read that failed first is the error to report
    if head[8:9] == b"{":
        # A safetensors header starts there: whatever is wrong, it is one of ours.
        return None
    for magic, describe in _KINDS:
        if head.startswith(magic):
            return describe(source)
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        if head.startswith(_LEGACY_TORCH):
            return (
                "is a PyTorch checkpoint in torch.save's legacy (pickle) format, not a "
                f"safetensors file; {_TO_SAFETENSORS}"
            )
        return (
            f"is a Python pickle (protocol {head[1]}), not a safetensors file; devpolicy "
            "never unpickles (loading a pickle runs whatever code it holds): load it with the "
            "library that wrote it, only if you trust where it came from, and write its "
            "arrays with devpolicy.save_file"
        )
    return None


def _npy(source: ByteSource) -> str:
    return (
        "is a NumPy .npy file (one array), not a safetensors file; read it with "
        "numpy.load(path) and write it with devpolicy.save_file({'name': array}, "
        "'out.safetensors')"
    )


def _zip(source: ByteSource) -> str:
    try:
        with zipfile.ZipFile(_Reader(source)) as archive:
            members = archive.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        members = []
    if any(m == "data.pkl" or m.endswith("/data.pkl") for m in members):
        return (
            "is a PyTorch checkpoint (torch.save's zip format), not a safetensors file; "
            + _TO_SAFETENSORS
        )
    if members and all(m.endswith(".npy") for m in members):
        arrays = [m.removesuffix(".npy") for m in members]
        return (
            f"is a NumPy .npz archive of {len(arrays)} array{'' if len(arrays) == 1 else 's'} "
            f"({_listed(arrays)}), not a safetensors file; convert it with "
            "devpolicy.save_file(dict(numpy.load(path)), 'out.safetensors')"
        )
    held = f" (members: {_listed(members)})" if members else ""
    return (
        f"is a zip archive{held}, not a safetensors file; unpack it and load the "
        ".safetensors files it holds, if any"
    )


def _gguf(source: ByteSource) -> str:
    return (
        "is a GGUF file (llama.cpp's format), not a safetensors file; read its tensors with "
        "the gguf package (gguf.GGUFReader) and write them with devpolicy.save_file"
    )


def _hdf5(source: ByteSource) -> str:
    return (
        "is an HDF5 file (Keras .h5 weights, say), not a safetensors file; read its arrays "
        "with h5py and write them with devpolicy.save_file"
    )


_KINDS: tuple[tuple[bytes, Callable[[ByteSource], str]], ...] = (
    (b"\x93NUMPY", _npy),
    (b"PK\x03\x04", _zip),
    (b"PK\x05\x06", _zip),  # an empty zip
    (b"GGUF", _gguf),
    (b"\x89HDF\r\n\x1a\n", _hdf5),
)


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown if len(names) <= _SHOWN else f"{shown} and {len(names) - _SHOWN} more"


class _Reader(io.RawIOBase):
    """A source as the seekable binary file `zipfile` reads: only the ranges it asks for
    (the end-of-archive record and the member list), never the members' data."""

    def __init__(self, source: ByteSource) -> None:
        super().__init__()
        self._source = source
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._source.size}
        self._position = max(0, base[whence] + offset)
        return self._position

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        count = max(0, min(len(buffer), self._source.size - self._position))
        if count:
            self._source.read_into(self._position, memoryview(buffer)[:count])
            self._position += count
        return count
