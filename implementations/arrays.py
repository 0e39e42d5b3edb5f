"""Array adapters: everything the suite knows about one array framework, in one class each.

An implementation declares ``ARRAY = "<kind>"``; the adapter registered under that
kind is the only place the suite learns about the framework. Every adapter meets
this contract (``ArrayAdapter`` gives the defaults):

``kind``
    The name implementations put in ARRAY.
``DEVICES``
    Every device name the framework can ever offer (a subset of, or an addition
    to, "cpu" and "cuda"). ``--device``'s choices, DEVICES and DTYPES-by-device
    of an implementation, and the parametrisation all come from the union over
    the registered adapters (``device_names()``).
``unavailable_reason()``
    None when the framework imports, else why not (its implementations are then
    skipped with that reason).
``devices()``
    The devices of DEVICES present on this machine (imports the framework).
``to_native(array, device)`` / ``to_numpy(value)``
    A NumPy test input (any of DTYPE_NAMES, bfloat16 as ml_dtypes.bfloat16) into
    the framework's array on ``device``, and an output back into NumPy.
``precision(arrays)``
    A context manager the suite enters around converting a case's inputs and calling the
    implementation (in the thread that calls it), given the case's NumPy arrays (a dict,
    nested dicts allowed): the framework settings that case needs and no others. JAX's
    enables x64 for a case with float64 arrays only; every other case runs under JAX's
    defaults (docs/declarations.md, "JAX and float64").
``versions()``
    Version of each module of ``VERSION_MODULES`` the process has imported, None for
    one it has not: the report's environment lists them. Never imports anything.
``device_info()``
    Names of the framework's devices for the report (e.g. {"cuda": [...]}), only
    when the framework is already imported and started. Never imports anything.
``DIFFERENTIABLE`` and ``vjp(forward, primals, d_out, device)``
    Whether the suite may differentiate an implementation of this kind
    (conformance/judging/gradients.py), and how: ``forward(**arrays)`` is called on the
    native ``primals`` (name -> native array) and ``vjp`` returns ``(out,
    {name: gradient or None})`` as native arrays for the upstream NumPy ``d_out``;
    it raises NotDifferentiable when the output carries no gradient.

Frameworks are imported inside the methods, so naming or registering an adapter
imports nothing. A new framework is one subclass of ``ArrayAdapter`` added to
ADAPTERS below; code outside the suite (a conftest, a plugin, or the module of the
implementation itself, before the suite reads its ARRAY) calls ``register(adapter)``.
"""
from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Callable

import numpy as np

DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16")


# 8-bit floating-point inputs (FP8 attention, docs/contract.md, FP8): q, k and v stored as OCP float8
# (e4m3fn: 4 exponent bits, 3 mantissa bits, no infinity, max 448; e5m2: 5 and 2, max 57344) with per-head descale
# factors. An implementation declares them in DTYPES beside (or instead of) the computing dtypes above; only the
# 8-bit tests (conformance/test_fp8.py, fixtures marked for them) run in them, and the 16/32/64-bit tests never do.
EIGHT_BIT_DTYPE_NAMES = ("float8_e4m3fn", "float8_e5m2")


DECLARABLE_DTYPE_NAMES = DTYPE_NAMES + EIGHT_BIT_DTYPE_NAMES


SUITE_DEVICES = ("cpu", "cuda")  # the device names the suite's own adapters use


class NotDifferentiable(Exception):
    """The implementation's output carries no gradient (detached, or not a framework array)."""


def needs_ml_dtypes(name: str) -> bool:
    """bfloat16 and the 8-bit formats: NumPy knows none of them, ml_dtypes gives their NumPy types."""
    return name == "bfloat16" or name in EIGHT_BIT_DTYPE_NAMES


@functools.cache
def dtype_unavailable_reason(name: str) -> str | None:
    """Why the suite cannot make test inputs of dtype ``name`` here (None: it can). ml_dtypes is a dependency of the
    suite, but an environment that lacks it still runs every other dtype: these are skipped with this reason."""
    if not needs_ml_dtypes(name):
        return None
    missing = _import_reason("ml_dtypes")
    return f"{name} needs ml_dtypes ({missing}; pip install ml_dtypes)" if missing else None


def numpy_dtype(name: str) -> np.dtype:
    if needs_ml_dtypes(name):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def is_eight_bit(name: str) -> bool:
    """Whether a dtype name (DECLARABLE_DTYPE_NAMES) is one of the 8-bit input formats."""
    return name in EIGHT_BIT_DTYPE_NAMES


def dtype_name(dtype) -> str:
    """The contract's name for a NumPy, torch or JAX dtype ('float32', 'bool', ...)."""
    text = str(dtype)
    return text.rsplit(".", 1)[-1]


def module_version(name: str) -> str | None:
    module = sys.modules.get(name)
    version = getattr(module, "__version__", None) if module else None
    return None if version is None else str(version)  # torch's is a str subclass xdist cannot send


class ArrayAdapter:
    """The defaults of the contract in the module docstring: a CPU-only framework that cannot differentiate."""

    kind: str = ""
    DEVICES: tuple[str, ...] = ("cpu",)
    VERSION_MODULES: tuple[str, ...] = ()
    DIFFERENTIABLE = False

    def unavailable_reason(self) -> str | None:
        return None

    def devices(self) -> list[str]:
        return list(self.DEVICES)

    def to_native(self, array: np.ndarray, device: str):
        raise NotImplementedError

    def to_numpy(self, value) -> np.ndarray:
        return np.asarray(value)

    def precision(self, arrays) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def versions(self) -> dict[str, str | None]:
        return {name: module_version(name) for name in self.VERSION_MODULES}

    def device_info(self) -> dict[str, Any]:
        return {}

    def vjp(self, forward: Callable, primals: dict[str, Any], d_out: np.ndarray, device: str):
        raise NotImplementedError(f"ARRAY {self.kind!r} does not differentiate")


def _import_reason(module: str) -> str | None:
    try:
        __import__(module)
    except Exception as exc:  # ImportError or a broken install
        return f"{module} is not importable: {exc}"
    return None


class NumpyArrays(ArrayAdapter):
    kind = "numpy"
    VERSION_MODULES = ("numpy",)

    def to_native(self, array: np.ndarray, device: str):
        return array


class TorchArrays(ArrayAdapter):
    kind = "torch"
    DEVICES = ("cpu", "cuda")
    VERSION_MODULES = ("torch",)
    DIFFERENTIABLE = True

    @functools.cache  # one attempt per run: a failing import is retried from scratch every time
    def unavailable_reason(self) -> str | None:
        return _import_reason("torch")

    @functools.cache  # devices do not come and go during a run
    def devices(self) -> list[str]:
        import torch

        return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

    def to_native(self, array: np.ndarray, device: str):
        import torch

        if array.dtype == numpy_dtype("bfloat16"):
            # torch.from_numpy knows no bfloat16; float32 holds every bfloat16 exactly.
            return torch.from_numpy(array.astype(np.float32)).to(device=device, dtype=torch.bfloat16)
        if dtype_name(array.dtype) in EIGHT_BIT_DTYPE_NAMES:
            # Nor float8: the same bytes, reinterpreted (ml_dtypes and torch share the OCP encodings).
            bits = torch.from_numpy(np.ascontiguousarray(array).view(np.uint8))
            return bits.view(getattr(torch, dtype_name(array.dtype))).to(device)
        return torch.from_numpy(np.ascontiguousarray(array)).to(device)

    def to_numpy(self, value) -> np.ndarray:
        import torch

        if not isinstance(value, torch.Tensor):
            return np.asarray(value)
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            return value.float().numpy().astype(numpy_dtype("bfloat16"))
        if dtype_name(value.dtype) in EIGHT_BIT_DTYPE_NAMES:
            return value.contiguous().view(torch.uint8).numpy().view(numpy_dtype(dtype_name(value.dtype)))
        return value.numpy()

    def device_info(self) -> dict[str, Any]:
        torch = sys.modules.get("torch")
        if torch is None:
            return {}
        try:
            if torch.cuda.is_available():
                return {"cuda": [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]}
        except Exception:  # a GPU in a bad state (a device-side assert, say) must not cost the report
            pass
        return {}

    def vjp(self, forward, primals, d_out, device):
        import torch

        leaves = {name: value.detach().requires_grad_(True) for name, value in primals.items()}
        with torch.enable_grad():
            out = forward(**leaves)
            if not isinstance(out, torch.Tensor):
                raise NotDifferentiable(f"sdpa returned {type(out).__name__}, not a torch.Tensor")
            if not out.requires_grad:
                raise NotDifferentiable(
                    "the output does not require grad (the graph was cut: detach, NumPy or no_grad)")
            out.backward(self.to_native(np.asarray(d_out), device).to(out.dtype))
        return out, {name: leaf.grad for name, leaf in leaves.items()}


class JaxArrays(ArrayAdapter):
    kind = "jax"
    DEVICES = ("cpu", "cuda")
    VERSION_MODULES = ("jax", "jaxlib")
    DIFFERENTIABLE = True

    @functools.cache
    def unavailable_reason(self) -> str | None:
        return _import_reason("jax")

    def _jax(self):
        import jax

        return jax

    def precision(self, arrays) -> contextlib.AbstractContextManager:
        """x64 for a float64 case only, scoped to this thread and call: turned on for the whole process it had
        changed every case (jnp.arange, integer division and Python scalars become 64-bit), which broke the
        Pallas kernel's causal path (int32 against int64 in lax.div) on its float32 cases."""
        if not _has_float64(arrays):
            return contextlib.nullcontext()
        jax = self._jax()
        if hasattr(jax, "enable_x64"):
            return jax.enable_x64(True)
        from jax.experimental import enable_x64  # older JAX

        return enable_x64()

    @functools.cache
    def devices(self) -> list[str]:
        jax = self._jax()
        found = ["cpu"]
        try:
            if jax.devices("gpu"):
                found.append("cuda")
        except RuntimeError:
            pass
        return found

    def to_native(self, array: np.ndarray, device: str):
        jax = self._jax()
        platform = "gpu" if device == "cuda" else "cpu"
        with self.precision({"array": array}):  # outside a float64 case's scope, float64 would become float32
            return jax.device_put(array, jax.devices(platform)[0])

    def device_info(self) -> dict[str, Any]:
        jax = sys.modules.get("jax")
        if jax is None:
            return {}
        try:
            from jax._src import xla_bridge

            # Only backends the run started: asking for devices would start the others.
            if xla_bridge.backends_are_initialized():
                return {"jax": sorted({f"{d.platform}:{d.id} {d.device_kind}"
                                       for platform in xla_bridge.backends() for d in jax.devices(platform)})}
        except Exception:
            pass
        return {}

    def vjp(self, forward, primals, d_out, device):
        jax = self._jax()
        names = list(primals)
        out, pullback = jax.vjp(lambda *arrays: forward(**dict(zip(names, arrays))), *primals.values())
        cotangents = pullback(self.to_native(np.asarray(d_out), device).astype(out.dtype))
        return out, dict(zip(names, cotangents))


def _has_float64(arrays) -> bool:
    """Whether a case's arrays (a dict of NumPy arrays, nested dicts, options) hold a float64 array."""
    values = arrays.values() if isinstance(arrays, dict) else [arrays]
    return any(_has_float64(v) if isinstance(v, dict) else getattr(v, "dtype", None) == np.float64 for v in values)


ADAPTERS: tuple[ArrayAdapter, ...] = (NumpyArrays(), TorchArrays(), JaxArrays())


ARRAY_KINDS: dict[str, ArrayAdapter] = {adapter.kind: adapter for adapter in ADAPTERS}


def register(adapter: ArrayAdapter) -> ArrayAdapter:
    """Make ``adapter`` the one for ARRAY = adapter.kind (replacing one of that kind); returns it.

    Devices it brings that no other adapter has reach --device's choices only when
    it is registered before pytest parses the options (a conftest or a plugin).
    """
    if not adapter.kind or not isinstance(adapter.kind, str):
        raise ValueError(f"{type(adapter).__name__}: an array adapter needs a kind (the name ARRAY gives)")
    if not adapter.DEVICES or isinstance(adapter.DEVICES, str):
        raise ValueError(f"{type(adapter).__name__}: DEVICES must be a non-empty tuple of device names")
    ARRAY_KINDS[adapter.kind] = adapter
    return adapter


def device_names() -> tuple[str, ...]:
    """Every device a registered adapter can offer: the suite's first, then others in registration order."""
    found = list(SUITE_DEVICES)
    for adapter in ARRAY_KINDS.values():
        found.extend(d for d in adapter.DEVICES if d not in found)
    return tuple(found)


def differentiable_kinds() -> tuple[str, ...]:
    return tuple(kind for kind, adapter in ARRAY_KINDS.items() if adapter.DIFFERENTIABLE)


def framework_versions() -> dict[str, str | None]:
    """The registered frameworks' versions (None: not imported by this process)."""
    versions: dict[str, str | None] = {}
    for adapter in ARRAY_KINDS.values():
        versions.update(adapter.versions())
    return versions


def device_info() -> dict[str, Any]:
    """The registered frameworks' device names for the report, from those already imported and started."""
    info: dict[str, Any] = {}
    for adapter in ARRAY_KINDS.values():
        info.update(adapter.device_info())
    return info
