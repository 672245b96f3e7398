"""Files that are not safetensors (`_io/format/foreign`): `load_file`, `plan` and `read_metadata`
name a NumPy `.npy` or `.npz`, a PyTorch checkpoint or a pickle as what it is, with what to
do, instead of a header error."""

from __future__ import annotations

import pickle
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import devpolicy


def _torch_zip(path: Path) -> Path:
    """A file laid out as `torch.save` writes one (PyTorch 1.6 on): a zip whose members
    sit under one folder, the pickled object in `data.pkl`, tensors' bytes in `data/N`."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"w": 0}, protocol=2))
        archive.writestr("archive/.format_version", "1")
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/data/0", np.zeros(4, np.float32).tobytes())
        archive.writestr("archive/version", "3\n")
    return path


def _legacy_torch(path: Path) -> Path:
    """`torch.save` before PyTorch 1.6: pickles, the first of them its magic number."""
    path.write_bytes(
        pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + pickle.dumps(1001, protocol=2)
    )
    return path


def _npy(path: Path) -> Path:
    np.save(path, np.zeros((2, 3), np.float32))
    return path


def _npz(path: Path) -> Path:
    with path.open("wb") as f:
        np.savez(f, embed=np.zeros(2), head=np.ones(3), bias=np.ones(1), step=np.int32(3))
    return path


def _pickle(path: Path) -> Path:
    path.write_bytes(pickle.dumps({"w": [1.0, 2.0]}, protocol=4))
    return path


def _zip(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/config.json", "{}")
    return path


def _gguf(path: Path) -> Path:
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))
    return path


def _hdf5(path: Path) -> Path:
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(64))
    return path


CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    (
        "w.npy",
        _npy,
        r"is a NumPy \.npy file \(one array\), not a safetensors file; read it with "
        r"numpy\.load\(path\) and write it with devpolicy\.save_file\(\{'name': array\}, "
        r"'out\.safetensors'\)",
    ),
    (
        "w.npz",
        _npz,
        r"is a NumPy \.npz archive of 4 arrays \(embed, head, bias and 1 more\), not a "
        r"safetensors file; convert it with devpolicy\.save_file\(dict\(numpy\.load\(path\)\), "
        r"'out\.safetensors'\)",
    ),
    (
        "pytorch_model.bin",
        _torch_zip,
        r"is a PyTorch checkpoint \(torch\.save's zip format\), not a safetensors file; convert "
        r"it once: `safetensors\.torch\.save_file\(torch\.load\(path, weights_only=True\), "
        r"'model\.safetensors'\)` for a state dict of tensors",
    ),
    (
        "old.pt",
        _legacy_torch,
        r"is a PyTorch checkpoint in torch\.save's legacy \(pickle\) format, not a safetensors "
        r"file; convert it once",
    ),
    (
        "w.pkl",
        _pickle,
        r"is a Python pickle \(protocol 4\), not a safetensors file; devpolicy never unpickles "
        r"\(loading a pickle runs whatever code it holds\)",
    ),
    (
        "model.zip",
        _zip,
        r"is a zip archive \(members: model/config\.json\), not a safetensors file; unpack it",
    ),
    ("m.gguf", _gguf, r"is a GGUF file \(llama\.cpp's format\), not a safetensors file"),
    ("m.h5", _hdf5, r"is an HDF5 file \(Keras \.h5 weights, say\), not a safetensors file"),
]


@pytest.mark.parametrize(("name", "make", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_foreign_file_is_named_as_what_it_is(
    tmp_path: Path, name: str, make: Callable[[Path], Path], message: str
) -> None:
    """load_file, plan and read_metadata each say what the file is and what to do."""
    path = make(tmp_path / name)
    policy = devpolicy.load_policy({"version": 1})
    for call in (
        lambda: policy.load_file(path),
        lambda: policy.plan(path),
        lambda: devpolicy.read_metadata(path),
    ):
        with pytest.raises(devpolicy.SafetensorsFileError) as caught:
            call()
        assert re.match(f"^{re.escape(str(path))}: {message}", str(caught.value))
        assert caught.value.tensor is None


def test_a_broken_safetensors_file_keeps_its_own_error(tmp_path: Path) -> None:
    """A header length that reads as a pickle's first bytes (640 = 0x280) followed by a
    JSON object is a safetensors file: its fault is reported, not guessed at."""
    path = tmp_path / "bad.safetensors"
    header = b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}'
    path.write_bytes((640).to_bytes(8, "little") + header.ljust(640) + bytes(4))
    assert path.read_bytes()[:2] == b"\x80\x02"
    with pytest.raises(
        devpolicy.SafetensorsFileError, match=r": tensor 'w': shape \[2\] of F32 needs 8 bytes"
    ):
        devpolicy.read_metadata(path)


def test_a_truncated_file_of_unknown_kind_keeps_the_header_error(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"\xff" * 20)
    with pytest.raises(
        devpolicy.SafetensorsFileError,
        match=r"header length \d+ is larger than the rest of the file \(12 bytes\): truncated, "
        r"or not a safetensors file$",
    ):
        devpolicy.read_metadata(path)
