"""Hypothesis strategies of sdpa's variant keywords, drawn at their edges: windows, softcap, ALiBi, the query offset,
key and query lengths (variant_cases), and learnable sinks, sink tokens, chunks and left padding
(sink_chunk_leftpad_cases).
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.covering import hint
from attention_conformance.conformance.cases.drawing import keep_inside, runs_variant, variant_allowed
from attention_conformance.conformance.cases.sdpa import sdpa_cases
from attention_conformance.conformance.reference import oracle
from attention_conformance.implementations.region import shape_facts

# ------------------------------------------------------------------ variants
# The sdpa variants of the contract (docs/contract.md). A variant case is an sdpa case
# drawn as above (inside the active region, kernel-shaped where the region demands it) with variant
# keywords added, each drawn at its edges: windows of 0, past the length and one side unbounded; softcaps
# from strong saturation to no-op, relative to the case's own score magnitude; ALiBi slopes geometric
# (2^(-8h/H), Press et al.) or random over three decades, per head or per example and head; lengths 0, 1,
# full or between; offsets 0, Lk - Lq (bottom-right) or between.
VARIANTS = ("window", "softcap", "alibi_slopes", "query_offset", "lengths")


# softcap / (largest |scale q.k| of the case): 0.05 saturates every score, 50 is nearly no-op.
SOFTCAP_RATIOS = (0.05, 0.5, 1.0, 5.0, 50.0, 1e4)


def window_side(length: int):
    """One side of a window: None (unbounded), 0, 1, past the length, or anything between."""
    return st.one_of(st.none(), st.sampled_from([0, 1, length, length + 3]), st.integers(0, max(length, 1)))


def _offsets(lq: int, lk: int):
    bottom_right = max(lk - lq, 0)
    return st.sampled_from(sorted({0, bottom_right})) | st.integers(0, max(bottom_right, 1))


def _lengths(limit: int):
    return st.sampled_from(sorted({0, 1, limit})) | st.integers(0, limit)


def draw_softcap(draw, top: float, words: list[str]) -> float:
    """A softcap of SOFTCAP_RATIOS times the case's largest |score| ``top``; its label word appended to ``words``."""
    ratio = draw(st.sampled_from(SOFTCAP_RATIOS), label="softcap / max |score|")
    # Kept within 1e-2 .. 6e4: a softcap a 16-bit implementation rounds to its dtype stays normal and finite.
    cap = float(np.clip(max(top, 1e-3) * ratio, 1e-2, 6e4))
    words.append(f"softcap={cap:.3g} ({ratio}x max score)")
    return cap


def draw_alibi_slopes(draw, b: int, hq: int, per_row: str, words: list[str]) -> np.ndarray:
    """ALiBi slopes: geometric (Hq,), random over three decades (Hq,), or random per example / sequence (B, Hq) (the
    form named ``per_row``); the label word appended to ``words``."""
    form = draw(st.sampled_from(["geometric", "random", per_row]), label="ALiBi slopes")
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="slopes seed"))
    words.append(f"alibi={form}")
    if form == "geometric":  # Press et al.: 2^(-8h/H), h = 1..H
        return 2.0 ** (-8.0 * np.arange(1, hq + 1) / hq)
    return 10.0 ** rng.uniform(-3, 0, size=(b, hq) if form == per_row else (hq,))  # mixed magnitudes, 1e-3 .. 1


def draw_variant_keywords(draw, inputs: dict, variants) -> list[str]:
    """The keywords of ``variants`` (names of VARIANTS) drawn at their edges for the sdpa-shaped ``inputs`` (q, k,
    scale; put in them, in this order); their labels."""
    q, k = inputs["q"], inputs["k"]
    b, lq, lk = q.shape[0], q.shape[2], k.shape[2]
    words = []
    if "query_offset" in variants:
        offset = draw(_offsets(lq, lk), label="query_offset")
        inputs["query_offset"] = offset
        words.append(f"offset={offset}")
    if "window" in variants:
        if hint("window") is not None:  # a corner's window; "past": a side beyond every query-key distance
            beyond = inputs.get("query_offset", 0) + lq + lk
            window = tuple(beyond if side == "past" else side for side in hint("window"))
        else:
            window = (draw(window_side(lk), label="window left"), draw(window_side(lk), label="window right"))
        inputs["window"] = window
        words.append(f"window={window}")
    if "softcap" in variants:
        scale_value = inputs.get("scale", q.shape[-1] ** -0.5)
        top = float(np.max(np.abs(q @ np.swapaxes(oracle.repeat_kv_heads(k, q.shape[1]), -1, -2) * scale_value),
                           initial=0.0))
        inputs["softcap"] = draw_softcap(draw, top, words)
    if "alibi_slopes" in variants:
        inputs["alibi_slopes"] = draw_alibi_slopes(draw, b, q.shape[1], "per-example", words)
    if "lengths" in variants:
        inputs["key_lengths"] = np.array([draw(_lengths(lk), label="key length") for _ in range(b)], dtype=np.int32)
        words.append(f"key_lengths={inputs['key_lengths'].tolist()}")
        if variant_allowed("query_lengths") and draw(st.booleans(), label="query lengths"):
            inputs["query_lengths"] = np.array([draw(_lengths(lq), label="query length") for _ in range(b)],
                                               dtype=np.int32)
            words.append(f"query_lengths={inputs['query_lengths'].tolist()}")
    return words


@st.composite
def variant_cases(draw, *, variants=VARIANTS, clauses=("sdpa.variant-order",), mask_kinds=("none",),
                  causal=st.booleans(), gqa: bool = True, scale=st.none(), same_lengths: bool = False,
                  outermost: bool = True, optional=(), **base) -> Case:
    """An sdpa case using the variant keywords named in ``variants`` (each always used) on a case of sdpa_cases.

    ``variants``: names of VARIANTS; "lengths" draws key_lengths and, half the time, query_lengths (where the
    implementation runs them: its declared variants and its signature). ``optional``: names of VARIANTS each always
    used where the implementation runs it, left out where it does not (a window property still judges the window of
    an implementation without query_offset, at offset 0).
    ``base``: further keywords of sdpa_cases. ``outermost``: False where another strategy adds keywords to the
    case (sink_chunk_leftpad_cases), which then asks the region.
    """
    case = draw(sdpa_cases(mask_kinds=mask_kinds, causal=causal, gqa=gqa, scale=scale, same_lengths=same_lengths,
                           clauses=clauses, allow_empty_rows=True, outermost=False, **base), label="base case")
    inputs = dict(case.inputs)
    words = draw_variant_keywords(draw, inputs, tuple(variants) + tuple(v for v in optional if runs_variant(v)))
    if outermost:
        keep_inside(draw, shape_facts("sdpa", inputs))
    return Case("sdpa", inputs, case.clauses, f"{case.label} {' '.join(words)}", mask_kind=case.mask_kind)


# ------------------------------------------------------------------ sinks, chunks and left padding
# Learnable attention sinks, sink tokens, chunked local attention and left padding (docs/contract.md;
# spec/clauses.yaml sdpa.learnable-sink ... sdpa.key-leftpad), each drawn at its edges on a case of variant_cases:
# sink logits above a row's scores, among them, far below them (no effect) or mixed across heads, also on
# rows without keys; chunks of 1, 2, a few, the key length and past it; sink tokens 1 .. Lk beside a window whose
# left edge is bounded (without one they change nothing); left paddings of 0, 1, Lk (every key padding) or one that
# leaves real keys to the last query row.
SINK_FEATURES = ("learnable_sink", "sink_token_length", "attention_chunk", "key_leftpad")


# At a covering corner past a key block of SINK_TOKENS_BLOCK, the sink-token properties' windows reach back at most
# SINK_TOKENS_WINDOW_LEFT keys (sink_chunk_leftpad_cases).
SINK_TOKENS_BLOCK, SINK_TOKENS_WINDOW_LEFT = 64, 16


SINK_FORMS = ("above", "among", "below", "mixed")


SINK_FORMS_THAT_MATTER = ("above", "among", "mixed")


def sink_logits(form: str, rng: np.random.Generator, scores: np.ndarray) -> np.ndarray:
    """(Hq,) sink logits placed against each head's own scores (B, Hq, Lq, Lk), -inf where a key is removed: above
    one of its rows' largest score by 0.5 .. 4 (that row's weights shrink by up to e^-4, none vanishes), equal to one
    of its scores (comparable to the keys), or below its smallest by 20 .. 40 (the rows are unchanged); "mixed" draws
    a form per head. A head without keys gets a logit in [-3, 3]: its rows are 0 whatever the sink."""
    heads = scores.shape[1]
    forms = rng.choice(SINK_FORMS[:3], size=heads) if form == "mixed" else [form] * heads
    logits = np.empty(heads)
    for h, chosen in enumerate(forms):
        head = scores[:, h]
        finite = head[np.isfinite(head)]
        if finite.size == 0:
            logits[h] = rng.uniform(-3.0, 3.0)
            continue
        row_max = np.max(head, axis=-1)
        if chosen == "above":
            logits[h] = rng.choice(row_max[np.isfinite(row_max)]) + rng.uniform(0.5, 4.0)
        elif chosen == "among":
            logits[h] = rng.choice(finite)
        else:
            logits[h] = finite.min() - rng.uniform(20.0, 40.0)
    return logits


def _chunks(length: int):
    return st.sampled_from(sorted({1, 2, 3, max(length // 2, 1), max(length, 1), length + 1})) | st.integers(
        1, max(length, 1) + 2)


def _leftpads(length: int, inputs: dict, example: int):
    """A left padding: 0, 1 or all the keys, or one that leaves the example a real key before its end
    (key_lengths) and its last query row past the padding, as in a batch of left-padded prompts."""
    end = length if inputs.get("key_lengths") is None else int(inputs["key_lengths"][example])
    live = max(0, min(end - 1, int(inputs.get("query_offset", 0)) + inputs["q"].shape[2] - 1))
    return st.sampled_from(sorted({0, 1, length})) | st.integers(0, live)


def _sink_token_lengths(length: int):
    return st.sampled_from(sorted({1, 2, 4, max(length, 1)})) | st.integers(1, max(length, 1))


def draw_sink_chunk_leftpad(draw, inputs: dict, features) -> list[str]:
    """The sink, chunk and left-padding keywords of ``features`` (SINK_FEATURES) drawn at their edges for the sdpa-shaped ``inputs``
    (q, k and the older keywords already drawn; put in them, in this order); their labels. The learnable sink comes
    last: it is placed against the scores every other keyword leaves."""
    q, k = inputs["q"], inputs["k"]
    b, hq, lq, _ = q.shape
    lk = k.shape[2]
    words = []
    if "sink_token_length" in features:
        left, right = inputs.get("window") or (None, None)
        if left is None:
            left = draw(st.sampled_from([0, 1, lk, lk + 3]) | st.integers(0, max(lk, 1)), label="window left")
            inputs["window"] = (left, right)
            words.append(f"window={inputs['window']}")
        inputs["sink_token_length"] = draw(_sink_token_lengths(lk), label="sink_token_length")
        words.append(f"sink_tokens={inputs['sink_token_length']}")
    if "attention_chunk" in features:
        inputs["attention_chunk"] = draw(_chunks(lk), label="attention_chunk")
        words.append(f"chunk={inputs['attention_chunk']}")
    if "key_leftpad" in features:
        inputs["key_leftpad"] = np.array([draw(_leftpads(lk, inputs, example), label="key leftpad")
                                          for example in range(b)], dtype=np.int32)
        words.append(f"key_leftpad={inputs['key_leftpad'].tolist()}")
    if "learnable_sink" in features:
        # A covering corner takes a form that changes its rows ("below" leaves them as they are): a split-KV decode
        # path that forgot the sink passed a run whose decode corner drew "below".
        forms = SINK_FORMS if hint("index") is None else SINK_FORMS_THAT_MATTER
        form = draw(st.sampled_from(forms), label="sink logits")
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="sink seed"))
        scores = oracle.scores(q, k, inputs.get("mask"), inputs.get("is_causal", False), inputs.get("scale"),
                               **oracle.variant_options(inputs))
        inputs["learnable_sink"] = sink_logits(form, rng, np.broadcast_to(scores, (b, hq, lq, lk)))
        words.append(f"sink={form}")
    return words


@st.composite
def sink_chunk_leftpad_cases(draw, *, features=SINK_FEATURES, variants=(), optional=(),
                             clauses=("sdpa.learnable-sink",), mask_kinds=("none",), causal=st.booleans(),
                             **base) -> Case:
    """An sdpa case using the sink, chunk and left-padding keywords named in ``features`` (each always used; SINK_FEATURES) on a case
    of variant_cases with the older variant keywords ``variants`` and ``optional`` (VARIANTS; as variant_cases
    takes them). With sink_token_length, a window whose left edge is unbounded gets a bounded one (the sink tokens'
    only effect). ``base``: further keywords of variant_cases / sdpa_cases."""
    case = draw(variant_cases(variants=variants, optional=optional, clauses=clauses, mask_kinds=mask_kinds,
                              causal=causal, outermost=False, **base), label="variant case")
    inputs = dict(case.inputs)
    label = case.label
    window = inputs.get("window")
    if "sink_token_length" in features and window is not None and hint("index") is not None \
            and inputs["k"].shape[2] > SINK_TOKENS_BLOCK and (window[0] is None or window[0] > SINK_TOKENS_WINDOW_LEFT):
        # A kernel-shaped corner: a left edge and an offset that leave the first key block behind every row's window,
        # so that a tiled kernel skipping the blocks left of a window must still visit the sink tokens' block (an
        # independently written one that did not passed 11 of 12 default runs, whose sink-token cases had a few keys).
        inputs["window"] = (SINK_TOKENS_WINDOW_LEFT, window[1])
        label = label.replace(f"window={window}", f"window={inputs['window']}")
        offset = inputs.get("query_offset")
        if offset is not None and offset < SINK_TOKENS_BLOCK + SINK_TOKENS_WINDOW_LEFT:
            inputs["query_offset"] = SINK_TOKENS_BLOCK + SINK_TOKENS_WINDOW_LEFT
            label = label.replace(f"offset={offset} ", f"offset={inputs['query_offset']} ", 1)
    words = draw_sink_chunk_leftpad(draw, inputs, features)
    keep_inside(draw, shape_facts("sdpa", inputs))  # with this case's own keywords among its variants
    return Case("sdpa", inputs, case.clauses, f"{label} {' '.join(words)}", mask_kind=case.mask_kind)
