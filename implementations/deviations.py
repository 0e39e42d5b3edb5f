"""Ready-made KNOWN_DEVIATIONS entries for conventions that real attention code shares.

An adapter of a library that follows one of these conventions imports the entry instead of writing its own
``when`` lambda (docs/contract.md, ready-made deviations)::

    from attention_conformance.implementations import deviations

    FULLY_MASKED_ROWS = deviations.LARGE_FINITE_NEGATIVE_ROWS
    KNOWN_DEVIATIONS = (deviations.large_finite_negative_mask_fill(note="keras 3.x numpy backend"),)

Each factory returns a fresh ``{"clause", "when", "reason"}`` dict; ``note`` (the library and version measured)
is appended to the reason. A case a ``when`` matches that fails one of its clauses is reported as a deviation
(xfail, with the reason), never hidden and never passed; a case it does not match is judged as any other. Each
``when`` is as narrow as the facts of a case allow (the keys are those of KNOWN_DEVIATIONS, docs/contract.md), so the
same entry declared by an implementation without the convention changes nothing where that
implementation is right, and a different defect still fails.

The conventions, as the libraries write them:

``large_finite_negative_mask_fill``
    Masked scores are replaced (or offset) by a large finite negative number instead of -inf: JAX's
    ``jax.nn.dot_product_attention`` and Keras 3 (``-0.7 * finfo(dtype).max``, ``jnp.where(mask, logits,
    large_negative)``), Flax linen (``jnp.finfo(dtype).min``), HF transformers' eager attention (an additive
    ``torch.finfo(dtype).min``). A row whose every key is removed then has all-equal scores and averages v: the
    FULLY_MASKED_ROWS policy "uniform", declared with LARGE_FINITE_NEGATIVE_ROWS, not a deviation. The deviation is
    the row whose float mask is -inf on every key the removals (the boolean mask, the causal band, the window, the
    key lengths) leave: those removed keys hold the finite fill, which beats -inf, so the row attends them (the
    causally masked future keys, the padding).
``float64_computed_in_float32``
    float64 inputs computed at float32 precision (jax.nn.dot_product_attention on a CPU; HF eager attention's
    ``softmax(..., dtype=torch.float32)``): errors of about 1e-8 against float64 tolerances of about 1e-14, seen
    through every clause that compares values (``value_clauses``), in float64 cases only.
``masked_fill_overflow_16bit``
    An additive ``finfo(float16).min`` mask (HF eager attention) overflows to -inf where a masked score is below
    about -16, so in float16 a row whose every key is masked gets NaN (all -inf) or the mean of a few keys'
    values, not the declared policy; float32 and bfloat16, whose range holds ``finfo.min`` minus any score, are
    not affected.
``scale_after_masking``
    A kernel that masks with -inf and then multiplies by the scale (or folds the scale into the exponent)
    computes -inf * 0 = NaN for a scale of 0 and +inf for a negative scale: torch's CPU flash kernel under
    is_causal, the CUDA flash and cuDNN kernels in 16 bits (measured on an H100, docs/gpu.md).
"""
from __future__ import annotations

from attention_conformance.implementations.contract import FULLY_MASKED_CAUSES

# The FULLY_MASKED_ROWS a large finite negative fill gives: every removal averages v (all scores equal), a float
# mask that is -inf on every key gives NaN (-inf - (-inf)), exactly as in jax.nn.dot_product_attention (measured,
# jax 0.10.2 CPU: bool, window and key_lengths rows the mean of v, an all -inf bias row NaN).
LARGE_FINITE_NEGATIVE_ROWS = {cause: ("nan" if cause == "float" else "uniform") for cause in FULLY_MASKED_CAUSES}


# The variant keywords that remove keys (docs/contract.md): with one of them a row can lose keys to a
# removal beside its float mask. query_offset moves the causal band; it removes nothing on its own.
KEY_REMOVING_VARIANTS = ("window", "key_lengths", "attention_chunk", "key_leftpad")


# Clauses no precision loss can break: shapes, dtypes, exact zeros of -inf inputs, NaN/inf (a float32 computation
# of a stable softmax overflows no more than a float64 one), the contract's calls, and the dropout rate (a count).
STRUCTURAL_CLAUSES = frozenset({
    "sdpa.output-shape", "sdpa.output-dtype", "mha.shapes", "sdpa.finite", "softmax.masked-exact-zero",
    "dropout.rate", "contract.result-type", "contract.inputs-unchanged", "contract.layout"})


# How the operations of the spec (spec/clauses.yaml ``binds``) are named in facts["op"]; gradients and dropout are
# sdpa cases.
OPERATION_BINDS = {"softmax": ("softmax",), "sdpa": ("sdpa", "sdpa_backward", "dropout"),
                   "multi_head_attention": ("multi_head_attention",), "sdpa_varlen": ("sdpa_varlen",),
                   "sdpa_paged": ("sdpa_paged",)}


def _reason(text: str, note: str) -> str:
    return f"{text} ({note})" if note else text


def value_clauses(ops=("softmax", "sdpa", "multi_head_attention")) -> tuple[str, ...]:
    """Every clause of spec/clauses.yaml that compares values of these operations (gradients and dropout with
    sdpa) with a tolerance: all that bind them but STRUCTURAL_CLAUSES. Read from the spec, so a clause added
    there is included."""
    from attention_conformance.conformance.specdata import clauses

    binds = {bound for op in ops for bound in OPERATION_BINDS[op]}
    return tuple(cid for cid, clause in clauses().items()
                 if set(clause.binds) & binds and cid not in STRUCTURAL_CLAUSES)


# ------------------------------------------------------------------ large finite negative fill
def float_row_beside_a_removal(facts) -> bool:
    """A fully masked row attributed to the float mask (all -inf on the keys the other removals leave, or
    everywhere) in a case where a removal (is_causal, a key-removing variant) holds keys a finite fill would
    give back."""
    return (facts.get("mask_kind") == "float" and bool(facts.get("fully_masked"))
            and "float" in facts.get("fully_masked_causes", ("float",))
            and (bool(facts.get("is_causal")) or bool(set(facts.get("variants", ())) & set(KEY_REMOVING_VARIANTS))))


def large_finite_negative_mask_fill(note: str = "") -> dict:
    """The row whose float mask is -inf on every key the causal band (or a window, the key lengths) leaves
    attends the removed keys: they hold a large finite negative, which beats -inf. Declare the rows every removal
    empties with FULLY_MASKED_ROWS = LARGE_FINITE_NEGATIVE_ROWS beside it."""
    return {
        "clause": ("mask.fully-masked-row", "mha.projections"),
        "when": float_row_beside_a_removal,
        "reason": _reason("removed keys are filled with a large finite negative, not -inf, so a row whose float mask "
                          "is -inf on every key the causal band, the window or the key lengths leave attends the "
                          "removed keys (future keys, padding) instead of following FULLY_MASKED_ROWS", note),
    }


# ------------------------------------------------------------------ float64 at float32 precision
def float64_case(facts) -> bool:
    return facts.get("dtype") == "float64"


def float64_computed_in_float32(note: str = "", ops=("softmax", "sdpa", "multi_head_attention")) -> dict:
    """float64 inputs computed at float32 precision, in float64 cases of ``ops`` only, through every value clause
    (``value_clauses``)."""
    ops = tuple(ops)
    unknown = [op for op in ops if op not in OPERATION_BINDS]
    if unknown:
        raise ValueError(f"float64_computed_in_float32: ops {unknown} are not operations "
                         f"({', '.join(OPERATION_BINDS)})")

    def when(facts) -> bool:
        return float64_case(facts) and facts.get("op") in ops

    when.__name__ = when.__qualname__ = "float64_case_of_" + "_".join(ops)
    return {
        "clause": value_clauses(ops),
        "when": when,
        "reason": _reason("float64 inputs are computed at float32 precision (errors about 1e-8 against the float64 "
                          "tolerance)", note),
    }


# ------------------------------------------------------------------ 16-bit additive finfo.min overflow
def float16_row_masked_by_a_removal(facts) -> bool:
    """float16, and a fully masked row emptied by a removal an additive finfo.min stands for (not only by a float
    mask's own -inf, which gives NaN in every dtype and is FULLY_MASKED_ROWS' "float")."""
    causes = set(facts.get("fully_masked_causes", ("bool",)))
    return facts.get("dtype") == "float16" and bool(facts.get("fully_masked")) and bool(causes - {"float"})


def masked_fill_overflow_16bit(note: str = "") -> dict:
    """float16 only: masked scores offset by finfo(float16).min overflow to -inf, so a fully masked row is NaN or
    the mean of the few keys that did not overflow. sdpa.finite: inside multi-head attention the NaN row reaches
    the output projection, where it is judged as a non-finite output."""
    return {
        "clause": ("mask.fully-masked-row", "mha.projections", "sdpa.finite"),
        "when": float16_row_masked_by_a_removal,
        "reason": _reason("masks are an additive finfo(float16).min: a masked score below about -16 overflows to "
                          "-inf, so a fully masked row is NaN (every score overflowed) or averages the few keys "
                          "whose score did not", note),
    }


# ------------------------------------------------------------------ scale applied after -inf masking
def scale_after_masking(note: str = "", *, causal_only: bool = False, devices=None, dtypes=None) -> dict:
    """A scale of 0 or below meets -inf masked scores: NaN (0 * -inf) or +inf (negative * -inf) rows, in the
    forward output and its gradients. ``causal_only``: only the is_causal path masks before scaling (torch's CPU
    flash kernel; its explicit mask path is right); ``devices``/``dtypes``: where it was measured."""
    devices = None if devices is None else tuple(devices)
    dtypes = None if dtypes is None else tuple(dtypes)

    def when(facts) -> bool:
        scale = facts.get("scale")
        return (scale is not None and scale <= 0
                and (not causal_only or (bool(facts.get("is_causal")) and facts.get("mask_kind") == "none"))
                and (devices is None or facts.get("device") in devices)
                and (dtypes is None or facts.get("dtype") in dtypes))

    when.__name__ = when.__qualname__ = "nonpositive_scale" + ("_causal" if causal_only else "")
    return {
        "clause": ("sdpa.finite",) + value_clauses(("sdpa",)),
        "when": when,
        "reason": _reason("masked scores are -inf before the scale is applied: a scale of 0 gives NaN (0 * -inf), a "
                          "negative one +inf" + (" (on the is_causal path)" if causal_only else ""), note),
    }


__all__ = [
    "KEY_REMOVING_VARIANTS",
    "LARGE_FINITE_NEGATIVE_ROWS",
    "STRUCTURAL_CLAUSES",
    "float16_row_masked_by_a_removal",
    "float64_case",
    "float64_computed_in_float32",
    "float_row_beside_a_removal",
    "large_finite_negative_mask_fill",
    "masked_fill_overflow_16bit",
    "scale_after_masking",
    "value_clauses",
]
