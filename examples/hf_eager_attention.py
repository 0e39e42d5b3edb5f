"""Hugging Face transformers' eager attention as Gemma 2 has it (``eager_attention_forward``: Llama's, plus a logit
softcap and the default scale), given what HF's models give it: q, k, v as (B, H, L, D) and one additive float mask
built as ``transformers.masking_utils`` builds it (the causal band ``kv_idx <= q_idx`` joined to a boolean mask, then
0 where kept and ``finfo(dtype).min`` elsewhere; a float mask takes ``finfo.min`` outside the band, as HF's
``create_position_bias_mask`` does). Measured (README, "Real libraries"): the softmax runs in float32 (float64 inputs
too) and the additive ``finfo.min`` is a large finite negative (float16: it overflows to -inf); all declared.
"""
from types import SimpleNamespace

import torch
import transformers
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

from attention_conformance.implementations import deviations

ARRAY = "torch"
OUTPUT_LAYOUT = "blhd"  # HF's attention functions take (B, H, L, D) and return (B, L, H, D)
DTYPES = ("float64", "float32", "float16", "bfloat16")
FULLY_MASKED_ROWS = deviations.LARGE_FINITE_NEGATIVE_ROWS
_NOTE = f"transformers {transformers.__version__}, eager attention"
KNOWN_DEVIATIONS = (deviations.large_finite_negative_mask_fill(note=_NOTE),
                    deviations.float64_computed_in_float32(note=_NOTE, ops=("sdpa",)),
                    deviations.masked_fill_overflow_16bit(note=_NOTE))


def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, softcap=None):
    lowest = torch.finfo(q.dtype).min
    if is_causal:
        band = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        mask = band if mask is None else mask & band if mask.dtype == torch.bool else mask.masked_fill(~band, lowest)
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(~mask, lowest)
    module = SimpleNamespace(num_key_value_groups=q.shape[1] // k.shape[1], head_dim=q.shape[-1], training=False)
    out, _ = eager_attention_forward(module, q, k, v, mask, scaling=scale, softcap=softcap)
    return out
