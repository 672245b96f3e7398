"""Saving to object storage: `devpolicy.save_file(tree, "s3://...")` against what users write
today, side by side in one run, against a local S3 server.

    python benchmarks/bench_upload.py [--size 512MiB] [--runs 3]
        [--out benchmarks/results/upload.md]

Starts SeaweedFS's S3 gateway on 127.0.0.1 (the `test` extra installs it). Each run is a
fresh process that builds a tree of float32 tensors of `--size` in all (64 MiB kernels
and small vectors), then saves it, methods interleaved:

- `devpolicy`: `save_file(tree, "s3://bench/...")`: one multipart upload, 8 MiB parts
  assembled from the arrays, eight at a time;
- `local file + upload`: `safetensors.numpy.save_file` to a local file (the page cache
  warm, a fast disk), then the file uploaded as boto3's `upload_file` does by default
  (8 MiB parts on 10 threads; here with botocore, which boto3 calls);
- `local file only`: the first half of the above, for scale.

Per method: the median time and its spread, and the process's peak RSS rise (its own
`VmHWM`) over the tree it started with, against the tree's size. Prints a Markdown table
with the machine's state and writes it to `--out`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import child_env, machine_state, markdown_table, median_known, run_child
from devpolicy._base.sizes import format_size, parse_size
from tests.io.remote import servers

BUCKET = "bench"

CHILD = r"""
import json, os, sys, time, tempfile
from concurrent.futures import ThreadPoolExecutor
import numpy as np
from benchmarks._common import PeakRise

method, size, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(0)
kernels = max(1, size // (64 * 2**20))
tree = {f"layers/{i}/kernel": rng.standard_normal((4096, 4096), np.float32) for i in range(kernels)}
tree.update({f"layers/{i}/bias": rng.standard_normal(4096, np.float32) for i in range(kernels)})
import devpolicy, botocore.session, botocore.config
from safetensors.numpy import save_file as plain_save
policy = devpolicy.load_policy({"version": 1, "logging": {"level": "error"}}, environ={})
rise = PeakRise()
started = time.perf_counter()
if method == "devpolicy":
    devpolicy.save_file(tree, f"s3://bench/{key}", policy=policy)
else:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        path = os.path.join(tmp, "model.safetensors")
        plain_save(tree, path)
        if method == "local+upload":
            client = botocore.session.get_session().create_client(
                "s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1",
                config=botocore.config.Config(s3={"addressing_style": "path"},
                                              max_pool_connections=10))
            upload = client.create_multipart_upload(Bucket="bench", Key=key)["UploadId"]
            chunk = 8 * 2**20
            total = os.path.getsize(path)

            def part(number):
                with open(path, "rb") as f:
                    f.seek((number - 1) * chunk)
                    body = f.read(chunk)
                tag = client.upload_part(Bucket="bench", Key=key, UploadId=upload,
                                         PartNumber=number, Body=body)["ETag"]
                return {"PartNumber": number, "ETag": tag}

            with ThreadPoolExecutor(10) as pool:
                parts = list(pool.map(part, range(1, -(-total // chunk) + 1)))
            client.complete_multipart_upload(Bucket="bench", Key=key, UploadId=upload,
                                             MultipartUpload={"Parts": parts})
seconds = time.perf_counter() - started
nbytes = sum(v.nbytes for v in tree.values())
print(json.dumps({"seconds": seconds, "rise": rise(), "nbytes": nbytes}))
"""

METHODS = ("devpolicy", "local+upload", "local only")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="512MiB")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    size = parse_size(args.size)
    lines = [f"`python benchmarks/bench_upload.py --size {args.size} --runs {args.runs}`", ""]
    lines += machine_state().lines()
    with tempfile.TemporaryDirectory() as work:
        s3 = servers.start_seaweedfs(Path(work) / "seaweedfs")
        try:
            s3.put(BUCKET, "warm", b"x")
            env = child_env() | {
                "AWS_ENDPOINT_URL": s3.url,
                "AWS_ACCESS_KEY_ID": servers.S3_ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": servers.S3_SECRET_KEY,
                "AWS_REGION": "us-east-1",
                "BENCH_DIR": work,
            }
            results: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
            for run in range(args.runs + 1):  # the first round warms up, not counted
                for method in METHODS:
                    key = f"{method}-{run}"
                    done = run_child(CHILD, method, size, key, what=method, env=env)[-1]
                    if run:
                        results[method].append(done)
        finally:
            s3.kill()
    nbytes = results["devpolicy"][0]["nbytes"]
    lines += [f"- tree: {format_size(int(nbytes))} of float32 (64 MiB kernels, 16 KiB biases)", ""]
    lines += [
        f"`--runs {args.runs}` fresh processes per method, interleaved, after one warm-up round.",
        "",
    ]
    anchor = statistics.median(r["seconds"] for r in results["local+upload"])
    rows = []
    for method in METHODS:
        times = [r["seconds"] for r in results[method]]
        rise = median_known(r["rise"] for r in results[method])
        rows.append(
            [
                method,
                f"{statistics.median(times):.3f}",
                f"{min(times):.3f}-{max(times):.3f}",
                f"{statistics.median(times) / anchor:.2f}",
                "n/a" if rise is None else f"{rise / nbytes:.2f}x",
            ]
        )
    heads = ["method", "median s", "best-worst s", "x local file + upload", "peak RSS rise / tree"]
    lines += markdown_table(heads, rows)
    lines += ["", "- load average at end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(f"# Saving to S3 (SeaweedFS on 127.0.0.1)\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
