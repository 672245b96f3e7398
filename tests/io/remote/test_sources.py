"""Every scheme reads the same bytes as the local file, fetching only what is asked."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devpolicy._io.remote import (
    INSTALL_HINT,
    RemoteExtraMissingError,
    RemoteObject,
    RemoteReadError,
    open_remote,
)

from . import servers
from .conftest import BUCKET, Proxied, s3_environ

# Each test talks to real servers (local S3, GCS, Hub and HTTP servers, some of them processes):
# out of the quick subset (`-m "not slow"`), in the full suite.
pytestmark = pytest.mark.slow


@pytest.fixture(params=["s3", "gs", "hf", "hf-dataset", "https"])
def opened(request: pytest.FixtureRequest, served_root: Path) -> Iterator[RemoteObject]:
    """An opened source of each scheme, all serving the same payload."""
    scheme = request.param
    if scheme == "s3":
        server = request.getfixturevalue("s3")
        url, environ = f"s3://{BUCKET}/ckpt/model.bin", s3_environ(server.url)
    elif scheme == "gs":
        server = request.getfixturevalue("gcs")
        url, environ = f"gs://{BUCKET}/ckpt/model.bin", {"STORAGE_EMULATOR_HOST": server.url}
    elif scheme.startswith("hf"):
        hub = request.getfixturevalue("hub")
        environ = {
            "HF_ENDPOINT": hub.url,
            "HF_TOKEN": servers.HUB_TOKEN,
            "HF_HOME": str(served_root / "none"),
        }
        url = (
            "hf://org/repo/model.bin"
            if scheme == "hf"
            else "hf://datasets/org/tokens@main/train/model.bin"
        )
    else:
        url, environ = request.getfixturevalue("rclone").url + "/model.bin", {}
    source = open_remote(url, environ=environ, chunk_bytes=2**20)
    assert isinstance(source, RemoteObject)
    yield source
    source.close()


class TestEveryScheme:
    def test_whole_object_equals_the_local_file(self, opened: RemoteObject, payload: bytes) -> None:
        """Reading every byte gives the local file's bytes, in chunk-sized requests."""
        assert opened.size == len(payload)
        assert opened.fileno() is None
        buffer = bytearray(len(payload))
        opened.read_into(0, memoryview(buffer))
        assert buffer == payload
        assert opened.counters.bytes == len(payload)

    def test_scattered_ranges_are_exact(self, opened: RemoteObject, payload: bytes) -> None:
        """Many ranges at once (neighbours joined, far ones apart) each get their own bytes."""
        ranges = [
            (0, 8),
            (8, 1000),
            (5000, 7000),
            (2 * 2**20, 2**20 + 4000),
            (len(payload) - 10, 10),
        ]
        buffers = [bytearray(n) for _, n in ranges]
        opened.read_many([(o, memoryview(b)) for (o, _), b in zip(ranges, buffers, strict=True)])
        assert [bytes(b) for b in buffers] == [payload[o : o + n] for o, n in ranges]

    def test_header_reads_cost_one_small_request(
        self, opened: RemoteObject, payload: bytes
    ) -> None:
        """The header's length and then the header come from one small ranged read."""
        before = opened.counters.as_fields()
        length, header = bytearray(8), bytearray(300)
        opened.read_into(0, memoryview(length))
        opened.read_into(8, memoryview(header))
        after = opened.counters.as_fields()
        assert bytes(length) + bytes(header) == payload[:308]
        assert after["requests"] - before["requests"] == 1
        assert after["bytes_fetched"] - before["bytes_fetched"] == 64 * 2**10

    def test_out_of_range_is_refused(self, opened: RemoteObject) -> None:
        """A range past the end is an error naming the object and its size."""
        with pytest.raises(ValueError, match=r"are outside the object \(3158073 bytes\)$"):
            opened.read_into(opened.size - 4, memoryview(bytearray(8)))


class TestWhatIsFetched:
    def test_two_readers_of_halves_fetch_half_each(
        self, s3_proxied: Proxied, payload: bytes
    ) -> None:
        """Two readers of disjoint halves each fetch about their half (bytes counted at the proxy)."""
        half = len(payload) // 2
        counted = []
        for offset, length in ((0, half), (half, len(payload) - half)):
            s3_proxied.proxy.reset()
            source = open_remote(s3_proxied.url, environ=s3_proxied.environ)
            buffer = bytearray(length)
            source.read_into(offset, memoryview(buffer))
            source.close()
            assert buffer == payload[offset : offset + length]
            counted.append(s3_proxied.proxy.body_bytes())
        assert counted[0] <= half * 1.02
        assert counted[1] <= (len(payload) - half) * 1.02

    def test_no_such_object_names_the_url(self, s3: servers.S3Server) -> None:
        """A missing object is an error naming the URL and the status, after one attempt."""
        with pytest.raises(
            RemoteReadError,
            match=r"^s3://devpolicy-tests/nope\.bin: no such object .*\(status 404, 1 attempt\)$",
        ):
            open_remote(f"s3://{BUCKET}/nope.bin", environ=s3_environ(s3.url))

    def test_wrong_credentials_are_refused_without_showing_them(self, s3: servers.S3Server) -> None:
        """Refused credentials give an error that says what to check and shows no secret."""
        environ = {**s3_environ(s3.url), "AWS_SECRET_ACCESS_KEY": "not-the-secret-0123456789"}
        with pytest.raises(
            RemoteReadError, match=r"access refused; the credentials found were refused"
        ) as caught:
            open_remote(f"s3://{BUCKET}/ckpt/model.bin", environ=environ)
        assert "not-the-secret" not in str(caught.value)
        assert servers.S3_ACCESS_KEY not in str(caught.value)

    def test_hub_without_token_says_to_set_it(self, hub: servers.LocalHub, tmp_path: Path) -> None:
        """A Hub that wants a token, asked without one, is an error that says to set HF_TOKEN."""
        with pytest.raises(RemoteReadError, match=r"set HF_TOKEN \(status 401, 1 attempt\)$"):
            open_remote(
                "hf://org/repo/model.bin",
                environ={"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path)},
            )


class TestExtra:
    def test_s3_without_the_extra_names_the_pip_command(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without botocore, an s3:// URL is an error naming the package and the pip command."""
        monkeypatch.setitem(sys.modules, "botocore", None)
        with pytest.raises(
            RemoteExtraMissingError,
            match=r"^s3://b-1/k: reading from a URL needs 'botocore'.*: pip install 'devpolicy\[remote\]'$",
        ):
            open_remote("s3://b-1/k", environ={})
        assert INSTALL_HINT == "pip install 'devpolicy[remote]'"
