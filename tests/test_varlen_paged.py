"""How the suite handles packed variable-length batches (sdpa_varlen) and paged KV caches (sdpa_paged): the oracle is
the padded sdpa per sequence, both alignments; the strategies' corners hold the structures kernels get wrong; the
padded form of a packed batch is the same math; the keywords reach an implementation in the contract's types; a
declared SEQUENCE_ALIGNMENT is validated and judged; LAYOUT applies to sdpa_paged's q; and each zoo bug is filed under
its clause with a repro that shows it (README "The contract"; spec/clauses.yaml varlen.*, paged.*)."""
from __future__ import annotations

import numpy as np
import pytest

from attention_conformance.conformance.cases.case import Case
from attention_conformance.conformance.cases.covering import DeterministicDraw, building, covering_hints
from attention_conformance.conformance.cases.sequences import GARBAGE_V_SIGMA, paged_cases, varlen_cases
from attention_conformance.conformance.judging.messages import ConformanceFailure
from attention_conformance.conformance.judging.verdict import Judge
from attention_conformance.conformance.reference import oracle
from attention_conformance.conformance.test_varlen import padded_batch
from attention_conformance.implementations.region import EVERYTHING
from attention_conformance.implementations.registry import ImplementationLoadError, from_object, load_implementation
from zoo import correct_varlen_paged_reference as reference

from .test_variant_judging import filed_under_and_reproduced

# kept_records: these judges record cases that the session's own summary and report must not count.
pytestmark = [pytest.mark.selfcheck, pytest.mark.usefixtures("kept_records")]


def packed_case(clause: str = "varlen.definition", **extra) -> Case:
    """5 sequences: (Lq, Lk) = (2, 3), (1, 2), (3, 1), (2, 0), (0, 2); 2 query heads on 1 kv head."""
    rng = np.random.default_rng(3)
    inputs = {"q": rng.standard_normal((8, 2, 3)), "k": rng.standard_normal((8, 1, 3)),
              "v": rng.standard_normal((8, 1, 2)), "cu_seqlens_q": np.array([0, 2, 3, 6, 8, 8], dtype=np.int32),
              "cu_seqlens_k": np.array([0, 3, 5, 6, 6, 8], dtype=np.int32), "max_seqlen_q": 3, "max_seqlen_k": 3,
              **extra}
    return Case("sdpa_varlen", inputs, (clause,), f"packed case for {clause}")


def three_sequences(clause: str) -> Case:
    """(Lq, Lk) = (1, 1), (2, 2), (1, 1), no causal band: every row attends its whole sequence."""
    rng = np.random.default_rng(5)
    inputs = {"q": rng.standard_normal((4, 2, 3)), "k": rng.standard_normal((4, 2, 3)),
              "v": rng.standard_normal((4, 2, 2)), "cu_seqlens_q": np.array([0, 1, 3, 4], dtype=np.int32),
              "cu_seqlens_k": np.array([0, 1, 3, 4], dtype=np.int32), "max_seqlen_q": 2, "max_seqlen_k": 2}
    return Case("sdpa_varlen", inputs, (clause,), f"three sequences for {clause}")


def paged_case(clause: str = "paged.definition", **extra) -> Case:
    """2 sequences of 5 and 4 keys in pages of 2 (shuffled, page 3 shared), garbage elsewhere; 3 queries each."""
    rng = np.random.default_rng(4)
    k_cache, v_cache = rng.standard_normal((6, 2, 1, 3)) * 30, rng.standard_normal((6, 2, 1, 2)) * 100
    for page in (3, 0, 5, 1):
        k_cache[page], v_cache[page] = rng.standard_normal((2, 1, 3)), rng.standard_normal((2, 1, 2))
    inputs = {"q": rng.standard_normal((2, 2, 3, 3)), "k_cache": k_cache, "v_cache": v_cache,
              "block_table": np.array([[3, 0, 5], [3, 1, 4]], dtype=np.int32),
              "seqused_k": np.array([5, 4], dtype=np.int32), **extra}
    return Case("sdpa_paged", inputs, (clause,), f"paged case for {clause}")


# ------------------------------------------------------------------ the oracle
@pytest.mark.parametrize("alignment", ["bottom-right", "top-left"])
def test_the_packed_oracle_is_the_padded_one_sequence_by_sequence(alignment):
    """oracle.sdpa_varlen's rows of sequence b are oracle.sdpa of that sequence alone, its queries at the alignment's
    offset; an empty query sequence adds no row, an empty key sequence gives zeros."""
    a = packed_case(is_causal=True).inputs
    out = oracle.sdpa_varlen(**a, alignment=alignment)
    assert out.shape == (8, 2, 2)
    for (qs, qe, ks, ke) in oracle.varlen_spans(a["cu_seqlens_q"], a["cu_seqlens_k"]):
        if qe == qs:
            continue
        q, k, v = (np.swapaxes(x, 0, 1)[None] for x in (a["q"][qs:qe], a["k"][ks:ke], a["v"][ks:ke]))
        if ke == ks:
            assert np.array_equal(out[qs:qe], np.zeros((qe - qs, 2, 2)))
            continue
        offset = (ke - ks) - (qe - qs) if alignment == "bottom-right" else 0
        want = oracle.sdpa(q, k, v, is_causal=True, query_offset=offset) if offset >= 0 else None
        if want is not None:
            assert np.allclose(out[qs:qe], np.swapaxes(want[0], 0, 1))
    # Sequence 2 has 3 queries and 1 key: bottom-right leaves its first two rows without a key, top-left none.
    assert np.array_equal(out[3:5] == 0, np.full((2, 2, 2), alignment == "bottom-right"))


@pytest.mark.parametrize("alignment", ["bottom-right", "top-left"])
def test_the_padded_form_of_a_packed_batch_is_the_same_math(alignment):
    """varlen.padded-agreement's construction: the padded batch (key_leftpad and query_offset bottom-right, key
    lengths top-left) gives the packed oracle's rows, with every per-sequence variant."""
    case = packed_case(is_causal=True, window=(1, None), softcap=2.0, alibi_slopes=np.array([[0.5, 0.1]] * 5),
                       learnable_sink=np.array([0.3, -1.0]))
    packed = oracle.sdpa_varlen(**case.inputs, alignment=alignment)
    padded_case, rows = padded_batch(case, alignment)
    padded = oracle.sdpa(**{n: x for n, x in padded_case.inputs.items()})
    for first, example, at, count in rows:
        assert np.allclose(packed[first:first + count], np.swapaxes(padded[example, :, at:at + count], 0, 1))


def test_the_paged_oracle_reads_only_the_used_slots():
    """Garbage in the slots past seqused_k, in pages no sequence uses and in table entries past the used ones changes
    nothing; a page shared by two sequences serves both."""
    case = paged_case(is_causal=True)
    out = oracle.sdpa_paged(**case.inputs)
    changed = {**case.inputs, "k_cache": case.inputs["k_cache"].copy(), "v_cache": case.inputs["v_cache"].copy(),
               "block_table": case.inputs["block_table"].copy()}
    changed["v_cache"][5, 1] = changed["v_cache"][2] = changed["v_cache"][4] = 1e6  # past seqused_k, unused pages
    changed["block_table"][1, 2] = 2  # sequence 1 uses 2 pages: its third entry is never read
    assert np.array_equal(oracle.sdpa_paged(**changed), out)
    keys = oracle.paged_keys(case.inputs["k_cache"], case.inputs["block_table"], 4, 1)
    assert np.array_equal(keys[:2], case.inputs["k_cache"][3].reshape(2, 1, 3))  # the shared page, first for both


# ------------------------------------------------------------------ the strategies' corners
def _corners(strategy):
    cases = []
    for hints in covering_hints(EVERYTHING, True):
        with building(hints):
            cases.append(DeterministicDraw(hints["index"])(strategy))
    return cases


def test_packed_corners_hold_empty_sequences_and_more_queries_than_keys():
    for case in _corners(varlen_cases()):
        a = case.inputs
        lq, lk = np.diff(a["cu_seqlens_q"]), np.diff(a["cu_seqlens_k"])
        used = lk if a.get("seqused_k") is None else a["seqused_k"]
        assert (lq == 0).any() or (used == 0).any(), case
        assert (lq > used).any() and lq.sum() > 0 and used.max() > 0, case
        assert a["max_seqlen_q"] == lq.max() and a["max_seqlen_k"] == lk.max()


def test_equal_lengths_holds_for_every_packed_sequence():
    """A kernel declaring equal_lengths runs a packed batch with one cu_seqlens for queries and keys (fla's
    parallel_attn): every sequence is drawn with Lq_b == Lk_b, not only the longest, and a property that needs a
    sequence with Lq_b != Lk_b is outside its region."""
    from hypothesis import HealthCheck, given, settings

    from attention_conformance.conformance.cases.drawing import drawing_inside
    from attention_conformance.implementations.region import parse_region

    region, drawn = parse_region({"equal_lengths": True}), []

    @settings(max_examples=60, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=varlen_cases())
    def draw(case):
        drawn.append(case)

    with drawing_inside(region, {"dtype": "float64", "device": "cpu"}, (), None):
        draw()
        corners = _corners(varlen_cases())
        with pytest.raises(pytest.skip.Exception, match=r"Lq_b != Lk_b \(declared equal_lengths: True\)"):
            DeterministicDraw(0)(varlen_cases(unequal=True))
    for case in drawn + corners:
        a = case.inputs
        used = np.diff(a["cu_seqlens_k"]) if a.get("seqused_k") is None else a["seqused_k"]
        assert np.array_equal(np.diff(a["cu_seqlens_q"]), used), case.label
    assert len(drawn) > 20
    causal_equal = parse_region({"causal": "lq==lk"})  # the same of causal sequences, for a kernel declaring that
    assert "Lq_b != Lk_b (declared causal: 'lq==lk')" in causal_equal.why_outside(
        {"is_causal": True, "equal_sequences": False})
    assert causal_equal.why_outside({"is_causal": False, "equal_sequences": False}) is None
    assert any(len(np.unique(np.diff(c.inputs["cu_seqlens_q"]))) > 1 for c in drawn)  # still varied lengths


def test_paged_corners_hold_page_boundaries_shared_pages_and_garbage():
    seen = {"boundary at the last key": 0, "partial last page": 0, "shared page": 0, "empty cache": 0}
    for case in _corners(paged_cases()):
        a = case.inputs
        block, table, used = a["k_cache"].shape[1], a["block_table"], a["seqused_k"]
        seen["boundary at the last key"] += bool(((used % block == 0) & (used > 0)).any())
        seen["partial last page"] += bool((used % block != 0).any())
        seen["empty cache"] += bool((used == 0).any())
        pages = [set(table[b, :-(-int(n) // block)].tolist()) for b, n in enumerate(used)]
        seen["shared page"] += any(pages[i] & pages[j] for i in range(len(pages)) for j in range(i))
        # Every slot no sequence uses holds garbage far from the real values.
        reached = np.zeros(a["v_cache"].shape[:2], dtype=bool)
        for b, n in enumerate(used):
            for j in range(int(n)):
                reached[table[b, j // block], j % block] = True
        assert (np.abs(a["v_cache"][~reached]) > 0).all() and np.abs(a["v_cache"][~reached]).mean() > 10
    assert all(seen.values()), seen
    assert GARBAGE_V_SIGMA >= 100


# ------------------------------------------------------------------ the registry and the judge
class Recorder:
    """The reference member, remembering what it was given."""

    DTYPES = reference.DTYPES
    seen: dict = {}

    @classmethod
    def sdpa_varlen(cls, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False,
                    scale=None, *, seqused_k=None, alibi_slopes=None):
        cls.seen = dict(cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q, seqused_k=seqused_k,
                        alibi_slopes=alibi_slopes)
        return reference.sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal,
                                     scale, seqused_k=seqused_k, alibi_slopes=alibi_slopes)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_offsets_reach_the_implementation_as_int32_and_maxima_as_ints(dtype):
    case = packed_case(seqused_k=np.array([1, 2, 1, 0, 1], dtype=np.int32), alibi_slopes=np.array([0.5, 0.25]))
    Judge(load_implementation("tests.test_varlen_paged:Recorder"), dtype, "cpu").check(case)
    seen = Recorder.seen
    assert seen["cu_seqlens_q"].dtype == np.int32 and seen["seqused_k"].dtype == np.int32
    assert type(seen["max_seqlen_q"]) is int and seen["max_seqlen_q"] == 3
    assert seen["alibi_slopes"].dtype == (np.float64 if dtype == "float64" else np.float32)


def test_a_signature_without_a_keyword_is_unsupported_not_failed():
    impl = load_implementation("tests.test_varlen_paged:Recorder")  # no window
    inputs = packed_case(window=(1, 1)).rounded("float64")
    assert "window" in impl.unsupported_reason("sdpa_varlen", inputs, "float64", "cpu")


def test_sequence_alignment_is_validated():
    class Sideways:
        SEQUENCE_ALIGNMENT = "bottom-left"
        sdpa_varlen = staticmethod(reference.sdpa_varlen)

    with pytest.raises(ImplementationLoadError, match="SEQUENCE_ALIGNMENT='bottom-left' must be one of"):
        from_object(Sideways, "sideways", "tests:Sideways")


def test_a_top_left_implementation_is_judged_against_top_left():
    """The declared alignment decides the oracle: the top-left member passes its causal case; the same code without
    the declaration fails it, filed under varlen.alignment."""
    case = packed_case("varlen.definition", is_causal=True)
    Judge(load_implementation("zoo.correct_varlen_paged_top_left"), "float32", "cpu").check(case)

    class Undeclared:
        sdpa_varlen = staticmethod(load_implementation("zoo.correct_varlen_paged_top_left").obj.sdpa_varlen)

    judge = Judge(from_object(Undeclared, "undeclared", "tests.test_varlen_paged:Undeclared"), "float32", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(case)
    assert raised.value.clause == "varlen.alignment"


class PagedBLHD:
    """The reference's sdpa_paged with q and the output as (B, Lq, Hq, D) (LAYOUT 'blhd', FlashAttention's order)."""

    LAYOUT = "blhd"

    @staticmethod
    def sdpa_paged(q, k_cache, v_cache, block_table, seqused_k, is_causal=False, scale=None):
        out = reference.sdpa_paged(np.swapaxes(q, 1, 2), k_cache, v_cache, block_table, seqused_k, is_causal, scale)
        return np.ascontiguousarray(np.swapaxes(out, 1, 2))


def test_layout_applies_to_the_paged_query_and_output():
    """A (B, Lq, Hq, D) implementation declaring it passes; the same code declaring nothing fails under
    contract.layout (the case passes with q handed in the other layout)."""
    case = paged_case(is_causal=True)
    Judge(load_implementation("tests.test_varlen_paged:PagedBLHD"), "float32", "cpu").check(case)

    class Undeclared:
        sdpa_paged = staticmethod(PagedBLHD.sdpa_paged)

    judge = Judge(from_object(Undeclared, "undeclared", "tests.test_varlen_paged:Undeclared"), "float32", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(case)
    assert raised.value.clause == "contract.layout"


def test_a_wrong_output_shape_names_the_operations_shape_clause():
    class Flat:
        @staticmethod
        def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
            return np.zeros((q.shape[1], q.shape[0], v.shape[2]), dtype=q.dtype)  # (Hq, total_q, Dv)

    judge = Judge(from_object(Flat, "flat", "tests.test_varlen_paged:Flat"), "float32", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(packed_case())
    assert raised.value.clause == "varlen.output-shape" and "expected (8, 2, 2)" in str(raised.value)


def test_a_failure_names_the_packed_row_and_its_sequence():
    judge = Judge(load_implementation("zoo.broken_varlen_cu_seqlens_as_lengths"), "float32", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(three_sequences("varlen.cu-seqlens"))
    assert "of (total_q, Hq, Dv) (sequence 1, its query row" in str(raised.value)


# ------------------------------------------------------------------ the zoo's bugs, each under its clause
@pytest.mark.parametrize("member, case, clause", [
    ("broken_varlen_cu_seqlens_as_lengths", three_sequences("varlen.cu-seqlens"), "varlen.cu-seqlens"),
    ("broken_varlen_causal_top_left", packed_case("varlen.definition", is_causal=True), "varlen.alignment"),
    ("broken_varlen_seqused_ignored", packed_case("varlen.seqused-k", seqused_k=np.array([1, 1, 1, 0, 2])),
     "varlen.seqused-k"),
    # Drawn for the definition, its sequence 1 emptied by seqused_k = 0: passes packed without seqused_k.
    ("broken_varlen_seqused_zero_as_absent",
     packed_case("varlen.definition", seqused_k=np.array([1, 0, 1, 0, 2], dtype=np.int32)), "varlen.seqused-k"),
    ("broken_paged_first_block_only", paged_case("paged.block-table"), "paged.block-table"),
    ("broken_paged_boundary_off_by_one", paged_case("paged.block-table"), "paged.block-table"),
    ("broken_paged_reads_partial_page", paged_case("paged.seqused-k"), "paged.seqused-k"),
    ("broken_varlen_causal_top_left", paged_case("paged.definition", is_causal=True), "paged.alignment"),
])
def test_a_bug_is_filed_under_its_clause_and_the_repro_shows_it(member, case, clause):
    filed_under_and_reproduced(member, case, clause)


def test_a_fault_of_the_empty_rows_stays_theirs_where_seqused_k_empties_them():
    """The seqused_k probe (the case packed without it, the same math) acquits how seqused_k is read only where the
    probe passes: NaN in every row without a key (FULLY_MASKED_ROWS undeclared) fails the probe's empty rows alike."""
    class NanRows:
        @staticmethod
        def sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None,
                        *, seqused_k=None):
            out = reference.sdpa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal,
                                        scale, seqused_k=seqused_k)
            used = np.diff(cu_seqlens_k) if seqused_k is None else seqused_k
            for b in np.flatnonzero(used == 0):
                out[cu_seqlens_q[b]:cu_seqlens_q[b + 1]] = np.nan
            return out

    judge = Judge(from_object(NanRows, "nan_rows", "tests.test_varlen_paged:NanRows"), "float32", "cpu")
    with pytest.raises(ConformanceFailure) as raised:
        judge.check(packed_case("varlen.definition", seqused_k=np.array([1, 0, 1, 0, 2], dtype=np.int32)))
    assert raised.value.clause == "mask.fully-masked-row"
    assert "without seqused_k" not in str(raised.value)


@pytest.mark.parametrize("case", [packed_case(is_causal=True, seqused_k=np.array([1, 1, 1, 0, 2])),
                                  paged_case(is_causal=True, window=(1, 0), learnable_sink=np.array([0.0, 1.0]))])
def test_the_correct_members_pass_the_same_cases(case):
    for member in ("correct_varlen_paged_reference",):
        Judge(load_implementation(f"zoo.{member}"), "float32", "cpu").check(case)
