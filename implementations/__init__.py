"""Registry of attention implementations under test.

Every implementation, built-in or a user's, meets one public contract (docs/contract.md). It is an object (a module, a
class or an instance) exposing one
or more of

    softmax(x, axis=-1)
    sdpa(q, k, v, mask=None, is_causal=False, scale=None,
         *, window=None, softcap=None, alibi_slopes=None, query_offset=0, query_lengths=None, key_lengths=None,
         learnable_sink=None, sink_token_length=0, attention_chunk=None, key_leftpad=None,
         q_descale=None, k_descale=None, v_descale=None)
    multi_head_attention(query, key, value, params, num_heads, mask=None, is_causal=False, *, <sdpa's variant
         keywords>)  (applied to every head's attention after the projections; mha.variants)
    sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None,
                *, seqused_k=None, window=None, softcap=None, alibi_slopes=None, learnable_sink=None)
    sdpa_paged(q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None,
               *, window=None, softcap=None, alibi_slopes=None, learnable_sink=None)

(sdpa_varlen: a packed batch, q (total_q, Hq, Dk), k/v (total_k, Hkv, D*), cu_seqlens (B+1,) int32 offsets ->
(total_q, Hq, Dv); sdpa_paged: q as sdpa's, k_cache/v_cache (num_blocks, block_size, Hkv, D*), block_table
(B, max_blocks) and seqused_k (B,) int32 -> (B, Hq, Lq, Dv); each sequence is an sdpa of its own keys, docs/contract.md,
"Packed batches and paged KV caches") and optionally the attributes

    DTYPES             names among float64, float32, float16, bfloat16 (default float32, float64), and the
                       8-bit float8_e4m3fn, float8_e5m2 (FP8: q, k, v stored in 8 bits with float32 (B, Hkv)
                       descale factors q_descale, k_descale, v_descale, passed to every 8-bit case; only the
                       8-bit tests run in them); or a dict {device: names} when they differ per device
    FP8_OUTPUT_DTYPE   "bfloat16" (default, FlashAttention 3's) or "float16": the output dtype of 8-bit cases
    ARRAY              "numpy" (default), "torch", "jax", or the kind of an adapter registered in
                       _arrays.py: the array type it takes and returns
    DEVICES            devices it runs on, e.g. ("cpu", "cuda"); default: every device of ARRAY present
    FULLY_MASKED_ROWS  "zeros" (default), "nan" or "uniform" (the mean of v over all keys) for a row with
                       no key; or a dict by the row's cause {"key_lengths", "window", "causal", "bool",
                       "float": policy} (a row's cause: the first of these that empties it on its own, else
                       the case's mask kind; a cause not named takes the case's mask kind's entry, so the
                       older {"bool": ..., "float": ...} keeps its meaning); or a dict by dtype
                       {"float16": policy or a dict by cause, ...}; or a callable(facts) -> policy, facts
                       those of KNOWN_DEVIATIONS plus "cause" (docs/declarations.md, "Rows without a key")
    LAYOUT             "bhld" (default) or "blhd": sdpa's q, k, v and output as (B, H, L, D) or (B, L, H, D);
                       handed over contiguous in it, output and gradients read back in it; masks unchanged
    SEQUENCE_ALIGNMENT "bottom-right" (default) or "top-left": where each sequence's queries sit against its keys
                       in sdpa_varlen and sdpa_paged (query row i at i + Lk_b - Lq_b, or at i)
    NAME               the id shown in test ids and reports (default: the --impl spec)
    SUPPORTS           the region it can run: {"head_dims", "value_head_dim", "lengths", "equal_lengths",
                       "masks", "causal" (or "only", "lq<=lk", "lq>=lk", "lq==lk"), "scale", "gqa", "max_group",
                       "variants"} (implementations/region.py); generated cases are drawn inside it, a
                       case outside it is unsupported, never failed
    supports(facts)    optional method: why a case is outside the region (str), or None; asked while
                       drawing, so a case it refuses is never generated (docs/declarations.md, "Facts")
    FLOAT32_MATMUL     "ieee" (default) or "tf32", or {device: mode}: float32 matmuls round their
                       inputs to TF32; the float32 tolerance of sdpa is then the 16-bit model at
                       TF32's unit roundoff 2^-11 (spec/tolerances.yaml, tf32)
    COMPILED           True when each new input signature compiles (torch.compile, a JIT): the
                       suite runs fewer examples per property and allows a longer first call
    KNOWN_DEVIATIONS   documented departures from a clause, each a dict
                       {"clause": id (or a tuple of ids: one defect seen through several
                       clauses), "when": callable(facts) -> bool, "reason": text};
                       a failure of that clause on a case whose facts match is reported
                       as a deviation (xfail), never hidden. facts: op, dtype, device,
                       scale, is_causal, mask_kind ("none", "bool", "float"), B, Hq, Hkv,
                       Lq, Lk, Dk, Dv, fully_masked (the case has a row with no attendable key),
                       fully_masked_causes (what emptied those rows), variants (the variant keywords
                       the case passes, docs/contract.md), variant_values (their values by name),
                       query_offset_is_bottom_right. Ready-made entries for conventions
                       real libraries share: ``deviations.py`` (attention_conformance.implementations
                       .deviations: large_finite_negative_mask_fill, float64_computed_in_float32,
                       masked_fill_overflow_16bit, scale_after_masking)

An operation that is not exposed is reported as not implemented, never as a
failure. A keyword the signature does not accept (no ``scale`` parameter, say)
makes the cases that need it unsupported, never failed; the variant keywords
(sliding window, softcap, ALiBi, query offset, per-example lengths, attention sinks, chunked
attention, left padding) are passed only to the cases that use them, to sdpa and to multi_head_attention alike.

Modules, bottom to top: ``contract`` (the names above: operations, keywords, policies, layouts), ``arrays``
(one adapter per array framework), ``region`` (SUPPORTS), ``deviations`` (ready-made KNOWN_DEVIATIONS),
``builtin`` (the built-ins, one module per framework and one small class per code path; a framework is
imported only when a built-in is first called, so one that is not installed costs nothing and is reported
skipped with its reason) and ``registry`` (``Implementation``, ``load_implementation``: what the suite knows
about one implementation and how it calls it).
"""
