"""The float64 oracle of merge_states: partial attention states over disjoint key sets merged into the state over
their union (clauses merge.*; docs/contract.md, "Merging partial states").

A state is (out, lse): a row's attention output over its own keys and the natural log of its softmax's denominator.
Over the union of disjoint key sets the denominator is the sum of the parts' denominators, so

    lse = log sum_p exp(lse_p)       out = sum_p exp(lse_p - lse) out_p

evaluated here around the largest part (m = max_p lse_p), a part without keys (lse_p = -inf) weighing exactly 0.
A learnable sink given to the merge adds exp(sigma_h) to the denominator once, and no value.
"""
from __future__ import annotations

import math

import numpy as np

from attention_conformance.conformance.reference import oracle


def natural_lse(lse, base: str = "e", empty_input: float = -np.inf) -> np.ndarray:
    """The parts' lse (as given, in LSE_CONVENTION's base, ``empty_input`` marking a part without keys) as natural
    logs in float64, -inf for a part without keys."""
    lse = np.asarray(lse, dtype=np.float64)
    empty = lse == empty_input if not math.isnan(empty_input) else np.isnan(lse)
    natural = lse * math.log(2.0) if base == "2" else lse
    return np.where(empty | np.isneginf(lse), -np.inf, natural)


def sink_column(learnable_sink, shape: tuple[int, ...]) -> np.ndarray | None:
    """(B, Hq, Lq) the sink logit of each row's head (learnable_sink (Hq,)), or None without one."""
    if learnable_sink is None:
        return None
    sink = np.asarray(learnable_sink, dtype=np.float64).reshape(1, -1, 1)
    return np.broadcast_to(sink, shape)


def merge_states(out, lse, learnable_sink=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out (B, Hq, Lq, Dv), lse (B, Hq, Lq), weights (P, B, Hq, Lq)) of the merge of P states: out (P, B, Hq, Lq,
    Dv), lse (P, B, Hq, Lq) natural logs (-inf: a part without keys). ``learnable_sink`` (Hq,): counted once.
    A row no part has a key for (and no sink): out 0, lse -inf."""
    out = np.asarray(out, dtype=np.float64)
    lse = np.asarray(lse, dtype=np.float64)
    sink = sink_column(learnable_sink, lse.shape[1:])
    top = np.max(lse, axis=0)
    if sink is not None:
        top = np.maximum(top, sink)
    shift = np.where(np.isneginf(top), 0.0, top)
    weights = np.exp(lse - shift)  # exp(-inf) = 0: an empty part weighs nothing
    total = np.sum(weights, axis=0) + (np.exp(sink - shift) if sink is not None else 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        merged_lse = shift + np.log(total)
        weights = np.where(total > 0, weights / np.where(total > 0, total, 1.0), 0.0)
    merged = np.sum(weights[..., None] * np.where(weights[..., None] > 0, out, 0.0), axis=0)
    return merged, merged_lse, weights


def keys_lse_alone(lse, learnable_sink=None) -> np.ndarray:
    """(B, Hq, Lq) log sum_p exp(lse_p): the merged lse without the sink's term (LSE_CONVENTION sink 'excluded')."""
    return merge_states(np.zeros(np.shape(lse) + (1,)), lse)[1]


def partial_states(attention_inputs: dict, parts: np.ndarray, offsets: np.ndarray | None = None,
                   sink_part: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(out (P, B, Hq, Lq, Dv), lse (P, B, Hq, Lq)): the oracle's sdpa state of each part of an sdpa case's keys.

    ``attention_inputs``: sdpa's inputs (q, k, v, mask, is_causal, scale and variant keywords, float64);
    ``parts`` (Lk,): the part of each key, 0..P-1 (a part no key falls in is empty: out 0, lse -inf);
    ``offsets`` (P,): a constant added to every score of a part's keys (its lse moves by it, its out does not);
    ``sink_part``: the part whose state counts the case's learnable sink (None: no part does; the sink is then the
    merge's to add). Everything else of the case (masks, causal band, windows, softcap, ALiBi) acts per key as in
    the whole case, so that the parts' merge is the sdpa of the whole case."""
    inputs = dict(attention_inputs)
    sink = inputs.pop("learnable_sink", None)
    count = int(np.max(parts, initial=-1)) + 1 if offsets is None else len(offsets)
    q, k = inputs["q"], inputs["k"]
    lq, lk = q.shape[-2], k.shape[-2]
    outs, lses = [], []
    for part in range(count):
        keep = np.asarray(parts) == part
        mask = inputs.get("mask")
        bias = np.where(keep, 0.0 if offsets is None else float(offsets[part]), -np.inf)  # (Lk,)
        bias = np.broadcast_to(bias, (lq, lk))
        if mask is None:
            part_mask = bias
        elif mask.dtype == np.bool_:
            part_mask = np.where(mask, bias, -np.inf)
        else:
            part_mask = np.asarray(mask, dtype=np.float64) + bias
        att = oracle.attention(q, k, inputs["v"], part_mask, inputs.get("is_causal", False), inputs.get("scale"),
                               learnable_sink=sink if part == sink_part else None, **oracle.variant_options(inputs))
        outs.append(np.where(np.isneginf(att.lse("included"))[..., None], 0.0, att.output("zeros")))
        lses.append(att.lse("included"))
    return np.stack(outs), np.stack(lses)
