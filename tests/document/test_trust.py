"""Trust: a policy nobody chose never changes a program (discovery, runtime.env, `run`)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

import devpolicy
from devpolicy._base import files as _files
from devpolicy._cli.main import main
from devpolicy._document import discovery as _discovery
from tests.helpers import write
from tests.runtime.test_settings import TIMEOUT, clean_env, last_json, python, run_command

ROOT = os.geteuid() == 0
POLICY = "version: 1\ndefault: cpu:2\n"
# What the attack planted: a compiled-code cache the attacker writes, opted in.
ATTACK = (
    "version: 1\nlogging:\n  format: json\nruntime:\n  allow: [JAX_COMPILATION_CACHE_DIR]\n"
    "  env:\n    JAX_COMPILATION_CACHE_DIR: /tmp/attacker-cache\n"
)


def _nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:  # pragma: no cover - every Linux has one
        pytest.skip("no user `nobody` to plant a file as")


def as_nobody(code: str, *args: str) -> None:
    """Run `code` (with `os` and `sys` imported, `sys.argv[1:]` = `args`) as user `nobody`,
    in a process that drops to its uid first."""
    user = _nobody()
    prelude = (
        f"import os, sys\nos.setgroups([]); os.setgid({user.pw_gid}); os.setuid({user.pw_uid})\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", prelude + code, *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def plant(path: Path, text: str) -> Path:
    """Write `text` to `path` as user `nobody`."""
    as_nobody("with open(sys.argv[1], 'w') as f:\n    f.write(sys.argv[2])\n", str(path), text)
    assert path.stat().st_uid == _nobody().pw_uid
    return path


def link_as_nobody(link: Path, target: Path) -> Path:
    """Make `link` a symlink to `target`, owned by user `nobody`."""
    as_nobody("os.symlink(sys.argv[1], sys.argv[2])", str(target), str(link))
    assert link.lstat().st_uid == _nobody().pw_uid
    return link


@pytest.fixture
def shared() -> Iterator[Path]:
    """A world-writable sticky directory (like /tmp, mode 1777) that user `nobody` can reach.

    pytest's own tmp_path sits under 0700 directories, so it is made in the system's
    temporary directory instead, and removed afterwards.
    """
    if not ROOT:
        pytest.skip("planting a file as another user needs root")
    base = Path(tempfile.mkdtemp(prefix="devpolicy-trust-")).resolve()
    try:
        if any(not d.stat().st_mode & stat.S_IXOTH for d in base.parents):
            pytest.skip(f"other users cannot reach {base}")
        base.chmod(0o1777)
        yield base
    finally:
        shutil.rmtree(base)


def _account_tool(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=False)


@contextlib.contextmanager
def temporary_account(prefix: str, *options: str) -> Iterator[pwd.struct_passwd]:
    """A new account made by `useradd` with `options` (no home, no login), removed after
    (its own group too, if `userdel` left it); the test skips where it cannot be made."""
    if not ROOT or shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("making accounts needs root and useradd/userdel")
    name = f"{prefix}{secrets.token_hex(3)}"
    made = _account_tool("useradd", "-M", *options, "-s", "/usr/sbin/nologin", name)
    if made.returncode != 0:
        pytest.skip(f"useradd failed: {made.stderr.strip()}")
    try:
        yield pwd.getpwnam(name)
    finally:
        _account_tool("userdel", name)
        if "-U" in options:
            _account_tool("groupdel", name)  # if userdel left it


@pytest.fixture(scope="module")
def owner() -> Iterator[pwd.struct_passwd]:
    """A temporary account with its own private group (`useradd -U`), removed afterwards."""
    with temporary_account("dpowner", "-U") as account:
        yield account


def guest_in_group_of(
    user: pwd.struct_passwd,
) -> contextlib.AbstractContextManager[pwd.struct_passwd]:
    """A temporary account whose primary group is `user`'s group (`useradd -g`): a member
    of it that /etc/group does not list."""
    return temporary_account("dpguest", "-N", "-g", str(user.pw_gid))


def discover_as(user: pwd.struct_passwd, cwd: Path) -> str:
    """What `load_policy()` finds when `user` runs it in `cwd`: `trusted PATH` or
    `refused FIRST-LINE`.

    Python and devpolicy are installed where only root may read, so the child imports
    everything (running discovery once as root) before it drops to `user`'s ids.
    """
    code = f"""
        import grp, os, pwd, devpolicy
        for source in (None, "devpolicy.yaml"):  # imports both ways, as root
            try:
                devpolicy.load_policy(source, environ={{}})
            except devpolicy.PolicyError:
                pass
        os.setgroups([]); os.setgid({user.pw_gid}); os.setuid({user.pw_uid})
        try:
            print("trusted", devpolicy.load_policy(environ={{}}).file)
        except devpolicy.errors.UntrustedPolicyError as e:
            print("refused", str(e).splitlines()[0])
    """
    result = python(code, cwd)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def project(directory: Path, policy: str = "version: 1\ndefault: cpu:3\n") -> Path:
    """A project whose pyproject.toml names its own policy (cpu:3)."""
    write(directory / "pyproject.toml", '[tool.devpolicy]\npolicy = "conf/place.yaml"\n')
    write(directory / "conf" / "place.yaml", policy)
    (directory / "src").mkdir(parents=True, exist_ok=True)
    return directory


class TestPlantedPolicy:
    def test_a_policy_planted_above_the_project_root_is_not_read(
        self, shared: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The project's own pyproject setting wins; the file above it is never looked at."""
        plant(shared / "devpolicy.yaml", "version: 1\ndefault: cpu:1\n")
        victim = project(shared / "victim")
        monkeypatch.chdir(victim / "src")
        policy = devpolicy.load_policy(environ={})
        assert policy.resolve("x").device_text == "cpu:3"
        assert policy.found == f"[tool.devpolicy] in {victim / 'pyproject.toml'}"

    def test_outside_any_project_a_planted_policy_is_refused_naming_its_owner(
        self, shared: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """No project root to stop at: discovery reaches the file, and refuses it saying who
        owns it and how to use it on purpose."""
        planted = plant(shared / "devpolicy.yaml", ATTACK)
        (shared / "scratch").mkdir()
        monkeypatch.chdir(shared / "scratch")
        nobody = _nobody()
        with pytest.raises(devpolicy.errors.UntrustedPolicyError) as caught:
            devpolicy.load_policy(environ={})
        error = caught.value
        assert isinstance(error, devpolicy.PolicyError)
        assert (error.owner, error.owner_name) == (nobody.pw_uid, "nobody")
        message = str(error)
        assert message.startswith(
            f"{planted}: refused: owned by nobody (uid {nobody.pw_uid}), not by you"
        )
        assert f"DEVPOLICY_FILE={planted}" in message
        assert f"chown root {planted}" in message

    @pytest.mark.parametrize("marker", ["pyproject.toml", ".git"])
    def test_the_documented_fix_a_project_marker_stops_discovery_below_the_planted_file(
        self, shared: Path, monkeypatch: pytest.MonkeyPatch, marker: str
    ) -> None:
        """The Trust page's fix for a planted /tmp/devpolicy.yaml: an empty pyproject.toml
        (or `git init`) where you work, and discovery never reaches the planted file."""
        plant(shared / "devpolicy.yaml", ATTACK)
        scratch = shared / "scratch"
        scratch.mkdir()
        monkeypatch.chdir(scratch)
        with pytest.raises(devpolicy.errors.UntrustedPolicyError):
            devpolicy.load_policy(environ={})
        if marker == ".git":
            (scratch / ".git").mkdir()
        else:
            write(scratch / marker, "")
        assert devpolicy.load_policy(environ={}).file is None

    @pytest.mark.slow
    def test_the_attack_cannot_set_a_cache_directory_through_run_or_bootstrap(
        self, shared: Path
    ) -> None:
        """`devpolicy run` refuses before running anything; `bootstrap()` raises and sets
        nothing."""
        plant(shared / "devpolicy.yaml", ATTACK)
        scratch = shared / "scratch"
        scratch.mkdir()
        show = "import os; print('ran', os.environ.get('JAX_COMPILATION_CACHE_DIR'))"
        result = run_cli("run", "--", sys.executable, "-c", show, cwd=scratch)
        assert result.returncode == 2
        assert "ran" not in result.stdout
        assert "refused: owned by nobody" in result.stderr
        booted = python(
            """
            import os, devpolicy
            try:
                devpolicy.bootstrap()
            except devpolicy.errors.UntrustedPolicyError as e:
                print(type(e).__name__, os.environ.get("JAX_COMPILATION_CACHE_DIR"))
            """,
            scratch,
        )
        assert booted.returncode == 0, booted.stderr
        assert booted.stdout.split() == ["UntrustedPolicyError", "None"]

    def test_a_planted_policy_named_on_purpose_is_used_with_a_warning(self, shared: Path) -> None:
        """load_policy(path) of a file owned by another user: loaded, and an
        `untrusted_policy` warning names the owner."""
        planted = plant(shared / "devpolicy.yaml", POLICY)
        with capture_logs() as logs:
            policy = devpolicy.load_policy(planted, environ={})
        assert policy.resolve("x").device_text == "cpu:2"
        (warning,) = [e for e in logs if e["event"] == "untrusted_policy"]
        assert warning["log_level"] == "warning"
        assert warning["owner"] == "nobody"
        assert warning["owner_uid"] == _nobody().pw_uid
        assert warning["reason"].startswith("owned by nobody")

    def test_a_pyproject_owned_by_another_user_cannot_choose_the_policy(
        self, shared: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A planted pyproject.toml naming a file of yours is refused: it chose the file."""
        write(shared / "mine.yaml", POLICY)
        plant(shared / "pyproject.toml", '[tool.devpolicy]\npolicy = "mine.yaml"\n')
        (shared / "scratch").mkdir()
        monkeypatch.chdir(shared / "scratch")
        with pytest.raises(
            devpolicy.errors.UntrustedPolicyError,
            match=r"(?s)pyproject\.toml: refused: owned by nobody .*DEVPOLICY_FILE=.*mine\.yaml",
        ):
            devpolicy.load_policy(environ={})


class TestWritableByOthers:
    def test_a_world_writable_directory_is_trusted_only_with_the_sticky_bit(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Mode 1777 (like /tmp): only you, the directory's owner or root can replace your
        file there, so it is trusted. Mode 0777: anyone could put another file in its
        place, so it is refused, even though the file is yours."""
        shared = tmp_path / "shared"
        write(shared / "devpolicy.yaml", POLICY)
        (shared / "work").mkdir()
        monkeypatch.chdir(shared / "work")
        shared.chmod(0o1777)
        assert devpolicy.load_policy(environ={}).resolve("x").device_text == "cpu:2"
        shared.chmod(0o777)
        with pytest.raises(
            devpolicy.errors.UntrustedPolicyError,
            match=r"^/.*/shared/devpolicy\.yaml: refused: its directory /.*/shared is "
            r"world-writable \(mode 0777\) without the sticky bit",
        ) as caught:
            devpolicy.load_policy(environ={})
        assert "chmod go-w" in str(caught.value)

    @pytest.mark.parametrize("mode", [0o666, 0o602])
    def test_a_policy_file_others_can_write_is_refused(self, tmp_path: Path, mode: int) -> None:
        """A file others may write says what they want: refused when discovered."""
        path = write(tmp_path / "devpolicy.yaml", POLICY)
        path.chmod(mode)
        with pytest.raises(
            devpolicy.errors.UntrustedPolicyError,
            match=rf"^devpolicy\.yaml: refused: world-writable \(mode 0{mode:o}\)",
        ):
            devpolicy.load_policy(environ={})

    def test_a_policy_file_a_shared_group_can_write_is_refused(self, tmp_path: Path) -> None:
        """Group-writable counts as others' when the group is not the owner's own."""
        if not ROOT:
            pytest.skip("giving a file to another group needs root")
        path = write(tmp_path / "devpolicy.yaml", POLICY)
        os.chown(path, -1, _nobody().pw_gid)
        path.chmod(0o664)
        with pytest.raises(
            devpolicy.errors.UntrustedPolicyError,
            match=r"^devpolicy\.yaml: refused: group-writable \(mode 0664\)",
        ):
            devpolicy.load_policy(environ={})

    def test_a_policy_file_writable_by_its_owners_private_group_is_trusted(
        self, tmp_path: Path
    ) -> None:
        """With a user private group (umask 002), group-writable is the owner alone."""
        path = write(tmp_path / "devpolicy.yaml", POLICY)
        own = pwd.getpwuid(os.geteuid())
        os.chown(path, -1, own.pw_gid)
        path.chmod(0o664)
        if not _files._private_group(own.pw_gid, own.pw_uid):
            pytest.skip("this user's primary group is shared")
        assert devpolicy.load_policy(environ={}).resolve("x").device_text == "cpu:2"

    @pytest.mark.slow
    def test_a_group_another_account_has_as_primary_group_is_not_private(
        self, owner: pwd.struct_passwd
    ) -> None:
        """A user private group (same name, no listed members) stops being private when
        another account has it as primary group (`useradd -g owner guest`): /etc/group
        lists no member, yet the guest can write the owner's group-writable policy. Refused
        then; trusted again once the guest is gone."""
        base = Path(tempfile.mkdtemp(prefix="devpolicy-group-")).resolve()
        try:
            if any(not d.stat().st_mode & stat.S_IXOTH for d in base.parents):
                pytest.skip(f"other users cannot reach {base}")
            (base / ".git").mkdir()
            policy = write(base / "devpolicy.yaml", POLICY)
            for path in (base, base / ".git", policy):
                os.chown(path, owner.pw_uid, owner.pw_gid)
            base.chmod(0o755)
            policy.chmod(0o664)
            assert discover_as(owner, base) == "trusted devpolicy.yaml"
            with guest_in_group_of(owner):
                assert discover_as(owner, base) == (
                    "refused devpolicy.yaml: refused: group-writable (mode 0664): "
                    "others can change it"
                )
            assert discover_as(owner, base) == "trusted devpolicy.yaml"
        finally:
            shutil.rmtree(base)

    def test_check_names_an_untrusted_discovered_policy(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`devpolicy check`: an error finding `untrusted-policy`, exit 1."""
        write(tmp_path / "devpolicy.yaml", POLICY).chmod(0o666)
        assert main(["check", "--json"]) == 1
        (finding,) = json.loads(capsys.readouterr().out)["findings"]
        assert finding["code"] == "untrusted-policy"
        assert finding["message"].startswith("refused: world-writable")

    def test_check_warns_about_an_untrusted_policy_named_on_purpose(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`devpolicy check p.yaml` of a world-writable file: valid, with a warning."""
        write(tmp_path / "p.yaml", "version: 1\ndefault: cpu\n").chmod(0o666)
        assert main(["check", "p.yaml", "--json"]) == 0
        codes = [f["code"] for f in json.loads(capsys.readouterr().out)["findings"]]
        assert codes == ["untrusted-policy"]


class TestSymlinkChains:
    def test_another_users_link_on_the_way_is_refused(
        self, shared: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """devpolicy.yaml (yours) -> a link `nobody` owns in a sticky directory -> your
        policy: `nobody` can re-point that link at any other file you or root own, so the
        chain is refused, naming the link and its owner. Every link on the way passes the
        test the file itself passes."""
        project = shared / "proj"
        (project / ".git").mkdir(parents=True)
        write(project / "real.yaml", POLICY)
        hop = link_as_nobody(shared / "hop", project / "real.yaml")
        (project / "devpolicy.yaml").symlink_to(hop)
        monkeypatch.chdir(project)
        with pytest.raises(
            devpolicy.errors.UntrustedPolicyError,
            match=rf"^devpolicy\.yaml: refused: a symlink on the way to it, {re.escape(str(hop))}, "
            r"is owned by nobody \(uid \d+\), not by you \(root\)",
        ) as caught:
            devpolicy.load_policy(environ={})
        assert f"replace {hop} with a link or copy of your own" in str(caught.value)

    def test_another_users_link_to_a_directory_on_the_way_is_refused(
        self, shared: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A directory reached through another user's link (pyproject.toml naming
        `../lnk/real.yaml`, `lnk` being `nobody`'s): refused as well."""
        project = shared / "proj"
        write(project / "pyproject.toml", '[tool.devpolicy]\npolicy = "../lnk/real.yaml"\n')
        write(project / "conf" / "real.yaml", POLICY)
        hop = link_as_nobody(shared / "lnk", project / "conf")
        monkeypatch.chdir(project)
        with pytest.raises(
            devpolicy.errors.UntrustedPolicyError,
            match=rf"^\.\./lnk/real\.yaml: refused: a symlink on the way to it, {re.escape(str(hop))}, "
            r"is owned by nobody",
        ):
            devpolicy.load_policy(environ={})

    def test_a_chain_of_your_own_links_through_a_sticky_directory_is_trusted(
        self, shared: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The same chain with every link yours: nobody else can change it (the sticky bit
        keeps others from replacing your link), so it is used."""
        project = shared / "proj"
        (project / ".git").mkdir(parents=True)
        write(project / "real.yaml", POLICY)
        (shared / "hop").symlink_to(project / "real.yaml")
        (project / "devpolicy.yaml").symlink_to(shared / "hop")
        monkeypatch.chdir(project)
        assert devpolicy.load_policy(environ={}).resolve("x").device_text == "cpu:2"

    def test_every_link_followed_is_found_as_the_kernel_follows_it(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Links to links, relative targets, a linked directory then `..`: the walk ends
        where the kernel does (`realpath`) and lists each link it followed, in order."""
        write(tmp_path / "a" / "b" / "p.yaml", POLICY)
        (tmp_path / "dir").symlink_to("a/b")
        # dir is a/b, so `dir/..` is a/ (where the kernel is), not the top directory.
        (tmp_path / "a" / "up").symlink_to("../dir/../b/p.yaml")
        (tmp_path / "top").symlink_to(tmp_path / "a" / "up")
        monkeypatch.chdir(tmp_path)
        real, links = _files._resolve("top")
        assert real == os.path.realpath("top") == str(tmp_path / "a" / "b" / "p.yaml")
        assert [path for path, _ in links] == [
            str(tmp_path / "top"),
            str(tmp_path / "a" / "up"),
            str(tmp_path / "dir"),
        ]

    def test_a_link_loop_is_left_to_the_reader(self, tmp_path: Path) -> None:
        """Links that loop cannot be examined: no trust verdict, reading says what is wrong."""
        (tmp_path / "x").symlink_to("y")
        (tmp_path / "y").symlink_to("x")
        assert _files.untrusted(tmp_path / "x") is None


class TestProjectRoot:
    @pytest.mark.parametrize("marker", ["pyproject.toml", ".git"])
    def test_discovery_stops_at_the_project_root(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marker: str
    ) -> None:
        """A devpolicy.yaml above the first directory holding pyproject.toml or .git is
        not the project's: not read, even when it is your own."""
        write(tmp_path / "devpolicy.yaml", POLICY)
        (tmp_path / "proj" / "src").mkdir(parents=True)
        if marker == ".git":
            (tmp_path / "proj" / ".git").mkdir()
        else:
            write(tmp_path / "proj" / marker, '[project]\nname = "proj"\n')
        monkeypatch.chdir(tmp_path / "proj" / "src")
        policy = devpolicy.load_policy(environ={})
        assert policy.file is None
        assert policy.resolve("x").is_auto

    def test_the_projects_pyproject_setting_wins_over_a_file_above(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """[tool.devpolicy] of the project beats a devpolicy.yaml in a parent of it."""
        write(tmp_path / "devpolicy.yaml", POLICY)
        project(tmp_path / "proj")
        monkeypatch.chdir(tmp_path / "proj" / "src")
        assert devpolicy.load_policy(environ={}).resolve("x").device_text == "cpu:3"

    def test_discovery_never_crosses_a_filesystem_boundary(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A parent on another filesystem (a mount point above) is not searched."""
        write(tmp_path / "devpolicy.yaml", POLICY)
        mounted = tmp_path / "mnt" / "work"
        mounted.mkdir(parents=True)
        monkeypatch.chdir(mounted)
        real = _discovery._device
        inside = {mounted, mounted.parent}

        def device(directory: Path) -> int | None:
            # `mnt` is the root of another filesystem.
            return -1 if directory in inside else real(directory)

        monkeypatch.setattr(_discovery, "_device", device)
        assert devpolicy.load_policy(environ={}).file is None
        assert _discovery.search_directories(mounted) == [mounted, mounted.parent]


def policy_file(tmp_path: Path, runtime: str) -> Path:
    body = textwrap.indent(textwrap.dedent(runtime).strip(), "  ")
    return write(tmp_path / "p.yaml", f"version: 1\nruntime:\n{body}\n")


class TestRuntimeEnv:
    @pytest.mark.parametrize(
        ("env", "item", "why"),
        [
            ("JAX_COMPILATION_CACHE_DIR: /srv/cache", "JAX_COMPILATION_CACHE_DIR", "names a path"),
            ("XLA_FLAGS: --xla_dump_to=/tmp/d", "--xla_dump_to", "names a path"),
            (
                "XLA_FLAGS: --xla_gpu_cuda_data_dir=/opt/c",
                "--xla_gpu_cuda_data_dir",
                "names a path",
            ),
            ("JAX_DISABLE_JIT: true", "JAX_DISABLE_JIT", "changes what programs compute"),
            ("JAX_DEFAULT_PRNG_IMPL: rbg", "JAX_DEFAULT_PRNG_IMPL", "changes what programs"),
            ("JAX_ENABLE_CHECKS: true", "JAX_ENABLE_CHECKS", "changes what programs compute"),
            ("JAX_SOMETHING_NEW: 1", "JAX_SOMETHING_NEW", "is not one devpolicy knows"),
            ("XLA_FLAGS: --xla_new_flag=1", "--xla_new_flag", "is not one devpolicy knows"),
        ],
    )
    def test_powerful_variables_need_an_opt_in_written_in_the_policy(
        self, tmp_path: Path, env: str, item: str, why: str
    ) -> None:
        """Paths, result-changing and unknown variables (or XLA flags): a PolicyError at the
        entry's line, saying what to write."""
        path = policy_file(tmp_path, f"env:\n  {env}")
        name = env.split(":")[0]
        with pytest.raises(
            devpolicy.PolicyError,
            match=rf"^p\.yaml:4: runtime\.env\.{name}: {item} {why}.*add `allow: \[{item}\]` "
            "under `runtime:`",
        ):
            devpolicy.load_policy(path, environ={})

    def test_an_opted_in_variable_is_set_and_check_warns_at_its_line(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """With `allow:` it loads; `devpolicy check` reports each opt-in as a warning."""
        policy_file(
            tmp_path,
            """
            allow: [JAX_COMPILATION_CACHE_DIR, --xla_dump_to]
            env:
              JAX_COMPILATION_CACHE_DIR: /srv/cache
              XLA_FLAGS: --xla_dump_to=/srv/dump --xla_cpu_multi_thread_eigen=false
            """,
        )
        assert main(["check", "p.yaml", "--json"]) == 0
        findings = json.loads(capsys.readouterr().out)["findings"]
        opt_ins = sorted((f["origin"], f["message"]) for f in findings)
        assert [f["code"] for f in findings] == ["runtime-opt-in"] * 2
        assert [origin for origin, _ in opt_ins] == ["p.yaml:5", "p.yaml:6"]
        assert "JAX_COMPILATION_CACHE_DIR names a path" in opt_ins[0][1]
        assert "--xla_dump_to names a path" in opt_ins[1][1]

    def test_an_allow_entry_nothing_uses_is_a_warning(self, tmp_path: Path) -> None:
        """A misspelt or stale opt-in is reported, at `allow:`'s line."""
        path = policy_file(tmp_path, "allow: [JAX_DISABLE_JIT]")
        findings = devpolicy.lint(devpolicy.load_policy(path, environ={}))
        assert [(f.code, f.origin) for f in findings] == [("runtime-allow-unused", "p.yaml:3")]

    @pytest.mark.parametrize(
        ("env", "message"),
        [
            ("TF_CPP_MIN_LOG_LEVEL: 9", r"expected a whole number 0\.\.3, got 9"),
            ("JAX_LOGGING_LEVEL: loud", r"expected one of NOTSET, DEBUG, .*, got 'loud'"),
            ("JAX_TRANSFER_GUARD: never", r"expected one of allow, log, disallow"),
            (
                "XLA_FLAGS: --xla_cpu_multi_thread_eigen=maybe",
                r"--xla_cpu_multi_thread_eigen: expected true or false, got 'maybe'",
            ),
            ("XLA_FLAGS: xla_dump_to", r"not an XLA flag: 'xla_dump_to'"),
            ('TF_CPP_MIN_LOG_LEVEL: "1\\n2"', r"contains a control character"),
        ],
    )
    def test_each_known_variable_is_validated(self, tmp_path: Path, env: str, message: str) -> None:
        """A value the variable does not take is a PolicyError at its line."""
        path = policy_file(tmp_path, f"env:\n  {env}")
        with pytest.raises(
            devpolicy.PolicyError, match=rf"^p\.yaml:4: runtime\.env\.\w+: {message}"
        ):
            devpolicy.load_policy(path, environ={})

    @pytest.mark.parametrize(
        ("env", "knob"),
        [
            ("JAX_CUDA_VISIBLE_DEVICES: '0'", "visible_devices"),
            ("JAX_ROCM_VISIBLE_DEVICES: '0'", "visible_devices"),
            ("JAX_PLATFORM_NAME: cpu", "platforms"),
            ("XLA_FLAGS: --xla_force_host_platform_device_count=4", "cpu_devices"),
        ],
    )
    def test_a_second_spelling_of_a_knob_a_field_owns_is_an_error(
        self, tmp_path: Path, env: str, knob: str
    ) -> None:
        """One knob, one spelling: write the field instead."""
        field = {"visible_devices": "[0]", "platforms": "[cpu]", "cpu_devices": "4"}[knob]
        path = policy_file(tmp_path, f"{knob}: {field}\nenv:\n  {env}")
        with pytest.raises(
            devpolicy.PolicyError,
            match=rf"^p\.yaml:5: runtime\.env\.\w+: .*is what `runtime\.{knob}` sets: "
            rf"write `{knob}:` instead",
        ):
            devpolicy.load_policy(path, environ={})

    def test_a_nul_byte_in_an_env_value_is_a_policy_error_at_its_line(self, tmp_path: Path) -> None:
        """No environment can hold it: refused when the policy is loaded, not half-way
        through applying it."""
        path = policy_file(
            tmp_path,
            'allow: [JAX_COMPILATION_CACHE_DIR]\nenv:\n  JAX_COMPILATION_CACHE_DIR: "/a\\0b"',
        )
        with pytest.raises(
            devpolicy.PolicyError,
            match=r"^p\.yaml:5: runtime\.env\.JAX_COMPILATION_CACHE_DIR: contains a NUL byte",
        ):
            devpolicy.load_policy(path, environ={})

    def test_applying_is_all_or_nothing(self, tmp_path: Path) -> None:
        """A plan holding a value the OS cannot take raises a PolicyError at its line
        before setting anything (not after the first variables)."""
        result = python(
            """
            import os
            from devpolicy._runtime import settings as r
            from devpolicy._base.errors import PolicyError
            knobs = (
                r.RuntimeKnob("env.TF_CPP_MAX_VLOG_LEVEL", "2", "2", "policy", "p.yaml:3",
                              "TF_CPP_MAX_VLOG_LEVEL"),
                r.RuntimeKnob("env.JAX_X", "a\\0b", "a\\0b", "policy", "p.yaml:4", "JAX_X"),
            )
            try:
                r.apply_runtime(r.RuntimeSettings(knobs, ()), os.environ)
            except PolicyError as e:
                print(str(e).splitlines()[0])
            print(os.environ.get("TF_CPP_MAX_VLOG_LEVEL"))
            """,
            tmp_path,
        )
        assert result.returncode == 0, result.stderr
        first, second = result.stdout.splitlines()
        assert first.startswith("p.yaml:4: runtime.env.JAX_X: cannot be set 'a\\x00b'")
        assert second == "None"


def runtime_events(stderr: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [e for e in lines if e["event"] == "runtime"]


class TestWhatWasApplied:
    @pytest.mark.slow
    def test_bootstrap_logs_the_policy_file_and_every_variable_it_set(self, tmp_path: Path) -> None:
        """The runtime event names the file, how it was found, and each NAME=value set."""
        write(
            tmp_path / "devpolicy.yaml",
            "version: 1\nlogging: {format: json}\nruntime:\n  cpu_devices: 2\n"
            "  env: {TF_CPP_MIN_LOG_LEVEL: 2}\n",
        )
        result = python("import devpolicy; devpolicy.bootstrap()", tmp_path)
        assert result.returncode == 0, result.stderr
        (event,) = runtime_events(result.stderr)
        assert event["policy"] == "devpolicy.yaml"
        assert event["found"] == "devpolicy.yaml in the working directory or a parent"
        assert event["set"] == ["JAX_NUM_CPU_DEVICES=2", "TF_CPP_MIN_LOG_LEVEL=2"]

    def test_run_logs_the_policy_file_and_every_variable_it_set(self, tmp_path: Path) -> None:
        """`devpolicy run` says on stderr what it applied, then runs the command."""
        write(
            tmp_path / "p.yaml", "version: 1\nlogging: {format: json}\nruntime: {cpu_devices: 2}\n"
        )
        result = run_cli("run", "--policy", "p.yaml", "--", "true", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        (event,) = runtime_events(result.stderr)
        assert (event["policy"], event["found"]) == ("p.yaml", "p.yaml")
        assert event["set"] == ["JAX_NUM_CPU_DEVICES=2"]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_command([sys.executable, "-m", "devpolicy", *args], cwd)


class TestRunCommand:
    def test_dry_run_output_is_shell_safe(self, tmp_path: Path) -> None:
        """A newline, quotes and `$(...)` in a value: one line per variable, and `eval`
        sets exactly the values, running nothing."""
        if shutil.which("bash") is None:
            pytest.skip("needs bash")
        odd = tmp_path / "a\nLD_PRELOAD=/evil.so $(touch pwned) 'q\" \\x"
        write(odd / "p.yaml", "version: 1\nruntime:\n  cpu_devices: 2\n")
        result = run_cli("run", "--policy", str(odd / "p.yaml"), "--dry-run", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert [line.split("=")[0] for line in lines] == [
            "export DEVPOLICY_FILE",
            "export DEVPOLICY_RUNTIME_SET",
            "export JAX_NUM_CPU_DEVICES",
        ]
        shown = subprocess.run(
            ["bash", "-c", 'eval "$1"; printf "%s" "$DEVPOLICY_FILE"', "-", result.stdout],
            cwd=tmp_path,
            capture_output=True,
            timeout=TIMEOUT,
            check=True,
        )
        assert shown.stdout == os.fsencode(odd / "p.yaml")
        assert not (tmp_path / "pwned").exists()

    @pytest.mark.slow
    def test_dry_run_lists_every_variable_the_child_gets(self, tmp_path: Path) -> None:
        """The child's environment differs from the parent's in exactly the listed
        variables (importing JAX used to add TF_CPP_MIN_LOG_LEVEL unlisted)."""
        write(tmp_path / "p.yaml", "version: 1\nruntime: {cpu_devices: 2, x64: true}\n")
        dry = run_cli("run", "--policy", "p.yaml", "--dry-run", cwd=tmp_path)
        assert dry.returncode == 0, dry.stderr
        listed = {line.split("=")[0].removeprefix("export ") for line in dry.stdout.splitlines()}
        dump = "import json, os; print(json.dumps(dict(os.environ)))"
        ran = run_cli("run", "--policy", "p.yaml", "--", sys.executable, "-c", dump, cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr
        parent = clean_env()
        child = last_json(ran.stdout)
        # The interpreter itself may add a variable or two (LC_CTYPE coercion): those are not
        # devpolicy's; everything devpolicy's child got beyond them is listed.
        baseline = json.loads(
            subprocess.run(
                [sys.executable, "-c", dump],
                env=parent,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                check=True,
            ).stdout
        )
        changed = {n for n in child if child[n] != baseline.get(n)}
        assert changed == listed
        assert listed == {
            "DEVPOLICY_FILE",
            "DEVPOLICY_RUNTIME_SET",
            "JAX_ENABLE_X64",
            "JAX_NUM_CPU_DEVICES",
        }

    def test_run_does_not_import_jax(self, tmp_path: Path) -> None:
        """Preparing the child's environment needs no JAX (2 s and 187 MB saved)."""
        write(tmp_path / "p.yaml", "version: 1\nruntime: {platforms: [cpu], cpu_devices: 2}\n")
        result = python(
            """
            import sys
            from devpolicy._cli.main import main
            status = main(["run", "--policy", "p.yaml", "--dry-run"])
            print(status, "jax" in sys.modules)
            """,
            tmp_path,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[-1] == "0 False"
