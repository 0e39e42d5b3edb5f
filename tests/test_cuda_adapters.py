"""The CUDA-only built-ins' adapters, run on the CPU: what they pass the kernel is the contract's semantics.

The kernels themselves need a GPU, but each adapter's mapping (masks to flex's mask_mod
and score_mod, causal bands, GQA, the scale, Pallas's repeated kv heads and x64-off
tracing) can be exercised here: flex_attention runs eagerly on a CPU, and Pallas
kernels run in interpret mode. A wrong mapping fails here, before any GPU sees it.
"""
from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

from attention_conformance.conformance.reference import oracle, tolerances
from attention_conformance.implementations.builtin import torch_backend, torch_cuda

pytestmark = pytest.mark.selfcheck

rng = np.random.default_rng(20261123)


def make_case(b, hq, hkv, lq, lk, d, dv, mask=None):
    q, k, v = (rng.standard_normal(shape).astype(np.float32)
               for shape in ((b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, dv)))
    m = None
    if mask == "bool":
        m = rng.random((b, 1, lq, lk)) < 0.6
        m[..., 0] = True
    elif mask == "float":
        m = rng.standard_normal((1, hq, lq, lk)).astype(np.float32)
        m[..., 1] = -np.inf
    elif mask == "rank3":
        m = rng.random((hq, lq, lk)) < 0.6
        m[..., 0] = True
    elif mask == "fully-masked":
        m = np.ones((b, hq, lq, lk), bool)
        m[:, :, -1] = False
    return q, k, v, m


def assert_within_float32_allowance(got, q, k, v, mask, is_causal, scale):
    want = oracle.sdpa(q, k, v, mask, is_causal, scale)
    allowed = tolerances.sdpa_allowed(q, k, v, mask, is_causal, scale, "float32")
    assert np.all(np.abs(np.asarray(got, np.float64) - want) <= allowed), float(np.max(np.abs(got - want) - allowed))


@pytest.mark.parametrize("shape, mask, is_causal, scale", [
    ((1, 2, 2, 9, 13, 16, 16), None, False, None),
    ((2, 4, 2, 9, 13, 32, 16), "bool", True, None),  # GQA, Dv != Dk, a key-padding-like mask with the causal band
    ((1, 2, 1, 9, 9, 16, 16), "float", False, -0.3),  # an additive mask with -inf, a negative scale
    ((1, 2, 2, 5, 3, 16, 16), None, True, None),  # causal with Lq > Lk: top-left
    ((2, 2, 2, 6, 7, 16, 16), "rank3", False, 0.0),  # a rank-3 mask, per head; scale 0
    ((1, 2, 2, 5, 5, 16, 16), "fully-masked", False, None),  # a row with no key: zeros
], ids=["plain", "gqa-bool-causal", "float-negative-scale", "causal-lq-gt-lk", "rank3-scale0", "fully-masked"])
def test_flex_adapter_maps_the_contract_onto_mask_mod_and_score_mod(monkeypatch, shape, mask, is_causal, scale):
    torch = pytest.importorskip("torch")
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    from attention_conformance.implementations.builtin.torch_flex import TorchFlexAttention

    monkeypatch.setattr(TorchFlexAttention, "_compiled", flex.flex_attention)  # eager: runs on the CPU
    q, k, v, m = make_case(*shape, mask=mask)
    as_torch = (lambda a: None if a is None else torch.from_numpy(a))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex_attention warns that it runs uncompiled: expected here
        got = TorchFlexAttention.sdpa(as_torch(q), as_torch(k), as_torch(v), as_torch(m), is_causal, scale)
    assert_within_float32_allowance(got.numpy(), q, k, v, m, is_causal, scale)


def _pallas_in_interpret_mode(monkeypatch):
    pytest.importorskip("jax")
    try:
        from jax.experimental.pallas.ops.gpu import attention
    except Exception as exc:  # noqa: BLE001 -- this JAX ships no Pallas GPU ops
        pytest.skip(f"jax.experimental.pallas.ops.gpu.attention is not importable: {exc}")
    monkeypatch.setattr(attention, "mha", functools.partial(attention.mha, interpret=True))


@pytest.mark.parametrize("is_causal, hq, hkv, scale", [(False, 2, 2, None), (True, 4, 2, -0.3)],
                         ids=["plain", "gqa-causal-negative-scale"])
def test_pallas_adapter_repeats_kv_heads_and_traces_causal_without_x64(monkeypatch, is_causal, hq, hkv, scale):
    _pallas_in_interpret_mode(monkeypatch)
    import jax

    from attention_conformance.implementations.builtin.jax_backend import JaxPallasFlashAttention

    q, k, v, _ = make_case(1, hq, hkv, 128, 128, 16, 16)
    # The suite turns x64 on for float64 cases only (README, "JAX and float64"), but a user's process may run with it
    # on: the adapter must cope.
    with jax.enable_x64(True):
        got = JaxPallasFlashAttention.sdpa(q, k, v, is_causal=is_causal, scale=scale)
    assert_within_float32_allowance(np.asarray(got), q, k, v, None, is_causal, scale)



def test_pallas_backward_refusal_of_unequal_block_counts_is_unsupported(monkeypatch):
    """H200, jax 0.11.2: Pallas flash's fused backward raised ValueError ("q_seq_len and kv_seq_len must be divided
    into the same number of blocks") for Lq 128, Lk 384, failing six gradient cases; a refusal is unsupported."""
    _pallas_in_interpret_mode(monkeypatch)
    import jax

    from attention_conformance.implementations.builtin.jax_backend import JaxPallasFlashAttention

    q, k, v, _ = make_case(1, 1, 1, 128, 256, 16, 16)
    with pytest.raises(NotImplementedError, match="same number of blocks"):
        jax.vjp(lambda q, k, v: JaxPallasFlashAttention.sdpa(q, k, v, is_causal=True), q, k, v)
    # The forward alone, at the same lengths, runs (the refusal is the backward's).
    got = JaxPallasFlashAttention.sdpa(q, k, v, is_causal=True)
    assert_within_float32_allowance(np.asarray(got), q, k, v, None, True, None)


def test_pallas_declares_its_causal_lengths_tf32_and_triton_s_shared_memory_refusal():
    """The causal key loop runs to the diagonal of the query block, past the last key where Lq > Lk (on an H200 it
    read garbage there; interpret mode's out-of-bounds reads differ, so only the GPU shows it): outside the declared
    region, never drawn. Its float32 dots are TF32 on a GPU: declared. Triton's shared-memory refusal is declared
    in REFUSALS (a case meeting it is unsupported: tests/test_containment.py)."""
    from attention_conformance.implementations.region import shape_facts
    from attention_conformance.implementations.registry import load_implementation

    impl = load_implementation("builtin:jax_pallas_flash")
    q, k, v, _ = make_case(1, 2, 2, 256, 128, 16, 16)

    def outside(**kwargs):  # the region's verdict (this machine has no cuda device to run it on)
        return impl.region.why_outside({**shape_facts("sdpa", {"q": q, "k": k, "v": v, **kwargs}), "dtype": "float16",
                                        "device": "cuda"})

    assert "causal" in (outside(is_causal=True) or "")
    assert outside() is None
    assert impl.tf32_on("cuda") and not impl.tf32_on("cpu")

    refusal = RuntimeError("RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested 262144, available: "
                           "232448, context: []")
    assert "Shared memory size limit exceeded" in (impl.refusal(refusal) or "")  # REFUSALS: unsupported
    assert impl.refusal(RuntimeError("RESOURCE_EXHAUSTED: out of memory")) is None


def test_flex_on_cuda_leaves_float32_head_dims_above_64_out_and_its_cpu_twin_keeps_them():
    """Compiling flex's float32 kernel at Dk 192 and 256 ran past 120 s on an H200 (two tests failed as hangs, 80
    cases after them failed without a call), and in the next run at Dk 112, Dv 80 past 92 s: outside torch_flex's
    region in float32 only, and only on cuda."""
    from attention_conformance.implementations.registry import load_implementation

    facts = {"op": "sdpa", "B": 1, "Hq": 2, "Hkv": 2, "Lq": 65, "Lk": 65, "Dk": 128, "Dv": 128, "mask_kind": "bool",
             "is_causal": False, "scale": None, "variants": (), "device": "cuda", "dtype": "float32"}
    flex, flex_cpu = load_implementation("builtin:torch_flex"), load_implementation("builtin:torch_flex_cpu")
    assert "float32" in (flex.region.why_outside(facts) or "")
    assert flex.region.why_outside({**facts, "dtype": "bfloat16"}) is None
    assert "float32" in (flex.region.why_outside({**facts, "Dk": 112, "Dv": 80}) or "")
    assert flex.region.why_outside({**facts, "Dk": 64, "Dv": 64}) is None
    assert flex_cpu.region.why_outside({**facts, "device": "cpu"}) is None


def test_flex_compiled_takes_a_new_softcap_without_recompiling_into_an_error(monkeypatch):
    """H200, torch 2.11 (and this CPU, torch 2.13): a softcap the score_mod closed over as a Python float compiled
    once; from the second value on dynamo passed it as an unspecialized scalar and inductor's flex lowering raised
    "unbacked_bindings" (13 cases failed, forward and backward). torch.compile on the CPU lowers the same way
    (inductor's C++ template): three softcaps in a row, each within the float32 allowance of the oracle."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.nn.attention.flex_attention")
    from attention_conformance.implementations.builtin.torch_flex import TorchFlexAttention

    monkeypatch.setattr(TorchFlexAttention, "_compiled", None)  # a fresh torch.compile, given back afterwards
    # The limits TorchFlexAttention._flex raises, put back by dynamo's own patch: monkeypatch's undo deletes a
    # config module's attribute, which torch then reports as not existing to every later flex call in the process.
    limits = {name: getattr(torch._dynamo.config, name) for name in ("recompile_limit", "accumulated_recompile_limit")}
    as_torch = torch.from_numpy
    with torch._dynamo.config.patch(**limits):
        for cap, length in ((30.0, 16), (20.0, 32), (7.0, 48)):
            q, k, v, _ = make_case(1, 2, 2, length, length, 16, 16)
            got = TorchFlexAttention.sdpa(as_torch(q), as_torch(k), as_torch(v), softcap=cap)
            want = oracle.sdpa(q, k, v, None, False, None, softcap=cap)
            allowed = tolerances.sdpa_allowed(q, k, v, None, False, None, "float32", softcap=cap)
            assert np.all(np.abs(got.numpy().astype(np.float64) - want) <= allowed), cap
    assert {name: getattr(torch._dynamo.config, name) for name in limits} == limits


def test_flex_on_the_cpu_traces_nothing_and_leaves_flex_s_switch_as_it_was():
    """torch_flex_cpu calls flex's dense path under flex's debug switch: no dynamo trace for a new structure of its
    mods (13 traces of 0.27-0.54 s, half its CPU, before), the switch restored after the call, the result the
    oracle's."""
    torch = pytest.importorskip("torch")
    flex_module = pytest.importorskip("torch.nn.attention.flex_attention")
    from torch._dynamo.utils import counters

    from attention_conformance.implementations.builtin.torch_flex import TorchFlexAttentionCPU

    before = flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG
    traces = counters["stats"]["unique_graphs"]
    q, k, v, mask = make_case(2, 4, 2, 7, 9, 8, 8, mask="bool")
    as_torch = torch.from_numpy
    for options in ({}, {"is_causal": True, "softcap": 5.0}, {"window": (2, 1), "alibi_slopes": as_torch(
            np.float32([0.5, 0.25, 0.125, 0.0625]))}):
        got = TorchFlexAttentionCPU.sdpa(as_torch(q), as_torch(k), as_torch(v), as_torch(mask), **options)
        options = {name: value.numpy() if hasattr(value, "numpy") else value for name, value in options.items()}
        causal = options.pop("is_causal", False)
        want = oracle.sdpa(q, k, v, mask, causal, None, **options)
        allowed = tolerances.sdpa_allowed(q, k, v, mask, causal, None, "float32", **options)
        assert np.all(np.abs(got.numpy().astype(np.float64) - want) <= allowed)
    assert counters["stats"]["unique_graphs"] == traces
    assert flex_module._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG == before


def test_a_pinned_torch_kernel_refusal_is_unsupported_with_torch_s_own_reason():
    """torch refuses a pinned SDPA kernel with "No available kernel" and says why in UserWarnings (16,251 of them
    in the H200 run): the case is unsupported with the first specific reason, and no warning escapes. On a CPU,
    FLASH_ATTENTION is torch's CPU flash kernel, which refuses Dv != Dk the same way."""
    torch = pytest.importorskip("torch")
    from attention_conformance.implementations.builtin.torch_cuda import TorchFlashAttention

    q, k, v, _ = make_case(1, 2, 2, 5, 7, 16, 8)
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        with pytest.raises(NotImplementedError,
                           match="FLASH_ATTENTION: Flash attention requires q,k,v to have the same last dimension"):
            TorchFlashAttention.sdpa(*(torch.from_numpy(a) for a in (q, k, v)), is_causal=True)
    assert not [w for w in escaped if "attention" in str(w.message).lower()]


def test_the_cudnn_kernel_gets_a_rank_3_mask_as_4_d_and_declares_one_key_out(monkeypatch):
    """On an H200 (torch 2.11) cuDNN refused every rank-3 attn_mask (98 cases: "Please use the following attn mask
    shapes: 2d ... 4d") and every case with one key (694): the adapter hands a rank-3 mask over as its 4-D view, which
    broadcasts the same, and the region leaves Lk 1 out (Lq 1 ran)."""
    torch = pytest.importorskip("torch")
    from attention_conformance.implementations.registry import load_implementation

    handed = {}

    def kernel(q, k, v, mask=None, is_causal=False, scale=None):  # what the pinned backend would be called with
        handed["mask"] = mask
        return q

    monkeypatch.setattr(torch_backend.TorchSDPA, "sdpa", kernel)
    q, k, v, mask = make_case(2, 3, 3, 4, 6, 8, 8, mask="rank3")
    torch_cuda.TorchCuDNNAttention.sdpa(*(torch.from_numpy(a) for a in (q, k, v, mask)))
    assert tuple(handed["mask"].shape) == (1, 3, 4, 6) and np.array_equal(handed["mask"][0].numpy(), mask)
    assert np.array_equal(oracle.sdpa(q, k, v, mask), oracle.sdpa(q, k, v, mask[None]))
    torch_cuda.TorchCuDNNAttention.sdpa(*(torch.from_numpy(a) for a in (q, k, v, mask[0])))  # 2-D: as given
    assert tuple(handed["mask"].shape) == (4, 6)

    region = load_implementation("builtin:torch_sdpa_cudnn").region
    facts = {"op": "sdpa", "B": 1, "Hq": 2, "Hkv": 2, "Lq": 1, "Lk": 7, "Dk": 64, "Dv": 64, "mask_kind": "none",
             "is_causal": False, "scale": None, "variants": (), "device": "cuda", "dtype": "float16"}
    assert region.why_outside(facts) is None
    assert "Lk 1" in (region.why_outside({**facts, "Lq": 7, "Lk": 1}) or "")


def test_jax_dpa_declares_xla_gpu_s_float16_refusal_of_one_key_on_cuda_only():
    """XLA:GPU refused jax_dpa's float16 dot in all 131 float16 cases with Lk 1 on an H200 (jax 0.11.2), and ran
    none: outside its region there, in float16 on cuda only (the CPU declares float32 alone)."""
    from attention_conformance.implementations.registry import load_implementation

    region = load_implementation("builtin:jax_dpa").region
    facts = {"op": "sdpa", "B": 1, "Hq": 2, "Hkv": 2, "Lq": 3, "Lk": 1, "Dk": 64, "Dv": 64, "mask_kind": "none",
             "is_causal": False, "scale": None, "variants": (), "device": "cuda", "dtype": "float16"}
    assert "Lk 1" in (region.why_outside(facts) or "")
    assert region.why_outside({**facts, "Lk": 2}) is None
    assert region.why_outside({**facts, "dtype": "bfloat16"}) is None
    assert region.why_outside({**facts, "device": "cpu", "dtype": "float32"}) is None


def test_the_memory_efficient_kernel_declares_its_16_byte_head_dims():
    """torch refused 12,538 of torch_sdpa_efficient's cases on an H200 for head dims not a multiple of 16 bytes (4
    in float32, 8 in 16 bits, Dk or Dv): declared, so that the suite draws cases it runs instead."""
    from attention_conformance.implementations.registry import load_implementation

    region = load_implementation("builtin:torch_sdpa_efficient").region
    facts = {"op": "sdpa", "B": 1, "Hq": 2, "Hkv": 2, "Lq": 5, "Lk": 7, "mask_kind": "none", "is_causal": False,
             "scale": None, "variants": (), "device": "cuda"}
    assert region.why_outside({**facts, "dtype": "float32", "Dk": 4, "Dv": 12}) is None
    assert region.why_outside({**facts, "dtype": "float32", "Dk": 4, "Dv": 5})
    assert region.why_outside({**facts, "dtype": "float16", "Dk": 4, "Dv": 8})
    assert region.why_outside({**facts, "dtype": "bfloat16", "Dk": 16, "Dv": 8}) is None


def test_the_flash_kernel_declares_causal_for_equal_lengths_only():
    """torch 2.11 refuses is_causal with Lq != Lk in its flash kernel ("Flash attention does not support the is_causal
    flag when seqlen_q != seqlen_k", 74 shapes on an H200): declared, so causal cases are drawn with Lq == Lk."""
    from attention_conformance.implementations.registry import load_implementation

    region = load_implementation("builtin:torch_sdpa_flash").region
    facts = {"op": "sdpa", "B": 1, "Hq": 2, "Hkv": 2, "Dk": 64, "Dv": 64, "mask_kind": "none", "scale": None,
             "variants": (), "device": "cuda", "dtype": "float16"}
    assert region.why_outside({**facts, "Lq": 64, "Lk": 128, "is_causal": True})
    assert region.why_outside({**facts, "Lq": 128, "Lk": 128, "is_causal": True}) is None
    assert region.why_outside({**facts, "Lq": 64, "Lk": 128, "is_causal": False}) is None


def test_the_sink_factor_keeps_its_gradient_where_the_sink_weight_is_tiny():
    """torch_flex rescales flex's output by Z / (Z + e^sigma) for a learnable sink. As sigmoid(lse - sigma) its
    float32 backward was 0 once the sink's weight fell below 2^-24 (H200: dsink 0 against -2.6e-16, allowed 7e-20).
    Value and d/dsigma, in float32, against float64 over the whole range, a row without keys included."""
    torch = pytest.importorskip("torch")
    from attention_conformance.implementations.builtin.torch_flex import sink_factor

    x = np.concatenate([np.linspace(-60.0, 60.0, 241), [37.0, -37.0]])  # lse - sigma
    lse = torch.tensor(x, dtype=torch.float32)
    sink = torch.zeros_like(lse, requires_grad=True)
    factor = sink_factor(lse, sink)
    (grad,) = torch.autograd.grad(factor.sum(), sink)
    exact = 1.0 / (1.0 + np.exp(-x.astype(np.float32).astype(np.float64)))  # sigmoid(lse - sigma)
    exact_grad = -exact * (1.0 / (1.0 + np.exp(x.astype(np.float32).astype(np.float64))))  # -f P
    u = np.finfo(np.float32).eps / 2
    assert np.all(np.abs(factor.detach().numpy() - exact) <= 4 * u * exact)
    assert np.all(np.abs(grad.numpy() - exact_grad) <= 8 * u * np.abs(exact_grad)), grad.numpy()[x == 37.0]
    no_keys = torch.zeros(1, requires_grad=True)
    empty = sink_factor(torch.tensor([-np.inf]), no_keys)
    (empty_grad,) = torch.autograd.grad(empty.sum(), no_keys)
    assert float(empty.detach()) == 0.0 and float(empty_grad) == 0.0


def test_flex_on_cuda_leaves_head_dims_above_128_out_in_every_dtype():
    """H100, torch 2.11+cu130, 16 workers (2026-11-27): at Dk 256 in 16 bits the forward's launch failed ("CUDA driver
    error: out of memory" in Triton's static launcher) and two backwards compiled past the 120 s call limit (86 cases
    of their workers failed uncalled); with head dims up to 128, an H200 rerun of every torch_flex test judged 1613
    cases, 0 failed. The CPU twin, which compiles no Triton kernel, keeps them."""
    from attention_conformance.implementations.registry import load_implementation

    facts = {"op": "sdpa", "B": 1, "Hq": 2, "Hkv": 2, "Lq": 65, "Lk": 65, "Dk": 256, "Dv": 256, "mask_kind": "bool",
             "is_causal": True, "scale": None, "variants": (), "device": "cuda", "dtype": "float16"}
    flex = load_implementation("builtin:torch_flex")
    for dtype in ("float16", "bfloat16"):
        assert "head dim" in (flex.region.why_outside({**facts, "dtype": dtype}) or "")
        assert flex.region.why_outside({**facts, "dtype": dtype, "Dk": 128, "Dv": 128}) is None
    assert load_implementation("builtin:torch_flex_cpu").region.why_outside({**facts, "device": "cpu"}) is None
