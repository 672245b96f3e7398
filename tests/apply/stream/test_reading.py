"""`ReadOptions`: the read path's settings, one record checked when made."""

from __future__ import annotations

import pytest

from devpolicy._apply.stream.reading import ReadOptions, read_options


class TestReadOptions:
    @pytest.mark.parametrize(
        ("fields", "error", "message"),
        [
            ({"path": "mapped"}, ValueError, r"^ReadOptions path must be one of 'auto', 'keep'"),
            ({"ahead": 1}, TypeError, r"^ReadOptions ahead must be True or False, got 1$"),
            ({"trial_groups": 0}, ValueError, r"^ReadOptions trial_groups must be an int >= 1"),
            ({"resident_budget": True}, ValueError, r"^ReadOptions resident_budget must be an int"),
            ({"warm_share": 1.5}, ValueError, r"^ReadOptions warm_share must be a number from 0"),
            ({"keep_of_ram": "0.5"}, ValueError, r"^ReadOptions keep_of_ram must be a number"),
            (
                {"recheck_seconds": 0},
                ValueError,
                r"^ReadOptions recheck_seconds must be a number > 0",
            ),
            (
                {"large_footprint": float("nan")},
                ValueError,
                r"^ReadOptions large_footprint must be a number > 0",
            ),
        ],
    )
    def test_a_bad_field_is_refused_naming_it(
        self, fields: dict[str, object], error: type[Exception], message: str
    ) -> None:
        with pytest.raises(error, match=message):
            ReadOptions(**fields)  # type: ignore[arg-type]

    def test_a_path_name_is_shorthand_for_the_record(self) -> None:
        assert read_options("keep") == ReadOptions(path="keep")
        assert read_options(None) == ReadOptions()
        options = ReadOptions(path="file", ahead=False)
        assert read_options(options) is options

    @pytest.mark.parametrize("reads", ["mapping", 3, {"path": "file"}])
    def test_anything_else_is_refused_naming_reads(self, reads: object) -> None:
        with pytest.raises(ValueError, match=r"^windows reads must be a devpolicy\.ReadOptions"):
            read_options(reads)

    def test_the_record_cannot_be_changed_after_it_is_made(self) -> None:
        options = ReadOptions()
        with pytest.raises(AttributeError):
            options.path = "file"  # type: ignore[misc]
