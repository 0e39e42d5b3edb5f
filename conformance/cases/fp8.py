"""Hypothesis strategies of 8-bit cases: q, k, v in float8 with per-(batch, kv head) descale factors
(sdpa.fp8-descale), small and kernel-shaped, the factors drawn per form.
"""
from __future__ import annotations

import math
import re

import numpy as np
from hypothesis import strategies as st

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.drawing import ACTIVE, active_region, keep_inside
from attention_conformance.conformance.cases.variants import variant_cases
from attention_conformance.implementations.region import shape_facts

# ------------------------------------------------------------------ FP8 attention
# 8-bit q, k, v with per-(batch, kv head) descale factors (docs/contract.md, FP8; spec/clauses.yaml
# sdpa.fp8-descale), on a case of variant_cases: its real values x are quantized the way FP8 inference stores
# them, stored = fp8(x / descale), and the case holds the stored values (exact in the 8-bit dtype under test) and
# the float32 factors. Each tensor draws how its factors are set: "calibrated" (descale = max |x| / the format's
# largest value per (batch, kv head), with the heads' magnitudes spread over a decade so that the factors
# differ by up to 10x: what FlashAttention 3's users and vLLM's calibration do), "one" (descale 1: the stored
# values are the real ones), "large" (descales 2^3 .. 2^8: small stored values, the format's subnormals and zeros
# among them), "small" (2^-8 .. 2^-3: stored values near the top of the format) and "per-tensor" (one factor for
# every (batch, kv head): vLLM's per-tensor scales expanded to (B, Hkv)). q's factors are per kv head: one for the
# query heads of a group.
DESCALE_FORMS = ("calibrated", "one", "large", "small", "per-tensor")


FP8_SCALES = st.none() | st.sampled_from([1.0, 0.125, 0.5])


def _eight_bit_dtype() -> str:
    """The 8-bit dtype the active drawing is for (float8_e4m3fn outside a test of one)."""
    from attention_conformance.implementations.arrays import is_eight_bit

    dtype = ACTIVE[-1].facts.get("dtype")
    return dtype if dtype is not None and is_eight_bit(dtype) else "float8_e4m3fn"


def quantized(x: np.ndarray, kv_heads: int, form: str, dtype: str, rng: np.random.Generator):
    """(stored values, descale factors (B, Hkv) float32) of the real values x (B, H, L, D) in the 8-bit ``dtype``:
    stored = x / descale rounded to the format (clipped to its range), every value of a (batch, kv head) sharing a
    factor (the query heads of a group share their kv head's)."""
    import ml_dtypes

    from attention_conformance.implementations.arrays import numpy_dtype

    fmt = numpy_dtype(dtype)
    largest = float(ml_dtypes.finfo(fmt).max)
    b, h = x.shape[:2]
    grouped = x.reshape(b, kv_heads, -1)  # the heads of a group together: (B, Hkv, G * L * D)
    if form in ("calibrated", "per-tensor"):
        # Heads of different magnitudes, a decade apart at most: scores stay within 10x of the magnitude class drawn
        # (16-bit scores near 1e4 at most, inside float16's range for an FP8_OUTPUT_DTYPE float16 path).
        spread = 10.0 ** rng.uniform(-0.5, 0.5, size=(b, kv_heads, 1))
        grouped = grouped * spread
        top = np.max(np.abs(grouped), axis=-1)
        top = np.max(top, keepdims=True) * np.ones_like(top) if form == "per-tensor" else top
        descale = np.where(top > 0, top / largest, 1.0)
    elif form == "one":
        descale = np.ones((b, kv_heads))
    else:
        exponents = rng.uniform(3.0, 8.0, size=(b, kv_heads))
        descale = 2.0 ** (exponents if form == "large" else -exponents)
    descale = descale.astype(np.float32).astype(np.float64)
    stored = np.clip(grouped / descale[..., None], -largest, largest).astype(fmt).astype(np.float64)
    return stored.reshape(x.shape), descale


DOMINANT_KEY_CACHES = (1024, 2048, 1025, 512)  # the keys of a dominant-key case, the first the region admits


def _dominant_key(draw, inputs: dict, dtype: str) -> str:
    """Shape the real q, k, v of a case (in place) so that each row has one dominant key and every other key ``gap``
    below it, the gap past where e^-gap rounds to 0 in the 8-bit format (half its smallest subnormal) even after q's
    rounding to the format (k is 0 and -1, exact); the other keys' values near 1, the dominant key's near -1.
    FlashAttention 3 rounds P = 2^8 e^(s - m) to the format (spec/tolerances.yaml, eight_bit, offset_bits): those
    weights stay normal numbers there, whereas P = e^(s - m) rounded flushes them all, and the output loses their
    share (0.48 of it at Lk 1024 in float8_e4m3fn). Stored with descales of 1 ("one"), the gap stays as drawn."""
    import ml_dtypes

    from attention_conformance.implementations.arrays import numpy_dtype

    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    # Long rows: the others' share must outgrow what P's rounding may move (about u8 of it) and the output's rounding.
    lk = draw(st.sampled_from(active_region().lengths.members(DOMINANT_KEY_CACHES) or [k.shape[2]]),
              label="keys beside the dominant one")
    dk = q.shape[-1]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="values seed"))
    v = rng.standard_normal(v.shape[:2] + (lk, v.shape[-1]))
    info = ml_dtypes.finfo(numpy_dtype(dtype))
    flush = math.log(2.0 / float(info.smallest_subnormal)) * (1.0 + 2.0 ** -(int(info.nmant) + 1))
    gap = draw(st.sampled_from([flush + 0.1, flush + 0.5, flush + 1.0]), label="gap below the dominant key")
    # In the first key block: an online softmax rounds the keys of blocks before the dominant one against their own
    # running maximum, which no flushing reaches.
    top = draw(st.integers(0, 63), label="dominant key")
    scale = inputs.get("scale") or 1.0 / math.sqrt(dk)
    q = np.zeros_like(q)
    q[..., 0] = gap / scale  # scale * q . k = -gap at k = -1
    k = np.zeros(k.shape[:2] + (lk, dk))
    k[..., :, 0] = -1.0
    k[..., top, 0] = 0.0
    others = np.arange(lk) != top
    v[..., others, :] = 1.0 + 0.25 * v[..., others, :]
    v[..., top, :] = -1.0 - 0.25 * np.abs(v[..., top, :])  # 2 or more below the others: their share shows
    inputs.update(q=q, k=k, v=v)
    return f"dominant key {top}, the others {gap:.3g} below"


@st.composite
def fp8_cases(draw, *, variants=(), clauses=("sdpa.fp8-descale",),
              mask_kinds=("none", "key-padding", "bool-full", "float"), causal=st.booleans(), scale=FP8_SCALES,
              forms=st.sampled_from(DESCALE_FORMS), dominant_key: bool = False, **base) -> Case:
    """An sdpa case of 8-bit q, k, v (the 8-bit dtype under test) with descale factors, on a case of variant_cases
    using ``variants`` (VARIANTS; none by default). ``forms``: how each tensor's factors are set (DESCALE_FORMS).
    A float mask (float32, Case.rounded) is added to the scores of the dequantized inputs: a kernel that added it
    before the descales, multiplying it by them, passed default runs that drew none. ``dominant_key``: each row's
    scores one dominant key and the rest far below it (_dominant_key)."""
    dtype = _eight_bit_dtype()
    case = draw(variant_cases(variants=variants, clauses=clauses, mask_kinds=mask_kinds, causal=causal,
                              scale=scale, outermost=False, **base), label="base case")
    inputs = dict(case.inputs)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="descales seed"))
    kv_heads = inputs["k"].shape[1]
    words = [_dominant_key(draw, inputs, dtype)] if dominant_key else []
    for name in ("q", "k", "v"):
        form = draw(forms, label=f"{name} descales")
        inputs[name], inputs[f"{name}_descale"] = quantized(inputs[name], kv_heads, form, dtype, rng)
        words.append(f"{name}:{form}")
    keep_inside(draw, shape_facts("sdpa", inputs))
    label = re.sub(r"\bLk\d+", f"Lk{inputs['k'].shape[2]}", case.label)  # a dominant-key case's own length
    return Case("sdpa", inputs, case.clauses, f"{label} {dtype} descales {' '.join(words)}",
                mask_kind=case.mask_kind)
