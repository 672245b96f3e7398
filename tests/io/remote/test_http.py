"""The HTTP client under hostile servers: deadlines that hold, redirects that stay where they
may go, and messages that never quote a secret."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import pytest

from devpolicy import DevicePolicyError
from devpolicy._io.remote import RemoteReadError, RemoteURLError, open_remote

from .servers import Asked, Scripted

# Each test talks to real servers (local S3, GCS, Hub and HTTP servers, some of them processes):
# out of the quick subset (`-m "not slow"`), in the full suite.
pytestmark = pytest.mark.slow

SIZE = 4096
BODY = bytes(range(256)) * (SIZE // 256)


def _head(asked: Asked, send: Callable[[bytes], None], extra: str = "") -> bool:
    """Answer a HEAD; True when it was one."""
    if not asked.line.startswith("HEAD"):
        return False
    send(f'HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\nETag: "v1"\r\n{extra}\r\n'.encode())
    return True


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    made: list[Scripted] = []

    def make(answer: Callable[[Asked, Callable[[bytes], None]], None]) -> Scripted:
        made.append(Scripted(answer))
        return made[-1]

    yield make
    for server in made:
        server.close()


class TestDeadline:
    @pytest.mark.parametrize("where", ["headers", "body"])
    def test_a_trickling_server_cannot_hold_a_read_past_total_time(
        self, scripted: Callable[..., Scripted], where: str
    ) -> None:
        """A server sending a byte every 0.2 s (headers, or body) is cut off at `total_time`
        (each wait is short of `timeout`, so only a real deadline stops it)."""

        def answer(asked: Asked, send: Callable[[bytes], None]) -> None:
            if _head(asked, send):
                return
            head = f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-{SIZE - 1}/{SIZE}\r\n"
            head += f'Content-Length: {SIZE}\r\nETag: "v1"\r\n\r\n'
            raw = head.encode() + BODY
            fast = len(head) if where == "body" else 0
            send(raw[:fast])
            for i in range(fast, len(raw)):
                time.sleep(0.2)
                send(raw[i : i + 1])

        server = scripted(answer)
        source = open_remote(
            f"{server.url}/m.bin", environ={}, timeout_seconds=1.0, total_seconds=2.0
        )
        began = time.monotonic()
        try:
            with pytest.raises(RemoteReadError, match="total_time"):
                source.read_into(0, memoryview(bytearray(SIZE)))
        finally:
            source.close()
        # The trickle alone would take over 800 s; the deadline ends it near 2 s.
        assert time.monotonic() - began < 15


class TestRedirects:
    @pytest.mark.parametrize(
        "location",
        ["http://203.0.113.7/m.bin", "file://127.0.0.1/etc/passwd", "ftp://127.0.0.1/m.bin"],
    )
    def test_a_redirect_off_https_or_loopback_http_is_refused_before_connecting(
        self, scripted: Callable[..., Scripted], monkeypatch: pytest.MonkeyPatch, location: str
    ) -> None:
        """A redirect to plain http:// off loopback, or to another scheme, is refused before
        any connection to it is tried."""

        def answer(asked: Asked, send: Callable[[bytes], None]) -> None:
            send(
                f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode()
            )

        server = scripted(answer)
        connected: list[object] = []
        real = socket.create_connection

        def recording(address: tuple[str, int], *args: object, **kw: object) -> socket.socket:
            connected.append(address)
            return real(address, *args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(socket, "create_connection", recording)
        with pytest.raises(RemoteURLError, match=r"redirect.*refused") as caught:
            open_remote(f"{server.url}/m.bin", environ={}, attempts=1)
        assert isinstance(caught.value, DevicePolicyError)
        assert connected == [("127.0.0.1", server.port)]

    def test_credentials_are_dropped_when_the_port_changes(
        self, scripted: Callable[..., Scripted]
    ) -> None:
        """A redirect to another port of the same host gets no credentials."""

        def serve(asked: Asked, send: Callable[[bytes], None]) -> None:
            _head(asked, send)

        target = scripted(serve)

        def answer(asked: Asked, send: Callable[[bytes], None]) -> None:
            send(
                f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {target.url}/m.bin\r\n"
                "Content-Length: 0\r\n\r\n".encode()
            )

        origin = scripted(answer)
        url = f"http://user:pa55word@127.0.0.1:{origin.port}/m.bin"
        open_remote(url, environ={}, attempts=1).close()
        assert "authorization" in origin.asked[0].headers
        assert [a.headers.get("authorization") for a in target.asked] == [None]


class TestNoSecretInMessages:
    def test_a_query_with_a_space_is_refused_without_quoting_it(self) -> None:
        """A URL whose query holds a space is a URL error that never shows the query."""
        with pytest.raises(RemoteURLError) as caught:
            open_remote("http://127.0.0.1:9/m.bin?sig=SECRET value", environ={}, attempts=1)
        assert "SECRET" not in str(caught.value)

    @pytest.mark.parametrize("token", ["hf_SECRETtoken\nsecond", "hf_SECRET\r\nX-Injected: 1"])
    def test_a_token_with_control_characters_is_refused_without_quoting_it(
        self, token: str
    ) -> None:
        """A Hub token holding a line break is refused, naming where it came from, never
        quoting it (nothing is sent)."""
        with pytest.raises(DevicePolicyError, match="HF_TOKEN") as caught:
            open_remote(
                "hf://org/repo/m.bin",
                environ={"HF_TOKEN": token, "HF_ENDPOINT": "http://127.0.0.1:9"},
                attempts=1,
            )
        assert "SECRET" not in str(caught.value)

    def test_user_information_in_an_hf_url_is_never_shown(self) -> None:
        """hf://org/user:SECRET@repo/... is refused without showing the secret."""
        with pytest.raises(RemoteURLError) as caught:
            open_remote("hf://org/u:SECRET@repo/m.bin", environ={})
        assert "SECRET" not in str(caught.value)

    def test_an_overlong_host_is_a_url_error(self) -> None:
        """A 70,000-character host is a RemoteURLError, not a raw UnicodeError."""
        with pytest.raises(RemoteURLError, match="host"):
            open_remote("https://" + "a" * 70_000 + "/m.bin", environ={}, attempts=1)


def _ranged(extra: str = "", validators: str = 'ETag: "v1"\r\n') -> Callable[..., None]:
    """A server of BODY that honours Range, with `extra` headers on data responses."""

    def answer(asked: Asked, send: Callable[[bytes], None]) -> None:
        if asked.line.startswith("HEAD"):
            send(f"HTTP/1.1 200 OK\r\nContent-Length: {SIZE}\r\n{validators}\r\n".encode())
            return
        first, last = (int(x) for x in asked.headers["range"][6:].split("-"))
        body = BODY[first : last + 1]
        head = f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {first}-{last}/{SIZE}\r\n"
        send(f"{head}Content-Length: {len(body)}\r\n{validators}{extra}\r\n".encode() + body)

    return answer


class TestWhatIsTaken:
    def test_an_encoded_body_is_refused_and_identity_asked(
        self, scripted: Callable[..., Scripted]
    ) -> None:
        """A range sent gzip-encoded is never taken as the file's bytes; identity is asked."""
        server = scripted(_ranged("Content-Encoding: gzip\r\n"))
        source = open_remote(f"{server.url}/m.bin", environ={}, attempts=1)
        try:
            with pytest.raises(RemoteReadError, match="Content-Encoding 'gzip'"):
                source.read_into(0, memoryview(bytearray(SIZE)))
        finally:
            source.close()
        assert server.asked[-1].headers["accept-encoding"] == "identity"

    def test_a_server_without_validators_is_refused(
        self, scripted: Callable[..., Scripted]
    ) -> None:
        """A server sending neither ETag nor Last-Modified is refused when opened: a
        replaced file could not be noticed."""
        server = scripted(_ranged(validators=""))
        with pytest.raises(RemoteReadError, match="neither ETag nor Last-Modified"):
            open_remote(f"{server.url}/m.bin", environ={}, attempts=1)

    def test_a_header_read_failure_says_why(self, scripted: Callable[..., Scripted]) -> None:
        """A failure reading a file's header at a URL says what failed, never `None`."""
        import devpolicy

        def answer(asked: Asked, send: Callable[[bytes], None]) -> None:
            if not _head(asked, send):
                send(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")

        server = scripted(answer)
        with pytest.raises(DevicePolicyError) as caught:
            devpolicy.read_metadata(f"{server.url}/m.safetensors", remote={"attempts": 1})
        assert "None" not in str(caught.value)
        assert "status 403" in str(caught.value)
