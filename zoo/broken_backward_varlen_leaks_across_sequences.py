"""Broken: sdpa_varlen with a correct forward and a backward whose document mask lets each sequence's queries reach
the previous sequence's keys (ARRAY = "torch")."""
from zoo import correct_torch_varlen_backward as base

BUG = ("the backward recomputes the packed weights with a document mask that also keeps sequence b's keys for the "
       "queries of sequence b + 1, so dk and dv of sequence b take gradient from the next sequence's queries and "
       "those queries' dq from sequence b's keys; the forward is right.")
SOURCE = ("known bug class (a varlen backward whose key loop runs past its sequence's cu_seqlens_k boundary, or a "
          "block-diagonal mask applied in the forward but not in the backward); FlashAttention's varlen backward "
          "bounds each sequence's key blocks by cu_seqlens_k[b] and cu_seqlens_k[b + 1]")
EXPECTED_CLAUSES = frozenset({"grad.varlen"})
ARRAY = "torch"
DTYPES = base.DTYPES


class SDPA(base.VarlenSDPA):
    BACKWARD_LEAKS_TO_NEXT_SEQUENCE = True  # BUG: sequence b's keys kept for sequence b + 1 in the backward


sdpa_varlen = base.sdpa_varlen_of(SDPA)
