"""How P @ V's rounding grows when its summands coincide: the measurement behind spec/tolerances.yaml, sdpa,
``coinciding_spread``.

    python benchmarks/coinciding_summands.py            # torch 2.13 CPU: about 1 min

One query row against Lk keys, 60 % of them kept by a boolean mask, v constant per feature (as
test_masked_weights_sum_to_one builds it), the weights' relative spread over the kept keys set by the scale to
``target * n * u`` (n kept keys, u the dtype's unit roundoff). For torch's default CPU path and its math path, in
float32 and float64, it prints the largest error / allowed over four cases, against the model with every sum's
growth sqrt(Lk) ("sqrt only", the model before the rule) and against the model as it is. A last line per dtype
gives v random (varied summands) for comparison.
"""
from __future__ import annotations

from unittest import mock

import numpy as np

from attention_conformance.conformance.reference import oracle, tolerances

TARGETS = (0.25, 0.5, 1, 2, 4, 8, 16, 64)  # the weights' relative spread, in units of n * u
LENGTHS = (1024, 4096, 16384, 65536)
CASES = 4


def sqrt_growth_only():
    """The model before the coinciding-summands rule: every sum grows as sqrt(Lk)."""
    return mock.patch.object(tolerances, "coinciding_spread", lambda: -1.0)


def one_case(rng, dtype: str, lk: int, target: float | None, head_dim: int = 64) -> dict[str, float]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    np_dtype = np.dtype(dtype)
    u = tolerances.unit_roundoff(dtype)
    q = rng.standard_normal((1, 1, 1, head_dim)).astype(np_dtype)
    k = rng.standard_normal((1, 1, lk, head_dim)).astype(np_dtype)
    if target is None:
        v = rng.standard_normal((1, 1, lk, head_dim)).astype(np_dtype)
        scale = 0.0
    else:
        v = np.broadcast_to(np.linspace(-1.5, 2.0, head_dim), (1, 1, lk, head_dim)).astype(np_dtype).copy()
    mask = rng.random((1, 1, 1, lk)) < 0.6
    mask[..., 0] = True
    if target is not None:
        scores = (q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2))[0, 0, 0][mask[0, 0, 0]]
        scale = float(target * mask.sum() * u / (scores.max() - scores.min()))
    tensors = [torch.from_numpy(a) for a in (q, k, v, mask)]
    got = {"torch default": torch.nn.functional.scaled_dot_product_attention(
        *tensors[:3], attn_mask=tensors[3], scale=scale).numpy()}
    with sdpa_kernel(SDPBackend.MATH):
        got["torch math"] = torch.nn.functional.scaled_dot_product_attention(
            *tensors[:3], attn_mask=tensors[3], scale=scale).numpy()
    exact = oracle.sdpa(q, k, v, mask, False, scale)
    with sqrt_growth_only():
        before = tolerances.sdpa_allowed(q, k, v, mask, False, scale, dtype)
    now = tolerances.sdpa_allowed(q, k, v, mask, False, scale, dtype)
    ratios = {}
    for path, out in got.items():
        error = np.abs(out.astype(np.float64) - exact)
        ratios[f"{path}, sqrt only"] = float(np.max(error / before))
        ratios[f"{path}, model"] = float(np.max(error / now))
    return ratios


def main() -> None:
    rng = np.random.default_rng(1)
    for dtype in ("float32", "float64"):
        print(f"{dtype}: largest error / allowed over {CASES} cases")
        for lk in LENGTHS:
            for target in TARGETS:
                runs = [one_case(rng, dtype, lk, target) for _ in range(CASES)]
                cells = "  ".join(f"{name} {max(r[name] for r in runs):6.3f}" for name in runs[0])
                print(f"  Lk {lk:6d}  spread {target:5g} n u  {cells}", flush=True)
        runs = [one_case(rng, dtype, 16384, None) for _ in range(CASES)]
        cells = "  ".join(f"{name} {max(r[name] for r in runs):6.3f}" for name in runs[0])
        print(f"  Lk  16384  v random, scale 0   {cells}", flush=True)


if __name__ == "__main__":
    main()
