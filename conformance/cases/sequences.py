"""Hypothesis strategies of packed (sdpa_varlen) and paged (sdpa_paged) batches: sequence lengths at tile and page
edges, empty sequences, shuffled and shared pages, garbage past the used keys, and the variants per sequence.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.covering import admits, hint, hinted
from attention_conformance.conformance.cases.drawing import (
    ACTIVE,
    active_region,
    causal_only_case,
    equal_lengths,
    keep_inside,
    outside_region,
    scales_inside,
    variant_allowed,
)
from attention_conformance.conformance.cases.limits import (
    KERNEL_HEAD_DIMS,
    KERNEL_SMALL_LENGTHS,
    MAX_DIM,
    MAX_GROUP,
    MAX_KV_HEADS,
    SCALES,
    SCORE_SIGMAS,
)
from attention_conformance.conformance.cases.variants import (
    SINK_FORMS,
    SINK_FORMS_THAT_MATTER,
    draw_alibi_slopes,
    draw_softcap,
    sink_logits,
    window_side,
)
from attention_conformance.conformance.reference import oracle
from attention_conformance.implementations.region import Region, shape_facts

# ------------------------------------------------------------------ packed batches and paged KV caches
# sdpa_varlen and sdpa_paged (docs/contract.md; spec/clauses.yaml varlen.*, paged.*): a batch of up to
# MAX_SEQUENCES sequences with their own query and key lengths, drawn at the corners real kernels get wrong: a
# sequence without queries or without keys, more queries than keys (rows the bottom-right band leaves without a key),
# a decode sequence, sequence boundaries off every tile; paged caches with pages shuffled across the pool, pages
# shared by two sequences, a last page partly filled or filled to its end (a page boundary at the last key), and
# large finite garbage everywhere no sequence's used keys are (slots past seqused_k, unused pages and table entries),
# so that a read past seqused_k shows. A covering corner (its "index") builds one of SEQUENCE_PATTERNS /
# PAGED_PATTERNS, each holding those corners together.
MAX_SEQUENCES = 4


MAX_SEQUENCE_LEN = 7


SEQUENCE_TILE_LENGTHS = (8, 9, 15, 16, 17)  # one sequence past a tile of 8 or 16, one time in four


GARBAGE_K_SIGMA, GARBAGE_V_SIGMA = 30.0, 100.0  # what lies where no used key is: a key read there dominates its row


SEQUENCE_VARIANT_NAMES = ("window", "softcap", "alibi_slopes", "learnable_sink")


# (Lq_b, Lk_b) per sequence; each pattern has an empty sequence and one with Lq_b != Lk_b. The third, the non-causal
# brief corner's (index 2), has a sequence with two more queries than any sequence has keys (_corner_window). The
# second, every brief set's first, has a sequence past a query block of 128 rows and two key blocks of 64 with a
# partial third (a varlen kernel that dropped the last Lk % 64 keys of a sequence longer than 64 passed default runs
# whose sequences stayed within 17 keys).
SEQUENCE_PATTERNS = (
    ((3, 5), (0, 4), (5, 2), (4, 0)),
    ((1, 7), (4, 0), (6, 3), (129, 133)),
    ((5, 2), (0, 0), (2, 3), (3, 3)),
    ((7, 7), (0, 3), (5, 2)),
    ((2, 2), (6, 1), (0, 5), (3, 0)),
)


# (block_size, seqused_k per sequence, Lq, shared pages): a page boundary at the last key of one sequence, a partial
# last page of another, an empty cache or more queries than keys.
# The non-causal brief corner's (index 2) has more queries than the block table holds keys, plus two
# (_corner_window). The second, every brief set's first, decodes against a cache of 34 pages, past two key blocks of 64
# (a kernel that staged 16 block-table entries and read the table modulo 16 passed default runs whose tables held at
# most 10).
PAGED_PATTERNS = (
    (2, (4, 3, 0), 3, True),
    (4, (5, 8, 1, 133), 1, False),
    (2, (2, 1), 6, True),
    (1, (3, 0, 5), 2, True),
    (3, (3, 7), 5, True),
    (3, (6, 2), 4, True),
)


def _sequence_lengths(limit: int):
    return st.sampled_from(sorted({0, 1, limit})) | st.integers(0, limit)


def _sequence_heads(draw, region: Region) -> tuple[int, int]:
    """(Hkv, Hq) of a packed or paged case inside the region's GQA declaration (the corner's where it has one)."""
    hkv = hint("Hkv") if hint("Hkv") in (1, 2) else draw(st.integers(1, MAX_KV_HEADS), label="Hkv")
    group = hint("group") if hint("group") in (1, 2, 3) else draw(st.integers(1, MAX_GROUP), label="Hq/Hkv")
    if not region.gqa:
        group = 1
    elif region.max_group is not None:
        group = min(group, region.max_group)
    return hkv, hkv * group


def _sequence_dims(draw, region: Region) -> tuple[int, int]:
    """(Dk, Dv): small ones, or the region's kernel head dims."""
    dims = region.head_dims.members(range(1, MAX_DIM + 1)) or region.head_dims.members(KERNEL_HEAD_DIMS)[:4] \
        or [region.head_dims.min]
    dk = hint("Dk") if hint("Dk") in dims else draw(st.sampled_from(dims), label="Dk")
    if region.same_value_dim or draw(st.booleans(), label="Dv == Dk"):
        return dk, dk
    return dk, draw(st.sampled_from(dims), label="Dv")


def _sequence_options(draw, causal, scale) -> tuple[bool, float | None]:
    region = active_region()
    wanted = hint("is_causal")
    if region.causal_only:
        is_causal = causal_only_case(draw, causal)
    else:
        is_causal = wanted if wanted is not None and admits(causal, wanted) else draw(causal, label="is_causal")
    if is_causal and not region.causal:
        outside_region("is_causal=True (declared causal: False)")
    scale = scales_inside(scale, region)
    chosen = hint("scale") if hinted("scale") and admits(scale, hint("scale")) else draw(scale, label="scale")
    return bool(is_causal), chosen


def _sequence_values(draw, rng, shape, sigma_name: str, dk: int) -> np.ndarray:
    sigma = SCORE_SIGMAS[sigma_name] * min(1.0, (MAX_DIM / dk) ** 0.25)
    return rng.standard_normal(shape) * sigma


def _sequence_variants(draw, op: str, inputs: dict, variants, b: int, hq: int, max_keys: int) -> list[str]:
    """Draw the per-sequence variant keywords ``variants`` names (those the implementation runs) into ``inputs``;
    returns the label's words. Each is drawn at its edges as for sdpa (variant_cases, sink_chunk_leftpad_cases)."""
    words = []
    wanted = [name for name in variants if variant_allowed(name)]
    if "window" in wanted:
        window = _corner_window(op, inputs) if hint("index") is not None else None
        if window is None:
            window = (draw(window_side(max_keys), label="window left"),
                      draw(window_side(max_keys), label="window right"))
        inputs["window"] = window
        words.append(f"window={window}")
    scores = None
    if "softcap" in wanted or "learnable_sink" in wanted:
        scores = _sequence_scores(op, inputs, hq)
    if "softcap" in wanted:
        inputs["softcap"] = draw_softcap(draw, float(np.abs(scores[np.isfinite(scores)]).max(initial=0.0)), words)
    if "alibi_slopes" in wanted:
        inputs["alibi_slopes"] = draw_alibi_slopes(draw, b, hq, "per-sequence", words)
    if "learnable_sink" in wanted:
        form = draw(st.sampled_from(SINK_FORMS if hint("index") is None else SINK_FORMS_THAT_MATTER),
                    label="sink logits")
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="sink seed"))
        inputs["learnable_sink"] = sink_logits(form, rng, _sequence_scores(op, inputs, hq))
        words.append(f"sink={form}")
    return words


# The window of a non-causal packed or paged corner whose queries pass every key (_corner_window): the left side
# bounded, the right unbounded.
SEQUENCE_CORNER_WINDOW = (1, None)


def _corner_window(op: str, inputs: dict) -> tuple | None:
    """SEQUENCE_CORNER_WINDOW at a non-causal corner whose pattern has a sequence with two more queries than any
    sequence has keys (the block table's keys, paged), else None (drawn). Bottom-right, that sequence's first rows sit
    before its keys: FlashAttention's varlen and kvcache paths give a bounded left side with an unbounded right the
    right edge seqlen_k (the batch's longest, or the table's pages times their size), which removes keys from those
    rows (flash-attention issue 895; an independently written kernel doing so passed 4 of 9 runs under random
    windows)."""
    if inputs.get("is_causal"):
        return None  # the band bounds the right
    sequences = oracle.sequence_cases(op, inputs)
    reach = (max(one["k"].shape[2] for one in sequences) if op == "sdpa_varlen"
             else inputs["block_table"].shape[1] * inputs["k_cache"].shape[1])
    return SEQUENCE_CORNER_WINDOW if any(one["q"].shape[2] >= reach + 2 for one in sequences) else None


def _sequence_shapes_inside(draw, op: str, sigmas, variants, **facts):
    """Filter a packed or paged draw the region refuses on its shape facts before any value is drawn; then the score
    magnitude and the values' seed: (magnitude name, seed, generator)."""
    keep_inside(draw, {"op": op, "mask_kind": "none", "variants": tuple(n for n in variants if variant_allowed(n)),
                        "variant_values": {}, **facts})  # the values are drawn later
    magnitudes = st.sampled_from(sigmas)
    sigma_name = hint("magnitude") if admits(magnitudes, hint("magnitude")) else draw(magnitudes,
                                                                                      label="score magnitude")
    seed = draw(st.integers(0, 2**32 - 1), label="values seed")
    return sigma_name, seed, np.random.default_rng(seed)


def _finish_sequence_case(draw, op: str, inputs: dict, variants, is_causal: bool, scale, hq: int,
                          max_keys: int) -> list[str]:
    """The options and per-sequence variants of a packed or paged case, then the region's last word on it; returns
    the label's words of the variants."""
    if is_causal:
        inputs["is_causal"] = True
    if scale is not None:
        inputs["scale"] = float(scale)
    sequences = len(inputs["cu_seqlens_q"]) - 1 if op == "sdpa_varlen" else inputs["q"].shape[0]
    words = _sequence_variants(draw, op, inputs, variants, sequences, hq, max_keys)
    keep_inside(draw, shape_facts(op, inputs))
    return words


def _sequence_scores(op: str, inputs: dict, hq: int) -> np.ndarray:
    """(1, Hq, rows, keys): every sequence's scores (bottom-right), -inf where a key is removed or padding; what the
    softcap and the sink logits are drawn against."""
    rows = []
    for one in oracle.sequence_cases(op, inputs):
        if one["q"].shape[2] == 0:
            continue
        s = oracle.scores(one["q"], one["k"], None, one["is_causal"], one["scale"],
                          **{n: one[n] for n in ("window", "softcap", "alibi_slopes", "query_offset", "key_lengths")
                             if n in one})
        rows.append(np.broadcast_to(s, (1, hq) + s.shape[2:]))
    width = max(r.shape[-1] for r in rows)
    return np.concatenate([np.pad(r, ((0, 0), (0, 0), (0, 0), (0, width - r.shape[-1])), constant_values=-np.inf)
                           for r in rows], axis=2)


@st.composite
def varlen_cases(draw, *, clauses=("varlen.definition",), causal=st.booleans(), scale=SCALES, variants=(),
                 seqused=st.booleans(), unequal: bool = False, sigmas=tuple(SCORE_SIGMAS)) -> Case:
    """An sdpa_varlen case: B sequences packed along the token axis (SEQUENCE_PATTERNS at a covering corner).

    ``variants``: names of SEQUENCE_VARIANT_NAMES each drawn where the implementation runs it; ``seqused``: whether
    to pass seqused_k (then each sequence gets 0 to 2 unused key rows of garbage); ``unequal``: at least one
    sequence with Lq_b != Lk_b, both > 0 (where the alignments differ)."""
    region = active_region()
    hkv, hq = _sequence_heads(draw, region)
    dk, dv = _sequence_dims(draw, region)
    lengths_ok = region.lengths.members(range(1, MAX_SEQUENCE_LEN + 1))
    index = hint("index")
    if index is not None:
        pairs = [tuple(p) for p in SEQUENCE_PATTERNS[index % len(SEQUENCE_PATTERNS)]]
    else:
        count = draw(st.integers(1, MAX_SEQUENCES), label="sequences")
        pairs = [(draw(_sequence_lengths(MAX_SEQUENCE_LEN), label="Lq_b"),
                  draw(_sequence_lengths(MAX_SEQUENCE_LEN), label="Lk_b")) for _ in range(count)]
        if draw(st.integers(0, 3), label="a sequence past a tile") == 0:
            long = draw(st.sampled_from(SEQUENCE_TILE_LENGTHS), label="long sequence")
            at = draw(st.integers(0, count - 1), label="which sequence")
            pairs[at] = (long, pairs[at][1]) if draw(st.booleans(), label="queries or keys") else (pairs[at][0], long)
    if lengths_ok != list(range(1, MAX_SEQUENCE_LEN + 1)):  # a region without the small lengths: its own
        members = region.lengths.members(KERNEL_SMALL_LENGTHS) or [region.lengths.min]
        pairs = [tuple(0 if n == 0 else members[min(n, len(members)) - 1] for n in pair) for pair in pairs]
    if unequal and not any(lq != lk and lq and lk for lq, lk in pairs):
        lq, lk = pairs[0]
        pairs[0] = (max(lq, 1), max(lq, 1) + 2)
    if not any(lq for lq, _ in pairs):
        pairs[0] = (max(1, min(lengths_ok or [1])), pairs[0][1])
    if not any(lk for _, lk in pairs):
        pairs[-1] = (pairs[-1][0], max(1, min(lengths_ok or [1])))
    b = len(pairs)
    is_causal, chosen_scale = _sequence_options(draw, causal, scale)
    keywords = ACTIVE[-1].keywords
    if equal_lengths(region, is_causal):
        # Lq_b == Lk_b for every sequence, as a kernel with one cu_seqlens for queries and keys runs them (packed
        # self-attention: fla's parallel_attn); the declaration is about each sequence, not only the longest.
        if unequal:
            outside_region(region.why_outside({"is_causal": is_causal, "equal_sequences": False}, ask_supports=False))
        pairs = [(lq, lq) for lq, _ in pairs]
    use_seqused = (keywords is None or "seqused_k" in keywords) and draw(seqused, label="seqused_k")
    slack = [draw(st.integers(0, 2), label="unused keys") if use_seqused else 0 for _ in range(b)]
    lq_b, lk_b = [lq for lq, _ in pairs], [lk for _, lk in pairs]
    sigma_name, seed, rng = _sequence_shapes_inside(draw, "sdpa_varlen", sigmas, variants, B=b, Hq=hq, Hkv=hkv,
                                                    Lq=max(lq_b), Lk=max(lk_b), Dk=dk, Dv=dv, is_causal=is_causal,
                                                    scale=chosen_scale)
    starts_q = np.concatenate([[0], np.cumsum(lq_b)]).astype(np.int32)
    allocated = [lk + extra for lk, extra in zip(lk_b, slack)]
    starts_k = np.concatenate([[0], np.cumsum(allocated)]).astype(np.int32)
    total_k = int(starts_k[-1])
    k = _sequence_values(draw, rng, (total_k, hkv, dk), sigma_name, dk)
    v = rng.standard_normal((total_k, hkv, dv))
    for start, used, extra in zip(starts_k[:-1], lk_b, slack):  # the unused keys: garbage
        k[start + used:start + used + extra] = rng.standard_normal((extra, hkv, dk)) * GARBAGE_K_SIGMA
        v[start + used:start + used + extra] = rng.standard_normal((extra, hkv, dv)) * GARBAGE_V_SIGMA
    inputs = {"q": _sequence_values(draw, rng, (int(starts_q[-1]), hq, dk), sigma_name, dk), "k": k, "v": v,
              "cu_seqlens_q": starts_q, "cu_seqlens_k": starts_k, "max_seqlen_q": int(max(lq_b)),
              "max_seqlen_k": int(max(allocated))}
    if use_seqused:
        inputs["seqused_k"] = np.asarray(lk_b, dtype=np.int32)
    words = _finish_sequence_case(draw, "sdpa_varlen", inputs, variants, is_causal, chosen_scale, hq, max(lk_b))
    label = (f"B{b} Hq{hq}/Hkv{hkv} Dk{dk} Dv{dv} (Lq, Lk)={pairs}"
             f"{f' seqused_k={lk_b} unused={slack}' if use_seqused else ''}{' causal' if is_causal else ''}"
             f" scale={chosen_scale} scores~{sigma_name} {' '.join(words)} seed={seed}").replace("  ", " ")
    return Case("sdpa_varlen", inputs, tuple(clauses), label)


def _used_lengths(block: int, limit: int):
    """Cache lengths at and around page boundaries (a multiple of the block size, one short, one past), 0, or any."""
    boundaries = sorted({n for m in range(0, limit + 1, block) for n in (m - 1, m, m + 1) if 0 <= n <= limit})
    return st.sampled_from(boundaries) | st.integers(0, limit)


@st.composite
def paged_cases(draw, *, clauses=("paged.definition",), causal=st.booleans(), scale=SCALES, variants=(),
                shared=st.booleans(), sigmas=tuple(SCORE_SIGMAS)) -> Case:
    """An sdpa_paged case (PAGED_PATTERNS at a covering corner): q (B, Hq, Lq, Dk), a pool of pages in shuffled
    order, each sequence's table naming its pages (``shared``: one page shared by two sequences), the entries past
    its last used page and every unused page and slot holding garbage."""
    region = active_region()
    hkv, hq = _sequence_heads(draw, region)
    dk, dv = _sequence_dims(draw, region)
    index = hint("index")
    if index is not None:
        block, used, lq, share = PAGED_PATTERNS[index % len(PAGED_PATTERNS)]
        used = list(used)
    else:
        block = draw(st.integers(1, 5), label="block size")
        count = draw(st.integers(1, MAX_SEQUENCES - 1), label="sequences")
        used = [draw(_used_lengths(block, 3 * MAX_SEQUENCE_LEN // 2), label="seqused_k") for _ in range(count)]
        lq = draw(st.integers(1, MAX_SEQUENCE_LEN), label="Lq")
        share = draw(shared, label="a shared page")
    lq = (region.lengths.members(range(lq, MAX_SEQUENCE_LEN + 1)) or region.lengths.members(KERNEL_SMALL_LENGTHS)
          or [region.lengths.min])[0]
    if not any(used):
        used[0] = block + 1
    b = len(used)
    is_causal, chosen_scale = _sequence_options(draw, causal, scale)
    sigma_name, seed, rng = _sequence_shapes_inside(draw, "sdpa_paged", sigmas, variants, B=b, Hq=hq, Hkv=hkv, Lq=lq,
                                                    Lk=max(used), Dk=dk, Dv=dv, is_causal=is_causal,
                                                    scale=chosen_scale)
    pages = [-(-n // block) for n in used]
    spare = int(rng.integers(1, 4))  # pages no sequence uses
    num_blocks = sum(pages) + spare
    pool = rng.permutation(num_blocks)  # the pool in shuffled order
    table = np.zeros((b, max(pages) + int(rng.integers(0, 2))), dtype=np.int32)
    taken = 0
    for row, n in enumerate(pages):
        table[row, :n] = pool[taken:taken + n]
        taken += n
    sharing = ""
    holders = [row for row, n in enumerate(pages) if n]
    if share and len(holders) >= 2:  # a page of one sequence serves another too (its own page freed)
        first, second = holders[0], holders[1]
        at_first, at_second = int(rng.integers(0, pages[first])), int(rng.integers(0, pages[second]))
        table[second, at_second] = table[first, at_first]
        sharing = f" page {int(table[first, at_first])} shared (seq {first} block {at_first}, seq {second} block {at_second})"
    for row, n in enumerate(pages):  # entries past the used ones: any page of the pool
        table[row, n:] = rng.integers(0, num_blocks, size=table.shape[1] - n)
    k_cache = rng.standard_normal((num_blocks, block, hkv, dk)) * GARBAGE_K_SIGMA
    v_cache = rng.standard_normal((num_blocks, block, hkv, dv)) * GARBAGE_V_SIGMA
    for row, n in enumerate(used):  # the used slots: real keys (a shared page keeps the first sequence's)
        for j in range(n):
            page, slot = table[row, j // block], j % block
            if row == 0 or not any(table[r, i // block] == page and i % block == slot
                                   for r in range(row) for i in range(used[r])):
                k_cache[page, slot] = _sequence_values(draw, rng, (hkv, dk), sigma_name, dk)
                v_cache[page, slot] = rng.standard_normal((hkv, dv))
    inputs = {"q": _sequence_values(draw, rng, (b, hq, lq, dk), sigma_name, dk), "k_cache": k_cache,
              "v_cache": v_cache, "block_table": table, "seqused_k": np.asarray(used, dtype=np.int32)}
    words = _finish_sequence_case(draw, "sdpa_paged", inputs, variants, is_causal, chosen_scale, hq, max(used))
    label = (f"B{b} Hq{hq}/Hkv{hkv} Dk{dk} Dv{dv} Lq{lq} block_size={block} seqused_k={used} "
             f"pages={num_blocks}{sharing}{' causal' if is_causal else ''} scale={chosen_scale} scores~{sigma_name} "
             f"{' '.join(words)} seed={seed}").replace("  ", " ").rstrip()
    return Case("sdpa_paged", inputs, tuple(clauses), label)
