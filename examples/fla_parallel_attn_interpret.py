"""flash-linear-attention's softmax attention kernel, ``fla.ops.attn.parallel.parallel_attn`` (fla-core), run on the
CPU by Triton's interpreter (TRITON_INTERPRET=1): the kernel's own Triton forward (a blocked online softmax with GQA,
a sliding window, a learnable sink and packed batches) and its Triton backward, without a GPU.

Measured (README, "Real libraries"): no failure in float32 or float16. bfloat16 is not declared: Triton's interpreter
multiplies bfloat16's raw bit patterns in tl.dot (triton-lang/triton#11584, "we just don't support it yet"); declared,
every bfloat16 case the suite ran failed, outputs near 8e8, as a six-line tl.dot kernel does under the interpreter.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is first imported: kernels run on the CPU

from fla.ops.attn.parallel import parallel_attn  # noqa: E402

ARRAY = "torch"
LAYOUT = "blhd"
DTYPES = ("float32", "float16")
# One length T for queries and keys, always causal, no mask; the key head dim fits one block of 256.
SUPPORTS = {"equal_lengths": True, "head_dims": {"max": 256}, "variants": ["window", "learnable_sink"]}


def supports(facts):
    if not facts["is_causal"]:
        return "parallel_attn is causal attention only"


def _attend(q, k, v, scale, window, learnable_sink, cu_seqlens=None):
    left = None if window is None else window[0]  # W keeps keys i - W + 1 .. i: the contract's (W - 1, 0)
    return parallel_attn(q, k, v, scale=scale, window_size=None if left is None else left + 1, sink_bias=learnable_sink,
                         cu_seqlens=cu_seqlens)


def sdpa(q, k, v, is_causal=False, scale=None, *, window=None, learnable_sink=None):
    return _attend(q, k, v, scale, window, learnable_sink)


def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None, *,
                window=None, learnable_sink=None):  # one cu_seqlens for both (SUPPORTS equal_lengths), batch 1
    return _attend(q[None], k[None], v[None], scale, window, learnable_sink, cu_seqlens_q.long())[0]
