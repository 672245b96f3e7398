"""Remote reads: devpolicy's source against N concurrent raw ranged GETs, from a local S3 server.

    python benchmarks/bench_remote.py [--size 256MiB] [--runs 3] [--concurrency 8]
        [--clients] [--out benchmarks/results/remote.md]

Starts SeaweedFS's S3 gateway on 127.0.0.1 (the `test` extra installs it), stores one random
object of `--size`, and reads it whole, `--runs` times, methods interleaved, each into one
page-aligned buffer:

- `devpolicy`: `open_remote("s3://...")` then `read_into` (8 MiB chunks on `--concurrency`
  threads, checked and retried);
- `aiohttp raw`: the floor: the same chunks as N concurrent SigV4-signed ranged GETs on one
  aiohttp session, no checks, no retries.

With `--clients` (needs `pip install obstore s3fs` beside the `test` extra) it also compares
the client libraries the source could have been built on (the measurement behind the
choice): obstore (`get_range` on N threads, and `get_ranges`), s3fs (`cat_ranges`), urllib3
on N threads; plus the bytes each pulls for an 8-byte header read
and how each treats three 503s and a body cut short (through the tests' fault proxy).

With `--sharded` it measures instead what the issue asks of a load (`load_file`): one
safetensors checkpoint of `--size` sharded over two processes (`jax.distributed` on
127.0.0.1, two CPU devices each, fresh processes every run, methods interleaved), against
what users write today: fetch the whole object (botocore's `get_object`, streamed to a local
file), then `safetensors.numpy.load_file` and `jax.device_put` with the same sharding. Per
method: the job's time (the slower process), each process's peak host memory (its own
`VmHWM` rise) against the tensor, and the bytes each process fetched (counted at a proxy of
its own) against its share; then the delay three 503s on one range add (through the proxy).

Prints a Markdown table (median seconds, MiB/s, ratio to the floor) with the machine's state,
and writes it to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import mmap
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import PeakRise, child_env, mib
from devpolicy._base.sizes import parse_size
from devpolicy._io.remote import open_remote
from tests.io.remote import servers

BUCKET, KEY = "bench", "big.bin"
Method = Callable[[str, int, mmap.mmap, list[tuple[int, int]]], None]


def _environ(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": servers.S3_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": servers.S3_SECRET_KEY,
        "AWS_REGION": "us-east-1",
    }


def _signer() -> Callable[[str, dict[str, str]], dict[str, str]]:
    import botocore.auth
    import botocore.awsrequest
    import botocore.credentials

    credentials = botocore.credentials.Credentials(servers.S3_ACCESS_KEY, servers.S3_SECRET_KEY)

    def sign(url: str, headers: dict[str, str]) -> dict[str, str]:
        request = botocore.awsrequest.AWSRequest("GET", url, headers=headers)
        botocore.auth.S3SigV4Auth(credentials, "s3", "us-east-1").add_auth(request)
        return dict(request.headers.items())

    return sign


OPEN_SECONDS: list[float] = []


def devpolicy_source(endpoint: str, n: int, buf: mmap.mmap, ranges: list[tuple[int, int]]) -> None:
    began = time.perf_counter()
    source = open_remote(f"s3://{BUCKET}/{KEY}", environ=_environ(endpoint), concurrency=n)
    OPEN_SECONDS.append(time.perf_counter() - began)
    try:
        view = memoryview(buf)
        source.read_many([(a, view[a:b]) for a, b in ranges])
        view.release()
    finally:
        source.close()


def aiohttp_raw(endpoint: str, n: int, buf: mmap.mmap, ranges: list[tuple[int, int]]) -> None:
    import aiohttp

    url, sign, view = f"{endpoint}/{BUCKET}/{KEY}", _signer(), memoryview(buf)

    async def main() -> None:
        gate = asyncio.Semaphore(n)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=n)) as session:

            async def one(a: int, b: int) -> None:
                async with gate:
                    headers = sign(url, {"Range": f"bytes={a}-{b - 1}"})
                    async with session.get(url, headers=headers) as response:
                        position = a
                        async for chunk in response.content.iter_chunked(2**20):
                            view[position : position + len(chunk)] = chunk
                            position += len(chunk)

            await asyncio.gather(*(one(a, b) for a, b in ranges))

    asyncio.run(main())
    view.release()


def urllib3_threads(endpoint: str, n: int, buf: mmap.mmap, ranges: list[tuple[int, int]]) -> None:
    import urllib3

    pool, url, sign, view = (
        urllib3.PoolManager(maxsize=n),
        f"{endpoint}/{BUCKET}/{KEY}",
        _signer(),
        memoryview(buf),
    )

    def one(r: tuple[int, int]) -> None:
        a, b = r
        response = pool.request(
            "GET",
            url,
            headers=sign(url, {"Range": f"bytes={a}-{b - 1}"}),
            preload_content=False,
            retries=False,
        )
        if response.status != 206:
            raise OSError(f"status {response.status}")
        got = 0
        while got < b - a:
            k = response.readinto(view[a + got : b])
            if not k:
                raise OSError("short body")
            got += k
        response.release_conn()

    with ThreadPoolExecutor(n) as executor:
        list(executor.map(one, ranges))
    view.release()


def _obstore(endpoint: str) -> Any:
    from obstore.store import S3Store

    return S3Store(
        BUCKET,
        endpoint=endpoint,
        access_key_id=servers.S3_ACCESS_KEY,
        secret_access_key=servers.S3_SECRET_KEY,
        region="us-east-1",
        client_options={"allow_http": True},
        virtual_hosted_style_request=False,
    )


def obstore_threads(endpoint: str, n: int, buf: mmap.mmap, ranges: list[tuple[int, int]]) -> None:
    import obstore

    store, view = _obstore(endpoint), memoryview(buf)

    def one(r: tuple[int, int]) -> None:
        view[r[0] : r[1]] = memoryview(obstore.get_range(store, KEY, start=r[0], end=r[1]))

    with ThreadPoolExecutor(n) as executor:
        list(executor.map(one, ranges))
    view.release()


def obstore_ranges(endpoint: str, n: int, buf: mmap.mmap, ranges: list[tuple[int, int]]) -> None:
    import obstore

    store, view = _obstore(endpoint), memoryview(buf)
    got = obstore.get_ranges(store, KEY, starts=[a for a, _ in ranges], ends=[b for _, b in ranges])
    for (a, b), part in zip(ranges, got, strict=True):
        view[a:b] = memoryview(part)
    view.release()


def s3fs_ranges(endpoint: str, n: int, buf: mmap.mmap, ranges: list[tuple[int, int]]) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(
        key=servers.S3_ACCESS_KEY,
        secret=servers.S3_SECRET_KEY,
        endpoint_url=endpoint,
        skip_instance_cache=True,
        max_concurrency=n,
    )
    got = fs.cat_ranges(
        [f"{BUCKET}/{KEY}"] * len(ranges), [a for a, _ in ranges], [b for _, b in ranges]
    )
    for (a, b), part in zip(ranges, got, strict=True):
        buf[a:b] = part


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        _worker(*sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--clients", action="store_true")
    parser.add_argument("--sharded", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/remote.md")
    args = parser.parse_args()
    if args.sharded:
        _sharded(parse_size(args.size), args.runs, args.out)
        return
    size, chunk, n = parse_size(args.size), 8 * 2**20, args.concurrency
    methods: dict[str, Method] = {"devpolicy": devpolicy_source, "aiohttp raw (floor)": aiohttp_raw}
    if args.clients:
        methods |= {
            "urllib3 x threads": urllib3_threads,
            "obstore get_range x threads": obstore_threads,
            "obstore get_ranges": obstore_ranges,
            "s3fs cat_ranges": s3fs_ranges,
        }
    load_before = os.getloadavg()
    with (
        tempfile.TemporaryDirectory() as work,
        servers.running(lambda: servers.start_seaweedfs(Path(work))) as s3,
    ):
        data = os.urandom(size)
        s3.put(BUCKET, KEY, data)
        ranges = [(a, min(a + chunk, size)) for a in range(0, size, chunk)]
        buf, zeros = mmap.mmap(-1, size), bytes(size)
        times: dict[str, list[float]] = {name: [] for name in methods}
        for run in range(args.runs + 1):  # the first round warms the server and is dropped
            for name, method in methods.items():
                buf[:] = zeros  # so that a method that leaves bytes out is caught below
                began = time.perf_counter()
                method(s3.url, n, buf, ranges)
                elapsed = time.perf_counter() - began
                if method is devpolicy_source:  # the read alone; opening is reported apart
                    elapsed -= OPEN_SECONDS[-1]
                if buf[:] != data:
                    raise SystemExit(f"{name}: wrong bytes")
                if run:
                    times[name].append(elapsed)
        notes = _behaviour(s3.url, methods, data, chunk) if args.clients else []
    load_after = os.getloadavg()
    floor = statistics.median(times["aiohttp raw (floor)"])
    lines = [
        f"# Remote reads: {args.size} from a local S3 server (SeaweedFS), 8 MiB ranges, N={n}",
        "",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; {args.runs} runs per method, "
        "interleaved, after one warm-up round; one process.",
        "",
        "| method | median s | spread s | MiB/s | throughput vs floor |",
        "|---|---|---|---|---|",
    ]
    for name, values in times.items():
        median = statistics.median(values)
        lines.append(
            f"| {name} | {median:.3f} | {min(values):.3f}-{max(values):.3f} | "
            f"{size / 2**20 / median:.0f} | {floor / median:.2f}x |"
        )
    opens = OPEN_SECONDS[1:]  # the warm-up round's open dropped, as its read is
    lines += [
        "",
        f"devpolicy's rows time the read alone; opening (botocore's client, one HEAD) took "
        f"{statistics.median(opens):.3f} s (median; {min(opens):.3f}-{max(opens):.3f}).",
    ]
    lines += notes
    text = "\n".join(lines) + "\n"
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text, encoding="utf-8")


def _behaviour(endpoint: str, methods: dict[str, Method], data: bytes, chunk: int) -> list[str]:
    """Bytes pulled for an 8-byte read, and three 503s / a cut body, through the fault proxy."""
    lines = [
        "",
        "| method | bytes for an 8-byte read | three 503s | a body cut short |",
        "|---|---|---|---|",
    ]
    proxy = servers.FaultProxy(endpoint)
    buf = mmap.mmap(-1, len(data))
    try:
        for name, method in methods.items():
            proxy.reset()
            method(proxy.url, 1, buf, [(0, 8)])
            pulled = proxy.body_bytes()
            outcomes = []
            for kind in ("status", "cut"):
                proxy.reset()
                proxy.faults.append(
                    servers.Fault(
                        kind,
                        times=3 if kind == "status" else 1,
                        applies=lambda m, p, r: m == "GET" and r is not None,
                    )
                )
                began = time.perf_counter()
                try:
                    method(proxy.url, 1, buf, [(0, chunk)])
                    ok = "exact" if buf[:chunk] == data[:chunk] else "WRONG BYTES"
                except Exception as e:
                    ok = f"error ({type(e).__name__})"
                outcomes.append(f"{ok}, {time.perf_counter() - began:.2f} s")
            lines.append(f"| {name} | {pulled} | {outcomes[0]} | {outcomes[1]} |")
        proxy.reset()
        import s3fs

        fs = s3fs.S3FileSystem(
            key=servers.S3_ACCESS_KEY,
            secret=servers.S3_SECRET_KEY,
            endpoint_url=proxy.url,
            skip_instance_cache=True,
        )
        with fs.open(f"{BUCKET}/{KEY}", "rb") as f:
            f.read(8)
        lines.append(f"| s3fs open().read(8) | {proxy.body_bytes()} | | |")
    finally:
        proxy.close()
    return lines


# --- a sharded load over two processes, against fetch-whole-then-load ------------------


def _worker(method: str, port: str, process: str, endpoint: str, key: str) -> None:
    """One process of the two: load `s3://bench/<key>` by `method`, print a JSON report."""
    import json

    import jax

    jax.config.update("jax_num_cpu_devices", 2)
    jax.config.update("jax_platforms", "cpu")
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    import devpolicy

    os.environ.update(_environ(endpoint))
    jax.distributed.initialize(f"127.0.0.1:{port}", 2, int(process), initialization_timeout=60)
    try:
        import botocore.session
        import safetensors.numpy

        mesh = jax.make_mesh((4,), ("data",), devices=jax.devices())
        sharding = NamedSharding(mesh, PartitionSpec("data"))
        policy = devpolicy.load_policy({
            "version": 1, "meshes": {"dp": {"axes": {"data": -1}, "devices": "cpu"}},
            "rules": [{"match": "*", "sharding": {"mesh": "dp", "spec": ["data"]}}],
        }, environ={})  # fmt: skip
        # Warm-up outside the timed region, alike for both: imports, JAX's first sharded
        # array of each kind, the policy: what a training job has done before it loads.
        with tempfile.TemporaryDirectory() as warm:
            small = os.path.join(warm, "small.safetensors")
            devpolicy.save_file({"w": np.zeros((8, 4), np.float32)}, small)
            devpolicy.load_file(small, policy=policy)
            jax.device_put(safetensors.numpy.load_file(small)["w"], sharding).block_until_ready()
        client = botocore.session.get_session().create_client(
            "s3", endpoint_url=endpoint, region_name="us-east-1",
            aws_access_key_id=servers.S3_ACCESS_KEY,
            aws_secret_access_key=servers.S3_SECRET_KEY,
        )  # fmt: skip
        rise, began = PeakRise(), time.perf_counter()
        fetched = requests = retries = 0
        try:
            out, fetched, requests, retries = _load(method, client, key, sharding, policy)
        except Exception as e:
            # The other process waits for this one in JAX's collectives: leave at once
            # (its parent stops it), never through jax.distributed.shutdown's barrier.
            print(f"{type(e).__name__}: {str(e)[:200]}", file=sys.stderr, flush=True)
            os._exit(3)
        for array in out.values():
            array.block_until_ready()
        seconds = time.perf_counter() - began
        held = sum(s.data.nbytes for a in out.values() for s in a.addressable_shards)
        total = sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in out.values())
        report = {"seconds": seconds, "peak_rise": rise(), "fetched": fetched,
                  "requests": requests, "retries": retries, "held": held,
                  "total": total}  # fmt: skip
        print(json.dumps(report), flush=True)
    finally:
        jax.distributed.shutdown()


def _load(
    method: str, client: Any, key: str, sharding: Any, policy: Any
) -> tuple[dict[str, Any], int, int, int]:
    """(arrays, bytes fetched, requests, retries) of one load by `method`."""
    import jax
    import safetensors.numpy
    from structlog.testing import capture_logs

    import devpolicy

    if method == "devpolicy":
        with capture_logs() as events:
            out = devpolicy.load_file(f"s3://{BUCKET}/{key}", policy=policy)
        summary = next(e for e in events if e["event"] == "load_file")
        return out, summary["bytes_fetched"], summary["requests"], summary["retries"]
    fetched = 0
    body = client.get_object(Bucket=BUCKET, Key=key)["Body"]
    with tempfile.NamedTemporaryFile(suffix=".safetensors") as local:
        for part in iter(lambda: body.read(8 * 2**20), b""):
            local.write(part)
            fetched += len(part)
        local.flush()
        arrays = safetensors.numpy.load_file(local.name)
    out = {k: jax.device_put(v, sharding) for k, v in arrays.items()}
    return out, fetched, 1, 0


class _WorkerError(Exception):
    """A worker of a pair failed (its last line of error in `args[0]`)."""


def _pair(method: str, endpoints: list[str], key: str) -> list[dict[str, Any]]:
    import json
    import subprocess

    port = servers.free_port()
    env = child_env()
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", method, str(port), str(i), endpoint, key],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i, endpoint in enumerate(endpoints)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        if proc.returncode:
            for other in procs:
                if other.poll() is None:
                    other.kill()
                    other.wait()
            raise _WorkerError(err.strip().splitlines()[-1] if err.strip() else "no output")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def _sharded(size: int, runs: int, out: str) -> None:
    import numpy as np

    import devpolicy

    key = "sharded.safetensors"
    methods = {
        "devpolicy load_file (each process its half)": "devpolicy",
        "get_object whole + safetensors.numpy + device_put": "baseline",
    }
    load_before = os.getloadavg()
    with (
        tempfile.TemporaryDirectory() as work,
        servers.running(lambda: servers.start_seaweedfs(Path(work) / "weed")) as s3,
    ):
        local = Path(work) / key
        rows = size // (4 * 4096)
        devpolicy.save_file(
            {"w": np.random.default_rng(0).standard_normal((rows, 4096), np.float32)}, local
        )
        s3.put(BUCKET, key, local.read_bytes())
        local.unlink()
        tensor = rows * 4096 * 4
        results: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in methods}
        for run in range(runs + 1):  # the first round warms the server and is dropped
            for name, method in methods.items():
                reports = _pair(method, [s3.url, s3.url], key)
                if run:
                    results[name].append(reports)
        counted: dict[str, list[int]] = {}
        delays: dict[str, str] = {}
        with (
            servers.running(lambda: servers.FaultProxy(s3.url)) as first,
            servers.running(lambda: servers.FaultProxy(s3.url)) as second,
        ):
            for name, method in methods.items():
                first.reset(), second.reset()
                clean = _pair(method, [first.url, second.url], key)[0]["seconds"]
                counted[name] = [first.body_bytes(), second.body_bytes()]
                first.reset(), second.reset()
                first.faults.append(servers.Fault(
                    "status", times=3, applies=lambda m, p, r: m == "GET" and "x-id" not in p
                    and (r is None or not r.startswith("bytes=0-65535"))))  # fmt: skip
                try:
                    faulted = _pair(method, [first.url, second.url], key)[0]
                    delays[name] = (
                        f"{faulted['seconds'] - clean:+.2f} s ({faulted['retries']} retries)"
                    )
                except _WorkerError as e:
                    # "... (reached max retries: 2): Service Unavailable" -> 3 attempts
                    tries = re.search(r"max retries: (\d+)", e.args[0])
                    kind = e.args[0].split(":")[0]
                    delays[name] = (
                        f"fails after {int(tries.group(1)) + 1} attempts ({kind})"
                        if tries
                        else f"fails: {e.args[0][:60]}"
                    )
    load_after = os.getloadavg()
    lines = [
        f"# A sharded load over two processes: {mib(tensor)} from a local S3 server",
        "",
        f"Machine: {os.cpu_count()} cores, Python {platform.python_version()}, load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after; two processes under "
        "jax.distributed on 127.0.0.1 (two CPU devices each, the tensor sharded in halves "
        f"by rows), fresh processes every run, {runs} runs per method, interleaved, after one "
        "warm-up round.",
        "",
        "| method | median s (the slower process) | vs fetch-whole | peak host memory per "
        "process / tensor | bytes fetched per process / its share | three 503s add |",
        "|---|---|---|---|---|---|",
    ]
    medians = {
        name: statistics.median(max(r["seconds"] for r in reports) for reports in runs_)
        for name, runs_ in results.items()
    }
    base = medians["get_object whole + safetensors.numpy + device_put"]
    for name, runs_ in results.items():
        peaks = [r["peak_rise"] for reports in runs_ for r in reports]
        peak = "n/a" if None in peaks else f"{max(peaks) / tensor:.2f}x"
        share = tensor / 2
        fetched = max(counted[name]) / share
        lines.append(
            f"| {name} | {medians[name]:.2f} | {medians[name] / base:.2f}x | "
            f"{peak} | {fetched:.3f}x | {delays[name]} |"
        )
    lines += [
        "",
        "Timed: the load alone, after the same warm-up in both (imports, the policy, JAX's "
        "first sharded arrays); peak host memory: the process's own VmHWM rise over the load. "
        "Bytes are counted at a proxy in front of each process (the header's small read "
        "included); the delay of three 503s on one data range is one faulted run against one "
        "clean run through the same proxies, in the process whose proxy answers 503 "
        "(`get_object` with botocore's default retries).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    path = Path(out)
    previous = path.read_text(encoding="utf-8") if path.exists() else ""
    marker = "# A sharded load over two processes"
    kept = previous.split(marker, 1)[0].rstrip()
    path.write_text((kept + "\n\n" if kept else "") + text, encoding="utf-8")


if __name__ == "__main__":
    main()
