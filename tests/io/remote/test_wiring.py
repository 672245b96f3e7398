"""URLs wherever a path is taken: load_file, into=, plan, read_metadata, the command line.

Every scheme against its real local server: the same arrays on the same devices as the local
file, by the same rules (`file:` globs on the object's path too); folders and indexes chosen
as locally; the load event counts the fetch; the plan predicts it; no credential shows.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections import Counter
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._base import locations
from devpolicy._cli.main import main as cli_main
from devpolicy._io.remote import RemoteExtraMissingError, urls
from tests.conftest import REPO

from . import servers
from .conftest import BUCKET, Checkpoints, Proxied, s3_environ

# Each test talks to real servers (local S3, GCS, Hub and HTTP servers, some of them processes):
# out of the quick subset (`-m "not slow"`), in the full suite.
pytestmark = pytest.mark.slow

_TEXT = devpolicy.inventory().text


@dataclass
class Remote:
    """One scheme's URLs of the checkpoints, and the environment that reaches its server."""

    scheme: str
    single: str
    folder: str
    environ: dict[str, str]


@pytest.fixture(params=["s3", "gs", "hf", "hf-dataset", "https"])
def remote(
    request: pytest.FixtureRequest, served_root: Path, monkeypatch: pytest.MonkeyPatch
) -> Remote:
    """The checkpoints at each scheme's URLs, its server's environment set."""
    scheme = request.param
    if scheme == "s3":
        server = request.getfixturevalue("s3")
        found = Remote(
            scheme,
            f"s3://{BUCKET}/ckpt/model.safetensors",
            f"s3://{BUCKET}/sharded",
            s3_environ(server.url),
        )
    elif scheme == "gs":
        server = request.getfixturevalue("gcs")
        found = Remote(
            scheme,
            f"gs://{BUCKET}/ckpt/model.safetensors",
            f"gs://{BUCKET}/sharded/",
            {"STORAGE_EMULATOR_HOST": server.url},
        )
    elif scheme.startswith("hf"):
        hub = request.getfixturevalue("hub")
        environ = {
            "HF_ENDPOINT": hub.url,
            "HF_TOKEN": servers.HUB_TOKEN,
            "HF_HOME": str(served_root / "none"),
        }
        if scheme == "hf":
            found = Remote(scheme, "hf://org/repo/model.safetensors", "hf://org/sharded", environ)
        else:
            found = Remote(
                scheme,
                "hf://datasets/org/tokens@main/train/model.safetensors",
                "hf://datasets/org/tokens/train",
                environ,
            )
    else:
        url = request.getfixturevalue("rclone").url
        found = Remote(scheme, f"{url}/ckpt/model.safetensors", f"{url}/sharded/", {})
    for name, value in found.environ.items():
        monkeypatch.setenv(name, value)
    return found


def _policy(**extra: Any) -> devpolicy.Policy:
    return devpolicy.load_policy(
        {
            "version": 1,
            "default": "cpu:0",
            "rules": [
                {"file": "model.safetensors", "match": "*/layers/*", "device": "cpu:1"},
                {"match": "*/embed", "device": "cpu:2"},
            ],
            **extra,
        },
        environ={},
    )


def _same(local: dict[str, jax.Array], remote: dict[str, jax.Array]) -> None:
    assert list(remote) == list(local)
    for key, array in local.items():
        assert np.array_equal(np.asarray(remote[key]), np.asarray(array)), key
        assert [_TEXT(d) for d in remote[key].devices()] == [_TEXT(d) for d in array.devices()]


class TestEveryScheme:
    def test_a_file_loads_as_the_local_file_does(
        self, remote: Remote, checkpoints: Checkpoints
    ) -> None:
        """Each scheme loads the same arrays onto the same devices as the local file, by the
        same rules (the `file:` glob on the object's name too), and the load event counts
        the fetch under the URL as shown."""
        policy = _policy()
        local = devpolicy.load_file(checkpoints.single, policy=policy)
        with capture_logs() as events:
            loaded = devpolicy.load_file(remote.single, policy=policy)
        _same(local, loaded)
        assert _TEXT(*loaded["layers/0/w"].devices()) == "cpu:1"
        (summary,) = [e for e in events if e["event"] == "load_file"]
        assert summary["file"] == remote.single
        assert summary["requests"] >= 3
        assert summary["retries"] == 0
        size = checkpoints.single.stat().st_size
        assert size <= summary["bytes_fetched"] <= size + 64 * 2**10
        assert summary["mapped"] == 0

    def test_a_folder_loads_its_index_files(self, remote: Remote, checkpoints: Checkpoints) -> None:
        """A folder at a URL is chosen from as a local one (its index and the files it names;
        the Hub dataset's folder: its model.safetensors beside another file), named by the
        folder's name."""
        policy = _policy()
        local_path = checkpoints.sharded if remote.scheme != "hf-dataset" else checkpoints.single
        local = devpolicy.load_file(local_path, policy=policy, prefix="x")
        loaded = devpolicy.load_file(remote.folder, policy=policy, prefix="x")
        _same(local, loaded)
        planned = devpolicy.plan(remote.folder, policy=policy)
        stem = "train" if remote.scheme == "hf-dataset" else "sharded"
        assert {t.name.split("/")[0] for t in planned.tensors} == {stem}

    def test_plan_and_metadata_read_only_the_header(
        self, remote: Remote, checkpoints: Checkpoints
    ) -> None:
        """`plan` and `read_metadata` of a URL give what they give locally."""
        policy = _policy()
        local = devpolicy.plan(checkpoints.single, policy=policy)
        planned = devpolicy.plan(remote.single, policy=policy)
        assert [(t.name, t.decision and t.decision.device_text) for t in planned.tensors] == [
            (t.name, t.decision and t.decision.device_text) for t in local.tensors
        ]
        assert planned.file == remote.single
        assert devpolicy.read_metadata(remote.single) == {"format": "devpolicy-tests"}
        (fetch,) = planned.fetches
        assert fetch.file == remote.single
        assert fetch.share == sum(t.nbytes for t in planned.tensors)

    def test_each_url_a_load_meets_is_parsed_once(
        self, remote: Remote, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The path a load names is located once, and every URL it meets (that one, a
        folder's files, an index) is parsed once: the parsed value flows down to the listing
        and to the object's opening, which never parse it again."""
        located: Counter[str] = Counter()
        parsed: Counter[str] = Counter()

        real_location, real_parse = locations.location, urls.parse_url

        def locate(path: Any) -> Any:
            located[str(path)] += 1
            return real_location(path)

        def parse(url: str, *, folder: bool = False) -> Any:
            parsed[url] += 1
            return real_parse(url, folder=folder)

        # Wherever devpolicy took either by name: its modules that locate and parse.
        for module in [m for n, m in sys.modules.items() if n.startswith("devpolicy.")]:
            if getattr(module, "location", None) is real_location:
                monkeypatch.setattr(module, "location", locate)
            if getattr(module, "parse_url", None) is real_parse:
                monkeypatch.setattr(module, "parse_url", parse)
        for url in (remote.single, remote.folder):
            located.clear()
            parsed.clear()
            devpolicy.load_file(url, policy=_policy(), prefix="x")
            assert located[url] == 1
            assert parsed
            assert max(parsed.values()) == 1, parsed


class TestWhatIsFetched:
    def test_the_plan_predicts_the_requests_and_bytes_of_the_load(
        self, s3_proxied: Proxied, monkeypatch: pytest.MonkeyPatch, checkpoints: Checkpoints
    ) -> None:
        """`plan` reads only the header (two requests: the object's size, then one small
        ranged read) and predicts what the load then sends, request for request."""
        s3_proxied.setenv(monkeypatch)
        url = f"s3://{BUCKET}/ckpt/model.safetensors"
        policy = _policy(remote={"chunk": "256KiB"})
        planned = devpolicy.plan(url, policy=policy)
        seen = s3_proxied.proxy.exchanges
        assert len(seen) == 2
        assert s3_proxied.proxy.body_bytes() <= 64 * 2**10
        s3_proxied.proxy.reset()
        with capture_logs() as events:
            devpolicy.load_file(url, policy=policy)
        (summary,) = [e for e in events if e["event"] == "load_file"]
        (fetch,) = planned.fetches
        assert (fetch.requests, fetch.nbytes) == (summary["requests"], summary["bytes_fetched"])
        assert len(s3_proxied.proxy.exchanges) == fetch.requests
        assert s3_proxied.proxy.body_bytes() == fetch.nbytes
        assert "fetch s3://devpolicy-tests/ckpt/model.safetensors:" in str(planned)

    def test_a_sharded_tensor_fetches_only_the_slices_held(
        self, s3_proxied: Proxied, monkeypatch: pytest.MonkeyPatch, checkpoints: Checkpoints
    ) -> None:
        """Sharded over two of this process's four devices' columns, a tensor is still read
        whole (every slice is held here), joined into few requests, values exact; the plan
        says the same bytes."""
        s3_proxied.setenv(monkeypatch)
        url = f"s3://{BUCKET}/ckpt/model.safetensors"
        policy = devpolicy.load_policy(
            {
                "version": 1,
                "meshes": {"m": {"axes": {"data": 2, "model": 2}, "devices": "cpu"}},
                "rules": [{"match": "*/embed", "sharding": {"mesh": "m", "spec": [None, "model"]}}],
                "default": "cpu:0",
            },
            environ={},
        )
        planned = devpolicy.plan(url, policy=policy)
        with capture_logs() as events:
            loaded = devpolicy.load_file(url, policy=policy)
        local = devpolicy.load_file(checkpoints.single, policy=policy)
        assert np.array_equal(np.asarray(loaded["embed"]), np.asarray(local["embed"]))
        assert loaded["embed"].sharding.is_equivalent_to(local["embed"].sharding, 2)
        (summary,) = [e for e in events if e["event"] == "load_file"]
        (fetch,) = planned.fetches
        assert (fetch.requests, fetch.nbytes) == (summary["requests"], summary["bytes_fetched"])

    def test_three_503s_during_a_load_are_retried_and_counted(
        self, s3_proxied: Proxied, monkeypatch: pytest.MonkeyPatch, checkpoints: Checkpoints
    ) -> None:
        """Three 503s on one data range cost retries the load event reports; bytes exact."""
        s3_proxied.setenv(monkeypatch)
        s3_proxied.proxy.faults.append(
            servers.Fault("status", times=3, applies=lambda m, p, r: m == "GET" and r is not None
                          and not r.startswith("bytes=0-"))
        )  # fmt: skip
        with capture_logs() as events:
            loaded = devpolicy.load_file(s3_proxied.url.replace("model.bin", "model.safetensors"),
                                         policy=_policy())  # fmt: skip
        _same(devpolicy.load_file(checkpoints.single, policy=_policy()), loaded)
        (summary,) = [e for e in events if e["event"] == "load_file"]
        assert summary["retries"] == 3
        assert [e["status"] for e in events if e["event"] == "remote_retry"] == [503] * 3


class TestNarrowing:
    def test_64_bit_tensors_narrow_as_from_the_local_file(
        self, remote: Remote, checkpoints: Checkpoints
    ) -> None:
        """With x64 off, a URL's 64-bit tensors (a large one read in groups, a small one in
        a run) are narrowed exactly as the local file's, with the same `narrowed` events."""
        if remote.scheme.startswith("hf"):
            pytest.skip("the Hub's repositories hold other files")
        url = remote.single.replace("model.safetensors", "wide.safetensors")
        policy = _policy()
        with capture_logs() as local_events:
            local = devpolicy.load_file(checkpoints.wide, policy=policy)
        with capture_logs() as events:
            loaded = devpolicy.load_file(url, policy=policy)
        _same(local, loaded)
        assert loaded["ids"].dtype == np.int32
        narrowed = [(e["name"], e["to_dtype"]) for e in events if e["event"] == "narrowed"]
        assert narrowed == [
            (e["name"], e["to_dtype"]) for e in local_events if e["event"] == "narrowed"
        ]
        assert len(narrowed) == 2


class TestInto:
    def test_a_tree_is_filled_from_a_url(self, remote: Remote, checkpoints: Checkpoints) -> None:
        """`into=` fills a tree from a URL as from the local file."""
        shapes = {
            "embed": jax.ShapeDtypeStruct((512, 1024), np.float32),
            "norm": jax.ShapeDtypeStruct((1024,), np.float32),
        }
        policy = _policy()
        out = devpolicy.load_file(remote.single, into=shapes, policy=policy, strict=False)
        local = devpolicy.load_file(checkpoints.single, into=shapes, policy=policy, strict=False)
        for key in shapes:
            assert np.array_equal(np.asarray(out[key]), np.asarray(local[key]))


class TestOptions:
    def test_the_policy_then_the_environment_then_the_call(
        self, s3_proxied: Proxied, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`remote:` in the policy sets the chunk size; DEVPOLICY_REMOTE_CHUNK overrides it;
        `remote=` overrides both (seen in the requests the plan predicts)."""
        s3_proxied.setenv(monkeypatch)
        url = f"s3://{BUCKET}/ckpt/model.safetensors"
        document = {"version": 1, "remote": {"chunk": "128KiB"}}
        by_file = devpolicy.load_policy(document, environ={})
        by_env = devpolicy.load_policy(document, environ={"DEVPOLICY_REMOTE_CHUNK": "1MiB"})
        requests = [
            devpolicy.plan(url, policy=by_file).fetch_requests,
            devpolicy.plan(url, policy=by_env).fetch_requests,
            devpolicy.plan(url, policy=by_env, remote={"chunk": "64MiB"}).fetch_requests,
        ]
        assert requests[0] > requests[1] > requests[2]
        assert by_env.settings.remote["chunk"].origin == "env:DEVPOLICY_REMOTE_CHUNK"
        assert by_file.settings.remote["chunk"].origin == "<mapping>:remote.chunk"

    def test_a_bad_remote_field_names_the_file_line_and_choices(self, tmp_path: Path) -> None:
        """A policy's `remote:` value out of range is an error at its line, with the forms."""
        path = tmp_path / "p.yaml"
        path.write_text("version: 1\nremote:\n  concurrency: 1000\n")
        with pytest.raises(
            devpolicy.PolicyError,
            match=r"p\.yaml:3: remote\.concurrency: out of range; accepted: a whole number from 1 to 256",
        ):
            devpolicy.load_policy(path, environ={})

    def test_a_bad_call_option_lists_the_known_ones(self, remote: Remote) -> None:
        """An unknown `remote=` field is an error listing the fields."""
        with pytest.raises(
            devpolicy.DevicePolicyError, match=r"unknown option; accepted: concurrency, chunk"
        ):
            devpolicy.load_file(remote.single, policy=_policy(), remote={"chunks": 4})


class TestCache:
    def test_second_load_fetches_no_data_and_maps(
        self,
        s3_proxied: Proxied,
        monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path,
        checkpoints: Checkpoints,
    ) -> None:
        """With a cache (the policy's `remote: cache`), the first load fetches the file once;
        the second sends no data request and maps the cached file (file-backed arrays)."""
        s3_proxied.setenv(monkeypatch)
        url = f"s3://{BUCKET}/ckpt/model.safetensors"
        policy = _policy(remote={"cache": str(tmp_path / "cache")})
        first = devpolicy.load_file(url, policy=policy, mmap=True)
        assert s3_proxied.proxy.body_bytes() >= checkpoints.single.stat().st_size
        s3_proxied.proxy.reset()
        with capture_logs() as events:
            second = devpolicy.load_file(url, policy=policy, mmap=True)
        assert s3_proxied.proxy.data_exchanges() == []
        (summary,) = [e for e in events if e["event"] == "load_file"]
        assert summary["mapped"] == len(second)
        assert summary["file_backed"] is True
        assert summary["bytes_fetched"] == 0
        assert summary["cached"].startswith(str(tmp_path / "cache"))
        _same(first, second)

    def test_an_index_is_never_read_through_the_cache(
        self, s3_proxied: Proxied, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """A folder loaded with DEVPOLICY_REMOTE_CACHE set: its two files are cached; its
        index, a small file read whole, is not (the environment was weighed once, with
        the policy's layers, not again for the index)."""
        s3_proxied.setenv(monkeypatch)
        monkeypatch.setenv("DEVPOLICY_REMOTE_CACHE", str(tmp_path / "cache"))
        policy = devpolicy.load_policy({"version": 1}, environ=dict(os.environ))
        devpolicy.load_file(f"s3://{BUCKET}/sharded", policy=policy)
        cached = sorted(p.name for p in (tmp_path / "cache").rglob("*") if p.is_file())
        assert len([name for name in cached if name.endswith(".data")]) == 2, cached

    def test_mapping_asked_for_without_a_cache_is_refused_aloud(
        self, s3_proxied: Proxied, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`mmap=True` or a rule's `mmap: true` on a URL with no cache: every tensor is
        read, and one `mmap_refused` warning says why and names the cache as the fix."""
        s3_proxied.setenv(monkeypatch)
        url = f"s3://{BUCKET}/ckpt/model.safetensors"
        by_rule = devpolicy.load_policy(
            {"version": 1, "rules": [{"match": "*", "device": "cpu:0", "mmap": True}]},
            environ={},
        )
        for policy, mmap in ((_policy(), True), (by_rule, None)):
            with capture_logs() as events:
                loaded = devpolicy.load_file(url, policy=policy, mmap=mmap)
            (refused,) = [e for e in events if e["event"] == "mmap_refused"]
            assert refused["log_level"] == "warning"
            assert refused["file"] == url
            assert refused["tensors"] == len(loaded)
            assert "not a local file" in refused["reason"]
            assert "remote: {cache: DIR}" in refused["reason"]
            assert "DEVPOLICY_REMOTE_CACHE" in refused["reason"]
            (summary,) = [e for e in events if e["event"] == "load_file"]
            assert summary["mapped"] == 0

    def test_no_mapping_asked_for_is_no_warning(
        self, s3_proxied: Proxied, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A URL loaded with the rules' default (no `mmap`) warns of nothing."""
        s3_proxied.setenv(monkeypatch)
        with capture_logs() as events:
            devpolicy.load_file(f"s3://{BUCKET}/ckpt/model.safetensors", policy=_policy())
        assert [e for e in events if e["event"] == "mmap_refused"] == []


class TestProgress:
    class _Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    def test_a_fetch_shows_a_bar_of_bytes_and_throughput(
        self, s3_proxied: Proxied, monkeypatch: pytest.MonkeyPatch, checkpoints: Checkpoints
    ) -> None:
        """On a terminal, `progress=True` on a URL draws the bar a local load draws: the
        object's name (without credentials), the bytes fetched of the total, the speed."""
        s3_proxied.setenv(monkeypatch)
        for variable in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
            monkeypatch.delenv(variable, raising=False)
        monkeypatch.setenv("TERM", "xterm-256color")
        monkeypatch.setenv("COLUMNS", "200")
        url = f"s3://{BUCKET}/ckpt/model.safetensors"
        terminal = self._Terminal()
        with monkeypatch.context() as patched:
            patched.setattr(sys, "stderr", terminal)
            devpolicy.load_file(url, policy=_policy(logging={"level": "error"}), progress=True)
        shown = terminal.getvalue()
        number, unit = devpolicy.sizes.format_size(checkpoints.single.stat().st_size).split()
        assert "model.safetensors" in shown
        assert f"0.0/{number} {unit}" in shown  # from nothing
        assert f"{number}/{number} {unit}" in shown  # to every byte
        assert "B/s" in shown
        assert s3_proxied.environ["AWS_SECRET_ACCESS_KEY"] not in shown


class TestNoCredentialShows:
    def test_not_in_events_errors_plans_or_reports(
        self, hub: servers.LocalHub, served_root: Path, monkeypatch: pytest.MonkeyPatch,
        rclone: servers.Child,
    ) -> None:  # fmt: skip
        """The Hub token, S3 secrets and a URL's password never appear in an event, an
        error, a plan or report()."""
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", servers.HUB_TOKEN)
        monkeypatch.setenv("HF_HOME", str(served_root / "none"))
        secret_url = rclone.url.replace("http://", "http://user:pa55word-secret@")
        policy = _policy()
        with capture_logs() as events:
            devpolicy.load_file("hf://org/repo/model.safetensors", policy=policy)
            devpolicy.load_file(
                f"{secret_url}/ckpt/model.safetensors?sig=query-secret", policy=policy
            )
            planned = str(devpolicy.plan(f"{secret_url}/ckpt/model.safetensors", policy=policy))
        with pytest.raises(devpolicy.DevicePolicyError) as caught:
            devpolicy.load_file(f"{secret_url}/ckpt/missing.safetensors", policy=policy)
        shown = repr(events) + planned + str(caught.value) + str(devpolicy.report())
        for secret in (servers.HUB_TOKEN, "pa55word-secret", "query-secret"):
            assert secret not in shown


class TestWithoutTheExtra:
    @pytest.mark.parametrize(
        ("url", "module", "package"),
        [
            ("s3://bucket-1/model.safetensors", "botocore", "botocore"),
            ("gs://bucket-1/model.safetensors", "google.auth", "google-auth"),
        ],
    )
    def test_a_url_names_the_pip_command(
        self, monkeypatch: pytest.MonkeyPatch, url: str, module: str, package: str
    ) -> None:
        """Without the `remote` extra, loading a URL of a scheme that needs it is an error
        naming the package and `pip install 'devpolicy[remote]'`."""
        monkeypatch.setitem(sys.modules, module, None)
        monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
        with pytest.raises(
            RemoteExtraMissingError,
            match=rf"needs '{package}', which is not installed; install devpolicy's remote support: pip install 'devpolicy\[remote\]'$",
        ):
            devpolicy.load_file(url, policy=_policy())


class TestCommandLine:
    def _run(self, *args: str) -> tuple[int, str]:
        out = io.StringIO()
        with redirect_stdout(out):
            try:
                code = cli_main(list(args))
            except SystemExit as e:
                code = int(e.code or 0)
        return code, out.getvalue()

    def test_plan_check_and_explain_take_urls(self, remote: Remote, tmp_path: Path) -> None:
        """`devpolicy plan URL`, `check --names URL` and `explain --file URL` work on URLs."""
        policy = tmp_path / "p.yaml"
        policy.write_text(
            "version: 1\ndefault: cpu:0\nrules:\n"
            "  - file: model.safetensors\n    match: '*/layers/*'\n    device: cpu:1\n"
        )
        code, text = self._run("plan", remote.single, "--policy", str(policy), "--json")
        assert code == 0
        payload = json.loads(text)
        assert payload["file"] == remote.single
        assert payload["fetch"][0]["requests"] >= 3
        code, text = self._run("check", str(policy), "--names", remote.single, "--json")
        assert code == 0, text
        code, text = self._run(
            "explain", "model/layers/0/w", "--policy", str(policy), "--file", remote.single,
            "--json",
        )  # fmt: skip
        assert code == 0
        assert json.loads(text)["decision"]["device"] == "cpu:1"


class TestTheStory:
    def test_the_token_file_is_fetched_once_into_the_cache_then_mapped(
        self,
        hub: servers.LocalHub,
        served_root: Path,
        monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path,
        checkpoints: Checkpoints,
    ) -> None:
        """The Loading page's steps against a local Hub: the story's policy puts the token
        file from `hf://datasets/...` on the host; with a cache, the first load fetches it
        and every later one sends no data request and maps the cached file."""
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", servers.HUB_TOKEN)
        monkeypatch.setenv("HF_HOME", str(served_root / "none"))
        policy = devpolicy.load_policy(REPO / "policies" / "dataset-on-host.yaml", environ={})
        url = "hf://datasets/org/tokens/train.safetensors"
        cache = {"cache": str(tmp_path / "cache")}
        (fetch,) = devpolicy.plan(url, policy=policy, remote=cache).fetches
        assert fetch.cached
        first = devpolicy.load_file(url, policy=policy, remote=cache)["tokens"]
        hub.requests.clear()
        with capture_logs() as events:
            tokens = devpolicy.load_file(url, policy=policy, remote=cache)["tokens"]
        assert [r for r in hub.requests if r[1].startswith("/cdn/")] == []
        (summary,) = [e for e in events if e["event"] == "load_file"]
        assert (summary["mapped"], summary["file_backed"], summary["bytes_fetched"]) == (1, True, 0)
        assert _TEXT(*tokens.devices()).startswith("cpu")
        local = devpolicy.load_file(checkpoints.tokens, policy=policy)["tokens"]
        assert np.array_equal(np.asarray(tokens), np.asarray(local))
        assert np.array_equal(np.asarray(first), np.asarray(local))
