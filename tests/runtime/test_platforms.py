"""Which platforms JAX would start here: libraries found only where JAX finds installed ones,
a TPU only with a chip, and one answer for `run`, `bootstrap()`, `devices` and `check`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import devpolicy
from devpolicy._runtime import platforms as _platforms
from devpolicy._runtime import settings as _settings
from tests.helpers import write
from tests.runtime.test_settings import clean_env, python, run_command

# A file the dynamic loader would take for a shared library (and fail to load).
ELF = b"\x7fELF" + bytes(60)
# The real machine this suite runs on: the claims about a machine without accelerators
# cannot be shown on one that has them.
needs_no_chip = pytest.mark.skipif(
    _platforms.tpu_chips() > 0 or _platforms.nvidia_gpu_visible() or _platforms.amd_gpus() > 0,
    reason="this machine has an accelerator: JAX would start it",
)


def installed_libtpu(site: Path, name: str = "libtpu") -> Path:
    """A libtpu distribution installed in `site` as pip lays out `jax[tpu]`'s: its metadata,
    the `libtpu` package and `libtpu/libtpu.so` (which no loader will accept)."""
    info = site / f"{name.replace('-', '_')}-0.0.1.dist-info"
    write(info / "METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.1\n")
    write(
        site / "libtpu" / "__init__.py",
        "import os\n\ndef get_library_path():\n"
        "    return os.path.join(os.path.dirname(__file__), 'libtpu.so')\n",
    )
    (site / "libtpu" / "libtpu.so").write_bytes(ELF)
    return site / "libtpu" / "libtpu.so"


def machine(root: Path, *devices: tuple[str, str], nvidia: bool = False) -> Path:
    """A machine's `/sys` and `/dev` under `root`: one PCI device per (vendor, device)."""
    (root / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
    for i, (vendor, device) in enumerate(devices):
        folder = root / f"sys/bus/pci/devices/0000:00:{i + 4:02x}.0"
        write(folder / "vendor", vendor + "\n")
        write(folder / "device", device + "\n")
    if nvidia:
        write(root / "dev/nvidia0", "")
    return root


TPU_V5E = ("0x1ae0", "0x0063")
GVNIC = ("0x1ae0", "0x0042")  # Google's network card, on every GCE VM: no TPU


def plant(folder: Path, what: str) -> None:
    """A stray file or folder of the name JAX imports, as one left in a project folder."""
    target = folder / what
    if what.endswith("/"):
        target.mkdir(parents=True)
    else:
        write(target, "")


PLANTS = ["libtpu/", "libtpu.py", "libtpu.so", "jax_plugins/xla_cuda12.py"]

STARTED = """
    import os, sys, devpolicy
    devpolicy.bootstrap(sys.argv[1] if len(sys.argv) > 1 else 'p.yaml')
    import jax
    print(os.environ['JAX_PLATFORMS'], jax.devices()[0].platform)
"""


def policy(folder: Path, platforms: str, name: str = "p.yaml") -> Path:
    return write(folder / name, f"version: 1\nruntime:\n  platforms: {platforms}\n")


def plain_jax(cwd: Path, **env: str) -> str:
    result = python("import jax; print(jax.devices()[0].platform)", cwd, **env)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[-1]


@needs_no_chip
class TestAStrayLibraryNeverStopsJax:
    @pytest.mark.slow
    @pytest.mark.parametrize("what", PLANTS)
    def test_a_stray_library_in_the_working_directory_leaves_jax_on_the_cpu(
        self, tmp_path: Path, what: str
    ) -> None:
        """An empty `libtpu/`, `libtpu.py`, a stray `libtpu.so` or `jax_plugins/xla_cuda12.py`
        in the working directory is no runtime: `[accelerator, cpu]` starts the CPU, as
        plain JAX does there (JAX_PLATFORMS=tpu,cpu would start no backend at all)."""
        plant(tmp_path, what)
        policy(tmp_path, "[accelerator, cpu]")
        assert plain_jax(tmp_path) == "cpu"
        result = python(STARTED, tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["cpu", "cpu"]

    @pytest.mark.slow
    @pytest.mark.parametrize("what", ["libtpu.py", "jax_plugins/xla_cuda12.py"])
    def test_a_stray_library_beside_the_script_leaves_jax_on_the_cpu(
        self, tmp_path: Path, what: str
    ) -> None:
        """`python project/train.py`: the script's folder is `sys.path[0]`, not installed."""
        project = tmp_path / "project"
        plant(project, what)
        script = write(project / "train.py", textwrap.dedent(STARTED))
        policy(tmp_path, "[accelerator, cpu]")
        result = run_command([sys.executable, str(script), str(tmp_path / "p.yaml")], tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["cpu", "cpu"]

    @pytest.mark.slow
    def test_tpu_named_with_a_stray_libtpu_is_dropped_saying_why(self, tmp_path: Path) -> None:
        """`[tpu, cpu]` beside a stray `libtpu.py` starts the CPU; the note names the file."""
        plant(tmp_path, "libtpu.py")
        policy(tmp_path, "[tpu, cpu]")
        result = python(STARTED, tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["cpu", "cpu"]
        assert "libtpu.py in the working directory is not an installed libtpu" in result.stderr

    @pytest.mark.slow
    def test_a_garbage_tpu_library_path_leaves_jax_on_the_cpu(self, tmp_path: Path) -> None:
        """TPU_LIBRARY_PATH naming a file that is no shared library: `[tpu, cpu]` starts the
        CPU, as plain JAX does, and the note says what is wrong with the variable."""
        garbage = write(tmp_path / "notes.txt", "not a library\n")
        policy(tmp_path, "[tpu, cpu]")
        assert plain_jax(tmp_path, TPU_LIBRARY_PATH=str(garbage)) == "cpu"
        result = python(STARTED, tmp_path, TPU_LIBRARY_PATH=str(garbage))
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["cpu", "cpu"]
        assert f"TPU_LIBRARY_PATH={garbage} is not a shared library" in result.stderr

    @pytest.mark.slow
    def test_libtpu_installed_without_a_chip_leaves_jax_on_the_cpu(self, tmp_path: Path) -> None:
        """A real libtpu installed (as `jax[tpu]` installs it) on a machine with no TPU chip,
        a CI image or a laptop: `[accelerator, cpu]` is `cpu`, and the note says no chip."""
        site = tmp_path / "site"
        installed_libtpu(site)
        policy(tmp_path, "[accelerator, cpu]")
        path = f"{site}:{clean_env()['PYTHONPATH']}"
        assert plain_jax(tmp_path, PYTHONPATH=path) == "cpu"
        result = python(STARTED, tmp_path, PYTHONPATH=path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["cpu", "cpu"]
        assert "libtpu is installed but no TPU chip is attached" in result.stderr

    def test_gpu_alone_beside_a_stray_plugin_is_an_error_not_a_jax_without_backend(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`[gpu]` beside a stray `jax_plugins/xla_cuda12.py`: nothing would start, said at the
        field (JAX_PLATFORMS=cuda alone fails with a bare AssertionError)."""
        plant(tmp_path, "jax_plugins/xla_cuda12.py")
        path = policy(tmp_path, "[gpu]")
        monkeypatch.chdir(tmp_path)
        with pytest.raises(
            devpolicy.PolicyError,
            match=r"^p\.yaml:3: runtime\.platforms: gpu dropped: no GPU plugin installed .*"
            r"jax_plugins/xla_cuda12 in the working directory is not an installed plugin; add cpu",
        ):
            _settings.plan_runtime(devpolicy.load_policy(path).settings.runtime, {})


class TestChips:
    def test_a_tpu_chip_is_a_google_pci_device_of_a_tpu_id(self, tmp_path: Path) -> None:
        """Counted as JAX counts: vendor 0x1ae0 and a TPU device id; the gVNIC is no chip."""
        assert _platforms.tpu_chips(machine(tmp_path, TPU_V5E, TPU_V5E, GVNIC)) == 2

    @pytest.mark.parametrize(
        "devices", [[], [GVNIC], [("0x10de", "0x0063")]], ids=["none", "gvnic", "nvidia"]
    )
    def test_no_tpu_device_counts_no_chip(
        self, tmp_path: Path, devices: list[tuple[str, str]]
    ) -> None:
        """No PCI device, a Google network card, another vendor's device of a TPU's id: 0."""
        assert _platforms.tpu_chips(machine(tmp_path, *devices)) == 0

    def test_a_machine_without_sysfs_has_no_chip(self, tmp_path: Path) -> None:
        """No /sys at all (a container, macOS): no chip, no error."""
        assert _platforms.tpu_chips(tmp_path) == 0

    def test_the_installed_jax_table_of_tpu_ids_is_read(self, tmp_path: Path) -> None:
        """A chip id the installed jax lists and devpolicy does not yet still counts."""
        site = tmp_path / "site"
        write(site / "jax-9.0.dist-info" / "METADATA", "Metadata-Version: 2.1\nName: jax\n")
        write(
            site / "jax/_src/hardware_utils.py",
            "_TPU_PCI_DEVICE_IDS = {\n    '0x0063': TpuVersion.v5e,\n    '0x00aa': TpuVersion.v9,\n}\n",
        )
        ids = _platforms._tpu_device_ids((str(site),))
        assert "0x00aa" in ids
        assert _platforms.tpu_chips(machine(tmp_path / "m", ("0x1ae0", "0x00aa")), ids) == 1


class TestStartable:
    def test_libtpu_installed_and_a_chip_is_a_tpu(self, tmp_path: Path) -> None:
        """An installed libtpu distribution and one chip: JAX would start the TPU."""
        library = installed_libtpu(tmp_path / "site")
        found = _platforms.startable(
            {}, root=machine(tmp_path / "m", TPU_V5E), path=[str(tmp_path / "site")], cwd="/"
        )
        assert (found.tpu, found.libtpu) == (True, str(library))

    @pytest.mark.parametrize("name", ["libtpu", "libtpu-nightly"])
    def test_libtpu_installed_without_a_chip_is_no_tpu(self, tmp_path: Path, name: str) -> None:
        """Installed but no chip (only the VM's network card): no TPU, saying so."""
        installed_libtpu(tmp_path / "site", name)
        found = _platforms.startable(
            {}, root=machine(tmp_path / "m", GVNIC), path=[str(tmp_path / "site")], cwd="/"
        )
        assert not found.tpu
        assert found.libtpu is not None
        assert found.reason("tpu").startswith("libtpu is installed but no TPU chip is attached")

    def test_a_stray_libtpu_that_shadows_the_installed_one_is_no_tpu(self, tmp_path: Path) -> None:
        """JAX imports `libtpu` by name, the working directory first: a stray one there
        hides the real one and the TPU would not start (plain JAX falls back to the CPU)."""
        installed_libtpu(tmp_path / "site")
        plant(tmp_path / "work", "libtpu.py")
        found = _platforms.startable(
            {},
            root=machine(tmp_path / "m", TPU_V5E),
            path=[str(tmp_path / "site")],
            cwd=str(tmp_path / "work"),
        )
        assert not found.tpu
        assert "libtpu.py in the working directory hides the installed libtpu" in found.reason(
            "tpu"
        )

    @pytest.mark.parametrize("what", PLANTS)
    def test_a_library_in_the_working_directory_is_not_installed(
        self, tmp_path: Path, what: str
    ) -> None:
        """Whatever the working directory holds, with a chip and a GPU: not installed."""
        plant(tmp_path / "work", what)
        work = str(tmp_path / "work")
        root = machine(tmp_path / "m", TPU_V5E, nvidia=True)
        found = _platforms.startable({}, root=root, path=[work], cwd=work)
        assert found.accelerators == ()
        assert "in the working directory is not an installed" in " ".join(
            found.reason(p) for p in ("tpu", "cuda")
        )

    def test_tpu_library_path_naming_a_library_is_used_as_jax_uses_it(self, tmp_path: Path) -> None:
        """TPU_LIBRARY_PATH naming a shared library and a chip: a TPU, that library."""
        library = tmp_path / "lib" / "libtpu.so"
        library.parent.mkdir()
        library.write_bytes(ELF)
        env = {"TPU_LIBRARY_PATH": str(library)}
        found = _platforms.startable(env, root=machine(tmp_path / "m", TPU_V5E), path=[], cwd="/")
        assert (found.tpu, found.libtpu) == (True, str(library))

    @pytest.mark.parametrize(
        ("value", "said"),
        [("notes.txt", "is not a shared library"), ("missing.so", "is not a file")],
    )
    def test_a_garbage_tpu_library_path_is_no_tpu(
        self, tmp_path: Path, value: str, said: str
    ) -> None:
        """A file that is no library, or no file: no TPU, the variable named in the note."""
        write(tmp_path / "notes.txt", "text\n")
        env = {"TPU_LIBRARY_PATH": str(tmp_path / value)}
        found = _platforms.startable(env, root=machine(tmp_path / "m", TPU_V5E), path=[], cwd="/")
        assert not found.tpu
        assert f"TPU_LIBRARY_PATH={tmp_path / value} {said}" in found.reason("tpu")

    def test_a_cuda_plugin_installed_counts_only_with_an_nvidia_gpu(self, tmp_path: Path) -> None:
        """JAX skips `cuda` where no NVIDIA device file exists: so does the answer."""
        site = tmp_path / "site"
        write(site / "jax_plugins" / "xla_cuda12" / "__init__.py", "")
        with_gpu = machine(tmp_path / "gpu", nvidia=True)
        without = machine(tmp_path / "laptop")
        assert _platforms.startable({}, root=with_gpu, path=[str(site)], cwd="/").gpus == ("cuda",)
        found = _platforms.startable({}, root=without, path=[str(site)], cwd="/")
        assert found.gpus == ()
        assert (
            found.reason("cuda")
            == "its plugin is installed but no NVIDIA GPU visible (/dev/nvidia*)"
        )

    def test_a_cuda_plugin_entry_point_counts(self, tmp_path: Path) -> None:
        """A plugin advertised as a `jax_plugins` entry point, as the CUDA wheels do."""
        site = tmp_path / "site"
        info = site / "jax_cuda12_plugin-0.1.dist-info"
        write(info / "METADATA", "Metadata-Version: 2.1\nName: jax-cuda12-plugin\n")
        write(info / "entry_points.txt", "[jax_plugins]\nxla_cuda12 = jax_cuda12_plugin\n")
        root = machine(tmp_path / "m", nvidia=True)
        assert _platforms.startable({}, root=root, path=[str(site)], cwd="/").gpus == ("cuda",)

    def test_a_stray_plugin_of_the_installed_name_hides_it(self, tmp_path: Path) -> None:
        """JAX imports `jax_plugins.xla_cuda12` from the working directory first."""
        site = tmp_path / "site"
        write(site / "jax_plugins" / "xla_cuda12" / "__init__.py", "")
        plant(tmp_path / "work", "jax_plugins/xla_cuda12.py")
        root = machine(tmp_path / "m", nvidia=True)
        found = _platforms.startable({}, root=root, path=[str(site)], cwd=str(tmp_path / "work"))
        assert found.gpus == ()
        assert "hides the installed plugin" in found.reason("cuda")

    def test_a_rocm_plugin_counts_with_an_amd_gpu_as_jax_counts_them(self, tmp_path: Path) -> None:
        """A KFD topology node with SIMD units is a GPU; the CPU's node (0 SIMDs) is not."""
        site = tmp_path / "site"
        write(site / "jax_plugins" / "xla_rocm7" / "__init__.py", "")
        cpu_only, with_gpu = machine(tmp_path / "cpu"), machine(tmp_path / "gpu")
        for root in (cpu_only, with_gpu):
            node = root / "sys/class/kfd/kfd/topology/nodes/0/properties"
            write(node, "cpu_cores_count 8\nsimd_count 0\n")
        write(with_gpu / "sys/class/kfd/kfd/topology/nodes/1/properties", "simd_count 304\n")
        assert _platforms.startable({}, root=cpu_only, path=[str(site)], cwd="/").gpus == ()
        assert _platforms.startable({}, root=with_gpu, path=[str(site)], cwd="/").gpus == ("rocm",)

    def test_finding_out_imports_no_jax(self, tmp_path: Path) -> None:
        """`devpolicy run` asks the same question and must not import JAX."""
        code = """
            import sys
            from devpolicy._runtime.platforms import startable
            startable()
            print("jax" in sys.modules)
        """
        assert python(code, tmp_path).stdout.split() == ["False"]


def devpolicy_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The `devpolicy` command as installed (its `sys.path[0]` is the scripts folder)."""
    script = Path(sys.executable).with_name("devpolicy")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "devpolicy"]
    return run_command([*command, *args], cwd)


@needs_no_chip
class TestOneAnswer:
    @pytest.mark.slow
    def test_run_bootstrap_devices_and_check_agree_beside_a_stray_libtpu(
        self, tmp_path: Path
    ) -> None:
        """In one folder holding a stray `libtpu.py`: `run --dry-run`, `bootstrap()` and
        `devices` all start `cpu` for `[accelerator, cpu]`, and for `[cpu]` none of them,
        nor `check`, warns of a hidden TPU."""
        plant(tmp_path, "libtpu.py")
        policy(tmp_path, "[accelerator, cpu]")
        policy(tmp_path, "[cpu]", "q.yaml")
        dry = devpolicy_cli("run", "--policy", "p.yaml", "--dry-run", cwd=tmp_path)
        assert "export JAX_PLATFORMS=cpu" in dry.stdout.splitlines(), dry.stderr
        stray = "libtpu.py in the working directory is not an installed libtpu"
        assert stray in dry.stderr
        module = run_command(
            [sys.executable, "-m", "devpolicy", "run", "--policy", "p.yaml", "--dry-run"], tmp_path
        )
        assert module.stdout == dry.stdout
        started = python(STARTED, tmp_path)
        assert started.stdout.split() == ["cpu", "cpu"], started.stderr
        devices = devpolicy_cli("devices", "--json", "--policy", "p.yaml", cwd=tmp_path)
        knobs = {k["knob"]: k for k in json.loads(devices.stdout)["runtime"]}
        assert knobs["platforms"]["value"] == "cpu", devices.stderr
        assert stray in knobs["platforms"]["note"]
        code = "import devpolicy\nprint(devpolicy.bootstrap('q.yaml').policy.file, end=' ')\n"
        hidden = python(code + "print(devpolicy.runtime_settings().hidden)", tmp_path)
        assert hidden.stdout.split() == ["q.yaml", "()"], hidden.stderr
        quiet = devpolicy_cli("run", "--policy", "q.yaml", "--dry-run", cwd=tmp_path)
        assert "hides" not in quiet.stderr
        check = devpolicy_cli("check", "--json", "q.yaml", cwd=tmp_path)
        codes = [f["code"] for f in json.loads(check.stdout)["findings"]]
        assert "runtime-hides-accelerator" not in codes
