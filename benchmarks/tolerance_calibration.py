"""Measure how much of the tolerance model's allowance implementations use.

For every built-in (CPU) and declared dtype, draws generated sdpa, softmax and
multi_head_attention cases (the same strategies as the suite), and records
error / allowed at the worst element of each case. The constants in
spec/tolerances.yaml are right when the largest ratio stays well under 1 for
correct implementations (at most 0.5: the safety factor is the headroom) and
above 1 for broken ones.

sdpa is measured twice: on the suite's small cases and on kernel-shaped ones
(head dims 16..256, lengths up to 2048, drawn as for a flash-like kernel's
declared region). For an implementation that declares a region (SUPPORTS), all
cases are drawn inside it. Printed per implementation, dtype and operation:
the median and the largest ratio over the cases, and for sdpa the share of
output rows whose allowance reaches the row's own largest |exact output| (such
a row would accept zeros), over the rows with Dk >= 64 where there are any.
Cases under one of the implementation's declared deviations (KNOWN_DEVIATIONS) are left
out and counted (the suite reports them as deviations, it does not judge them).

    python benchmarks/tolerance_calibration.py [--examples 60] [--impl zoo.kernel_correct ...] [--dtype float16]
    python benchmarks/tolerance_calibration.py --precision-zoo   # the zoo's precision_* and correct 16-bit members
    python benchmarks/tolerance_calibration.py --ops variants,variants-kernel,softcap,alibi   # the sdpa variants
    python benchmarks/tolerance_calibration.py --ops sinks,sinks-kernel,chunk-leftpad   # sinks, chunks, left padding
    python benchmarks/tolerance_calibration.py --ops varlen,paged   # packed batches and paged KV caches
    python benchmarks/tolerance_calibration.py --ops mha-variants   # multi_head_attention's variant keywords
    python benchmarks/tolerance_calibration.py --fp8-zoo --ops fp8,fp8-kernel,fp8-decode,fp8-variants   # FP8 attention
    python benchmarks/tolerance_calibration.py --fp8-adversarial   # FP8 rows built to correlate P's roundings
    python benchmarks/tolerance_calibration.py --ops merge,merge-sink   # merge_states, built-ins and --impl members
    python benchmarks/tolerance_calibration.py --ops lse,lse-kernel,lse-variants,lse-sinks,lse-varlen   # the lse
      (error / allowed of the log-sum-exp returned with return_lse=True, by implementations whose signature has it)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

import numpy as np

from attention_conformance.conformance.cases import fp8, mha, sdpa, sequences, softmax, variants
from attention_conformance.conformance.cases import merging
from attention_conformance.conformance.judging import expected, lse_verdicts, merge_verdicts, verdict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from attention_conformance.conformance.cases.drawing import drawing_inside
from attention_conformance.conformance.reference.output_forms import canonical_output
from attention_conformance.implementations.arrays import is_eight_bit, numpy_dtype
from attention_conformance.implementations.region import parse_region
from attention_conformance.implementations.registry import builtin_implementations, load_implementation

# The region a flash-like kernel declares (zoo/kernel_correct.py): kernel-shaped cases only.
KERNEL_REGION = {"head_dims": {"min": 16, "max": 256, "multiple": 8}}
PRECISION_ZOO = ("zoo.kernel_correct", "zoo.correct_flash_blockwise", "zoo.correct_torch", "zoo.correct_loop",
                 "zoo.correct_logsumexp", "zoo.correct_reference", "zoo.precision_fp16_as_bf16",
                 "zoo.precision_bf16_pv_accumulate", "zoo.precision_bf16_zeros_large_head",
                 "zoo.precision_bf16_exp2_no_log2e")
# FP8 attention (spec/tolerances.yaml, eight_bit): the correct 8-bit members beside the built-in
# torch_scaled_mm_fp8: FlashAttention 3's pipeline emulated, the same with P in float32, and a path that
# dequantizes to bfloat16 and computes there.
FP8_ZOO = ("builtin:torch_scaled_mm_fp8", "zoo.correct_fp8_fa3_emulation", "zoo.correct_fp8_unrounded_p",
           "zoo.correct_fp8_dequant_bf16")


def lse_ratio(impl, dtype, case, inputs) -> float | None:
    """error / allowed of the lse at the case's worst judged finite row (None: no such row, or not supported)."""
    judge = lse_verdicts.LseJudge(impl, dtype, "cpu")
    try:
        _, lse = impl.call(case.op, case.arrays(inputs), {**case.options(), "return_lse": True}, "cpu")
    except NotImplementedError:
        return None
    lse = np.asarray(lse, dtype=np.float64)
    lse = lse[None] if case.op == "sdpa_varlen" else lse
    want, allowed, _ = judge.expected_lse(case, inputs)
    rows = judge.judged_lse_rows(case, inputs, want.shape) & np.isfinite(want) & (allowed > 0)
    if not rows.any():
        return None
    with np.errstate(invalid="ignore"):
        error = np.where(np.isfinite(lse), np.abs(lse - np.where(rows, want, 0.0)), np.inf)
    return float(np.max(error[rows] / allowed[rows]))


def merge_ratio(impl, dtype, case) -> float | None:
    """error / allowed of a merge_states case's worst element of out or row of lse (None: nothing finite)."""
    judge = merge_verdicts.MergeJudge(impl, dtype, "cpu")
    inputs = judge.merge_inputs(case)
    got_out, got_lse = impl.call("merge_states", case.arrays(inputs), case.options(), "cpu")
    want, want_lse, allowed, lse_allowed, _ = judge.expected(inputs)
    ratios = []
    for got, exact, room in ((got_out, want, allowed), (got_lse, want_lse, lse_allowed)):
        got = np.asarray(got, dtype=np.float64)
        live = np.isfinite(exact) & (room > 0)
        if live.any():
            with np.errstate(invalid="ignore"):
                error = np.where(np.isfinite(got), np.abs(got - exact), np.inf)
            ratios.append(float(np.max(error[live] / room[live])))
    return max(ratios) if ratios else None


def measure(impl, dtype, strategy, examples: int, region=None, seed: int | None = None, lse: bool = False) -> dict:
    """{'ratios': [per case], 'rows': rows measured, 'zero_rows': rows whose allowance >= max |exact|,
    'rows64'/'zero_rows64': the same for Dk >= 64}. ``lse``: the ratios of the lse returned with return_lse=True
    instead of the output's."""
    found = {"ratios": [], "rows": 0, "zero_rows": 0, "rows64": 0, "zero_rows64": 0, "deviations": 0}

    @settings(max_examples=examples, deadline=None, database=None, derandomize=seed is None,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        inputs = case.rounded(dtype)
        if impl.unsupported_reason(case.op, inputs, dtype, "cpu"):
            return
        # A case under a declared deviation (KNOWN_DEVIATIONS, e.g. torch_sdpa's causal CPU kernel with a negative
        # scale in 16-bit dtypes) is reported as a deviation by the suite, not judged: it measures nothing here.
        if impl.known_deviations:
            facts = verdict.Judge(impl, dtype, "cpu").facts(case, inputs)
            if any(deviation["when"](facts) for deviation in impl.known_deviations):
                found["deviations"] += 1
                return
        if case.op == "merge_states":
            ratio = merge_ratio(impl, dtype, case)
            if ratio is not None:
                found["ratios"].append(ratio)
            return
        if lse:
            ratio = lse_ratio(impl, dtype, case, inputs)
            if ratio is not None:
                found["ratios"].append(ratio)
            return
        try:
            got = impl.call(case.op, case.arrays(inputs), case.options(), "cpu").astype(np.float64)
        except NotImplementedError:
            return
        got = canonical_output(case.op, got)  # sdpa_varlen's rows as the judge holds them
        policy = impl.policy_for(inputs.get("mask")) if case.op != "softmax" else "zeros"
        want = expected.expected_output(case, inputs, policy, impl.sequence_alignment)
        allowed = np.broadcast_to(expected.allowed_error(case, inputs, dtype, policy, alignment=impl.sequence_alignment,
                                                       output_dtype=impl.output_dtype(dtype)), want.shape)
        finite = np.isfinite(want) & (allowed > 0)
        if case.op == "sdpa":  # padding rows of a variable-length batch (sdpa.varlen) are not judged
            finite &= np.broadcast_to(verdict.Judge(impl, dtype, "cpu").judged_rows(case, inputs)[..., None], want.shape)
        elif case.op == "multi_head_attention":  # nor those of MHA's output (mha.variants)
            finite &= np.broadcast_to(verdict.Judge(impl, dtype, "cpu").judged_rows(case, inputs), want.shape)
        if finite.any():
            with np.errstate(invalid="ignore"):
                error = np.where(np.isfinite(got), np.abs(got - want), np.inf)
            found["ratios"].append(float(np.max(error[finite] / allowed[finite])))
        if case.op == "sdpa":
            top = np.max(np.abs(np.nan_to_num(want)), axis=-1)
            room = np.max(allowed, axis=-1)
            live = top > 0
            zero = live & (room >= top)
            found["rows"] += int(live.sum())
            found["zero_rows"] += int(zero.sum())
            if case.inputs["q"].shape[-1] >= 64:
                found["rows64"] += int(live.sum())
                found["zero_rows64"] += int(zero.sum())

    declared = impl.region if impl.region.declared else None
    # The dtype is a fact of the drawing: an 8-bit case draws values of the 8-bit dtype measured (fp8_cases).
    with drawing_inside(declared if declared is not None else parse_region(region), {"dtype": dtype, "device": "cpu"}):
        run()
    return found


# Rows built to make the roundings of P correlate, where a random walk over independent roundings would fail
# (spec/tolerances.yaml, eight_bit, term 2): nearly equal weights, duplicate keys, a plateau beside one dominant key,
# geometric weights (scores in arithmetic progression, ALiBi-like), two levels of weights, values all positive.
FP8_ADVERSARIAL = ("random", "near-uniform", "positive-v-flat", "duplicates", "plateau", "progression", "two-levels",
                   "large")


def fp8_adversarial_case(kind: str, dtype: str, lk: int, rng):
    """(stored q, k, v, q_descale, k_descale, v_descale) of one such row family: B 1, Hq 2, Hkv 1, D 64."""
    b, hq, hkv, lq, d = 1, 2, 1, 2 if lk > 1000 else 4, 64
    q = rng.standard_normal((b, hq, lq, d))
    k, v = rng.standard_normal((b, hkv, lk, d)), rng.standard_normal((b, hkv, lk, d))
    if kind == "near-uniform":
        q *= 1e-3
    elif kind == "positive-v-flat":
        q, v = q * 1e-2, np.abs(v) + 1
    elif kind == "duplicates":
        k[:, :, 1:], v = k[:, :, :1], np.abs(v)
    elif kind == "plateau":
        q, v = q * 0.05, np.abs(v) + 0.5
        k[:, :, 0] *= 30
    elif kind == "progression":
        q, k, v = np.zeros_like(q), np.zeros_like(k), np.abs(v)
        q[..., 0] = 1.0
        k[..., 0] = np.arange(lk) * rng.uniform(0.001, 0.05)
    elif kind == "two-levels":
        k[:, :, ::2], k[:, :, 1::2], v = k[:, :, :1], k[:, :, 1:2], np.abs(v) + 1
    elif kind == "large":
        q, k = q * 4, k * 4
    stored = [fp8.quantized(x, hkv, "calibrated", dtype, rng) for x in (q, k, v)]
    return tuple(x for x, _ in stored) + tuple(factors for _, factors in stored)


def fp8_adversarial(specs) -> None:
    """Max error / allowed per implementation and 8-bit dtype over the FP8_ADVERSARIAL rows, Lk 5, 300 and 2048."""
    from attention_conformance.conformance.reference import oracle, tolerances

    rng = np.random.default_rng(0)
    for spec in specs:
        impl = load_implementation(spec)
        for dtype in (d for d in impl.dtypes if is_eight_bit(d)):
            worst = {}
            for kind in FP8_ADVERSARIAL:
                for lk in (5, 300, 2048):
                    q, k, v, qd, kd, vd = fp8_adversarial_case(kind, dtype, lk, rng)
                    arrays = {n: x.astype(numpy_dtype(dtype)) for n, x in zip("qkv", (q, k, v))}
                    arrays.update(q_descale=qd.astype(np.float32), k_descale=kd.astype(np.float32),
                                  v_descale=vd.astype(np.float32))
                    got = impl.call("sdpa", arrays, {}, "cpu").astype(np.float64)
                    dq, dk, dv = oracle.dequantize(q, k, v, qd, kd, vd)
                    allowed = tolerances.sdpa_allowed(dq, dk, dv, None, False, None, dtype,
                                                      output_dtype=impl.output_dtype(dtype))
                    ratio = float(np.max(np.abs(got - oracle.sdpa(dq, dk, dv)) / allowed))
                    worst[kind] = max(worst.get(kind, 0.0), ratio)
            print(f"{impl.name:<34}{dtype:<15}" + " ".join(f"{kind} {r:.3f}" for kind, r in worst.items()), flush=True)


def summary(found: dict) -> str:
    r = found["ratios"]
    if not r:
        return "-"
    skipped = f", {found['deviations']} under a declared deviation" if found["deviations"] else ""
    text = f"{statistics.median(r):.3g}/{max(r):.3g} (n={len(r)}{skipped})"
    if found["rows"]:
        rows, zero = (found["rows64"], found["zero_rows64"]) if found["rows64"] else (found["rows"], found["zero_rows"])
        text += f" z{'64' if found['rows64'] else ''}={zero / rows:.3f}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=60)
    parser.add_argument("--impl", action="append", help="module[:attr] to measure instead of the built-ins")
    parser.add_argument("--precision-zoo", action="store_true", help="measure the zoo's 16-bit members")
    parser.add_argument("--fp8-zoo", action="store_true", help="measure the 8-bit built-in and the zoo's 8-bit members")
    parser.add_argument("--fp8-adversarial", action="store_true",
                        help="the 8-bit built-in and zoo members on rows built to correlate P's roundings")
    parser.add_argument("--dtype", action="append", help="only these dtypes")
    parser.add_argument("--ops", default="sdpa,sdpa-kernel,softmax,multi_head_attention")
    parser.add_argument("--seed", type=int, default=None, help="draw at random from this seed (default derandomized)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    if args.fp8_adversarial:
        fp8_adversarial(args.impl or FP8_ZOO)
        return
    if args.seed is not None:
        import random

        random.seed(args.seed)
    specs = list(args.impl or []) + (list(PRECISION_ZOO) if args.precision_zoo else []) \
        + (list(FP8_ZOO) if args.fp8_zoo else [])
    impls = [load_implementation(s) for s in specs] if specs else builtin_implementations()
    ops = {
        "sdpa": ("sdpa", sdpa.sdpa_cases(allow_empty_rows=True), None),
        "sdpa-kernel": ("sdpa", sdpa.sdpa_cases(allow_empty_rows=True), KERNEL_REGION),
        # The sdpa variants (window, softcap, ALiBi, query offset, lengths) together, with masks, causal and GQA
        # (spec/tolerances.yaml, variants): python benchmarks/tolerance_calibration.py --ops variants,variants-kernel
        "variants": ("sdpa", variants.variant_cases(mask_kinds=("none", "bool-full", "float")), None),
        "variants-kernel": ("sdpa", variants.variant_cases(mask_kinds=("none", "bool-full", "float")), KERNEL_REGION),
        "softcap": ("sdpa", variants.variant_cases(variants=("softcap",), mask_kinds=("none", "float")), None),
        "alibi": ("sdpa", variants.variant_cases(variants=("alibi_slopes", "query_offset")), None),
        # Sinks, chunks, left padding (spec/tolerances.yaml, variants: c_sink): learnable sinks on every older
        # variant, with masks, causal and GQA, small and kernel-shaped; chunks, sink tokens and left padding (they
        # only choose keys).
        "sinks": ("sdpa", variants.sink_chunk_leftpad_cases(
            features=("learnable_sink",), variants=variants.VARIANTS, mask_kinds=("none", "bool-full", "float")), None),
        "sinks-kernel": ("sdpa", variants.sink_chunk_leftpad_cases(
            features=("learnable_sink",), variants=variants.VARIANTS, mask_kinds=("none", "bool-full", "float")),
            KERNEL_REGION),
        "chunk-leftpad": ("sdpa", variants.sink_chunk_leftpad_cases(
            features=variants.SINK_FEATURES, variants=("window", "query_offset"),
            mask_kinds=("none", "key-padding")), None),
        # Packed batches and paged caches (spec/tolerances.yaml, sequences): every per-sequence variant drawn.
        "varlen": ("sdpa_varlen", sequences.varlen_cases(variants=sequences.SEQUENCE_VARIANT_NAMES), None),
        "paged": ("sdpa_paged", sequences.paged_cases(variants=sequences.SEQUENCE_VARIANT_NAMES), None),
        # FP8 (spec/tolerances.yaml, eight_bit): the cases of conformance/test_fp8.py, small and kernel-shaped,
        # decode against a long cache, and with a window and a softcap.
        "fp8": ("sdpa", fp8.fp8_cases(), None),
        "fp8-kernel": ("sdpa", fp8.fp8_cases(), KERNEL_REGION),
        "fp8-decode": ("sdpa", fp8.fp8_cases(mask_kinds=("none", "key-padding"), causal=st.just(False),
                                                    query_mode="decode"), None),
        "fp8-variants": ("sdpa", fp8.fp8_cases(variants=("window", "softcap"), mask_kinds=("none",)), None),
        # The log-sum-exp (spec/tolerances.yaml, lse): the cases of conformance/test_lse.py, small and
        # kernel-shaped, with the variants, a learnable sink, packed batches.
        "lse": ("sdpa", sdpa.sdpa_cases(allow_empty_rows=True), None),
        "lse-kernel": ("sdpa", sdpa.sdpa_cases(allow_empty_rows=True), KERNEL_REGION),
        "lse-variants": ("sdpa", variants.variant_cases(mask_kinds=("none", "bool-full", "float")), None),
        "lse-sinks": ("sdpa", variants.sink_chunk_leftpad_cases(
            features=("learnable_sink",), variants=variants.VARIANTS, mask_kinds=("none", "bool-full", "float")), None),
        "lse-varlen": ("sdpa_varlen", sequences.varlen_cases(variants=sequences.SEQUENCE_VARIANT_NAMES), None),
        # merge_states (spec/tolerances.yaml, merge_states): the cuts of conformance/test_merge_states.py.
        "merge": ("merge_states", merging.merge_cases(sink_modes=("none", "part")), None),
        "merge-sink": ("merge_states", merging.merge_cases(sink_modes=("merge",)), None),
        "softmax": ("softmax", softmax.softmax_cases(), None),
        "multi_head_attention": ("multi_head_attention", mha.mha_cases(), None),
        # mha.variants: every variant keyword inside multi-head attention (a random subset a case), per head
        "mha-variants": ("multi_head_attention", mha.mha_variant_cases(), None),
    }
    ops = {name: ops[name] for name in args.ops.split(",")}
    print("median/max of error / allowed over the cases; z: share of sdpa rows whose allowance reaches the row's "
          "largest |exact output| (z64: rows with Dk >= 64)")
    print(f"{'implementation':<34}{'dtype':<10}" + "".join(f"{op:>34}" for op in ops))
    for impl in impls:
        if impl.skip_reason or "cpu" not in impl.devices():
            continue
        for dtype in impl.dtypes_on("cpu"):
            if args.dtype and dtype not in args.dtype:
                continue
            if any(op.startswith("fp8") for op in ops) != is_eight_bit(dtype):  # as collection decides
                continue
            row = []
            for name, (op, strategy, region) in ops.items():
                lse = name.startswith("lse")
                if not impl.implements(op) or (lse and "return_lse" not in (impl.accepted_keywords(op) or {"return_lse"})):
                    row.append("-")
                    continue
                # A member with a declared region draws inside it anyway.
                row.append(summary(measure(impl, dtype, strategy, args.examples, region, args.seed, lse)))
            print(f"{impl.name:<34}{dtype:<10}" + "".join(f"{r:>34}" for r in row), flush=True)


if __name__ == "__main__":
    main()
