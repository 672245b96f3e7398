"""The cache: fetched once, then served from disk with no data request, safe with many fillers."""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path

import pytest

from devpolicy import DevicePolicyError
from devpolicy._io.remote import CachedFile, RemoteCache, RemoteObject, RemoteReadError, open_remote
from devpolicy._io.remote.errors import RemoteCacheError, RemoteOfflineError
from tests.helpers import run_threads

from . import servers
from .conftest import BUCKET, Proxied, s3_environ

# Each test talks to real servers (local S3, GCS, Hub and HTTP servers, some of them processes):
# out of the quick subset (`-m "not slow"`), in the full suite.
pytestmark = pytest.mark.slow


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


def _gets(method: str, path: str, range_: str | None) -> bool:
    return method == "GET" and range_ is not None


def _cached_then_flipped(proxied: Proxied, cache: Path) -> Path:
    """The object fetched into the cache, then one byte of its cached data flipped; the
    entry's base path."""
    open_remote(proxied.url, environ=proxied.environ, cache_dir=cache).close()
    base = _entry(proxied, cache)
    with open(f"{base}.data", "r+b") as f:
        f.seek(12345)
        byte = f.read(1)
        f.seek(12345)
        f.write(bytes([byte[0] ^ 1]))
    return base


def _entry(proxied: Proxied, cache: Path) -> Path:
    """The entry's base path of `proxied`'s object in `cache` (one metadata request)."""
    source = open_remote(proxied.url, environ=proxied.environ)
    assert isinstance(source, RemoteObject)
    try:
        return RemoteCache(cache).base(source)
    finally:
        source.close()


needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="making another account's files needs root",
)


class TestTrust:
    def test_a_cache_others_can_write_is_refused_with_the_fix(
        self, s3_proxied: Proxied, tmp_path: Path
    ) -> None:
        """A cache directory writable by others is refused (they could plant entries), saying
        how to fix it, before any data request."""
        shared = tmp_path / "shared"
        shared.mkdir()
        shared.chmod(0o777)
        with pytest.raises(RemoteCacheError, match=r"world-writable.*chmod go-w"):
            open_remote(s3_proxied.url, environ=s3_proxied.environ, cache_dir=shared)
        assert s3_proxied.proxy.data_exchanges() == []

    @needs_root
    def test_a_cache_of_another_account_is_refused(
        self, s3_proxied: Proxied, tmp_path: Path
    ) -> None:
        """A cache directory another account owns is refused, naming the owner."""
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(RemoteCacheError, match=r"owned by .*uid 65534"):
            open_remote(s3_proxied.url, environ=s3_proxied.environ, cache_dir=theirs)

    @needs_root
    def test_an_entry_of_another_account_is_never_served(
        self, s3_proxied: Proxied, payload: bytes, tmp_path: Path
    ) -> None:
        """A complete entry (data and checksum) owned by another account is refused."""
        cache = tmp_path / "cache"
        open_remote(s3_proxied.url, environ=s3_proxied.environ, cache_dir=cache).close()
        base = _entry(s3_proxied, cache)
        for suffix in (".data", ".json"):
            os.chown(f"{base}{suffix}", 65534, 65534)
        with pytest.raises(RemoteCacheError, match=r"owned by uid 65534"):
            open_remote(s3_proxied.url, environ=s3_proxied.environ, cache_dir=cache)

    @pytest.mark.parametrize("suffix", [".partial", ".lock", ".progress"])
    def test_a_planted_link_is_never_followed(
        self, s3_proxied: Proxied, tmp_path: Path, suffix: str
    ) -> None:
        """A symlink in an entry's place is refused: the file it points at is neither
        written nor created."""
        cache = tmp_path / "cache"
        cache.mkdir(mode=0o700)
        base = _entry(s3_proxied, cache)
        victim = tmp_path / "victim"
        victim.write_bytes(b"mine")
        victim.chmod(0o600)
        elsewhere = tmp_path / "created-elsewhere"
        os.symlink(victim, f"{base}{suffix}")
        os.symlink(elsewhere, f"{base}.json")
        with pytest.raises(RemoteCacheError, match="symlink"):
            open_remote(s3_proxied.url, environ=s3_proxied.environ, cache_dir=cache)
        assert victim.read_bytes() == b"mine"
        assert not elsewhere.exists()

    def test_a_new_cache_is_private(self, s3_proxied: Proxied, tmp_path: Path) -> None:
        """The directory is made 0700 and every entry 0600 (a gated model stays private)."""
        cache = tmp_path / "new" / "cache"
        open_remote(s3_proxied.url, environ=s3_proxied.environ, cache_dir=cache).close()
        assert stat.S_IMODE(cache.stat().st_mode) == 0o700
        modes = {p.name.rsplit(".", 1)[-1]: stat.S_IMODE(p.stat().st_mode) for p in cache.iterdir()}
        assert modes == {"data": 0o600, "json": 0o600, "lock": 0o600}

    def test_a_flipped_byte_is_fetched_again(
        self, s3_proxied: Proxied, payload: bytes, tmp_path: Path
    ) -> None:
        """A complete entry whose bytes no longer match its checksum is never served: the
        object is fetched again."""
        _cached_then_flipped(s3_proxied, tmp_path)
        s3_proxied.proxy.reset()
        again = open_remote(s3_proxied.url, environ=s3_proxied.environ, cache_dir=tmp_path)
        try:
            assert isinstance(again, CachedFile)
            assert again.path.read_bytes() == payload
            assert sum(e.body_bytes for e in s3_proxied.proxy.data_exchanges()) == len(payload)
        finally:
            again.close()

    def test_an_unusable_cache_directory_names_the_option(
        self, s3_proxied: Proxied, tmp_path: Path
    ) -> None:
        """A cache that cannot be made is a devpolicy error naming the cache option and
        saying the load does not go on uncached (not a raw OSError)."""
        (tmp_path / "file").write_bytes(b"")
        with pytest.raises(
            RemoteCacheError, match=r"DEVPOLICY_REMOTE_CACHE.*cannot be made.*not go on uncached"
        ):
            open_remote(
                s3_proxied.url, environ=s3_proxied.environ, cache_dir=tmp_path / "file" / "c"
            )


class TestFailedFill:
    @pytest.mark.parametrize(
        "fault",
        [
            servers.Fault("status", times=1000, status=503, applies=_gets),
            servers.Fault("status", times=1000, status=404, applies=_gets),
            servers.Fault("cut", times=1000, keep=0.3, applies=_gets),
        ],
        ids=["503-storm", "404", "cut-bodies"],
    )
    def test_the_read_error_surfaces_and_a_later_load_resumes(
        self, s3_proxied: Proxied, payload: bytes, tmp_path: Path, fault: servers.Fault
    ) -> None:
        """A server failing during a fill raises its `RemoteReadError` (a DevicePolicyError,
        not a BufferError from the cache's map); the leftovers are resumed by a later load,
        which removes them."""
        options = {"chunk_bytes": 2**20, "attempts": 2, "backoff_seconds": 0.0}
        s3_proxied.proxy.faults.append(servers.Fault("cut", times=0))
        first = open_remote(s3_proxied.url, environ=s3_proxied.environ, **options)
        assert isinstance(first, RemoteObject)
        base = RemoteCache(tmp_path).base(first)
        first.close()
        s3_proxied.proxy.faults.append(fault)
        with pytest.raises(DevicePolicyError) as caught:
            open_remote(s3_proxied.url, environ=s3_proxied.environ, cache_dir=tmp_path, **options)
        assert isinstance(caught.value, RemoteReadError), repr(caught.value)
        assert os.path.exists(f"{base}.partial")
        assert os.path.exists(f"{base}.progress")
        s3_proxied.proxy.reset()
        again = open_remote(
            s3_proxied.url, environ=s3_proxied.environ, cache_dir=tmp_path, **options
        )
        try:
            assert isinstance(again, CachedFile)
            assert again.path.read_bytes() == payload
            assert not os.path.exists(f"{base}.partial")
            assert not os.path.exists(f"{base}.progress")
        finally:
            again.close()


class TestOffline:
    def test_a_complete_entry_loads_offline_with_no_request(
        self, s3_proxied: Proxied, payload: bytes, tmp_path: Path
    ) -> None:
        """With DEVPOLICY_REMOTE_OFFLINE=1 a complete entry is served with no request at
        all (not even the metadata one)."""
        open_remote(s3_proxied.url, environ=s3_proxied.environ, cache_dir=tmp_path).close()
        s3_proxied.proxy.reset()
        environ = {**s3_proxied.environ, "DEVPOLICY_REMOTE_OFFLINE": "1"}
        cached = open_remote(s3_proxied.url, environ=environ, cache_dir=tmp_path)
        try:
            assert isinstance(cached, CachedFile)
            assert cached.path.read_bytes() == payload
            assert s3_proxied.proxy.exchanges == []
        finally:
            cached.close()

    def test_a_missing_entry_offline_is_an_error_naming_the_switch(
        self, s3_proxied: Proxied, tmp_path: Path
    ) -> None:
        """Offline, a file not in the cache is an error naming the switch; nothing is asked."""
        environ = {**s3_proxied.environ, "DEVPOLICY_REMOTE_OFFLINE": "1"}
        with pytest.raises(RemoteOfflineError, match=r"DEVPOLICY_REMOTE_OFFLINE=1"):
            open_remote(s3_proxied.url, environ=environ, cache_dir=tmp_path)
        with pytest.raises(RemoteOfflineError, match=r"no cache"):
            open_remote(s3_proxied.url, environ=environ)
        assert s3_proxied.proxy.exchanges == []

    def test_a_missing_entry_offline_says_no_request_was_made(
        self, s3_proxied: Proxied, tmp_path: Path
    ) -> None:
        """Offline and not cached: no "(no response, 1 attempt)", since nothing was asked;
        the error counts no attempt."""
        environ = {**s3_proxied.environ, "DEVPOLICY_REMOTE_OFFLINE": "1"}
        with pytest.raises(RemoteOfflineError) as caught:
            open_remote(s3_proxied.url, environ=environ, cache_dir=tmp_path)
        assert str(caught.value).endswith("or unset DEVPOLICY_REMOTE_OFFLINE")
        assert "attempt" not in str(caught.value)
        assert (caught.value.attempts, caught.value.status) == (0, None)

    def test_a_damaged_entry_offline_says_its_checksum_failed(
        self, s3_proxied: Proxied, payload: bytes, tmp_path: Path
    ) -> None:
        """Offline, a cached copy whose bytes no longer match its checksum is refused saying
        so (not "not complete in the cache"), and that nothing was asked of the server."""
        base = _cached_then_flipped(s3_proxied, tmp_path)
        s3_proxied.proxy.reset()
        environ = {**s3_proxied.environ, "DEVPOLICY_REMOTE_OFFLINE": "1"}
        with pytest.raises(
            RemoteOfflineError,
            match=rf"^{s3_proxied.url}: offline \(DEVPOLICY_REMOTE_OFFLINE=1\) and the cached "
            rf"copy {base}\.data failed its checksum \(its bytes changed since it was "
            r"fetched\): nothing was asked of the server; load it once online to fetch it "
            r"again, or unset DEVPOLICY_REMOTE_OFFLINE$",
        ) as caught:
            open_remote(s3_proxied.url, environ=environ, cache_dir=tmp_path)
        assert caught.value.attempts == 0
        assert s3_proxied.proxy.exchanges == []

    def test_hf_hub_offline_serves_the_hub_file_from_the_cache(
        self, hub: servers.LocalHub, payload: bytes, tmp_path: Path
    ) -> None:
        """HF_HUB_OFFLINE=1, the Hub's own switch, serves hf:// from the cache with the
        Hub unreachable."""
        url = "hf://org/repo/model.bin"
        online = {"HF_ENDPOINT": hub.url, "HF_TOKEN": servers.HUB_TOKEN, "HF_HOME": str(tmp_path)}
        open_remote(url, environ=online, cache_dir=tmp_path / "c").close()
        gone = {**online, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"}
        cached = open_remote(url, environ=gone, cache_dir=tmp_path / "c")
        try:
            assert isinstance(cached, CachedFile)
            assert cached.path.read_bytes() == payload
        finally:
            cached.close()

    def test_a_bad_offline_value_names_the_variable(self, tmp_path: Path) -> None:
        """DEVPOLICY_REMOTE_OFFLINE takes 1/0 (and true/false, yes/no, on/off) only."""
        with pytest.raises(DevicePolicyError, match=r"DEVPOLICY_REMOTE_OFFLINE.*accepted"):
            open_remote("s3://devpolicy-tests/x.bin", environ={"DEVPOLICY_REMOTE_OFFLINE": "maybe"})


class TestLeftovers:
    def test_a_newer_version_removes_the_older_ones_leftovers(
        self, s3: servers.S3Server, s3_proxied: Proxied, payload: bytes, tmp_path: Path
    ) -> None:
        """Leftovers of a cut-short fill of one version are removed by the fill of a newer
        version of the same URL (they would never be resumed)."""
        key = "ckpt/leftovers.bin"
        url = f"s3://{BUCKET}/{key}"
        s3.put(BUCKET, key, payload)
        s3_proxied.proxy.faults.append(servers.Fault("status", times=1000, applies=_gets))
        with pytest.raises(RemoteReadError):
            open_remote(url, environ=s3_proxied.environ, cache_dir=tmp_path, attempts=1)
        assert len(list(tmp_path.glob("*.partial"))) == 1
        s3_proxied.proxy.reset()
        s3.put(BUCKET, key, payload[::-1])
        open_remote(url, environ=s3_proxied.environ, cache_dir=tmp_path).close()
        assert list(tmp_path.glob("*.partial")) == []
        assert list(tmp_path.glob("*.progress")) == []
