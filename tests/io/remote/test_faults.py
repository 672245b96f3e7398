"""Faults are survived where they can be, and never give wrong bytes where they cannot."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from devpolicy._io.remote import (
    ObjectChangedError,
    RangeIgnoredError,
    RemoteReadError,
    open_remote,
)

from . import servers
from .conftest import BUCKET, Proxied, s3_environ

# Each test talks to real servers (local S3, GCS, Hub and HTTP servers, some of them processes):
# out of the quick subset (`-m "not slow"`), in the full suite.
pytestmark = pytest.mark.slow


def _gets(method: str, path: str, range_: str | None) -> bool:
    return method == "GET" and range_ is not None


def _read_all(proxied: Proxied, **options: Any) -> tuple[bytes, Any, list[dict[str, Any]]]:
    source = open_remote(proxied.url, environ=proxied.environ, chunk_bytes=2**20, **options)
    try:
        buffer = bytearray(source.size)
        with capture_logs() as events:
            source.read_into(0, memoryview(buffer))
        return bytes(buffer), source.counters, events
    finally:
        source.close()


class TestRetried:
    def test_three_503s_cost_a_bounded_delay_and_exact_bytes(
        self, s3_proxied: Proxied, payload: bytes
    ) -> None:
        """Three 503s on one range are retried with backoffs adding up to at most 0.7 s."""
        s3_proxied.proxy.faults.append(servers.Fault("status", times=3, status=503, applies=_gets))
        data, counters, events = _read_all(s3_proxied)
        assert data == payload
        retries = [e for e in events if e["event"] == "remote_retry"]
        assert [e["status"] for e in retries] == [503, 503, 503]
        assert sum(e["delay_s"] for e in retries) <= 0.1 + 0.2 + 0.4
        assert counters.retries == 3

    @pytest.mark.parametrize("status", [429, 500, 502, 504])
    def test_other_transient_statuses_are_retried(
        self, https_proxied: Proxied, payload: bytes, status: int
    ) -> None:
        """429 and 5xx statuses are retried like 503."""
        https_proxied.proxy.faults.append(
            servers.Fault("status", times=2, status=status, applies=_gets)
        )
        data, counters, _ = _read_all(https_proxied)
        assert data == payload
        assert counters.retries == 2

    def test_a_cut_body_is_retried_for_what_is_missing(
        self, s3_proxied: Proxied, payload: bytes
    ) -> None:
        """A body cut short is retried from its first missing byte, not from the start."""
        s3_proxied.proxy.faults.append(servers.Fault("cut", times=1, keep=0.5, applies=_gets))
        data, counters, _events = _read_all(s3_proxied)
        assert data == payload
        assert counters.retries == 1
        assert counters.bytes == len(payload)
        starts = [
            int(e.range[6:].split("-")[0])
            for e in s3_proxied.proxy.data_exchanges()
            if e.fault is None and e.range
        ]
        assert [s for s in starts if s % 2**20], "no request resumed mid-chunk"

    def test_a_reset_is_retried(self, https_proxied: Proxied, payload: bytes) -> None:
        """A connection reset before the answer is retried."""
        https_proxied.proxy.faults.append(servers.Fault("reset", times=2, applies=_gets))
        data, counters, _ = _read_all(https_proxied)
        assert data == payload
        assert counters.retries == 2

    def test_a_slow_response_times_out_and_is_retried(
        self, https_proxied: Proxied, payload: bytes
    ) -> None:
        """A response slower than the timeout is given up and asked again."""
        https_proxied.proxy.faults.append(servers.Fault("slow", times=1, delay=3.0, applies=_gets))
        data, counters, events = _read_all(https_proxied, timeout_seconds=0.5)
        assert data == payload
        assert counters.retries == 1
        assert [e["problem"] for e in events if e["event"] == "remote_retry"] == [
            "timed out waiting for bytes"
        ]

    def test_giving_up_names_url_range_status_and_attempts(self, s3_proxied: Proxied) -> None:
        """A fault that outlasts the attempts is an error naming the URL, range, status, attempts
        (the range that failed first: the others stop then)."""
        s3_proxied.proxy.faults.append(
            servers.Fault("status", times=100, status=503, applies=_gets)
        )
        with pytest.raises(
            RemoteReadError,
            match=r"^s3://devpolicy-tests/ckpt/model\.bin bytes [0-9]+-[0-9]+: status 503; gave up after 3 attempts \(status 503, 3 attempts\)$",
        ):
            _read_all(s3_proxied, attempts=3, backoff_seconds=0.01)


class TestRefused:
    def test_a_server_that_ignores_range_is_an_error(self, plain_http: servers.Child) -> None:
        """http.server answers a ranged GET with the whole file: an error naming URL and range."""
        source = open_remote(plain_http.url + "/model.bin", environ={})
        try:
            with pytest.raises(
                RangeIgnoredError,
                match=r"^http://127\.0\.0\.1:[0-9]+/model\.bin bytes 65536-1114111: the server ignored Range and sent the whole object \(status 200\).*\(status 200, 1 attempt\)$",
            ):
                source.read_into(65536, memoryview(bytearray(2**20)))
        finally:
            source.close()

    def test_a_proxy_dropping_range_is_an_error(self, https_proxied: Proxied) -> None:
        """A Range dropped on the way (the whole object comes back) is never taken as the range."""
        https_proxied.proxy.faults.append(servers.Fault("ignore_range", times=1, applies=_gets))
        # Ranges are read concurrently: whichever reaches the proxy first meets the fault.
        with pytest.raises(
            RangeIgnoredError, match=r"model.bin bytes \d+-\d+: the server ignored Range"
        ):
            _read_all(https_proxied)

    def test_an_s3_object_replaced_mid_load_is_an_error(
        self, s3: servers.S3Server, payload: bytes
    ) -> None:
        """An object replaced between open and a data read is an error naming URL and range."""
        s3.put(BUCKET, "ckpt/replaced.bin", payload)
        source = open_remote(f"s3://{BUCKET}/ckpt/replaced.bin", environ=s3_environ(s3.url))
        try:
            s3.put(BUCKET, "ckpt/replaced.bin", payload[::-1])
            with pytest.raises(
                ObjectChangedError,
                match=r"^s3://devpolicy-tests/ckpt/replaced\.bin bytes 0-65535: the object changed since it was opened",
            ):
                source.read_into(100, memoryview(bytearray(100)))
        finally:
            source.close()

    def test_a_gcs_object_replaced_mid_load_is_an_error(
        self, gcs: servers.GcsServer, payload: bytes
    ) -> None:
        """A new generation of a GCS object after open is an error, never its bytes."""
        gcs.put(BUCKET, "ckpt/replaced.bin", payload)
        source = open_remote(
            f"gs://{BUCKET}/ckpt/replaced.bin", environ={"STORAGE_EMULATOR_HOST": gcs.url}
        )
        try:
            gcs.put(BUCKET, "ckpt/replaced.bin", payload[::-1] + b"more")
            with pytest.raises(
                ObjectChangedError,
                match=r"^gs://devpolicy-tests/ckpt/replaced\.bin bytes 0-65535: the object changed",
            ):
                source.read_into(100, memoryview(bytearray(100)))
        finally:
            source.close()


class TestNoCredentialShown:
    def test_events_and_errors_never_show_a_credential(
        self, s3_proxied: Proxied, hub: servers.LocalHub, tmp_path: Any
    ) -> None:
        """Retries and failures of signed reads show no key, secret, token or signature."""
        s3_proxied.proxy.faults.append(
            servers.Fault("status", times=100, status=503, applies=_gets)
        )
        texts = []
        with capture_logs() as events:
            source = open_remote(
                s3_proxied.url, environ=s3_proxied.environ, attempts=2, backoff_seconds=0.01
            )
            try:
                with pytest.raises(RemoteReadError) as failed_read:
                    source.read_into(0, memoryview(bytearray(source.size)))
                texts.append(str(failed_read.value))
            finally:
                source.close()
            with pytest.raises(RemoteReadError) as failed_open:
                open_remote(
                    "hf://org/repo/nope.bin",
                    environ={"HF_ENDPOINT": hub.url, "HF_TOKEN": servers.HUB_TOKEN},
                )
            texts.append(str(failed_open.value))
        texts += [repr(e) for e in events]
        assert len(texts) >= 3
        for secret in (
            servers.S3_ACCESS_KEY,
            servers.S3_SECRET_KEY,
            servers.HUB_TOKEN,
            "Signature",
            "Credential",
        ):
            assert not any(secret in text for text in texts), secret


class TestFailFast:
    @pytest.mark.parametrize("kind", ["reset", "status"])
    @pytest.mark.parametrize("concurrency", [1, 4])
    def test_the_first_range_to_fail_for_good_ends_the_read(
        self, s3_proxied: Proxied, kind: str, concurrency: int
    ) -> None:
        """A server failing every data request (dead, or a 503 storm) is given up on once
        one range has spent its attempts: the other ranges stop, one error is raised, and
        the requests are bounded by attempts x concurrency, not attempts x ranges."""
        s3_proxied.proxy.faults.append(servers.Fault(kind, times=10_000, status=503, applies=_gets))
        source = open_remote(
            s3_proxied.url, environ=s3_proxied.environ, chunk_bytes=64 * 2**10,
            concurrency=concurrency, attempts=3, backoff_seconds=0.01,
        )  # fmt: skip
        try:
            with pytest.raises(RemoteReadError, match="gave up after 3 attempts"):
                source.read_into(0, memoryview(bytearray(source.size)))
            sent = len(s3_proxied.proxy.data_exchanges())
            assert sent <= 3 * concurrency, f"{sent} requests for a dead server"
        finally:
            source.close()

    def test_an_unreachable_server_is_not_asked_again_by_later_reads(
        self, s3_proxied: Proxied
    ) -> None:
        """After a read found the server unreachable (no answer at all), a later read of the
        same object fails at once, asking nothing."""
        s3_proxied.proxy.faults.append(servers.Fault("reset", times=10_000, applies=_gets))
        source = open_remote(s3_proxied.url, environ=s3_proxied.environ, attempts=2,
                             backoff_seconds=0.01)  # fmt: skip
        try:
            with pytest.raises(RemoteReadError):
                source.read_into(2**20, memoryview(bytearray(2**20)))
            before = len(s3_proxied.proxy.data_exchanges())
            with pytest.raises(RemoteReadError, match="unreachable"):
                source.read_into(0, memoryview(bytearray(2**20)))
            assert len(s3_proxied.proxy.data_exchanges()) == before
        finally:
            source.close()
