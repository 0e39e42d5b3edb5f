"""The TF32 tolerance (spec/tolerances.yaml, tf32) against TF32 as a GPU computes it, and against bfloat16 inputs.

    python benchmarks/tf32_calibration.py [--cases 3000] [--mha 400]

1. Replays the H100 scenarios of kernels-characterized.md (EVIDENCE below: measured 2026-11-23 on one NVIDIA H100
   80GB, jax 0.11.2 with the CUDA 13 plugin; `characterize.py`'s seeded inputs, drawn again in its order) through
   tests/tf32_standins.sdpa_rounded, the TF32 emulation (q, k, P, v rounded to 10 mantissa bits, float32
   accumulation), and prints how close the emulation's error comes to the error measured on
   the GPU for `jax.nn.dot_product_attention` in float32 at JAX's default precision, and what share of the allowance
   the measured error uses.
2. Draws random sdpa cases (head dims 1 to 256, lengths to 300, masks, scales, magnitudes) and multi-head attention
   cases, and prints error / allowed, max and median, for the TF32 emulation (correct: must stay below 1), for TF32
   by truncation (a tensor core reading float32 registers unrounded: also correct TF32) and for the same computation
   with bfloat16 matmul inputs (torch's float32_matmul_precision "medium", declared as TF32: the
   share of cases over 1 is how often the suite catches it).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attention_conformance.conformance.reference import oracle, tolerances
from tests.tf32_standins import mha_rounded, sdpa_rounded, to_bfloat16, to_tf32_truncated  # noqa: E402
from zoo.kernel_correct import to_tf32  # noqa: E402

EVIDENCE = ROOT / "docs" / "gpu-runs" / "2026-11-23-h100" / "kernels-characterized.md"


ROUNDINGS = {"tf32": to_tf32, "tf32 truncated": to_tf32_truncated, "bfloat16": to_bfloat16}


def characterized_scenarios():
    """(scenario, inputs, measured max abs error) of the 'jax xla' float32 rows, inputs drawn as characterize.py drew
    them (one generator, every path and dtype in order)."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in EVIDENCE.read_text().splitlines() if line.startswith("| ") and not line.startswith("| path")]
    rows = [r for r in rows if r[0] != "---"]
    order = list(dict.fromkeys((r[0], r[1]) for r in rows))
    scenarios = [(b, hq, hkv, lq, lk, d, scale, causal, mask)
                 for (b, hq, hkv, lq, lk, d) in [(2, 4, 4, 9, 9, 64), (1, 4, 2, 5, 13, 64), (1, 2, 2, 130, 257, 128)]
                 for scale in (None, 0.0, -0.3, 0.7) for causal in (False, True)
                 for mask in ("none", "bool-keypad", "float", "fully-masked-row")]
    rng = np.random.default_rng(0)
    measured = [r[3] for r in rows if (r[0], r[1]) == ("jax xla", "float32")]
    for path in order:
        for index, sc in enumerate(scenarios):
            b, hq, hkv, lq, lk, d, scale, causal, kind = sc
            q, k, v = (rng.standard_normal(s) for s in ((b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, d)))
            mask = None
            if kind == "bool-keypad":
                mask = np.ones((b, 1, 1, lk), bool)
                mask[..., lk // 2:] = False
                mask[..., 0] = True
            elif kind == "float":
                mask = rng.standard_normal((b, hq, lq, lk))
                mask[..., 1] = -np.inf
            elif kind == "fully-masked-row":
                mask = np.ones((b, hq, lq, lk), bool)
                mask[:, :, -1, :] = False
            if path == ("jax xla", "float32") and kind != "fully-masked-row" and measured[index] != "-":
                yield sc, (q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                           mask if mask is None or mask.dtype == bool else mask.astype(np.float32)), float(measured[index])


def ratio(got, want, allowed) -> float:
    with np.errstate(invalid="ignore", divide="ignore"):
        finite = np.isfinite(want)
        return float(np.max(np.where(finite, np.abs(got - want) / allowed, 0.0)))


def replay_h100() -> None:
    gaps, shares = [], []
    for sc, (q, k, v, mask), measured in characterized_scenarios():
        _, _, _, _, _, _, scale, causal, _ = sc
        want = oracle.sdpa(q, k, v, mask, causal, scale)
        emulated = float(np.nanmax(np.abs(sdpa_rounded(q, k, v, mask, causal, scale) - want)))
        allowed = tolerances.sdpa_allowed(q, k, v, mask, causal, scale, "float32", tf32=True)
        gaps.append(abs(emulated - measured) / measured)
        shares.append(ratio(sdpa_rounded(q, k, v, mask, causal, scale), want, allowed))
    print(f"H100 scenarios: {len(gaps)}; emulated vs measured max abs error, relative difference: max {max(gaps):.2e}, "
          f"median {np.median(gaps):.2e}; error / allowed of the emulation (= of the GPU): max {max(shares):.3f}, "
          f"median {np.median(shares):.3f}")


def random_sdpa(rng):
    d = int(rng.choice([1, 2, 3, 4, 8, 16, 32, 64, 128, 256]))
    lq, lk = int(rng.integers(1, 100)), int(rng.integers(1, 300))
    magnitude = float(rng.choice([1.0, 1.0, 3.0, 0.1, 10.0]))
    hkv = int(rng.integers(1, 3))
    q = (rng.standard_normal((1, hkv * int(rng.integers(1, 3)), lq, d)) * magnitude).astype(np.float32)
    k = (rng.standard_normal((1, hkv, lk, d)) * magnitude).astype(np.float32)
    v = rng.standard_normal((1, hkv, lk, d)).astype(np.float32)
    scale = [None, None, 0.0, -0.3, 0.7, 2.0][int(rng.integers(0, 6))]
    causal = bool(rng.integers(0, 2))
    mask = None
    pick = rng.random()
    if pick < 0.25:
        mask = rng.random((1, 1, lq, lk)) < 0.6
        mask[..., 0] = True
    elif pick < 0.4:
        mask = (rng.standard_normal((1, 1, lq, lk)) * 3).astype(np.float32)
    return q, k, v, mask, causal, scale


def monte_carlo(cases: int, mha: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    found = {name: [] for name in ROUNDINGS}
    for _ in range(cases):
        q, k, v, mask, causal, scale = random_sdpa(rng)
        want = oracle.sdpa(q, k, v, mask, causal, scale)
        allowed = tolerances.sdpa_allowed(q, k, v, mask, causal, scale, "float32", tf32=True)
        for name, rounding in ROUNDINGS.items():
            found[name].append(ratio(sdpa_rounded(q, k, v, mask, causal, scale, rounding), want, allowed))
    report("sdpa", found)
    found = {name: [] for name in ROUNDINGS}
    for _ in range(mha):
        heads, e = int(rng.choice([1, 2, 4])), int(rng.choice([4, 8, 16, 64, 128]))
        b, lq, lk = 1, int(rng.integers(1, 40)), int(rng.integers(1, 60))
        query, key, value = (rng.standard_normal((b, n, e)).astype(np.float32) for n in (lq, lk, lk))
        params = {f"w_{n}": (rng.standard_normal((e, heads * max(1, e // heads))) / np.sqrt(e)).astype(np.float32)
                  for n in "qkv"}
        params["w_o"] = (rng.standard_normal((heads * max(1, e // heads), e)) / np.sqrt(e)).astype(np.float32)
        params.update({f"b_{n}": rng.standard_normal(params[f"w_{n}"].shape[1]).astype(np.float32) for n in "qkvo"})
        causal = bool(rng.integers(0, 2))
        want = oracle.multi_head_attention(query, key, value, params, heads, None, causal)
        allowed = tolerances.mha_allowed(query, key, value, params, heads, None, causal, "float32", tf32=True)
        for name, rounding in ROUNDINGS.items():
            got = mha_rounded(query, key, value, params, heads, None, causal, rounding)
            found[name].append(ratio(got, want, allowed))
    report("multi_head_attention", found)


def report(op: str, found: dict) -> None:
    for name, ratios in found.items():
        r = np.asarray(ratios)
        print(f"{op}, {name} matmul inputs: {r.size} cases, error / allowed max {r.max():.3f}, median "
              f"{np.median(r):.3f}, over 1 in {(r > 1).mean():.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--mha", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-replay", action="store_true", help="skip the H100 scenarios")
    args = parser.parse_args()
    if args.no_replay:
        pass
    elif EVIDENCE.exists():
        replay_h100()
    else:
        print(f"{EVIDENCE} not found: the H100 replay is skipped")
    monte_carlo(args.cases, args.mha, args.seed)


if __name__ == "__main__":
    main()
