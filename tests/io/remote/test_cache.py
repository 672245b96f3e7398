"""The cache: fetched once, then served from disk with no data request, safe with many fillers."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from devpolicy._io.remote import CachedFile, RemoteCache, RemoteObject, open_remote
from tests.helpers import run_threads

from . import servers
from .conftest import BUCKET, Proxied, s3_environ


class TestCache:
    def test_second_open_makes_no_data_request_and_maps(
        self, s3_proxied: Proxied, payload: bytes, tmp_path: Path
    ) -> None:
        """The first open fills the cache; the second is served from it with no GET, and maps."""
        first = open_remote(s3_proxied.url, environ=s3_proxied.environ, cache_dir=tmp_path)
        assert isinstance(first, CachedFile)
        assert first.counters.bytes == len(payload)
        first.close()
        s3_proxied.proxy.reset()
        second = open_remote(s3_proxied.url, environ=s3_proxied.environ, cache_dir=tmp_path)
        try:
            assert isinstance(second, CachedFile)
            assert s3_proxied.proxy.data_exchanges() == []
            assert second.counters.bytes == 0
            fd = second.fileno()
            assert fd is not None
            assert second.name == s3_proxied.url
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mapped:
                assert mapped[:] == payload
            buffer = bytearray(100)
            second.read_into(1000, memoryview(buffer))
            assert buffer == payload[1000:1100]
        finally:
            second.close()

    def test_changed_object_is_fetched_again(
        self, s3: servers.S3Server, payload: bytes, tmp_path: Path
    ) -> None:
        """A new version of the object (another ETag) is a new entry, never the old bytes."""
        environ = s3_environ(s3.url)
        s3.put(BUCKET, "ckpt/cached.bin", payload)
        open_remote(f"s3://{BUCKET}/ckpt/cached.bin", environ=environ, cache_dir=tmp_path).close()
        s3.put(BUCKET, "ckpt/cached.bin", payload[::-1])
        again = open_remote(f"s3://{BUCKET}/ckpt/cached.bin", environ=environ, cache_dir=tmp_path)
        try:
            assert isinstance(again, CachedFile)
            assert again.counters.bytes == len(payload)
            assert again.path.read_bytes() == payload[::-1]
        finally:
            again.close()

    def test_concurrent_fillers_fetch_once(
        self, s3_proxied: Proxied, payload: bytes, tmp_path: Path
    ) -> None:
        """Several fillers at once: one fetches, the others wait and read its file."""
        opened: list[CachedFile] = []

        def fill() -> None:
            source = open_remote(s3_proxied.url, environ=s3_proxied.environ, cache_dir=tmp_path)
            assert isinstance(source, CachedFile)
            opened.append(source)

        run_threads(fill, fill, fill)
        try:
            assert [s.path.read_bytes() == payload for s in opened] == [True, True, True]
            assert sum(e.body_bytes for e in s3_proxied.proxy.data_exchanges()) == len(payload)
        finally:
            for source in opened:
                source.close()

    def test_a_cut_short_fill_is_resumed(
        self, s3_proxied: Proxied, payload: bytes, tmp_path: Path
    ) -> None:
        """A fill that stopped part way is resumed: only the chunks not yet in are fetched."""
        source = open_remote(s3_proxied.url, environ=s3_proxied.environ, chunk_bytes=2**20)
        assert isinstance(source, RemoteObject)
        cache = RemoteCache(tmp_path)
        base = cache.base(source)
        # What a filler killed after its first two chunks leaves behind.
        partial = Path(f"{base}.partial")
        partial.write_bytes(payload[: 2 * 2**20] + bytes(len(payload) - 2 * 2**20))
        Path(f"{base}.progress").write_bytes(b"\1\1\0\0")
        s3_proxied.proxy.reset()
        cached = cache.open(source)
        try:
            assert cached.path.read_bytes() == payload
            assert (
                sum(e.body_bytes for e in s3_proxied.proxy.data_exchanges())
                == len(payload) - 2 * 2**20
            )
            assert not partial.exists()
            assert not os.path.exists(f"{base}.progress")
        finally:
            cached.close()
