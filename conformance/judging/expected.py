"""What a case should give: the oracle's output and the tolerance model's allowed error, by operation.

Both the verdict (verdict.py) and the attribution's probes (attribution.py) ask these of a Case, and
what emptied each fully masked row (the cause its FULLY_MASKED_ROWS policy is looked up by);
they live apart from either so that neither module imports the other. A Reference computes a case once:
its output under each policy, its allowed error and its rows without keys are read from it. Inputs are the case's
inputs already rounded to the dtype under test; they are widened to float64 (exactly) here, so the
oracle and the bound see the very values the implementation got.
"""
from __future__ import annotations

import numpy as np

from attention_conformance.conformance.cases.case import Case, widen
from attention_conformance.conformance.reference import oracle, tolerances
from attention_conformance.conformance.reference.output_forms import SEQUENCE_OPS, assemble
from attention_conformance.implementations.contract import FULLY_MASKED_CAUSES, mask_cause


# ------------------------------------------------------------ fully masked rows: cause and policy
def fully_masked_causes(empty: np.ndarray, lq: int, lk: int, mask=None, is_causal: bool = False, *, window=None,
                        query_offset=0, key_lengths=None, sink_token_length=0, attention_chunk=None, key_leftpad=None,
                        **_values) -> np.ndarray:
    """What emptied each fully masked row: (B, Hq, Lq) cause names of FULLY_MASKED_CAUSES, "" where ``empty`` is False.

    A row is attributed to the first of key_lengths, window, causal, attention_chunk, key_leftpad, bool, float (in
    that order) that leaves it without a key: key_lengths, window, causal, bool and float each on its own (the
    window and the band at the left padding's positions, padding keys kept); attention_chunk together with the band
    and the window (FlashAttention's reference removes the three in one local mask); key_leftpad where no real key
    is left by the key lengths, or by the band, the window and the chunk (a query before the first real key). A row that
    none of these empties, only several together (a boolean mask keeping only keys the causal band removes, a float
    mask -inf on every key a window keeps, a window past the key lengths), is attributed to the case's mask kind:
    "float" when the case has a float mask, "bool" otherwise.
    ``empty`` is the (B, Hq, Lq) fully masked rows; the other arguments are the case's (widened) inputs.
    """
    full = empty.shape + (lk,)
    case_kind = mask_cause(mask)
    causes = np.full(empty.shape, "", dtype=f"<U{max(len(c) for c in FULLY_MASKED_CAUSES)}")
    if not empty.any():
        return causes

    def keyless(allowed) -> np.ndarray:
        return ~np.broadcast_to(allowed, full).any(axis=-1)

    offset = query_offset or 0
    band = {"is_causal": True} if is_causal else {}
    edges = {"window": window, "sink_token_length": sink_token_length} if window is not None else {}

    def placed(padding_removed=False, **removals) -> np.ndarray:
        """The keys ``removals`` leave at the left padding's positions (the padding keys kept unless removed)."""
        return oracle.positions_allowed(lq, lk, query_offset=offset, key_leftpad=key_leftpad,
                                        padding_removed=padding_removed, **removals)

    alone = {}
    if key_lengths is not None:
        alone["key_lengths"] = lambda: keyless(oracle.positions_allowed(lq, lk, key_lengths=key_lengths))
    if window is not None:
        alone["window"] = lambda: keyless(placed(**edges))
    if is_causal:
        alone["causal"] = lambda: keyless(placed(**band))
    if attention_chunk is not None:
        alone["attention_chunk"] = lambda: keyless(placed(attention_chunk=attention_chunk, **band, **edges))
    if key_leftpad is not None:
        chunk = {"attention_chunk": attention_chunk} if attention_chunk is not None else {}
        alone["key_leftpad"] = lambda: (keyless(oracle.positions_allowed(lq, lk, key_lengths=key_lengths,
                                                                         key_leftpad=key_leftpad))
                                        | keyless(placed(True, **band, **edges, **chunk)))
    if mask is not None and case_kind == "bool":
        alone["bool"] = lambda: keyless(np.asarray(mask))
    elif mask is not None:
        alone["float"] = lambda: ~np.broadcast_to(~np.isneginf(np.asarray(mask)), full).any(axis=-1)
    left = empty.copy()
    for cause in FULLY_MASKED_CAUSES:
        if cause in alone and left.any():
            hit = left & alone[cause]()
            causes[hit] = cause
            left &= ~hit
    causes[left] = case_kind
    return causes


def _by_row(policy: np.ndarray, values: dict[str, np.ndarray]) -> np.ndarray:
    """Each row (B, Hq, Lq) from the array computed under its own policy (``values`` by policy name)."""
    arrays = dict(zip(values, np.broadcast_arrays(*values.values())))
    rows = np.asarray(policy)[..., None]
    out = arrays.get("zeros", next(iter(arrays.values())))
    for name, array in arrays.items():
        out = np.where(rows == name, array, out)
    return out


class Reference:
    """The oracle's computation of one case, done once: its output under any FULLY_MASKED_ROWS policy, the
    tolerance model's allowed error and its rows without a key are all read from it (the oracle's intermediates
    flow to the tolerance model, which computes none of them again).

    sdpa: one ``oracle.Attention`` (8-bit q, k, v dequantized first, sdpa.fp8-descale); sdpa_varlen and sdpa_paged:
    one per sequence (None for a sequence without queries); multi_head_attention: the oracle's trace under the
    'zeros' policy (its heads' Attention in it); softmax: the softmax itself."""

    def __init__(self, case: Case, inputs: dict, alignment: str = "bottom-right"):
        self.op, self.alignment = case.op, alignment
        a = widen(inputs)
        if case.op in SEQUENCE_OPS:
            self.sequences = [(oracle.attention(**one) if _has_queries(one) else None, _no_rows(one).shape)
                              for one in oracle.sequence_cases(case.op, a, alignment)]
        elif case.op == "softmax":
            self.x, self.axis = a["x"], a.get("axis", -1)
            self.softmax = oracle.softmax(self.x, axis=self.axis)
        elif case.op == "sdpa":
            a = oracle.dequantized(a)
            self.attention = oracle.attention(a["q"], a["k"], a["v"], a.get("mask"), a.get("is_causal", False),
                                              a.get("scale"), **oracle.variant_options(a))
        else:
            self.inputs, self.trace = a, {}
            oracle.multi_head_attention(a["query"], a["key"], a["value"], a["params"], a["num_heads"], a.get("mask"),
                                        a.get("is_causal", False), trace=self.trace, **oracle.variant_options(a))

    def output(self, policy="zeros") -> np.ndarray:
        """The oracle's result. ``policy``: one FULLY_MASKED_ROWS policy for every fully masked row, or (B, Hq, Lq)
        policy names, one per row (Judge.policy); sdpa_varlen and sdpa_paged in the judge's form (canonical_output)."""
        if not isinstance(policy, str) and self.op != "multi_head_attention":  # MHA picks per head, before the merge
            return _by_row(policy, {name: self.output(str(name)) for name in np.unique(policy)})
        if self.op in SEQUENCE_OPS:
            return assemble(self.op, [np.zeros(shape) if att is None else att.output(policy)
                                      for att, shape in self.sequences])
        if self.op == "softmax":
            return self.softmax
        if self.op == "sdpa":
            return self.attention.output(policy)
        if isinstance(policy, str) and policy == "zeros":
            return self.trace["output"]
        return oracle.mha_output(self.trace, self.inputs["params"], policy)

    def allowed(self, dtype: str, policy="zeros", tf32: bool = False, output_dtype: str | None = None) -> np.ndarray:
        """The tolerance model's allowed error; ``tf32``: float32 matmuls declared to run in TF32 (FLOAT32_MATMUL);
        ``output_dtype``: the result's dtype where it is not ``dtype`` (an 8-bit case's FP8_OUTPUT_DTYPE). A packed or
        paged case's rows are the rows of its sequences' sdpa cases: each row's allowance is the sdpa model's for its
        own sequence (spec/tolerances.yaml, sequences)."""
        if not isinstance(policy, str) and self.op != "multi_head_attention":  # MHA's bound covers every policy
            return _by_row(policy, {name: self.allowed(dtype, str(name), tf32, output_dtype)
                                    for name in np.unique(policy)})
        if self.op in SEQUENCE_OPS:
            return assemble(self.op, [np.zeros(shape) if att is None else
                                      np.broadcast_to(tolerances.attention_allowed(att, dtype, policy, tf32), shape)
                                      for att, shape in self.sequences])
        if self.op == "softmax":
            return tolerances.softmax_allowed(self.x, self.axis, dtype, self.softmax)
        if self.op == "sdpa":
            return tolerances.attention_allowed(self.attention, dtype, policy, tf32, output_dtype)
        a = self.inputs
        return tolerances.mha_allowed(a["query"], a["key"], a["value"], a["params"], a["num_heads"], a.get("mask"),
                                      a.get("is_causal", False), dtype, tf32=tf32, trace=self.trace)

    def lse(self, sink: str = "included") -> np.ndarray:
        """(B, Hq, Lq) each row's log-sum-exp, natural log (oracle.Attention.lse; ``sink``: the learnable sink's term
        "included" or "excluded"); sdpa_varlen's in the judge's form (1, Hq, total_q)."""
        if self.op in SEQUENCE_OPS:
            return assemble(self.op, [np.zeros(shape[:3]) if att is None else att.lse(sink)
                                      for att, shape in self.sequences])
        return self.attention.lse(sink)

    def lse_allowed(self, dtype: str, tf32: bool = False, sink: str = "included") -> np.ndarray:
        """The tolerance model's allowed error of each row's lse, in log space (tolerances.lse_allowed)."""
        if self.op in SEQUENCE_OPS:
            return assemble(self.op, [np.zeros(shape[:3]) if att is None else
                                      tolerances.lse_allowed(att, dtype, tf32, sink) for att, shape in self.sequences])
        return tolerances.lse_allowed(self.attention, dtype, tf32, sink)

    def fully_masked_rows(self) -> np.ndarray:
        """(B, Hq, Lq) boolean, sdpa (sdpa_varlen, sdpa_paged: in the judge's form): the rows FULLY_MASKED_ROWS
        applies to (none with a learnable sink)."""
        if self.op in SEQUENCE_OPS:
            return assemble(self.op, [np.zeros(shape[:3], dtype=bool) if att is None else att.empty
                                      for att, shape in self.sequences])
        return self.attention.empty


# The latest case's Reference: the verdict, the contract checks and the fully-masked-rows rules of one case ask for
# its output, its allowance and its rows without keys in turn. Keyed by the inputs dict itself (held, so that its id
# is not reused), which the suite never changes once a case is rounded.
_LATEST: dict = {"key": None, "reference": None}


def reference(case: Case, inputs: dict, alignment: str = "bottom-right") -> Reference:
    """The Reference of ``case`` on ``inputs``, computed once for the latest inputs."""
    key = (inputs, case.op, alignment)
    held = _LATEST["key"]
    if held is None or held[0] is not inputs or held[1:] != key[1:]:
        _LATEST["key"], _LATEST["reference"] = key, Reference(case, inputs, alignment)
    return _LATEST["reference"]


def expected_output(case: Case, inputs: dict, policy="zeros", alignment: str = "bottom-right") -> np.ndarray:
    """The oracle's result on (rounded, widened) inputs (Reference.output)."""
    return reference(case, inputs, alignment).output(policy)


def allowed_error(case: Case, inputs: dict, dtype: str, policy="zeros", tf32: bool = False,
                  alignment: str = "bottom-right", output_dtype: str | None = None) -> np.ndarray:
    """The tolerance model's allowed error (Reference.allowed)."""
    return reference(case, inputs, alignment).allowed(dtype, policy, tf32, output_dtype)


def _has_queries(one: dict) -> bool:
    return one["q"].shape[2] > 0


def _no_rows(one: dict) -> np.ndarray:
    return np.zeros(one["q"].shape[:3] + (one["v"].shape[3],))


def sequence_fully_masked_rows(op: str, inputs: dict, alignment: str = "bottom-right") -> np.ndarray:
    """(1, Hq, total_q) or (B, Hq, Lq) boolean: the rows of a packed or paged case that have no key."""
    return reference(Case(op, inputs, (), ""), inputs, alignment).fully_masked_rows()


def sequence_row_causes(op: str, inputs: dict, empty: np.ndarray, alignment: str = "bottom-right") -> np.ndarray:
    """What emptied each fully masked row of a packed or paged case (fully_masked_causes, sequence by sequence): a
    sequence without keys (none packed, seqused_k 0) is "key_lengths"; the band and the window are their own."""
    a = widen(inputs)
    pieces, row = [], 0
    for one in oracle.sequence_cases(op, a, alignment):
        lq, lk = one["q"].shape[2], one["k"].shape[2]
        if op == "sdpa_varlen":
            rows = empty[:, :, row:row + lq]
            row += lq
        else:
            rows = empty[len(pieces):len(pieces) + 1]
        causes = fully_masked_causes(rows, lq, lk, None, one["is_causal"], **{
            name: one[name] for name in ("window", "query_offset", "key_lengths") if name in one})
        pieces.append(causes)
    return assemble(op, pieces)
