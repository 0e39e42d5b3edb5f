"""FP8 attention: 8-bit q, k, v with per-head descale factors against the oracle on the dequantized
inputs (spec/clauses.yaml sdpa.fp8-descale), under the eight_bit tolerance (spec/tolerances.yaml).

Every test here carries the ``eight_bit`` mark: collection parametrises it over the 8-bit dtypes an implementation
declares in DTYPES (float8_e4m3fn, float8_e5m2) and nothing else, so an implementation that declares none has no
item here, and no other test runs in an 8-bit dtype (conformance/plugin.py). The descale keywords are passed to
every case; an implementation whose sdpa lacks them is skipped here as unsupported, never failed.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_conformance.conformance.cases.fp8 import fp8_cases
from attention_conformance.conformance.harness.checks import check, needs_keywords
from attention_conformance.conformance.harness.properties import property_test
from attention_conformance.implementations.contract import DESCALE_DEFAULTS

pytestmark = [pytest.mark.conformance, pytest.mark.eight_bit]
sdpa_op = pytest.mark.op("sdpa")


def needs_descales(*variant_keywords: str):
    """``requires`` of property_test: why ``impl`` cannot run 8-bit cases (the descale keywords, or the variant
    keywords the property uses, missing from its signature; a variant keyword its SUPPORTS leaves out), or None."""
    return needs_keywords(*DESCALE_DEFAULTS, *variant_keywords)


# The whole case space of 8-bit inputs: shapes small and kernel-shaped, causal or not, no mask, a key-padding mask
# or a full boolean one, grouped kv heads, each tensor's factors drawn per form; its covering set is the full one.
@property_test(requires=needs_descales())
@sdpa_op
@given(case=fp8_cases())
def test_fp8_matches_dequantized_oracle(impl, device, dtype, case):
    check(impl, device, dtype, case)


# Grouped-query attention with two kv heads whose factors differ, for every tensor: q's factor must be read at the
# kv head of the query head's group, and no (batch, kv head) may borrow another's factor.
@property_test(covering_set="brief", requires=needs_descales())
@sdpa_op
@given(case=fp8_cases(kv_heads=st.just(2), groups=st.sampled_from([2, 3, 4]), forms=st.just("calibrated"),
                      mask_kinds=("none",), clauses=("sdpa.fp8-descale", "sdpa.gqa-mapping")))
def test_fp8_descales_per_kv_head(impl, device, dtype, case):
    check(impl, device, dtype, case)


# Decode against a long 8-bit KV cache (an FP8 KV cache is what most FP8 attention serves): hundreds to thousands
# of keys of small weights, where P's rounding to 8 bits and its underflow show. Each case is kernel-shaped (its
# oracle and bound cost about ten small cases): a third of the profile's examples (3 in dev, 8 in ci).
@property_test(covering_set="brief", requires=needs_descales())
@sdpa_op
@settings(max_examples=max(2, settings.default.max_examples // 3))
@given(case=fp8_cases(mask_kinds=("none", "key-padding"), causal=st.just(False), query_mode="decode",
                      clauses=("sdpa.fp8-descale", "sdpa.cross-attention")))
def test_fp8_decode_against_a_long_cache(impl, device, dtype, case):
    check(impl, device, dtype, case)


# P rounded to 8 bits after FlashAttention 3's offset of 2^8: against a long cache whose keys all lie far below one
# dominant key, weights that P = e^(s - m) would flush to 0 in the format stay normal numbers. Descales of 1 keep
# the gap as drawn (calibrated ones spread each head's magnitude over a decade).
@property_test(covering_set="brief", requires=needs_descales())
@sdpa_op
@settings(max_examples=max(2, settings.default.max_examples // 3))
@given(case=fp8_cases(mask_kinds=("none",), causal=st.just(False), query_mode="decode", forms=st.just("one"),
                      dominant_key=True, clauses=("sdpa.fp8-descale", "sdpa.cross-attention")))
def test_fp8_small_weights_beside_a_dominant_key(impl, device, dtype, case):
    check(impl, device, dtype, case)


# FlashAttention 3 takes a window and a softcap with 8-bit inputs; the descales act before the cap
# (softcap_val *= q_descale * k_descale).
@property_test(covering_set="brief", requires=needs_descales("window", "softcap"))
@sdpa_op
@given(case=fp8_cases(variants=("window", "softcap"), mask_kinds=("none",),
                      clauses=("sdpa.fp8-descale", "sdpa.softcap", "sdpa.window")))
def test_fp8_with_window_and_softcap(impl, device, dtype, case):
    check(impl, device, dtype, case)
