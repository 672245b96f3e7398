"""The active policy: activation, discovery on first use, and module-level functions."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from structlog.testing import capture_logs

import devpolicy
from tests.helpers import policy_of, write


class TestActivation:
    def test_activate_as_context_manager_restores_the_previous(self) -> None:
        """`with activate(p)` makes p active and restores the previous policy after."""
        outer, inner = policy_of(default="cpu:1"), policy_of(default="cpu:2")
        with devpolicy.activate(outer):
            with devpolicy.activate(inner):
                assert devpolicy.resolve("x").device_text == "cpu:2"
            assert devpolicy.resolve("x").device_text == "cpu:1"

    def test_activate_as_a_call_takes_effect_at_once(self) -> None:
        """activate(p) without `with` keeps p active for this context."""
        activation = devpolicy.activate(policy_of(default="cpu:3"))
        try:
            assert devpolicy.active_policy() is activation.policy
        finally:
            activation.__exit__(None, None, None)

    def test_without_activation_the_discovered_policy_is_used(self, tmp_path: Path) -> None:
        """Module-level calls load devpolicy.yaml once, lazily."""
        write(tmp_path / "devpolicy.yaml", "version: 1\ndefault: cpu:2\n")
        assert devpolicy.resolve("x").device_text == "cpu:2"
        (tmp_path / "devpolicy.yaml").write_text("version: 1\ndefault: cpu:3\n")
        assert devpolicy.resolve("x").device_text == "cpu:2"

    def test_outermost_activation_serves_other_threads(self) -> None:
        """Worker threads started after activate() use it too."""
        seen = []
        with devpolicy.activate(policy_of(default="cpu:3")):
            t = threading.Thread(target=lambda: seen.append(devpolicy.resolve("x").device_text))
            t.start()
            t.join()
        assert seen == ["cpu:3"]

    def test_tasks_activate_independently(self) -> None:
        """asyncio tasks copy the context, so each task's activation is its own."""

        async def one(default: str) -> str:
            with devpolicy.activate(policy_of(default=default)):
                await asyncio.sleep(0)
                return devpolicy.resolve("x").device_text

        async def main() -> list[str]:
            return list(await asyncio.gather(one("cpu:1"), one("cpu:2")))

        assert asyncio.run(main()) == ["cpu:1", "cpu:2"]

    def test_activate_rejects_non_policies(self) -> None:
        """Passing a path or mapping is a clear TypeError pointing to load_policy."""
        with pytest.raises(
            TypeError,
            match=r"^activate\(\) takes a Policy \(from devpolicy\.load_policy\), got dict",
        ):
            devpolicy.activate({"version": 1})  # type: ignore[arg-type]


class TestModuleLevelFunctions:
    def test_place_looks_up_the_policy_at_call_time(self, cpus: list[jax.Device]) -> None:
        """Decorate at import, activate later: the later policy applies."""

        @devpolicy.place("dataset/train")
        def load() -> jax.Array:
            return jnp.zeros(2)

        with devpolicy.activate(policy_of(default="cpu:1")):
            first = load()
        with devpolicy.activate(policy_of(default="cpu:2")):
            second = load()
        assert (first.devices(), second.devices()) == ({cpus[1]}, {cpus[2]})

    def test_scope_put_and_explain_use_the_active_policy(self, cpus: list[jax.Device]) -> None:
        """Every module-level function decides by the active policy."""
        with devpolicy.activate(policy_of(rules=[{"match": "d*", "device": "cpu:3"}])):
            with devpolicy.scope("data") as d:
                assert jnp.zeros(1).devices() == {cpus[3]}
            assert devpolicy.put("data", np.zeros(1)).devices() == {cpus[3]}
            assert devpolicy.explain("data").decision == d

    def test_a_broken_discovered_policy_raises_at_first_use(self, tmp_path: Path) -> None:
        """A bad devpolicy.yaml fails loudly, naming the file and line."""
        write(tmp_path / "devpolicy.yaml", "version: 1\ndefault: gpuu\n")
        with pytest.raises(
            devpolicy.PolicyError, match=r"^devpolicy\.yaml:2: default: unknown platform 'gpuu'"
        ):
            devpolicy.resolve("x")

    def test_every_module_function_is_a_policy_method(self) -> None:
        """The module-level API and the Policy methods match."""
        for name in ("resolve", "scope", "place", "put", "explain"):
            assert callable(getattr(devpolicy.Policy, name))


class TestActivationRegressions:
    def test_earliest_activation_serves_unrelated_threads(self) -> None:
        """A worker's own activation does not become every other thread's policy."""
        seen: list[str] = []
        main_policy, worker_policy = policy_of(default="cpu:1"), policy_of(default="cpu:3")
        worker_in, worker_out = threading.Event(), threading.Event()

        def worker() -> None:
            with devpolicy.activate(worker_policy):
                worker_in.set()
                worker_out.wait(5)

        with devpolicy.activate(main_policy):
            w = threading.Thread(target=worker)
            w.start()
            worker_in.wait(5)
            other = threading.Thread(target=lambda: seen.append(devpolicy.resolve("x").device_text))
            other.start()
            other.join()
            worker_out.set()
            w.join()
        assert seen == ["cpu:1"]

    def test_exit_in_another_context_is_a_clear_error_and_leaks_nothing(self) -> None:
        """Exiting an activation from another task raises and still removes it."""
        import contextvars

        activation = devpolicy.activate(policy_of(default="cpu:2"))
        with pytest.raises(
            RuntimeError, match=r"exited in a different context than it was entered"
        ):
            contextvars.Context().run(activation.__exit__, None, None, None)
        from devpolicy._policy import active as _active

        assert activation not in _active._outermost
        _active._ACTIVE.reset(activation._token)

    def test_bad_overrides_type(self) -> None:
        """overrides must be a mapping."""
        with pytest.raises(TypeError, match=r"^overrides must be a mapping of settings, got str$"):
            devpolicy.load_policy({"version": 1}, environ={}, overrides="abc")  # type: ignore[arg-type]


class TestPolicyNotActive:
    def test_loaded_but_not_activated_policy_is_warned_about_once(self, tmp_path: Path) -> None:
        """`load_policy("minilm.yaml")` then `devpolicy.resolve`: one warning naming both files."""
        write(tmp_path / "devpolicy.yaml", "version: 1\ndefault: cpu:2\n")
        write(tmp_path / "minilm.yaml", "version: 1\ndefault: cpu:1\n")
        devpolicy.load_policy("minilm.yaml")
        with capture_logs() as logs:
            first = devpolicy.resolve("x")
            devpolicy.resolve("y")
        assert first.device_text == "cpu:2"  # still the discovered one: nothing silently changes
        (event,) = [e for e in logs if e["event"] == "policy_not_active"]
        assert event["log_level"] == "warning"
        assert (event["loaded"], event["deciding"]) == ("minilm.yaml", "devpolicy.yaml")
        assert "devpolicy.activate(policy)" in event["fix"]

    def test_activated_policy_gives_no_warning(self, tmp_path: Path) -> None:
        """Activating the loaded policy is the fix: no warning."""
        write(tmp_path / "devpolicy.yaml", "version: 1\ndefault: cpu:2\n")
        write(tmp_path / "minilm.yaml", "version: 1\ndefault: cpu:1\n")
        policy = devpolicy.load_policy("minilm.yaml")
        with capture_logs() as logs, devpolicy.activate(policy):
            assert devpolicy.resolve("x").device_text == "cpu:1"
        assert not [e for e in logs if e["event"] == "policy_not_active"]

    def test_loading_the_discovered_file_itself_gives_no_warning(self, tmp_path: Path) -> None:
        """The loaded file is the one discovered: nothing to warn about."""
        write(tmp_path / "devpolicy.yaml", "version: 1\ndefault: cpu:2\n")
        devpolicy.load_policy("devpolicy.yaml")
        with capture_logs() as logs:
            devpolicy.resolve("x")
        assert not [e for e in logs if e["event"] == "policy_not_active"]


def no_policy_events(logs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [e for e in logs if e["event"] == "no_policy"]


class TestNoPolicyFound:
    @pytest.mark.parametrize(
        "call",
        [
            lambda: devpolicy.put("params", {"w": np.ones(4, np.float32)}),
            lambda: devpolicy.shardings("params", {"w": jax.ShapeDtypeStruct((4,), np.float32)}),
            lambda: devpolicy.place("step")(lambda: jnp.ones(2))(),
            lambda: devpolicy.resolve("x"),
        ],
        ids=["put", "shardings", "place", "resolve"],
    )
    def test_discovery_that_finds_nothing_warns_once(self, tmp_path: Path, call: object) -> None:
        """The first module-level call discovers no policy: one `no_policy` warning naming
        where discovery looked and the DEVPOLICY_FILE fix; the second call says nothing."""
        with capture_logs() as logs:
            call()  # type: ignore[operator]
            call()  # type: ignore[operator]
        (warning,) = no_policy_events(logs)
        assert warning["log_level"] == "warning"
        assert f"devpolicy.yaml in {tmp_path}" in str(warning["looked"])
        assert "DEVPOLICY_FILE=" in str(warning["fix"])
        assert "DEVPOLICY_REQUIRE=1" in str(warning["fix"])

    def test_load_file_with_no_policy_warns_once(self, tmp_path: Path) -> None:
        """Saving and loading a checkpoint by the discovered (empty) policy says so once."""
        path = tmp_path / "m.safetensors"
        with capture_logs() as logs:
            devpolicy.save_file({"w": np.ones((2, 2), np.float32)}, path)
            devpolicy.load_file(path)
            devpolicy.load_file(path)
        assert len(no_policy_events(logs)) == 1

    def test_save_file_places_nothing_and_says_nothing_of_a_missing_policy(self) -> None:
        """save_file of numpy arrays with no policy found writes with no `no_policy`
        warning (writing places nothing: issue 43, N3); the first call that places
        still warns, once."""
        with capture_logs() as logs:
            devpolicy.save_file({"w": np.ones(2, np.float32)}, "w.safetensors")
            devpolicy.save_file({"w": np.ones(2, np.float32)}, "w.safetensors")
        assert [e["event"] for e in logs] == ["save_file", "save_file"]
        with capture_logs() as logs:
            devpolicy.resolve("x")
            devpolicy.save_file({"w": np.ones(2, np.float32)}, "w.safetensors")
        assert len(no_policy_events(logs)) == 1

    def test_save_file_follows_a_discovered_policys_logging(self, tmp_path: Path) -> None:
        """A policy discovery finds still sets the save_file event's level."""
        write(tmp_path / "devpolicy.yaml", "version: 1\nlogging: {level: warning}\n")
        with capture_logs() as logs:
            devpolicy.save_file({"w": np.ones(2, np.float32)}, "w.safetensors")
        assert logs == []

    def test_one_warning_per_process_across_loads(self) -> None:
        """load_policy() twice, finding nothing both times: one warning."""
        with capture_logs() as logs:
            devpolicy.load_policy()
            devpolicy.load_policy()
        assert len(no_policy_events(logs)) == 1

    def test_the_looked_places_include_the_project_root_and_its_pyproject(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """In a project (pyproject.toml without a [tool.devpolicy] table) discovery looks up
        to its root and in its pyproject.toml, and says both."""
        write(tmp_path / "pyproject.toml", "[project]\nname = 'x'\n")
        (tmp_path / "src").mkdir()
        monkeypatch.chdir(tmp_path / "src")
        with capture_logs() as logs:
            devpolicy.load_policy()
        (warning,) = no_policy_events(logs)
        assert warning["looked"] == (
            f"devpolicy.yaml in {tmp_path / 'src'}, {tmp_path}; "
            f"[tool.devpolicy] in {tmp_path / 'pyproject.toml'}"
        )

    @pytest.mark.parametrize(
        "environ",
        [
            {"DEVPOLICY_RULES": "x=cpu:1"},
            {"DEVPOLICY_DEFAULT": "cpu:1"},
            {"DEVPOLICY_DISABLE": "1"},
        ],
    )
    def test_a_policy_from_the_environment_is_not_warned_about(
        self, environ: dict[str, str]
    ) -> None:
        """Rules or a default from the environment are a policy; the kill switch is meant."""
        with capture_logs() as logs:
            devpolicy.load_policy(environ=environ)
        assert no_policy_events(logs) == []

    def test_a_policy_found_is_not_warned_about(self, tmp_path: Path) -> None:
        """devpolicy.yaml in the working directory: no warning."""
        write(tmp_path / "devpolicy.yaml", "version: 1\n")
        with capture_logs() as logs:
            devpolicy.resolve("x")
        assert no_policy_events(logs) == []

    def test_devpolicy_require_makes_it_an_error(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """DEVPOLICY_REQUIRE=1: the first module-level call raises PolicyError naming the
        switch, where discovery looked and the fix; nothing is placed."""
        monkeypatch.setenv("DEVPOLICY_REQUIRE", "1")
        with pytest.raises(
            devpolicy.PolicyError,
            match=rf"^DEVPOLICY_REQUIRE: no policy found \(looked for devpolicy\.yaml in "
            rf"{re.escape(str(tmp_path))}.*\), and a policy is required; to fix: set "
            r"DEVPOLICY_FILE=path/to/devpolicy\.yaml",
        ):
            devpolicy.put("x", np.ones(2))

    def test_devpolicy_require_is_strictly_parsed(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A value that is not a boolean is an EnvOverrideError listing the accepted ones."""
        monkeypatch.setenv("DEVPOLICY_REQUIRE", "please")
        with pytest.raises(
            devpolicy.errors.EnvOverrideError,
            match=r"^DEVPOLICY_REQUIRE='please': not a boolean; accepted: 1, true, yes, on",
        ):
            devpolicy.load_policy()

    def test_devpolicy_require_with_a_policy_found_loads_it(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Required and present: nothing changes."""
        monkeypatch.setenv("DEVPOLICY_REQUIRE", "true")
        write(tmp_path / "devpolicy.yaml", "version: 1\ndefault: cpu:2\n")
        assert devpolicy.resolve("x").device_text == "cpu:2"

    def test_bootstrap_required_raises(self) -> None:
        """bootstrap(required=True) with nothing to find raises before activating."""
        with pytest.raises(devpolicy.PolicyError, match=r"^required=True: no policy found"):
            devpolicy.bootstrap(required=True)

    def test_bootstrap_required_false_wins_over_the_environment(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The call's own word beats DEVPOLICY_REQUIRE: it warns and activates the empty
        policy."""
        monkeypatch.setenv("DEVPOLICY_REQUIRE", "1")
        with capture_logs() as logs, devpolicy.bootstrap(required=False) as policy:
            assert policy.file is None
        assert len(no_policy_events(logs)) == 1
