"""Which CUDA attention paths keep q.k of an outlier channel past float16's range (CUDA only; evidence for
sdpa.score-range's declarations).

The case is the property's (conformance/strategies.py, outlier_channel_cases): float16 q and k whose one channel is
313.5 (k's times +-1 per key), so |q.k| reaches 9.8e4 while the scaled score stays below 2.5e4. For each built-in path,
head dim, mask (none, key padding) and causal flag this prints the largest error against a float64 reference of the
same float16 inputs and the count of non-finite outputs; for torch's pinned kernels it also runs q pre-scaled in
float16 with scale 1, which tells an overflow before the scale from any other fault.

    PYTHONPATH=. python benchmarks/score_range_probe.py
"""
from __future__ import annotations

import math
import os

import numpy as np

from attention_conformance.conformance.cases.sdpa import OUTLIER_UNSCALED_SCORE

B, H, HKV, L = 1, 4, 4, 64
SIZE = math.sqrt(OUTLIER_UNSCALED_SCORE)
DEVICE = os.environ.get("PROBE_DEVICE", "cuda")  # cpu: a dry run of the script


def case(dk: int, seed: int):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, h, L, dk)) for h in (H, HKV, HKV))
    q[..., 0] = SIZE
    k[..., 0] = SIZE * rng.choice([-1.0, 1.0], size=k.shape[:-1])
    keep = np.ones((B, 1, 1, L), bool)
    keep[..., L - L // 3:] = False
    return (q.astype(np.float16), k.astype(np.float16), v.astype(np.float16)), keep


def reference(q, k, v, keep, causal, *, round_scores=False):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if round_scores:
        s = s.astype(np.float16).astype(np.float64)
    allowed = np.broadcast_to(keep, s.shape) if keep is not None else np.ones(s.shape, bool)
    if causal:
        allowed = allowed & np.tril(np.ones((L, L), bool))
    s = np.where(allowed, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def report(name, dk, keep, causal, out, ref):
    """ref: (the float64 reference, the same with the scaled scores rounded to float16). The second error is over the
    elements where float16 scores alone stay within 1e-2 of the reference: a path that only rounds its scores to
    float16 (torch_math) is small there; one that overflowed before the scale is not."""
    exact, rounded = ref
    out = np.asarray(out, np.float64)
    bad = int((~np.isfinite(out)).sum())
    error = np.abs(np.where(np.isfinite(out), out, 0) - exact)
    calm = np.abs(rounded - exact) < 1e-2
    print(f"{name:34s} Dk {dk:3d} mask {'key-padding' if keep is not None else 'none':11s} causal {causal!s:5s} "
          f"max error {error.max():9.3e}, where float16 scores are within 1e-2 {error[calm].max():9.3e} "
          f"({calm.mean():.0%} of elements); non-finite {bad}", flush=True)


def torch_paths(dk, inputs, keep, causal, ref):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attention_conformance.implementations import builtin

    q, k, v = (torch.tensor(a, device=DEVICE) for a in inputs)
    mask = None if keep is None else torch.tensor(keep, device=DEVICE)
    for impl in (builtin.TorchSDPA, builtin.TorchCuDNNAttention, builtin.TorchFlashAttention,
                 builtin.TorchMemoryEfficientAttention, builtin.TorchMath):
        try:
            out = impl.sdpa(q, k, v, mask=mask, is_causal=causal)
            report(impl.NAME, dk, keep, causal, out.float().cpu().numpy(), ref)
        except Exception as exc:  # a refusal is a finding too
            print(f"{impl.NAME:34s} Dk {dk:3d} refused: {str(exc).splitlines()[0][:90]}", flush=True)
    for backend in ("CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "FLASH_ATTENTION"):
        for prescaled in (False, True):
            qq, scale = ((q * (1 / math.sqrt(dk))).to(q.dtype), 1.0) if prescaled else (q, None)
            band = None
            if causal and mask is not None:
                band = mask & torch.ones(L, L, dtype=torch.bool, device=DEVICE).tril()
            try:
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    out = F.scaled_dot_product_attention(qq, k, v, attn_mask=band if band is not None else mask,
                                                         is_causal=causal and mask is None, scale=scale)
                report(f"F.sdpa {backend[:5]}{' q pre-scaled' if prescaled else ''}", dk, keep, causal,
                       out.float().cpu().numpy(), ref)
            except Exception as exc:
                print(f"F.sdpa {backend[:5]} Dk {dk} refused: {str(exc).splitlines()[0][:80]}", flush=True)


def jax_paths(dk, inputs, keep, causal, ref):
    import jax.numpy as jnp

    from attention_conformance.implementations import builtin

    q, k, v = (jnp.asarray(a) for a in inputs)
    mask = None if keep is None else jnp.asarray(keep)
    for impl in (builtin.JaxNumpy, builtin.JaxDotProductAttention, builtin.JaxCuDNNAttention):
        try:
            out = impl.sdpa(q, k, v, mask=mask, is_causal=causal)
            report(impl.NAME, dk, keep, causal, np.asarray(out, np.float32), ref)
        except Exception as exc:
            print(f"{impl.NAME:34s} Dk {dk:3d} refused: {str(exc).splitlines()[0][:90]}", flush=True)


def main():
    for dk in (8, 16, 64, 128):
        inputs, padding = case(dk, seed=dk)
        for keep in (None, padding):
            for causal in (False, True):
                ref = reference(*inputs, keep, causal), reference(*inputs, keep, causal, round_scores=True)
                torch_paths(dk, inputs, keep, causal, ref)
                jax_paths(dk, inputs, keep, causal, ref)


if __name__ == "__main__":
    main()
