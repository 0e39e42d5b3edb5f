"""Hugging Face transformers' ``sdpa_attention_forward`` (transformers.integrations.sdpa_attention): how HF models call
torch's scaled_dot_product_attention, with its GQA handling (enable_gqa, repeat_kv, or packing a single query's heads)
and its own reading of ``is_causal``. Masks reach it 4-D, as HF's models pass them.

Measured (README, "Real libraries"): ``is_causal`` is honoured only without a mask and with more than one query (HF's
masks carry the band; one query is a decode step that sees every key), stated in ``supports``; torch's CPU kernel
gives NaN/inf rows for is_causal with a scale <= 0 (torch's bug, declared as the built-in torch_sdpa declares it).
"""
from types import SimpleNamespace

import transformers
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from attention_conformance.implementations import deviations

ARRAY = "torch"
OUTPUT_LAYOUT = "blhd"  # HF's attention functions take (B, H, L, D) and return (B, L, H, D)
DTYPES = ("float64", "float32", "float16", "bfloat16")
KNOWN_DEVIATIONS = (deviations.scale_after_masking(note=f"torch's CPU kernel under transformers "
                                                        f"{transformers.__version__}", causal_only=True),)


def supports(facts):
    if facts["is_causal"] and (facts["mask_kind"] != "none" or facts["Lq"] == 1 < facts["Lk"]):
        return "sdpa_attention_forward drops is_causal beside a mask and for a single query"


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    mask = None if mask is None else mask[(None,) * (4 - mask.dim())]
    module = SimpleNamespace(num_key_value_groups=q.shape[1] // k.shape[1], is_causal=True, training=False)
    out, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=scale, is_causal=is_causal)
    return out
