"""devpolicy's errors cross process boundaries: each survives pickling with its fields and
message, so one raised in a worker process reaches the parent as itself."""

from __future__ import annotations

import inspect
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

import devpolicy
import devpolicy.errors
from devpolicy._base.errors import Problem

TIMEOUT = 120

# One instance of each class, every field given a value of its own.
SAMPLES: dict[str, Any] = {
    "AxisNamesError": lambda cls: cls("params/w", ("embed", None, ("a", "b")), (16, 32), " (r)"),
    "CheckpointMismatchError": lambda cls: cls(
        "m.safetensors", missing=["w"], unexpected=["v"], mismatched=[("x", "shape")], hint="h"
    ),
    "DevicePolicyError": lambda cls: cls("something went wrong"),
    "DeviceUnavailableError": lambda cls: cls(
        "gpu:1", [("gpu:1", "no gpu")], ["cpu:0"], {"gpu": "no plugin"}, " for 'x'"
    ),
    "EnvOverrideError": lambda cls: cls("DEVPOLICY_LOG_LEVEL", "loud", "unknown level", "info"),
    "HostViewError": lambda cls: cls("float32[4] on gpu:0", "not on a host device", "load it"),
    "MachineSpecError": lambda cls: cls("--devices", "gpu=x", "not a count", "gpu=8x80GiB"),
    "NarrowingError": lambda cls: cls([("a", "too big"), ("b", "too small")], "m.safetensors"),
    "ObjectChangedError": lambda cls: cls(
        "s3://b/k", "changed", byte_range=(0, 8), status=412, attempts=2
    ),
    "PolicyError": lambda cls: cls(
        [Problem("p.yaml", 3, "default", "bad"), Problem("p.yaml", None, "", "worse")]
    ),
    "RangeIgnoredError": lambda cls: cls("https://h/f", "ignored Range", status=200),
    "RemoteCacheError": lambda cls: cls("/cache/entry", "damaged", "delete it"),
    "RemoteExtraMissingError": lambda cls: cls("s3://b/k", "botocore"),
    "RemoteOfflineError": lambda cls: cls("hf://r/f", "not in the cache"),
    "RemoteOptionError": lambda cls: cls("retries", -1, "negative", "an integer >= 0"),
    "RemoteReadError": lambda cls: cls("gs://b/k", "timed out", byte_range=(8, 16), attempts=3),
    "RemoteURLError": lambda cls: cls("s3://", "bucket", "missing"),
    "RuntimeTooLateError": lambda cls: cls([("cpu_devices", "2", "4", "p.yaml:3")], "earlier"),
    "SafetensorsFileError": lambda cls: cls("m.safetensors", "truncated", tensor="w"),
    "ScopeInCoroutineError": lambda cls: cls("model"),
    "StreamStateError": lambda cls: cls("batch", "the saved stream had batch=32", "resume alike"),
    "StreamEndedError": lambda cls: cls("batch", "failed at step 7: HostViewError: cut", "reopen"),
    "TransferPlanError": lambda cls: cls("step", "args[0]", "deleted: the call would fail"),
    "TransferRefusedError": lambda cls: cls(
        "train.py:7",
        "host_to_device",
        "numpy",
        ("cpu:1",),
        64,
        "float32[16]",
        "host_to_device",
        "p.yaml:5",
    ),
    "UnmatchedNameError": lambda cls: cls("x", "p.yaml:2", ["model/*"]),
    "UntrustedPolicyError": lambda cls: cls("/tmp/p.yaml", "owned by eve", 1001, "eve", "chown"),
}

CLASSES = sorted(
    name
    for name in devpolicy.errors.__all__
    if inspect.isclass(getattr(devpolicy.errors, name))
    and issubclass(getattr(devpolicy.errors, name), BaseException)
)


def fields(error: BaseException) -> dict[str, Any]:
    """Everything an error holds: its attributes, and the built-in ones of OSError and
    ImportError that live outside `__dict__`."""
    held = dict(vars(error))
    for name in ("errno", "strerror", "filename", "filename2", "msg", "name", "path"):
        if hasattr(type(error), name):
            held[name] = getattr(error, name)
    return held


class TestPickling:
    def test_every_error_class_has_a_sample(self) -> None:
        """A class added to devpolicy.errors is tested here as soon as it has a sample."""
        assert set(CLASSES) <= set(SAMPLES), sorted(set(CLASSES) - set(SAMPLES))

    @pytest.mark.parametrize("name", CLASSES)
    def test_an_error_survives_a_pickle_round_trip(self, name: str) -> None:
        """The same class, message, args and fields after pickling and unpickling."""
        error = SAMPLES[name](getattr(devpolicy.errors, name))
        error.add_note("a note added on the way")
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error)
        assert str(back) == str(error)
        assert back.args == error.args
        assert fields(back) == fields(error)
        assert back.__notes__ == ["a note added on the way"]

    @pytest.mark.parametrize("name", CLASSES)
    def test_an_unpickled_error_still_is_its_builtin_kind(self, name: str) -> None:
        """`except ValueError` (or OSError, ImportError...) still catches it."""
        error = SAMPLES[name](getattr(devpolicy.errors, name))
        back = pickle.loads(pickle.dumps(error))
        assert set(type(back).__mro__) == set(type(error).__mro__)


class TestWorkerProcesses:
    @pytest.mark.slow
    def test_a_policy_error_in_a_pool_worker_reaches_the_parent_as_itself(self) -> None:
        """Raised in a ProcessPoolExecutor worker: the parent gets the PolicyError with its
        problems, and the pool goes on working (no BrokenProcessPool)."""
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
            future = pool.submit(devpolicy.load_policy, {"version": 1, "default": "gpuu"})
            with pytest.raises(
                devpolicy.PolicyError, match=r"^<mapping>.*default.*did you mean 'gpu'"
            ) as caught:
                future.result(timeout=TIMEOUT)
            assert caught.value.field == "default"
            assert caught.value.problems[0].file == "<mapping>"
            again = pool.submit(devpolicy.load_policy, {"version": 1})
            assert again.result(timeout=TIMEOUT).rules == ()
