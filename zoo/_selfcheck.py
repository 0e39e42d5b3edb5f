"""Quick standalone self-check of the zoo against zoo/_reference.py.

    python -m zoo._selfcheck            # summary, exit 1 on a problem
    python -m zoo._selfcheck -v         # every case of every member

Not the suite's harness (that lives in conformance/): this only confirms that
every correct member agrees with the reference on a battery of cases, in every
dtype it declares (a NotImplementedError is unsupported, as in the suite), and lists
the broken members it sees differ from it (or raise); one whose bug needs a variant keyword
or a kernel-sized shape is out of this small battery's reach and only named. Declared FULLY_MASKED_ROWS deviations are applied to the
reference before comparing. It also checks that every EXPECTED_CLAUSES id exists
in spec/clauses.yaml.
"""
from __future__ import annotations

import pathlib
import re
import sys
import warnings

import ml_dtypes
import numpy as np

import zoo
from zoo import _reference as ref

DTYPE_OBJ = {"float64": np.float64, "float32": np.float32, "float16": np.float16,
             "bfloat16": ml_dtypes.bfloat16}
RTOL = {"float64": 1e-12, "float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}
OPS = ("softmax", "sdpa", "multi_head_attention", "sdpa_varlen", "sdpa_paged")


def rng(seed):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- the cases
def softmax_cases():
    r = rng(0)
    x = r.normal(size=(3, 4, 5))
    sq = r.normal(size=(2, 4, 4))
    neg = x.copy()
    neg[0, 0, 1] = neg[1, 2, :2] = -np.inf
    dead = x.copy()
    dead[2, 1, :] = -np.inf
    return {
        "basic": dict(x=x),
        "axis0": dict(x=x, axis=0),
        "axis1": dict(x=x, axis=1),
        "square": dict(x=sq),
        "1d": dict(x=x[0, 0]),
        "neg-inf": dict(x=neg),
        "all-neg-inf-row": dict(x=dead),
        "large-positive": dict(x=x * 1e3),
        "large-negative": dict(x=x * 1e3 - 5e3),
    }


def sdpa_cases():
    r = rng(1)
    B, Hq, Hkv, Lq, Lk, Dk, Dv = 2, 4, 2, 3, 5, 4, 6
    q = r.normal(size=(B, Hq, Lq, Dk))
    k = r.normal(size=(B, Hkv, Lk, Dk))
    v = r.normal(size=(B, Hkv, Lk, Dv))
    qs, ks, vs = r.normal(size=(B, Hq, 5, Dk)), r.normal(size=(B, Hkv, 5, Dk)), r.normal(size=(B, Hkv, 5, Dv))
    bool2 = r.random((Lq, Lk)) > 0.4
    bool2[:, 0] = True
    kpad = np.ones((B, 1, 1, Lk), bool)
    kpad[0, 0, 0, -2:] = False
    kpad[1, 0, 0, 1] = False
    kpad_sq = np.ones((B, 1, 1, 5), bool)
    kpad_sq[0, 0, 0, 3:] = False
    kpad_sq[1, 0, 0, :1] = False
    bq = r.random((B, 1, Lq, Lk)) > 0.3
    bq[..., 2] = True
    per_head = r.random((1, Hq, Lq, Lk)) > 0.3
    per_head[..., 4] = True
    fmask = r.normal(size=(Lq, Lk))
    fmask[0, 1] = fmask[2, 3] = -np.inf
    fzero = np.where(r.random((B, 1, Lq, Lk)) > 0.5, 0.0, -np.inf)
    fzero[..., 0] = 0.0
    dead = np.ones((B, Hq, Lq, Lk), bool)
    dead[1, 2, 1, :] = False
    dead[0, :, 0, :] = False
    one = np.ones((1, 1, 1, 1), bool)
    c = dict(q=q, k=k, v=v)
    csq = dict(q=qs, k=ks, v=vs)
    return {
        "basic": c,
        "self-square": csq,
        "scale-explicit": dict(c, scale=0.37),
        "scale-zero": dict(c, scale=0.0),
        "scale-negative": dict(c, scale=-1.5),
        "mask-bool-2d": dict(c, mask=bool2),
        "mask-key-padding": dict(c, mask=kpad),
        "mask-key-padding-square": dict(csq, mask=kpad_sq),
        "mask-bool-b1lqlk": dict(c, mask=bq),
        "mask-per-head": dict(c, mask=per_head),
        "mask-float": dict(c, mask=fmask),
        "mask-float-0-neginf": dict(c, mask=fzero),
        "mask-float-large-neg": dict(c, mask=np.where(bool2, 0.0, -1e9)),
        "mask-one-element": dict(c, mask=one),
        "causal-square": dict(csq, is_causal=True),
        "causal-lq<lk": dict(c, is_causal=True),
        "causal-lq>lk": dict(q=r.normal(size=(B, Hq, 5, Dk)), k=k[:, :, :3], v=v[:, :, :3], is_causal=True),
        "causal+mask": dict(c, is_causal=True, mask=kpad),
        "fully-masked-rows": dict(c, mask=dead),
        "large-scores": dict(q=q * 40, k=k * 40, v=v),
        "gqa-1-kv-head": dict(q=q, k=k[:, :1], v=v[:, :1]),
    }


def mha_cases():
    r = rng(2)
    B, Lq, Lk, E, Ekv, H, Dk, Dv = 2, 3, 4, 5, 7, 6, 4, 3
    p = dict(w_q=r.normal(size=(E, H * Dk)), w_k=r.normal(size=(Ekv, H * Dk)),
             w_v=r.normal(size=(Ekv, H * Dv)), w_o=r.normal(size=(H * Dv, E)),
             b_q=r.normal(size=H * Dk), b_k=r.normal(size=H * Dk),
             b_v=r.normal(size=H * Dv), b_o=r.normal(size=E))
    E2, H2, D2 = 8, 2, 4
    p2 = dict(w_q=r.normal(size=(E2, H2 * D2)), w_k=r.normal(size=(E2, H2 * D2)),
              w_v=r.normal(size=(E2, H2 * D2)), w_o=r.normal(size=(H2 * D2, E2)))
    x = r.normal(size=(B, 4, E2))
    kpad = np.ones((B, 1, 1, Lk), bool)
    kpad[1, 0, 0, -1] = False
    return {
        "self-e8-h2": dict(query=x, key=x, value=x, params=p2, num_heads=H2),
        "self-e8-h2-causal": dict(query=x, key=x, value=x, params=p2, num_heads=H2, is_causal=True),
        "cross-head-width-free": dict(query=r.normal(size=(B, Lq, E)), key=r.normal(size=(B, Lk, Ekv)),
                                      value=r.normal(size=(B, Lk, Ekv)), params=p, num_heads=H),
        "cross-mask": dict(query=r.normal(size=(B, Lq, E)), key=r.normal(size=(B, Lk, Ekv)),
                           value=r.normal(size=(B, Lk, Ekv)), params=p, num_heads=H, mask=kpad),
    }


def varlen_cases():
    """Packed batches: an empty query sequence, an empty key sequence, Lq > Lk, seqused_k with garbage keys."""
    r = rng(3)
    Hq, Hkv, Dk, Dv = 4, 2, 3, 2
    cu_q, cu_k = np.array([0, 2, 4, 4, 9], np.int32), np.array([0, 3, 6, 8, 8], np.int32)
    base = dict(q=r.normal(size=(9, Hq, Dk)), k=r.normal(size=(8, Hkv, Dk)), v=r.normal(size=(8, Hkv, Dv)),
                cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=5, max_seqlen_k=3)
    used = dict(base, seqused_k=np.array([1, 3, 2, 0], np.int32))
    used["k"][1:3], used["v"][1:3] = 50.0, 300.0
    return {"plain": base, "causal": dict(base, is_causal=True), "seqused": dict(used, is_causal=True),
            "window-alibi": dict(base, is_causal=True, window=(1, 0), alibi_slopes=r.uniform(0.1, 1, size=(4, Hq)))}


def paged_cases():
    """Paged caches: shuffled pages, a page shared by two sequences, a partial last page, garbage past seqused_k."""
    r = rng(4)
    Hq, Hkv, Dk, Dv, bs = 2, 1, 3, 2, 3
    k_cache, v_cache = r.normal(size=(6, bs, Hkv, Dk)) * 30, r.normal(size=(6, bs, Hkv, Dv)) * 100
    table = np.array([[4, 1, 5], [4, 0, 2]], np.int32)  # page 4 shared
    k_cache[[4, 1, 0]], v_cache[[4, 1, 0]] = r.normal(size=(3, bs, Hkv, Dk)), r.normal(size=(3, bs, Hkv, Dv))
    base = dict(q=r.normal(size=(2, Hq, 4, Dk)), k_cache=k_cache, v_cache=v_cache, block_table=table,
                seqused_k=np.array([5, 6], np.int32))
    return {"plain": base, "causal": dict(base, is_causal=True), "sink": dict(base, learnable_sink=r.normal(size=Hq))}


# ------------------------------------------------------------------ oracle
def fully_masked(case):
    q, k = case["q"], case["k"]
    b = ref.build_bias(case.get("mask"), case.get("is_causal", False), q.shape[2], k.shape[2])
    b = np.broadcast_to(b, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
    return np.isneginf(b).all(axis=-1)


def oracle(op, case, policy, alignment="bottom-right"):
    if op in ("sdpa_varlen", "sdpa_paged"):  # rows without keys are 0 in these cases' reference (canonical policy)
        from zoo import correct_varlen_paged_reference as sequences

        keywords = {n: x for n, x in case.items() if n not in ("max_seqlen_q", "max_seqlen_k")}
        run = sequences.varlen if op == "sdpa_varlen" else sequences.paged
        return run(**keywords, alignment=alignment)
    if op == "softmax":
        return ref.softmax(**case)
    if op == "multi_head_attention":
        return ref.multi_head_attention(**case)
    out = ref.sdpa(**case)
    if isinstance(policy, dict) and "bool" in policy:  # per cause: this battery's rows are emptied by their mask
        mask = case.get("mask")
        policy = policy.get("float" if mask is not None and np.asarray(mask).dtype != np.bool_ else "bool", "zeros")
    if policy != "zeros":
        dead = fully_masked(case)
        if policy == "nan":
            out = np.where(dead[..., None], np.nan, out)
        else:
            g = case["q"].shape[1] // case["v"].shape[1]
            mean = np.repeat(case["v"], g, axis=1).mean(axis=2, keepdims=True)
            out = np.where(dead[..., None], mean, out)
    return out


# -------------------------------------------------------------- conversion
def torch_ints(a):
    import torch
    return torch.from_numpy(np.ascontiguousarray(a))


def cast_case(case, dt, array):
    def conv(a):
        if isinstance(a, np.ndarray):
            if a.dtype.kind in "iu":  # offsets, lengths, block tables stay int32
                return torch_ints(a) if array == "torch" else a
            if a.dtype != np.bool_:
                with np.errstate(over="ignore"):  # -1e9 -> -inf in float16
                    a = a.astype(DTYPE_OBJ[dt])
            if array == "torch":
                import torch
                tdt = {"float64": torch.float64, "float32": torch.float32,
                       "float16": torch.float16, "bfloat16": torch.bfloat16}[dt]
                if dt == "bfloat16" and a.dtype != np.bool_:
                    return torch.from_numpy(a.astype(np.float32)).to(tdt)
                return torch.from_numpy(np.ascontiguousarray(a))
        return a
    return {key: ({n: conv(w) for n, w in val.items()} if isinstance(val, dict) else conv(val))
            for key, val in case.items()}


def to_numpy(out):
    if hasattr(out, "detach"):
        import torch
        return str(out.dtype).replace("torch.", ""), out.detach().to(torch.float64).numpy()
    out = np.asarray(out)
    return out.dtype.name, out.astype(np.float64)


def score_magnitude(op, case):
    """max |scaled score|: a 16-bit implementation rounds scores to eps * |s|."""
    if op == "softmax":
        return float(np.abs(np.nan_to_num(case["x"], neginf=0)).max(initial=0))
    if op in ("multi_head_attention", "sdpa_varlen", "sdpa_paged"):
        return 0.0  # the packed and paged cases have unit-scale scores
    q, k = case["q"], case["k"]
    k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    scale = case.get("scale")
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    return float(np.abs(q @ np.swapaxes(k, -1, -2) * scale).max(initial=0))


def compare(got, want, dt, cond=0.0):
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    same_nan = np.array_equal(np.isnan(got), np.isnan(want))
    if not same_nan:
        return "NaN pattern differs"
    g, w = np.nan_to_num(got), np.nan_to_num(want)
    scale = max(1.0, float(np.abs(w).max(initial=0)))
    err = float(np.abs(g - w).max(initial=0)) / scale
    tol = RTOL[dt] * (1.0 + (cond if dt in ("float16", "bfloat16") else 0.0))
    if err > tol:
        return f"max rel err {err:.2e}"
    return None


def run_member(name, mod, verbose=False):
    # The 8-bit dtypes (FP8 members) take descale factors this battery has no case for: tests/test_zoo.py runs them.
    dtypes = [dt for dt in getattr(mod, "DTYPES", ("float32", "float64")) if dt in DTYPE_OBJ]
    array = getattr(mod, "ARRAY", "numpy")
    policy = getattr(mod, "FULLY_MASKED_ROWS", "zeros")
    problems, diffs, n = [], [], 0
    table = {"softmax": softmax_cases(), "sdpa": sdpa_cases(), "multi_head_attention": mha_cases(),
             "sdpa_varlen": varlen_cases(), "sdpa_paged": paged_cases()}
    alignment = getattr(mod, "SEQUENCE_ALIGNMENT", "bottom-right")
    for op in OPS:
        fn = getattr(mod, op, None)
        if fn is None:
            continue
        for cname, case in table[op].items():
            for dt in dtypes:
                n += 1
                # the oracle sees the inputs as rounded to dt, computed in float64
                rounded = cast_case(case, dt, "numpy")
                want = oracle(op, cast_case(rounded, "float64", "numpy"), policy, alignment)
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        got_dt, got = to_numpy(fn(**cast_case(case, dt, array)))
                    cond = score_magnitude(op, cast_case(rounded, "float64", "numpy"))
                    msg = compare(got, want, dt, cond)
                    if msg is None and got_dt != dt:
                        msg = f"dtype {got_dt} != {dt}"
                except NotImplementedError:  # outside what the member runs: unsupported, as in the suite
                    n -= 1
                    continue
                except Exception as e:  # noqa: BLE001
                    msg = f"raised {type(e).__name__}: {str(e)[:60]}"
                if msg:
                    diffs.append(f"{op}/{cname}/{dt}: {msg}")
    is_broken = name.startswith("broken_")
    exp = getattr(mod, "EXPECTED_CLAUSES", frozenset())
    beyond_forward = bool(exp) and all(c.startswith(("grad.", "dropout.")) for c in exp)
    if is_broken and not diffs and not beyond_forward and n:
        # The battery is small plain cases; a bug behind a variant keyword or a kernel-sized shape is out of its reach.
        # tests/test_zoo.py runs every broken member through the suite and asks for its expected clauses.
        print(f"   {name}: not reached by this battery (tests/test_zoo.py judges it)")
    if not is_broken and diffs:
        problems.extend(diffs)
    if verbose or problems:
        print(f"{name}: {n} runs, {len(diffs)} differ")
        for d in (diffs if verbose else problems):
            print("    ", d)
    else:
        first = diffs[0] if diffs else "-"
        print(f"{name:34s} {n:4d} runs {len(diffs):4d} differ   e.g. {first}")
    return problems


def check_metadata(name, mod, clause_ids):
    out = []
    for attr in ("BUG", "SOURCE", "EXPECTED_CLAUSES"):
        if not hasattr(mod, attr):
            out.append(f"missing {attr}")
    exp = getattr(mod, "EXPECTED_CLAUSES", frozenset())
    if not isinstance(exp, frozenset):
        out.append("EXPECTED_CLAUSES is not a frozenset")
    if name.startswith("broken_") and not exp:
        out.append("broken member with empty EXPECTED_CLAUSES")
    if name.startswith("correct_") and (exp or getattr(mod, "BUG", None) != "none"):
        out.append("correct member must have BUG 'none' and empty EXPECTED_CLAUSES")
    unknown = sorted(set(exp) - clause_ids)
    if unknown:
        out.append(f"unknown clause ids {unknown}")
    return out


def main(argv):
    verbose = "-v" in argv
    spec = pathlib.Path(__file__).resolve().parent.parent / "spec" / "clauses.yaml"
    clause_ids = set(re.findall(r"^\s*- id:\s*([\w.-]+)", spec.read_text(), re.M))
    bad = 0
    for name, mod in zoo.members():
        probs = check_metadata(name, mod, clause_ids) + run_member(name, mod, verbose)
        if probs:
            bad += 1
            print(f"!! {name}: " + "; ".join(probs[:5]))
    print(f"\n{len(zoo.member_names())} members, {bad} with problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
