"""URLs: which are read, their parts, and how they are shown (never with credentials)."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devpolicy._io.remote import RemoteURLError, is_url, parse_url, shown


class TestParse:
    @pytest.mark.parametrize(
        ("url", "scheme", "bucket", "key", "revision", "repo_type"),
        [
            ("s3://bucket/dir/model.safetensors", "s3", "bucket", "dir/model.safetensors", "", ""),
            ("gs://my_bucket/m.safetensors", "gs", "my_bucket", "m.safetensors", "", ""),
            (
                "hf://org/repo/model.safetensors",
                "hf",
                "org/repo",
                "model.safetensors",
                "main",
                "model",
            ),
            ("hf://models/org/repo@v1.0/a/b.bin", "hf", "org/repo", "a/b.bin", "v1.0", "model"),
            (
                "hf://datasets/org/tokens@refs%2Fpr%2F3/train/x.bin",
                "hf",
                "org/tokens",
                "train/x.bin",
                "refs/pr/3",
                "dataset",
            ),
            (
                "https://example.org/files/m.safetensors",
                "https",
                "example.org",
                "/files/m.safetensors",
                "",
                "",
            ),
            ("http://127.0.0.1:8000/m.bin", "http", "127.0.0.1", "/m.bin", "", ""),
            ("http://localhost/m.bin", "http", "localhost", "/m.bin", "", ""),
            ("http://[::1]:9/m.bin", "http", "::1", "/m.bin", "", ""),
        ],
    )
    def test_parts(
        self, url: str, scheme: str, bucket: str, key: str, revision: str, repo_type: str
    ) -> None:
        """Each scheme's URL splits into its bucket (or repository or host), key and revision."""
        parsed = parse_url(url)
        assert (parsed.scheme, parsed.bucket, parsed.key, parsed.revision, parsed.repo_type) == (
            scheme, bucket, key, revision, repo_type,
        )  # fmt: skip

    def test_unknown_scheme_lists_the_valid_ones(self) -> None:
        """An unknown scheme is an error that lists every scheme read."""
        with pytest.raises(
            RemoteURLError,
            match=r"^ftp://h/m\.bin: scheme: unknown scheme 'ftp'; accepted: gs://, hf://, http://, https://, s3://$",
        ):
            parse_url("ftp://h/m.bin")

    @pytest.mark.parametrize(
        ("url", "message"),
        [
            ("s3:///key", r"^s3:///key: bucket: missing; write s3://BUCKET/KEY$"),
            ("s3://bucket", r"^s3://bucket: key: missing; write s3://bucket/KEY$"),
            ("s3://bucket/", r"^s3://bucket/: key: missing"),
            ("s3://Bad_Bucket/k", r"^s3://Bad_Bucket/k: bucket: 'Bad_Bucket' is not a bucket name"),
            ("gs://b/k", r"^gs://b/k: bucket: 'b' is not a bucket name"),
            ("s3://bucket/k?versionId=1", r"^s3://bucket/k: key: a query string"),
            ("hf://org/model.bin", r"^hf://org/model\.bin: repository: write hf://ORG/REPO"),
            ("hf://org/repo@/m.bin", r"^hf://org/repo@/m\.bin: revision: empty after '@'"),
            (
                "hf://org/re po/m.bin",
                r"^hf://org/re po/m\.bin: characters: a space, line break or other control character",
            ),
            (
                "hf://org/repo/a/../b",
                r"^hf://org/repo/a/\.\./b: path: 'a/\.\./b' is not a file path",
            ),
            ("https:///m.bin", r"^https:///m\.bin: host: missing"),
            ("https://example.org/dir/", r"^https://example\.org/dir/: path: missing a file name"),
            ("https://example.org:99999/m", r"^https://example\.org/m: host: malformed"),
            (
                "http://example.org/m.bin",
                r"^http://example\.org/m\.bin: scheme: plain http:// is read only from a loopback host",
            ),
        ],
    )
    def test_malformed_part_is_named(self, url: str, message: str) -> None:
        """A malformed URL's error names the part that is wrong and how to write it."""
        with pytest.raises(RemoteURLError, match=message):
            parse_url(url)

    def test_a_local_path_is_not_a_url(self) -> None:
        """Paths, relative or absolute, are not URLs; `scheme://` text is."""
        assert [is_url(x) for x in ("m.safetensors", "/data/m", "C:/m", "s3://b/k", 3)] == [
            False, False, False, True, False,
        ]  # fmt: skip


class TestShown:
    @pytest.mark.parametrize(
        ("url", "expected"),
        [
            ("https://user:pa55@example.org/m.bin", "https://example.org/m.bin"),
            (
                "https://example.org/m.bin?X-Amz-Signature=abc&X-Amz-Credential=AKID",
                "https://example.org/m.bin",
            ),
            ("https://example.org:8443/m.bin#frag", "https://example.org:8443/m.bin"),
            ("s3://bucket/key", "s3://bucket/key"),
            ("hf://org/repo@v1.0/m.bin", "hf://org/repo@v1.0/m.bin"),
        ],
    )
    def test_credentials_are_never_shown(self, url: str, expected: str) -> None:
        """User information, query strings and fragments (where credentials travel) are dropped."""
        assert shown(url) == expected
        assert parse_url(url).name == expected

    def test_a_token_before_a_hub_repository_is_never_shown(self) -> None:
        """`hf://org/NAME:TOKEN@repo/...` (refused when parsed) is shown without the token;
        a revision after the repository stays."""
        assert shown("hf://org/u:SECRET@repo/m.bin") == "hf://org/repo/m.bin"
        assert shown("hf://org/u:SECRET@repo@v1/m.bin") == "hf://org/repo@v1/m.bin"

    def test_an_error_never_shows_the_password(self) -> None:
        """A malformed URL with a password is reported without it."""
        with pytest.raises(RemoteURLError) as caught:
            parse_url("https://user:hunter2@example.org/dir/")
        assert "hunter2" not in str(caught.value)

    @pytest.mark.parametrize(
        ("given", "part", "told"),
        [
            ("s3://AKIDEXAMPLE:hunter2@bucket/model.safetensors", "bucket", "NAME:PASSWORD@"),
            ("gs://AKIDEXAMPLE:hunter2@bucket/model.safetensors", "bucket", "NAME:PASSWORD@"),
            ("hf://AKIDEXAMPLE:hunter2@org/repo/model.safetensors", "repository", "NAME:TOKEN@"),
        ],
    )
    def test_user_information_in_a_url_is_refused_unshown(
        self, given: str, part: str, told: str
    ) -> None:
        """`s3://KEY:SECRET@bucket/...`, and the same in gs:// and hf:// (credentials where
        they do not go): an error that says where credentials come from, and shows neither
        the name nor the secret."""
        with pytest.raises(RemoteURLError) as caught:
            parse_url(given)
        text = str(caught.value)
        assert "hunter2" not in text
        assert "AKIDEXAMPLE" not in text
        expected = given.replace("AKIDEXAMPLE:hunter2@", "")
        assert text.startswith(f"{expected}: {part}: ")
        assert f"user information ({told}) is not part of" in text
        assert shown(given) == expected


class TestShownProperty:
    @given(
        user=st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=12),
        secret=st.text(
            alphabet=string.ascii_letters + string.digits + "-_.~", min_size=8, max_size=30
        ),
        path=st.text(alphabet=string.ascii_lowercase + "/", min_size=1, max_size=20),
    )
    def test_no_secret_survives(self, user: str, secret: str, path: str) -> None:
        """Whatever the URL, a password or query value never appears in the shown form."""
        secret = "S3CR3T" + secret  # never part of the (lowercase) path
        for url in (
            f"https://{user}:{secret}@example.org/{path}",
            f"https://example.org/{path}?token={secret}",
            f"s3://bucket/{path}?sig={secret}",
            f"s3://{user}:{secret}@bucket/{path}",
            f"gs://{user}:{secret}@bucket/{path}",
            f"hf://{user}:{secret}@org/repo/{path}",
            f"hf://{secret}@datasets/org/repo/{path}",
            f"hf://org/{user}:{secret}@repo/{path}",
            f"hf://org/{user}:{secret}@repo@main/{path}",
        ):
            assert secret not in shown(url)
