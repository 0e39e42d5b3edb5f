"""A correct sdpa that scales q in place: its output is right, but it changes its input
(reported as "mutated input q", clause contract.inputs-unchanged)."""
from examples.my_attention import sdpa as correct_sdpa


def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    q *= q.shape[-1] ** -0.5 if scale is None else scale   # in place: the caller's q changes
    return correct_sdpa(q, k, v, mask, is_causal, scale=1.0)
