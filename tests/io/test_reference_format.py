"""devpolicy's safetensors reader and writer against the reference package, on the same bytes.

Cases ported from the safetensors project's own tests (its Rust `tensor.rs` tests and its
Python `test_simple.py`), the format's edge cases, and seeded header mutants: for each,
both accept or both refuse, and where both accept they agree on names, dtypes, shapes and
bytes. Where devpolicy refuses what the reference accepts, the reason is JAX's and is
pinned here as such.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
import pytest
import safetensors
import structlog

import devpolicy
from devpolicy._io.format.header import (
    DTYPES,
    UNHOLDABLE,
    TensorEntry,
    as_array,
    pack,
    read_header,
)
from tests.helpers import policy_of

E = "Error while deserializing"


def framed(header: bytes | str, data: bytes = b"") -> bytes:
    """A file's bytes: the 8-byte little-endian header length, the header, the data."""
    raw = header.encode() if isinstance(header, str) else header
    return len(raw).to_bytes(8, "little") + raw + data


def entry(dtype: str, shape: list[int], offsets: list[int], **extra: Any) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets, **extra}


def reference_read(raw: bytes) -> dict[str, tuple[str, list[int], bytes]] | str:
    """What the reference reader makes of a file: each tensor, or its error message."""
    try:
        return {
            k: (v["dtype"], v["shape"], bytes(v["data"]))
            for k, v in safetensors.deserialize(raw)  # type: ignore[no-untyped-call]
        }
    except Exception as e:  # SafetensorError, not importable by one name across versions
        return str(e)


def our_read(tmp_path: Path, raw: bytes) -> dict[str, tuple[str, list[int], bytes]] | str:
    """What devpolicy's reader makes of the same bytes, in the same form."""
    path = tmp_path / "case.safetensors"
    path.write_bytes(raw)
    try:
        header = read_header(path)
    except devpolicy.SafetensorsFileError as e:
        return str(e)
    return {
        t.key: (t.dtype_name, list(t.shape), raw[t.offset : t.offset + t.nbytes])
        for t in header.tensors
    }


def assert_agree(tmp_path: Path, raw: bytes) -> bool:
    """Assert both readers accept `raw` alike or both refuse it; whether they accept."""
    ours, theirs = our_read(tmp_path, raw), reference_read(raw)
    if isinstance(theirs, str) or isinstance(ours, str):
        judged = f"devpolicy: {ours!r}\nreference: {theirs!r}"
        assert isinstance(ours, str), judged
        assert isinstance(theirs, str), judged
        return False
    assert ours == theirs
    return True


# Every dtype, in values each holds exactly (and 64-bit ones within 32 bits, as loading
# with x64 off narrows them only when exact).
def values_of(name: str) -> np.ndarray[Any, Any]:
    base = np.array([0.0, 1.0, -2.0, 0.5, 3.0, -0.5, 4.0, 6.0], np.float32).reshape(2, 4)
    if name == "BOOL":
        return base > 0
    if name.startswith("U") or name == "F8_E8M0":
        return np.abs(base).astype(np.float32).round().astype(DTYPES[name])
    if name.startswith("I"):
        return base.round().astype(DTYPES[name])
    return base.astype(DTYPES[name])


def file_bytes(name: str, array: np.ndarray[Any, Any]) -> bytes:
    return pack(array).tobytes() if name == "F4" else array.tobytes()


NARROWED = {"I64": np.int32, "U64": np.uint32, "F64": np.float32}
#: The reference's dtype names for its Python serializer.
TORCH_NAMES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "U32": "uint32",
    "I32": "int32",
    "U64": "uint64",
    "I64": "int64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F4": "float4_e2m1fn_x2",
    "C64": "complex64",
}


def reference_write(name: str, array: np.ndarray[Any, Any], metadata: Any = None) -> bytes:
    data = np.frombuffer(file_bytes(name, array), np.uint8).copy()
    shape = list(array.shape)
    if name == "F4":
        shape[-1] //= 2  # the reference takes F4's storage shape, two values a byte
    spec = safetensors.TensorSpec(
        dtype=TORCH_NAMES[name], shape=shape, data_ptr=data.ctypes.data, data_len=data.nbytes
    )
    out: bytes = safetensors.serialize({"t": spec}, metadata=metadata)
    del data
    return out


class TestDtypes:
    def test_every_dtype_the_reference_knows_is_held_or_refused_by_name(self) -> None:
        """The reference's own list of dtypes: each one devpolicy holds or names why not."""
        message = reference_read(framed(json.dumps({"t": entry("Q9", [0], [0, 0])})))
        assert isinstance(message, str)
        names = set(re.findall(r"`(\w+)`", message.split("expected one of", 1)[1]))
        assert len(names) >= 20
        assert names <= set(DTYPES) | set(UNHOLDABLE)
        assert set(DTYPES) <= names

    @pytest.mark.parametrize("name", sorted(TORCH_NAMES))
    def test_devpolicy_loads_what_the_reference_writes(self, tmp_path: Path, name: str) -> None:
        """Every dtype, written by the reference, loads with the same values and dtype."""
        array = values_of(name)
        path = tmp_path / "ref.safetensors"
        path.write_bytes(reference_write(name, array))
        loaded = devpolicy.load_file(path, policy=policy_of())["t"]
        if name in NARROWED and not jax.config.jax_enable_x64:  # type: ignore[attr-defined]
            assert loaded.dtype == NARROWED[name]  # exactly, as x64 off narrows 64-bit data
            np.testing.assert_array_equal(np.asarray(loaded), array)
        else:
            assert loaded.dtype == DTYPES[name]
            assert np.asarray(loaded).tobytes() == array.tobytes()
        assert loaded.shape == (2, 4)

    @pytest.mark.parametrize("name", sorted(TORCH_NAMES))
    def test_the_reference_reads_what_devpolicy_writes(self, tmp_path: Path, name: str) -> None:
        """Every dtype, written by `save_file`, reads back in the reference byte for byte."""
        array = values_of(name)
        path = tmp_path / "ours.safetensors"
        devpolicy.save_file({"t": array}, path)
        theirs = reference_read(path.read_bytes())
        assert theirs == {"t": (name, [2, 4], file_bytes(name, array))}
        assert path.read_bytes() == _realigned(reference_write(name, array), path)

    def test_f4_is_two_values_a_byte_first_in_the_low_bits(self, tmp_path: Path) -> None:
        """F4 unpacks as MX-FP4 is packed: element 0 in bits 0-3, element 1 in bits 4-7."""
        path = tmp_path / "f4.safetensors"
        path.write_bytes(framed(json.dumps({"t": entry("F4", [4], [0, 2])}), b"\x21\xc6"))
        assert reference_read(path.read_bytes()) == {"t": ("F4", [4], b"\x21\xc6")}
        loaded = devpolicy.load_file(path, policy=policy_of())["t"]
        assert np.asarray(loaded).astype(np.float32).tolist() == [0.5, 1.0, 4.0, -2.0]
        planned = devpolicy.plan(path, policy=policy_of()).tensors[0]
        assert (planned.nbytes, planned.decision.nbytes) == (4, 4)  # type: ignore[union-attr]
        assert loaded.nbytes == 4  # one value a byte in memory, as planned
        with structlog.testing.capture_logs() as logs:
            devpolicy.load_file(path, policy=policy_of(), mmap=True)
        (refused,) = [e for e in logs if e["event"] == "mmap_refused"]
        assert refused["reason"] == (
            "1 F4 tensor unpacked from two values a byte to one (first: 't'); JAX holds F4 "
            "one value a byte"
        )

    def test_f4_with_an_odd_count_is_refused_by_both(self, tmp_path: Path) -> None:
        """Three F4 values do not fill whole bytes: no file can hold them."""
        raw = framed(json.dumps({"t": entry("F4", [3], [0, 2])}), b"\0\0")
        assert_agree(tmp_path, raw)
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=r"tensor 't': shape \[3\] of F4 is 3 values of 4 bits: not a whole number",
        ):
            read_header(_written(tmp_path, raw))
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=r"tensor 'odd': 3 values of F4 \(4 bits each\) do not fill whole bytes",
        ):
            devpolicy.save_file(
                {"odd": np.zeros(3, ml_dtypes.float4_e2m1fn)}, tmp_path / "odd.safetensors"
            )
        assert not (tmp_path / "odd.safetensors").exists()

    @pytest.mark.parametrize("name", ["F6_E2M3", "F6_E3M2"])
    def test_six_bit_floats_are_refused_saying_jax_cannot_hold_them(
        self, tmp_path: Path, name: str
    ) -> None:
        """The reference reads F6 (four values in three bytes); JAX has no type for it."""
        raw = framed(json.dumps({"t": entry(name, [4], [0, 3])}), b"\1\2\3")
        assert reference_read(raw) == {"t": (name, [4], b"\1\2\3")}
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=rf"case\.safetensors: tensor 't': {name}: a 6-bit float JAX cannot hold$",
        ):
            read_header(_written(tmp_path, raw))
        with pytest.raises(
            ValueError, match=r"^save_file\(\): 't': dtype float6_e2m3fn cannot be stored"
        ):
            devpolicy.save_file(
                {"t": np.zeros(4, ml_dtypes.float6_e2m3fn)}, tmp_path / "f6.safetensors"
            )


def _written(tmp_path: Path, raw: bytes) -> Path:
    path = tmp_path / "case.safetensors"
    path.write_bytes(raw)
    return path


def _realigned(reference: bytes, ours: Path) -> bytes:
    """The reference's file laid out as devpolicy lays it out: same header JSON and data,
    the header padded to devpolicy's 64-byte alignment (the reference pads to 8)."""
    length = int.from_bytes(reference[:8], "little")
    header, data = reference[8 : 8 + length].rstrip(b" "), reference[8 + length :]
    ours_length = int.from_bytes(ours.read_bytes()[:8], "little")
    return framed(header + b" " * (ours_length - len(header)), data)


I32_2x2 = b'{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}'
U8 = entry("U8", [1], [0, 1])

#: (id, file bytes). Those from the reference's own tests keep their names there.
CASES: list[tuple[str, bytes]] = [
    # safetensors/src/tensor.rs
    ("test_deserialization", framed(I32_2x2, b"\0" * 16)),
    (
        "test_zero_sized_tensor",
        framed(b'{"test":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}', b"\0" * 4),
    ),
    ("test_polyglot", framed(I32_2x2, b"\0" * 16 + b"extra_bogus_data_for_polyglot_file")),
    ("test_missing_data", framed(I32_2x2, b"\0" * 14)),
    (
        "test_header_too_large",
        b"<\x00\x00\x00\x00\xff\xff\xff" + I32_2x2 + b"\0" * 16,
    ),
    ("test_header_too_small", b""),
    ("test_invalid_header_length", b"<\x00\x00\x00\x00\x00\x00\x00"),
    ("test_invalid_header_non_utf8", b"\x01\x00\x00\x00\x00\x00\x00\x00\xff"),
    ("test_invalid_header_not_json", b"\x01\x00\x00\x00\x00\x00\x00\x00{"),
    ("test_whitespace_padded_header", b"\x06\x00\x00\x00\x00\x00\x00\x00{}\x0d\x20\x09\x0a"),
    ("test_whitespace_start_padded_header", b"\x06\x00\x00\x00\x00\x00\x00\x00\x09\x0a{}\x0d\x20"),
    (
        "test_zero_sized_tensor_shape_2_0",
        framed(b'{"test":{"dtype":"I32","shape":[2,0],"data_offsets":[0, 0]}}'),
    ),
    (
        "test_invalid_info",
        framed(b'{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0, 4]}}', b"\0" * 4),
    ),
    (
        "test_validation_overflow",
        framed(
            b'{"test":{"dtype":"I32","shape":[2,18446744073709551614],"data_offsets":[0,16]}}',
            b"\0" * 16,
        ),
    ),
    (
        "test_validation_overflow_bits",
        framed(
            b'{"test":{"dtype":"I32","shape":[2,9223372036854775807],"data_offsets":[0,16]}}',
            b"\0" * 16,
        ),
    ),
    # bindings/python/tests/test_simple.py
    (
        "test_deserialization_metadata",
        framed(
            b'{"__metadata__":{"framework":"pt"},"test1":{"dtype":"I32","shape":[2,2],'
            b'"data_offsets":[0,16]}}       ',
            b"\0" * 16,
        ),
    ),
    # the differences issue 17 lists, each now agreed on
    ("extra_field", framed(json.dumps({"t": entry("U8", [1], [0, 1], extra="x")}), b"\1")),
    (
        "extra_fields_nested_and_repeated",
        framed(
            '{"t":{"dtype":"U8","x":[1,{"y":null}],"x":2.5,"shape":[1],"data_offsets":[0,1]}}',
            b"\1",
        ),
    ),
    ("tensor_twice_identical", framed(f'{{"t":{json.dumps(U8)},"t":{json.dumps(U8)}}}', b"\1")),
    (
        "tensor_twice_the_last_consistent",
        framed(
            '{{"t":{},"t":{}}}'.format(
                json.dumps(entry("U8", [2], [0, 2])), json.dumps(entry("U16", [1], [0, 2]))
            ),
            b"\1\2",
        ),
    ),
    (
        "tensor_twice_the_last_leaving_a_hole",
        framed(
            '{{"t":{},"t":{}}}'.format(json.dumps(entry("U8", [2], [0, 2])), json.dumps(U8)),
            b"\1\2",
        ),
    ),
    (
        "tensor_twice_the_first_malformed",
        framed(
            '{{"t":{},"t":{}}}'.format(json.dumps(entry("Q8", [1], [0, 1])), json.dumps(U8)), b"\1"
        ),
    ),
    (
        "tensor_twice_around_another",
        framed(
            '{{"t":{},"u":{},"t":{}}}'.format(
                json.dumps(U8), json.dumps(entry("U8", [1], [1, 2])), json.dumps(U8)
            ),
            b"\1\2",
        ),
    ),
    (
        "field_twice",
        framed('{"t":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1"),
    ),
    ("metadata_twice", framed('{"__metadata__":{"a":"1"},"__metadata__":{"b":"2"}}')),
    ("metadata_key_twice", framed('{"__metadata__":{"a":"1","a":"2"}}')),
    ("metadata_null", framed('{"__metadata__":null}')),
    ("metadata_empty", framed('{"__metadata__":{}}')),
    ("metadata_a_list", framed('{"__metadata__":[]}')),
    ("metadata_a_number_value", framed('{"__metadata__":{"a":1}}')),
    # numpy 1 holds at most 32 dimensions: there devpolicy refuses these, saying so
    # (`TestHeaders::test_more_dimensions_than_numpy_holds_are_refused_saying_so`).
    *(
        [
            ("33_dimensions", framed(json.dumps({"t": entry("U8", [1] * 33, [0, 1])}), b"\1")),
            ("64_dimensions", framed(json.dumps({"t": entry("U8", [1] * 64, [0, 1])}), b"\1")),
        ]
        if int(np.__version__.split(".")[0]) >= 2
        else []
    ),
    ("empty_with_a_dimension_of_2_62", framed(json.dumps({"t": entry("U8", [2**62, 0], [0, 0])}))),
    (
        "empty_with_a_dimension_of_2_63_less_1",
        framed(json.dumps({"t": entry("U8", [0, 2**63 - 1], [0, 0])})),
    ),
    (
        "empty_overflowing_before_its_zero",
        framed(json.dumps({"t": entry("U8", [2**63, 2, 0], [0, 0])})),
    ),
    ("a_dimension_of_2_64", framed(json.dumps({"t": entry("U8", [2**64, 0], [0, 0])}))),
    ("bits_overflow", framed(json.dumps({"t": entry("F64", [2**61, 1], [0, 0])}))),
    ("lone_surrogate_in_a_name", framed(f'{{"\\ud800":{json.dumps(U8)}}}', b"\1")),
    ("lone_surrogate_in_metadata", framed('{"__metadata__":{"a":"\\udc00"}}')),
    (
        "lone_surrogate_in_an_extra_field",
        framed('{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":"\\ud800"}}', b"\1"),
    ),
    ("surrogate_pair_in_a_name", framed(f'{{"\\ud83d\\ude00":{json.dumps(U8)}}}', b"\1")),
    ("negative_zero_in_shape", framed('{"t":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}}')),
    (
        "negative_zero_in_data_offsets",
        framed('{"t":{"dtype":"U8","shape":[0],"data_offsets":[-0,0]}}'),
    ),
    (
        "negative_zero_in_an_extra_field",
        framed('{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":-0}}', b"\1"),
    ),
    ("negative_zero_in_a_name", framed(f'{{"a-0":{json.dumps(U8)}}}', b"\1")),
    # JSON the two parsers could read differently
    ("float_in_shape", framed('{"t":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}', b"\1")),
    ("exponent_in_shape", framed('{"t":{"dtype":"U8","shape":[1e0],"data_offsets":[0,1]}}', b"\1")),
    ("boolean_in_shape", framed('{"t":{"dtype":"U8","shape":[true],"data_offsets":[0,1]}}', b"\1")),
    ("null_shape", framed('{"t":{"dtype":"U8","shape":null,"data_offsets":[0,1]}}', b"\1")),
    ("leading_zero", framed('{"t":{"dtype":"U8","shape":[01],"data_offsets":[0,1]}}', b"\1")),
    ("three_offsets", framed('{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}', b"\1")),
    (
        "nan_in_an_extra_field",
        framed('{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":NaN}}', b"\1"),
    ),
    (
        "infinity_in_an_extra_field",
        framed('{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":-Infinity}}', b"\1"),
    ),
    (
        "1e999_in_an_extra_field",
        framed('{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1e999}}', b"\1"),
    ),
    (
        "huge_integer_in_an_extra_field",
        framed(
            '{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":123456789012345678901234567890}}',
            b"\1",
        ),
    ),
    (
        "extra_field_nested_125_deep",
        framed(
            '{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":'
            + "[" * 125
            + "]" * 125
            + "}}",
            b"\1",
        ),
    ),
    (
        "extra_field_nested_126_deep",
        framed(
            '{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":'
            + "[" * 126
            + "]" * 126
            + "}}",
            b"\1",
        ),
    ),
    ("lowercase_dtype", framed('{"t":{"dtype":"u8","shape":[1],"data_offsets":[0,1]}}', b"\1")),
    ("unknown_dtype", framed('{"t":{"dtype":"Q8","shape":[1],"data_offsets":[0,1]}}', b"\1")),
    ("top_level_list", framed("[]")),
    ("empty_header", framed("{}")),
    ("byte_order_mark", framed("\ufeff{}")),
    ("trailing_characters", framed("{} x")),
    ("control_character_in_a_name", framed(f'{{"t\x01":{json.dumps(U8)}}}', b"\1")),
    ("empty_name", framed(f'{{"":{json.dumps(U8)}}}', b"\1")),
    (
        "escaped_name_equal_to_another",
        framed(f'{{"t":{json.dumps(U8)},"\\u0074":{json.dumps(U8)}}}', b"\1"),
    ),
    (
        "hole_between_tensors",
        framed(json.dumps({"a": U8, "b": entry("U8", [1], [2, 3])}), b"\1\2\3"),
    ),
    (
        "overlapping_tensors",
        framed(
            json.dumps({"a": entry("U8", [2], [0, 2]), "b": entry("U8", [2], [1, 3])}), b"\1\2\3"
        ),
    ),
    ("out_of_order_offsets", framed(json.dumps({"b": entry("U8", [1], [1, 2]), "a": U8}), b"\1\2")),
    ("end_before_begin", framed(json.dumps({"t": entry("U8", [0], [1, 0])}), b"\1")),
]


class TestHeaders:
    @pytest.mark.parametrize(("raw"), [raw for _, raw in CASES], ids=[name for name, _ in CASES])
    def test_devpolicy_and_the_reference_agree(self, tmp_path: Path, raw: bytes) -> None:
        """Both accept or both refuse; where both accept, the same tensors and bytes."""
        assert_agree(tmp_path, raw)

    @pytest.mark.slow
    def test_seeded_header_mutants_are_judged_alike(self, tmp_path: Path) -> None:
        """Headers with one token changed, dropped or repeated: both accept or refuse."""
        good = json.dumps(
            {
                "__metadata__": {"format": "pt"},
                "a": entry("F16", [2, 2], [0, 8]),
                "b": entry("F4", [2], [8, 9]),
                "c": entry("I32", [], [9, 13]),
            }
        )
        tokens = re.findall(r'"[^"]*"|-?\d+|[{}\[\],:]| ', good)
        swaps = [
            '"F4"',
            '"F6_E2M3"',
            "-0",
            "0",
            "1",
            "2",
            "8",
            "13",
            "18446744073709551616",
            '"x"',
            "[]",
            "{}",
            "null",
            "1.5",
            ",",
            '"\\ud800"',
            '"__metadata__"',
        ]
        rng = random.Random(17)
        data = bytes(range(13))
        accepted = 0
        for _ in range(400):
            mutant = list(tokens)
            i = rng.randrange(len(mutant))
            how = rng.randrange(3)
            if how == 0:
                mutant[i] = rng.choice(swaps)
            elif how == 1:
                del mutant[i]
            else:
                mutant.insert(i, mutant[i])
            accepted += assert_agree(tmp_path, framed("".join(mutant), data))
        assert 40 < accepted < 360  # both sides of the line are exercised

    def test_a_lone_surrogate_names_file_and_tensor(self, tmp_path: Path) -> None:
        """A name UTF-8 cannot encode is refused, the name shown escaped."""
        path = _written(tmp_path, framed(f'{{"ok\\ud800":{json.dumps(U8)}}}', b"\1"))
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=r"case\.safetensors: tensor 'ok\\ud800': header holds a lone UTF-16 surrogate",
        ):
            read_header(path)

    @pytest.mark.parametrize("field", ["shape", "data_offsets"])
    def test_negative_zero_is_refused_naming_the_tensor(self, tmp_path: Path, field: str) -> None:
        """`-0` is no size: the reference reads it as a float."""
        text = json.dumps({"t": entry("U8", [0], [0, 0])}).replace(
            "[0", "[-0", 1 if field == "shape" else 2
        )
        if field == "data_offsets":
            text = text.replace("[-0]", "[0]")
        with pytest.raises(
            devpolicy.SafetensorsFileError, match=rf"tensor 't': {field} must be .*, got \[-0"
        ):
            read_header(_written(tmp_path, framed(text)))

    def test_a_tensor_given_twice_is_its_last_entry(self, tmp_path: Path) -> None:
        """As the reference: the last of a repeated key's entries is the tensor."""
        raw = framed(
            '{{"t":{},"t":{}}}'.format(
                json.dumps(entry("U8", [2], [0, 2])), json.dumps(entry("U16", [1], [0, 2]))
            ),
            b"\1\2",
        )
        header = read_header(_written(tmp_path, raw))
        assert [(t.key, t.dtype_name, t.shape) for t in header.tensors] == [("t", "U16", (1,))]

    @pytest.mark.parametrize(("dtype", "shape"), [("F32", [2**62, 0]), ("U8", [0, 2**64 - 1])])
    def test_an_empty_tensor_jax_cannot_describe_is_refused_saying_why(
        self, tmp_path: Path, dtype: str, shape: list[int]
    ) -> None:
        """The reference accepts these; numpy refuses them and XLA aborts the process on
        them (their non-zero dimensions reach 2**63 bytes), so devpolicy refuses, saying so."""
        raw = framed(json.dumps({"t": entry(dtype, shape, [0, 0])}))
        assert not isinstance(reference_read(raw), str)
        shown = re.escape(str(shape))
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=rf"tensor 't': shape {shown} of {dtype} is too large for an "
            r"array, even an empty one \(its non-zero dimensions reach 2\*\*63 bytes\)$",
        ):
            read_header(_written(tmp_path, raw))

    def test_an_empty_tensor_with_a_huge_dimension_loads(self, tmp_path: Path) -> None:
        """U8 [2**62, 0] holds nothing and fits numpy and XLA: it loads, empty."""
        path = _written(tmp_path, framed(json.dumps({"t": entry("U8", [2**62, 0], [0, 0])})))
        loaded = devpolicy.load_file(path, policy=policy_of())["t"]
        assert loaded.shape == (2**62, 0)

    def test_more_dimensions_than_numpy_holds_are_refused_saying_so(self, tmp_path: Path) -> None:
        """The reference has no limit; numpy holds 64 dimensions (32 before numpy 2)."""
        limit = 64 if np.__version__ >= "2" else 32
        raw = framed(json.dumps({"t": entry("U8", [1] * (limit + 1), [0, 1])}), b"\1")
        assert not isinstance(reference_read(raw), str)
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=rf"tensor 't': {limit + 1} dimensions; numpy .* holds at most {limit}$",
        ):
            read_header(_written(tmp_path, raw))

    def test_33_dimensions_load(self, tmp_path: Path) -> None:
        """More than 32 dimensions load where numpy holds them."""
        if np.__version__ < "2":
            pytest.skip("numpy 1 holds at most 32 dimensions")
        path = tmp_path / "deep.safetensors"
        devpolicy.save_file({"t": np.arange(2, dtype=np.uint8).reshape((1,) * 32 + (2,))}, path)
        loaded = devpolicy.load_file(path, policy=policy_of())["t"]
        assert loaded.ndim == 33
        assert np.asarray(loaded).ravel().tolist() == [0, 1]


class TestWriter:
    def test_empty_metadata_is_written_as_the_reference_writes_it(self, tmp_path: Path) -> None:
        """`metadata={}` writes `"__metadata__":{}`, as the reference does."""
        path = tmp_path / "m.safetensors"
        array = np.arange(4, dtype=np.float32)
        devpolicy.save_file({"t": array}, path, metadata={})
        length = int.from_bytes(path.read_bytes()[:8], "little")
        assert json.loads(path.read_bytes()[8 : 8 + length])["__metadata__"] == {}
        assert path.read_bytes() == _realigned(reference_write("F32", array, {}), path)
        with safetensors.safe_open(path, framework="np") as f:
            assert f.metadata() == {}

    def test_no_metadata_writes_none(self, tmp_path: Path) -> None:
        path = tmp_path / "m.safetensors"
        devpolicy.save_file({"t": np.zeros(2, np.float32)}, path)
        with safetensors.safe_open(path, framework="np") as f:
            assert f.metadata() is None

    def test_a_name_utf8_cannot_encode_is_refused_before_writing(self, tmp_path: Path) -> None:
        """No file the reference cannot read: nothing is written."""
        path = tmp_path / "bad.safetensors"
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=r"bad\.safetensors: tensor 'w\\ud800': name holds a lone UTF-16 surrogate",
        ):
            devpolicy.save_file({"w\ud800": np.zeros(2)}, path)
        assert list(tmp_path.iterdir()) == []
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=r"bad\.safetensors: metadata 'a' holds a lone UTF-16 surrogate",
        ):
            devpolicy.save_file({"w": np.zeros(2)}, path, metadata={"a": "\udc00"})
        assert list(tmp_path.iterdir()) == []


class TestMetadata:
    def test_read_metadata_gives_a_files_metadata(self, tmp_path: Path) -> None:
        """The reference's `{"format": "pt"}`, without `safe_open`."""
        path = tmp_path / "pt.safetensors"
        path.write_bytes(reference_write("F32", np.zeros(2, np.float32), {"format": "pt"}))
        assert devpolicy.read_metadata(path) == {"format": "pt"}
        path.write_bytes(reference_write("F32", np.zeros(2, np.float32)))
        assert devpolicy.read_metadata(path) == {}

    def test_plan_and_the_load_file_event_give_each_files_metadata(self, tmp_path: Path) -> None:
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        devpolicy.save_file(
            {"a": np.zeros(2)}, ckpt / "model-00001-of-00002.safetensors", metadata={"format": "pt"}
        )
        devpolicy.save_file({"b": np.zeros(2)}, ckpt / "model-00002-of-00002.safetensors")
        plan = devpolicy.plan(ckpt, policy=policy_of())
        assert plan.metadata == {
            str(ckpt / "model-00001-of-00002.safetensors"): {"format": "pt"},
            str(ckpt / "model-00002-of-00002.safetensors"): {},
        }
        with structlog.testing.capture_logs() as logs:
            devpolicy.load_file(ckpt, policy=policy_of())
        assert [(e["file"], e["metadata"]) for e in logs if e["event"] == "load_file"] == list(
            plan.metadata.items()
        )


def _checkpoint(directory: Path, *names: str) -> Path:
    directory.mkdir(exist_ok=True)
    for i, name in enumerate(names):
        devpolicy.save_file({f"{name}.w{i}": np.zeros(2, np.float32)}, directory / name)
    return directory


def _loaded_from(directory: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """(keys loaded, (file, reason) of each file left out) for a directory."""
    with structlog.testing.capture_logs() as logs:
        out = devpolicy.load_file(directory, policy=policy_of())
    left = [
        (Path(e["file"]).name, e["reason"])
        for e in logs
        if e["event"] == "checkpoint_file_left_out"
    ]
    return sorted(out), left


class TestCheckpointDirectories:
    def test_model_safetensors_is_the_checkpoint_beside_consolidated(self, tmp_path: Path) -> None:
        """A Mistral layout: the same weights twice; only model.safetensors loads."""
        ckpt = _checkpoint(tmp_path / "m", "model.safetensors", "consolidated.safetensors")
        keys, left = _loaded_from(ckpt)
        assert keys == ["model.safetensors.w0"]
        assert left == [
            (
                "consolidated.safetensors",
                "model.safetensors is the checkpoint (no index): name the file to load it",
            )
        ]
        plan = devpolicy.plan(ckpt, policy=policy_of())
        assert plan.left_out == ((str(ckpt / "consolidated.safetensors"), left[0][1]),)
        assert str(plan).endswith(f"left out: {ckpt / 'consolidated.safetensors'}: {left[0][1]}")

    def test_an_index_leaves_out_files_it_does_not_name(self, tmp_path: Path) -> None:
        ckpt = _checkpoint(
            tmp_path / "m", "model-00001-of-00001.safetensors", "consolidated.safetensors"
        )
        (ckpt / "model.safetensors.index.json").write_text(
            json.dumps(
                {
                    "weight_map": {
                        "model-00001-of-00001.safetensors.w0": "model-00001-of-00001.safetensors"
                    }
                }
            )
        )
        keys, left = _loaded_from(ckpt)
        assert keys == ["model-00001-of-00001.safetensors.w0"]
        assert left == [
            (
                "consolidated.safetensors",
                "not in model.safetensors.index.json, the checkpoint's index: name the file to "
                "load it",
            )
        ]

    def test_an_adapter_and_variants_are_left_out_unless_named(self, tmp_path: Path) -> None:
        """adapter_model and model.fp16 are never merged into the model."""
        ckpt = _checkpoint(
            tmp_path / "m",
            "model.safetensors",
            "model.fp16.safetensors",
            "adapter_model.safetensors",
        )
        keys, left = _loaded_from(ckpt)
        assert keys == ["model.safetensors.w0"]
        assert [name for name, _ in left] == ["adapter_model.safetensors", "model.fp16.safetensors"]
        named = devpolicy.load_file(ckpt / "model.fp16.safetensors", policy=policy_of())
        assert list(named) == ["model.fp16.safetensors.w1"]

    def test_without_model_safetensors_variants_and_adapters_still_need_naming(
        self, tmp_path: Path
    ) -> None:
        ckpt = _checkpoint(
            tmp_path / "m",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.fp16-00001-of-00001.safetensors",
            "adapter_model.safetensors",
        )
        keys, left = _loaded_from(ckpt)
        assert keys == [
            "model-00001-of-00002.safetensors.w0",
            "model-00002-of-00002.safetensors.w1",
        ]
        assert left == [
            (
                "adapter_model.safetensors",
                "a PEFT adapter, not the model's weights: name the file to load it",
            ),
            (
                "model.fp16-00001-of-00001.safetensors",
                "variant 'fp16' of model: name the file (or its index) to load it",
            ),
        ]

    def test_a_variants_index_loads_the_variant(self, tmp_path: Path) -> None:
        """`model.safetensors.index.fp16.json` (transformers' name for it) is an index."""
        ckpt = _checkpoint(
            tmp_path / "m", "model.safetensors", "model.fp16-00001-of-00001.safetensors"
        )
        index = ckpt / "model.safetensors.index.fp16.json"
        index.write_text(
            json.dumps(
                {
                    "weight_map": {
                        "model.fp16-00001-of-00001.safetensors.w1": "model.fp16-00001-of-00001.safetensors"
                    }
                }
            )
        )
        assert _loaded_from(ckpt)[0] == ["model.safetensors.w0"]
        assert list(devpolicy.load_file(index, policy=policy_of())) == [
            "model.fp16-00001-of-00001.safetensors.w1"
        ]

    def test_shards_without_an_index_load_as_one_complete_set(self, tmp_path: Path) -> None:
        """Shards beside other files: the set alone, the others said left out."""
        ckpt = _checkpoint(
            tmp_path / "m",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "consolidated.safetensors",
        )
        keys, left = _loaded_from(ckpt)
        assert keys == [
            "model-00001-of-00002.safetensors.w0",
            "model-00002-of-00002.safetensors.w1",
        ]
        assert left == [
            (
                "consolidated.safetensors",
                "not a shard of model, which is the checkpoint: name the file to load it",
            )
        ]

    def test_a_shard_missing_is_an_error(self, tmp_path: Path) -> None:
        """A checkpoint missing a shard never loads as a smaller one."""
        ckpt = _checkpoint(
            tmp_path / "m", "model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"
        )
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=rf"^{re.escape(str(ckpt))}: shards of model are not a complete set of 3: 1 "
            r"missing \(model-00002-of-00003\.safetensors\); a checkpoint missing a file never",
        ):
            devpolicy.plan(ckpt, policy=policy_of())

    def test_shards_of_two_checkpoints_are_an_error(self, tmp_path: Path) -> None:
        ckpt = _checkpoint(
            tmp_path / "m", "a-00001-of-00001.safetensors", "b-00001-of-00001.safetensors"
        )
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=r": holds shards of several checkpoints \(a-\*-of-00001, b-\*-of-00001\) and no "
            "index: name one$",
        ):
            devpolicy.load_file(ckpt, policy=policy_of())

    def test_a_folder_of_only_an_adapter_says_to_name_it(self, tmp_path: Path) -> None:
        ckpt = _checkpoint(tmp_path / "m", "adapter_model.safetensors")
        with pytest.raises(
            devpolicy.SafetensorsFileError,
            match=r": a directory without a checkpoint: no \*\.safetensors\.index\.json, no "
            r"model\.safetensors, and every other file is left out \(adapter_model\.safetensors: "
            "a PEFT adapter",
        ):
            devpolicy.load_file(ckpt, policy=policy_of())

    def test_unrelated_files_without_model_or_index_load_together(self, tmp_path: Path) -> None:
        """A folder of parts (a dataset's splits): every file, as before; nothing left out."""
        ckpt = _checkpoint(tmp_path / "d", "train.safetensors", "valid.safetensors")
        assert _loaded_from(ckpt) == (["train.safetensors.w0", "valid.safetensors.w1"], [])


def test_align_file_keeps_metadata_as_it_was(tmp_path: Path) -> None:
    """A file without `__metadata__` gets none when aligned; one with `{}` keeps `{}`."""
    given: dict[str, str] | None
    for given in (None, {}):
        path, copy = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
        devpolicy.save_file({"t": np.zeros(2)}, path, metadata=given)
        devpolicy.align_file(path, copy)
        assert read_header(copy).metadata == given


def test_as_array_unpacks_f4_into_one_value_a_byte() -> None:
    """Element 0 from the low four bits, element 1 from the high four."""
    f4 = TensorEntry("t", "F4", DTYPES["F4"], (4,), 0, 2, 64)
    unpacked = as_array(f4, np.array([0x21, 0xC6], np.uint8))
    assert unpacked.dtype == ml_dtypes.float4_e2m1fn
    assert unpacked.astype(np.float32).tolist() == [0.5, 1.0, 4.0, -2.0]
