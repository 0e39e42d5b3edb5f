"""Moving NumPy test inputs into an implementation's array type and back.

One small class per array kind. Frameworks are imported inside the methods, so
merely naming an array kind imports nothing.
"""
from __future__ import annotations

import functools

import numpy as np

DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16")
DEVICE_NAMES = ("cpu", "cuda")  # what DEVICES, DTYPES-by-device and --device may name


def numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def dtype_name(dtype) -> str:
    """The contract's name for a NumPy, torch or JAX dtype ('float32', 'bool', ...)."""
    text = str(dtype)
    return text.rsplit(".", 1)[-1]


class NumpyArrays:
    kind = "numpy"

    def devices(self) -> list[str]:
        return ["cpu"]

    def unavailable_reason(self) -> str | None:
        return None

    def to_native(self, array: np.ndarray, device: str):
        return array

    def to_numpy(self, value) -> np.ndarray:
        return np.asarray(value)


class TorchArrays:
    kind = "torch"

    @functools.cache  # one attempt per run: a failing import is retried from scratch every time
    def unavailable_reason(self) -> str | None:
        try:
            import torch  # noqa: F401
        except Exception as exc:  # ImportError or a broken install
            return f"torch is not importable: {exc}"
        return None

    @functools.cache  # devices do not come and go during a run
    def devices(self) -> list[str]:
        import torch

        return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

    def to_native(self, array: np.ndarray, device: str):
        import torch

        if array.dtype == numpy_dtype("bfloat16"):
            # torch.from_numpy knows no bfloat16; float32 holds every bfloat16 exactly.
            return torch.from_numpy(array.astype(np.float32)).to(device=device, dtype=torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(array)).to(device)

    def to_numpy(self, value) -> np.ndarray:
        import torch

        if not isinstance(value, torch.Tensor):
            return np.asarray(value)
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            return value.float().numpy().astype(numpy_dtype("bfloat16"))
        return value.numpy()


class JaxArrays:
    kind = "jax"

    @functools.cache
    def unavailable_reason(self) -> str | None:
        try:
            import jax  # noqa: F401
        except Exception as exc:
            return f"jax is not importable: {exc}"
        return None

    def _jax(self):
        import jax

        # float64 cases need x64; inputs always carry an explicit dtype, so
        # enabling it changes no other case.
        jax.config.update("jax_enable_x64", True)
        return jax

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
        return jax.device_put(array, jax.devices(platform)[0])

    def to_numpy(self, value) -> np.ndarray:
        return np.asarray(value)


ARRAY_KINDS = {"numpy": NumpyArrays(), "torch": TorchArrays(), "jax": JaxArrays()}
