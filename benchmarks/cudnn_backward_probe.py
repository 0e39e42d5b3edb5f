"""Where torch's cuDNN attention backward returns NaN in dq (CUDA only; measured evidence for a declared deviation).

The suite's first full GPU run (H200, torch 2.11+cu130) failed torch_sdpa_cudnn's test_gqa_gradient_sum in float16 and
bfloat16: one row of dq NaN where the analytic backward is finite, with a boolean mask folded with the causal band.
This script replays repro files given on the command line and draws random cases, varying one thing at a time
(GQA through enable_gqa or repeated kv heads, the boolean mask or the same mask as a float -inf bias, the band folded
into the mask or passed as is_causal), and prints, for each NaN row, how many keys it attends and its largest
softmax weight, so the deviation can be declared as narrowly as the facts allow.

    python benchmarks/cudnn_backward_probe.py [REPRO.npz ...]

Measured on an H200 (torch 2.11+cu130, 2026-11-27), with the first version of this script, which left the repro's
explicit scale out: docs/gpu-runs/2026-11-27-h200/cudnn-backward-probe.log.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def backward(q, k, v, mask, d_out, dtype, *, gqa: str, mask_as: str, scale=None):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    t = lambda a: torch.tensor(a, dtype=dtype, device="cuda")
    tq, tk, tv = (t(a).requires_grad_(True) for a in (q, k, v))
    kk, vv = tk, tv
    if gqa == "repeat":
        group = q.shape[1] // k.shape[1]
        kk, vv = tk.repeat_interleave(group, 1), tv.repeat_interleave(group, 1)
    m = torch.tensor(mask, device="cuda")
    if mask_as == "float":
        m = torch.zeros(m.shape, dtype=dtype, device="cuda").masked_fill(~m, float("-inf"))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(tq, kk, vv, attn_mask=m, scale=scale,
                                             enable_gqa=kk.shape[1] != tq.shape[1])
    out.backward(t(d_out))
    return tq.grad.float().cpu().numpy(), out.float().detach().cpu().numpy()


def nan_rows(dq):
    return np.argwhere(~np.isfinite(dq).all(-1))


def describe(q, k, mask, rows, scale):
    lines = []
    for b, h, r in rows[:6]:
        hk = h // (q.shape[1] // k.shape[1])
        keep = np.broadcast_to(mask, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))[b, h, r]
        s = q[b, h, r] @ k[b, hk].T * scale
        s = np.where(keep, s, -np.inf)
        if not keep.any():
            lines.append(f"row {(int(b), int(h), int(r))}: attends no key"); continue
        p = np.exp(s - s.max()); p /= p.sum()
        diagonal = "kept" if r < keep.size and keep[r] else "masked"
        lines.append(f"row {(int(b), int(h), int(r))}: attends {int(keep.sum())} keys, max weight {p.max():.3g}, "
                     f"diagonal {diagonal}, last key {int(np.nonzero(keep)[0][-1])}")
    return lines


def variants(q, k, v, mask, d_out, dtype, scale=None, is_causal=True):
    band = np.tril(np.ones((q.shape[2], k.shape[2]), bool)) if is_causal else True
    folded = np.broadcast_to(mask, mask.shape[:-2] + (q.shape[2], k.shape[2])) & band
    for gqa in ("enable_gqa", "repeat"):
        for mask_as in ("bool", "float"):
            counts = []
            for _ in range(3):
                dq, out = backward(q, k, v, folded, d_out, dtype, gqa=gqa, mask_as=mask_as, scale=scale)
                counts.append(len(nan_rows(dq)))
            rows = nan_rows(dq)
            print(f"  gqa={gqa:10s} mask={mask_as:5s} nan dq rows over 3 calls: {counts}; out non-finite "
                  f"{int((~np.isfinite(out)).sum())}")
            for line in describe(q, k, folded, rows, q.shape[-1] ** -0.5 if scale is None else scale):
                print("    " + line)


def main(paths):
    import torch

    print("torch", torch.__version__, torch.cuda.get_device_name())
    from attention_conformance.conformance.harness import replay

    for path in paths:
        saved = replay.load(Path(path))  # either repro format; large arrays from the directory's arrays/
        inputs, meta = saved.case.inputs, saved.meta
        dtype = getattr(torch, meta["dtype"])
        options = meta["case"]["options"]  # the case's explicit scale and is_causal (a first version left them out)
        print(path, dtype, options)
        variants(inputs["q"], inputs["k"], inputs["v"], inputs["mask"], inputs["d_out"], dtype,
                 scale=options.get("scale"), is_causal=options.get("is_causal", False))
    rng = np.random.default_rng(0)
    tally = {}
    for trial in range(40):
        hq, hkv = (4, 2) if trial % 2 else (2, 2)
        dtype = torch.float16 if trial % 4 < 2 else torch.bfloat16
        q, k, v, d_out = (rng.standard_normal((1, h, 64, 64)) for h in (hq, hkv, hkv, hq))
        mask = rng.random((1, 1, 1, 64)) < 0.5
        mask[..., 0] = True  # no fully masked row (cuDNN's forward is wrong there, declared apart)
        band = np.tril(np.ones((64, 64), bool))
        folded = np.broadcast_to(mask, (1, 1, 64, 64)) & band
        for gqa in ("enable_gqa", "repeat"):
            dq, _ = backward(q, k, v, folded, d_out, dtype, gqa=gqa, mask_as="bool")
            rows = nan_rows(dq)
            key = (f"Hq{hq}/Hkv{hkv}", gqa, str(dtype).split(".")[-1])
            tally.setdefault(key, [0, 0])
            tally[key][0] += 1
            tally[key][1] += bool(len(rows))
            if len(rows) and tally[key][1] <= 2:
                print("random", key, *describe(q, k, folded, rows, 64 ** -0.5), sep="\n  ")
    for key, (n, bad) in sorted(tally.items()):
        print("random cases", key, f"{bad}/{n} with a NaN dq row")


if __name__ == "__main__":
    main(sys.argv[1:])
