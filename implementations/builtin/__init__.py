"""The built-in implementations, one module per framework and one small class per code path.

Each class meets the contract of ``attention_conformance.implementations`` (its docstring) on its framework's
arrays and declares what it runs (DTYPES, SUPPORTS) and what it was measured to do differently
(FULLY_MASKED_ROWS, KNOWN_DEVIATIONS). Frameworks are imported inside the methods, so a framework that is not
installed costs nothing until a built-in of it is called, and is then reported skipped with its reason.

- ``numpy_backend``: the oracle itself (``numpy_oracle``) and a NumPy port of a kernel's arithmetic
  (``numpy_native``);
- ``torch_backend``: torch's math path, ``scaled_dot_product_attention``'s default dispatch, ``nn.MultiheadAttention``
  and an FP8 path on ``torch._scaled_mm``; ``torch_cuda``: the CUDA kernels pinned one at a time (flash, memory
  efficient, cuDNN); ``torch_flex``: ``flex_attention`` compiled, on CUDA and on the CPU;
- ``jax_backend``: ``jax.nn.dot_product_attention`` (XLA and cuDNN) and the Pallas flash kernel; ``jax_numpy``:
  hand-written ``jax.numpy`` run in size buckets; ``jax_jit``: the compile cache and XLA options they share;
- ``sequence_parallel_torch``: ring attention and Ulysses on torch.distributed; ``sequence_parallel_jax``: the same
  under JAX's shard_map (sdpa_sequence_parallel);
- ``common``: array helpers shared by several frameworks' paths; ``cuda_deviations``: CUDA kernels' measured
  conventions, declared by the torch and JAX paths alike.

``BUILTINS`` is the catalogue ``builtin:NAME`` and a run without ``--impl`` load (implementations/registry.py).
``REFERENCE_BUILTINS`` are the suite's own arithmetic, which call no framework's attention: the float64 oracle and
the NumPy and jax.numpy ports of a kernel's arithmetic. The dev profile's run without ``--impl`` leaves them out
where torch or JAX is installed (conformance/plugin.py); ``--hypothesis-profile ci`` runs them, as CI does.
"""
from __future__ import annotations

from attention_conformance.implementations.builtin.jax_backend import (
    JaxCuDNNAttention,
    JaxDotProductAttention,
    JaxPallasFlashAttention,
)
from attention_conformance.implementations.builtin.jax_numpy import JaxNumpy
from attention_conformance.implementations.builtin.numpy_backend import NumpyNative, NumpyOracle
from attention_conformance.implementations.builtin.sequence_parallel_jax import JaxRingAttention, JaxUlyssesAttention
from attention_conformance.implementations.builtin.sequence_parallel_torch import (
    TorchRingAttention,
    TorchUlyssesAttention,
)
from attention_conformance.implementations.builtin.torch_backend import (
    TorchMath,
    TorchMultiheadAttentionModule,
    TorchScaledMMFP8,
    TorchSDPA,
)
from attention_conformance.implementations.builtin.torch_cuda import (
    TorchCuDNNAttention,
    TorchFlashAttention,
    TorchMemoryEfficientAttention,
)
from attention_conformance.implementations.builtin.torch_flex import TorchFlexAttention, TorchFlexAttentionCPU

BUILTINS = (
    NumpyOracle,
    NumpyNative,
    TorchMath,
    TorchSDPA,
    TorchFlashAttention,
    TorchMemoryEfficientAttention,
    TorchCuDNNAttention,
    TorchFlexAttention,
    TorchFlexAttentionCPU,
    TorchMultiheadAttentionModule,
    JaxDotProductAttention,
    JaxCuDNNAttention,
    JaxPallasFlashAttention,
    JaxNumpy,
    TorchScaledMMFP8,
    TorchRingAttention,
    TorchUlyssesAttention,
    JaxRingAttention,
    JaxUlyssesAttention,
)


REFERENCE_BUILTINS = (NumpyOracle.NAME, NumpyNative.NAME, JaxNumpy.NAME)
