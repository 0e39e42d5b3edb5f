"""Measure what GPU attention paths do (run on a CUDA machine): one line per probe.

Used to decide the CUDA built-ins' declared regions and deviations (README, "GPU").
Each probe prints: path | dtype | case | max abs error vs float64 | non-finite | exception | seconds.
"""
import inspect
import math
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, ".")
from attention_conformance.conformance.reference import oracle

rng = np.random.default_rng(0)
LINES = []


def emit(*cols):
    line = " | ".join(str(c) for c in cols)
    LINES.append(line)
    print(line, flush=True)


def case(b, hq, hkv, lq, lk, d, dv=None, mask=None, causal=False, scale=None):
    dv = d if dv is None else dv
    q = rng.standard_normal((b, hq, lq, d))
    k = rng.standard_normal((b, hkv, lk, d))
    v = rng.standard_normal((b, hkv, lk, dv))
    m = None
    if mask == "keypad":
        m = np.ones((b, 1, 1, lk), bool); m[..., lk // 2:] = False; m[..., 0] = True
    elif mask == "bool-full":
        m = rng.random((b, hq, lq, lk)) < 0.6; m[..., 0] = True
    elif mask == "float":
        m = rng.standard_normal((b, hq, lq, lk)); m[..., 1 % lk] = -np.inf
    elif mask == "fully-masked":
        m = np.ones((b, hq, lq, lk), bool); m[:, :, -1, :] = False
    elif mask == "float-fully-masked":
        m = np.zeros((b, hq, lq, lk)); m[:, :, -1, :] = -np.inf
    elif mask == "shift":
        m = np.full((b, hq, lq, 1), 3.0)
    return q, k, v, m, causal, scale


def probe(path, dtype, label, fn, args, policy="zeros"):
    q, k, v, m, causal, scale = args
    t0 = time.perf_counter()
    try:
        got, rq, rk, rv, rm = fn(q, k, v, m, causal, scale, dtype)
        want = oracle.sdpa(rq, rk, rv, rm, causal, scale, fully_masked_rows_policy=policy)
        got = np.asarray(got, np.float64)
        fin = np.isfinite(want)
        nonfin = int((~np.isfinite(got) & fin).sum())
        err = float(np.max(np.where(fin & np.isfinite(got), np.abs(got - want), 0))) if got.shape == want.shape else "shape" + str(got.shape)
        emit(path, dtype, label, f"{err:.2e}" if isinstance(err, float) else err, nonfin, "", f"{time.perf_counter() - t0:.2f}")
    except Exception as exc:
        emit(path, dtype, label, "-", "-", (type(exc).__name__ + ": " + str(exc).strip().splitlines()[0])[:150],
             f"{time.perf_counter() - t0:.2f}")


def lbl(args):
    q, k, v, m, causal, scale = args
    return f"B{q.shape[0]} H{q.shape[1]}/{k.shape[1]} L{q.shape[2]}x{k.shape[2]} D{q.shape[3]}/{v.shape[3]} mask={'none' if m is None else m.shape} causal={int(causal)} scale={scale}"


# ----------------------------------------------------------------- torch
def torch_probes():
    import torch
    import torch.nn.functional as F
    emit("versions", "torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), "", "")
    tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

    def to(a, dtype):
        t = torch.tensor(a, device="cuda")
        return t if t.dtype == torch.bool else t.to(tdt[dtype])

    def back(t):
        return t.float().cpu().double().numpy() if t.dtype != torch.bool else t.cpu().numpy()

    # efficient kernel and a float mask whose last dim is 1 (the shift-invariance case)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for fix in (False, True):
        def eff(q, k, v, m, causal, scale, dtype, fix=fix):
            tq, tk, tv, tm = to(q, dtype), to(k, dtype), to(v, dtype), to(m, dtype)
            if fix:
                tm = tm.expand(*tm.shape[:-1], tk.shape[-2]).contiguous()
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                out = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm, scale=scale)
            return back(out), back(tq), back(tk), back(tv), back(tm) if not fix else np.broadcast_to(back(tm), tm.shape)
        a = case(1, 1, 1, 1, 2, 4, mask="shift")
        probe(f"torch efficient expand={fix}", "float32", lbl(a), eff, a)

    # flex_attention compiled
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except Exception as exc:
        emit("flex", "-", "import", "-", "-", repr(exc), "")
        return
    emit("flex signature", "", str(inspect.signature(flex_attention))[:300], "", "", "", "")
    compiled = torch.compile(flex_attention, dynamic=False)

    def flex(q, k, v, m, causal, scale, dtype, use_compiled=True):
        tq, tk, tv = to(q, dtype), to(k, dtype), to(v, dtype)
        b, hq, lq, lk = tq.shape[0], tq.shape[1], tq.shape[2], tk.shape[2]
        block_mask = score_mod = None
        tm = None
        if m is not None and m.dtype == bool:
            tm = torch.tensor(np.broadcast_to(m, (b, hq, lq, lk)).copy(), device="cuda")
        if causal or tm is not None:
            def mask_mod(bi, h, qi, ki, tm=tm):
                keep = (ki <= qi) if causal else (qi >= 0)
                return keep & tm[bi, h, qi, ki] if tm is not None else keep
            block_mask = create_block_mask(mask_mod, b, hq, lq, lk, device="cuda")
        if m is not None and m.dtype != bool:
            bias = to(np.broadcast_to(m, (b, hq, lq, lk)).copy(), dtype)
            def score_mod(s, bi, h, qi, ki, bias=bias):
                return s + bias[bi, h, qi, ki]
        fn = compiled if use_compiled else flex_attention
        out = fn(tq, tk, tv, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=hq != tk.shape[1])
        torch.cuda.synchronize()
        return back(out), back(tq), back(tk), back(tv), m

    for dtype in ("float32", "float16", "bfloat16"):
        for args in (
            case(1, 2, 2, 9, 9, 8), case(1, 2, 2, 9, 9, 16), case(1, 2, 2, 9, 9, 24), case(1, 2, 2, 9, 9, 64),
            case(1, 2, 2, 9, 9, 64, dv=32), case(2, 4, 2, 130, 257, 128), case(1, 8, 1, 1, 1000, 128),
            case(1, 2, 2, 9, 9, 64, scale=0.0), case(1, 2, 2, 9, 9, 64, scale=-0.3),
            case(1, 2, 2, 9, 9, 64, causal=True, scale=-0.3), case(1, 2, 2, 9, 9, 64, mask="fully-masked"),
            case(1, 2, 2, 9, 9, 64, mask="float-fully-masked"), case(1, 2, 2, 9, 13, 64, mask="float", causal=True),
            case(1, 2, 2, 5, 3, 64, causal=True), case(1, 2, 2, 9, 9, 256), case(1, 2, 2, 9, 9, 80),
            case(2, 4, 4, 65, 129, 96, mask="keypad"),
        ):
            probe("flex compiled", dtype, lbl(args), flex, args)
    a = case(1, 2, 2, 9, 9, 64)
    probe("flex eager", "float32", lbl(a), lambda *x: flex(*x, use_compiled=False), a)


# ------------------------------------------------------------------- jax
def jax_probes():
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    emit("versions", "jax", jax.__version__, str(jax.devices()), "", "", "")
    jdt = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}
    gpu = jax.devices("gpu")[0]

    def to(a, dtype):
        if a is None:
            return None
        a = np.asarray(a)
        x = jnp.asarray(a) if a.dtype == bool else jnp.asarray(a.astype(np.float32), dtype=jdt[dtype])
        return jax.device_put(x, gpu)

    def back(x):
        return None if x is None else (np.asarray(x) if x.dtype == jnp.bool_ else np.asarray(x.astype(jnp.float32), np.float64))

    sw = lambda t: jnp.swapaxes(t, 1, 2)

    def dpa(q, k, v, m, causal, scale, dtype, implementation=None, precision=None, jit=True, scale_traced=False,
            full_mask=False):
        tq, tk, tv, tm = to(q, dtype), to(k, dtype), to(v, dtype), to(m, dtype)
        if tm is not None and full_mask:
            tm = jnp.broadcast_to(tm, tm.shape[:-2] + (tq.shape[2], tk.shape[2]))
        kw = dict(is_causal=causal, implementation=implementation)

        def body(tq, tk, tv, tm, s):
            extra = {}
            if tm is not None:
                extra["mask" if tm.dtype == jnp.bool_ else "bias"] = tm
            return sw(jax.nn.dot_product_attention(sw(tq), sw(tk), sw(tv), scale=s, **extra, **kw))
        s = scale
        if scale_traced and scale is not None:
            s = jnp.asarray(scale, jdt[dtype])
        f = jax.jit(body) if jit else body
        if precision:
            with jax.default_matmul_precision(precision):
                out = f(tq, tk, tv, tm, s)
        else:
            out = f(tq, tk, tv, tm, s)
        return back(out), back(tq), back(tk), back(tv), back(tm)

    # float16 "Unsupported dot precision algorithm: 4": which shapes, which calls
    for d in (1, 4, 8, 16, 64):
        for traced in (False, True):
            a = case(1, 1, 1, 1, 1, d, scale=0.5)
            probe(f"jax xla traced={traced}", "float16", lbl(a), lambda *x, t=traced: dpa(*x, scale_traced=t), a)
    a = case(1, 1, 1, 3, 5, 4)
    probe("jax xla highest", "float16", lbl(a), lambda *x: dpa(*x, precision="highest"), a)
    probe("jax xla default", "float16", lbl(a), lambda *x: dpa(*x, precision="default"), a)
    probe("jax xla nojit", "float16", lbl(a), lambda *x: dpa(*x, jit=False), a)
    from attention_conformance.implementations.builtin.jax_backend import JaxDotProductAttention
    from attention_conformance.implementations.builtin.jax_numpy import JaxNumpy
    for cls in (JaxDotProductAttention, JaxNumpy):
        for d in (1, 4, 64):
            for dtype in ("float32", "float16", "bfloat16"):
                a = case(1, 2, 1, 3, 5, d, scale=0.5)
                probe(f"builtin {cls.NAME}", dtype, lbl(a),
                      lambda q, k, v, m, c, s, dt, cls=cls: (back(cls.sdpa(to(q, dt), to(k, dt), to(v, dt), None, c, s)),
                                                             back(to(q, dt)), back(to(k, dt)), back(to(v, dt)), None), a)
    # float32 default (TF32?) vs highest precision
    a = case(1, 2, 2, 64, 64, 64)
    for prec in (None, "highest", "high"):
        probe(f"jax xla precision={prec}", "float32", lbl(a), lambda *x, p=prec: dpa(*x, precision=p), a)
    # cudnn
    for dtype in ("float32", "float16", "bfloat16"):
        for args in (
            case(1, 2, 2, 9, 9, 64), case(1, 2, 2, 9, 9, 8), case(1, 2, 2, 9, 9, 16), case(1, 2, 2, 9, 9, 24),
            case(1, 2, 2, 9, 9, 80), case(1, 2, 2, 9, 9, 256), case(1, 2, 2, 9, 9, 64, dv=32),
            case(2, 8, 2, 130, 257, 128), case(1, 8, 1, 1, 1000, 128), case(1, 2, 2, 1, 1, 64),
            case(1, 2, 2, 9, 9, 64, scale=0.0), case(1, 2, 2, 9, 9, 64, scale=-0.3), case(1, 2, 2, 9, 9, 64, scale=0.01),
            case(1, 2, 2, 9, 13, 64, causal=True), case(1, 2, 2, 13, 9, 64, causal=True),
            case(2, 2, 2, 9, 9, 64, mask="keypad"), case(2, 2, 2, 9, 9, 64, mask="bool-full"),
            case(2, 2, 2, 9, 9, 64, mask="float"), case(1, 2, 2, 9, 9, 64, mask="fully-masked"),
            case(1, 2, 2, 9, 9, 64, mask="float-fully-masked"),
        ):
            probe("jax cudnn", dtype, lbl(args), lambda *x: dpa(*x, implementation="cudnn"), args)
            if args[3] is not None and args[3].shape[-2] == 1:
                probe("jax cudnn full-mask", dtype, lbl(args), lambda *x: dpa(*x, implementation="cudnn", full_mask=True), args)
    # pallas
    try:
        from jax.experimental.pallas.ops.gpu import attention as pallas_attention
        emit("pallas mha signature", "", str(inspect.signature(pallas_attention.mha))[:400], "", "", "", "")

        def pallas(q, k, v, m, causal, scale, dtype):
            tq, tk, tv = to(q, dtype), to(k, dtype), to(v, dtype)
            s = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
            out = pallas_attention.mha(sw(tq), sw(tk), sw(tv), None, sm_scale=s, causal=causal)
            return back(sw(out)), back(tq), back(tk), back(tv), None
        for dtype in ("float32", "float16", "bfloat16"):
            for args in (case(1, 2, 2, 128, 128, 64), case(1, 2, 2, 9, 9, 64), case(1, 2, 2, 130, 257, 64),
                         case(1, 2, 2, 128, 128, 64, causal=True), case(1, 2, 2, 128, 128, 64, scale=-0.3),
                         case(1, 2, 2, 128, 128, 16), case(1, 2, 2, 128, 128, 128), case(1, 4, 2, 128, 128, 64),
                         case(1, 2, 2, 256, 128, 64, causal=True)):
                probe("jax pallas", dtype, lbl(args), pallas, args)
    except Exception as exc:
        emit("pallas", "-", "import/call", "-", "-", (type(exc).__name__ + ": " + str(exc))[:200], "")


if __name__ == "__main__":
    which = sys.argv[1:] or ["torch", "jax"]
    for name in which:
        try:
            {"torch": torch_probes, "jax": jax_probes}[name]()
        except Exception:
            traceback.print_exc()
