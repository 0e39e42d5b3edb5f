"""Measure the frameworks' variant semantics and costs the built-ins rely on (implementations/builtin.py).

    python benchmarks/variant_probe.py            # JAX window/length semantics, flex eager vs compiled on CPU

Prints, for jax.nn.dot_product_attention, which keys each query row attends (v = identity, so a row of the
output is the row's attention weights) under local_window_size, is_causal and the sequence-length
arguments; and the time per call of torch's flex_attention eager and under torch.compile on this CPU.
"""
from __future__ import annotations

import time

import numpy as np


def jax_rows(lq: int, lk: int, **kwargs) -> np.ndarray:
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    q = jnp.asarray(0.1 * rng.standard_normal((1, lq, 1, lk)), jnp.float32)
    k = jnp.asarray(0.1 * rng.standard_normal((1, lk, 1, lk)), jnp.float32)
    v = jnp.asarray(np.eye(lk, dtype=np.float32).reshape(1, lk, 1, lk))
    return np.asarray(jax.nn.dot_product_attention(q, k, v, **kwargs))[0, :, 0]


def probe_jax() -> None:
    import jax
    import jax.numpy as jnp

    print(f"jax {jax.__version__}: 1 = the row attends the key")
    for title, lq, lk, kwargs in (
        ("local_window_size=(1, 1), Lq = Lk = 5", 5, 5, {"local_window_size": (1, 1)}),
        ("local_window_size=(2, 0), Lq 3, Lk 6", 3, 6, {"local_window_size": (2, 0)}),
        ("local_window_size=(2, 0) and is_causal, Lq 3, Lk 6", 3, 6, {"local_window_size": (2, 0), "is_causal": True}),
        ("is_causal, Lq 3, Lk 6", 3, 6, {"is_causal": True}),
        ("key_value_seq_lengths=[3], Lq 3, Lk 5", 3, 5, {"key_value_seq_lengths": jnp.array([3], jnp.int32)}),
    ):
        print(title)
        print((jax_rows(lq, lk, **kwargs) > 1e-6).astype(int))
    print("key_value_seq_lengths=[0] (weights of a row with no key):")
    print(np.round(jax_rows(2, 3, key_value_seq_lengths=jnp.array([0], jnp.int32)), 4))
    print("query_seq_lengths=[1] (rows 1, 2 are padding):")
    print(np.round(jax_rows(3, 3, query_seq_lengths=jnp.array([1], jnp.int32)), 4))


def probe_flex(shapes=((2, 4, 2, 5, 7, 8), (1, 2, 1, 33, 65, 16))) -> None:
    import warnings

    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    compiled = torch.compile(flex_attention)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for b, hq, hkv, lq, lk, d in shapes:
        q, k, v = torch.randn(b, hq, lq, d), torch.randn(b, hkv, lk, d), torch.randn(b, hkv, lk, d)

        def call(fn):
            mask = create_block_mask(lambda bi, h, qi, ki: ki <= qi + lk - lq, b, hq, lq, lk, device="cpu")
            return fn(q, k, v, block_mask=mask, score_mod=lambda s, bi, h, qi, ki: 30 * torch.tanh(s / 30),
                      enable_gqa=hq != hkv)

        for name, fn in (("eager", flex_attention), ("compiled", compiled)):
            start = time.perf_counter()
            call(fn)
            first = time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(5):
                call(fn)
            print(f"  {name:8s} {(b, hq, hkv, lq, lk, d)}: first call {first:.2f} s, then {(time.perf_counter() - start) / 5 * 1e3:.1f} ms")


if __name__ == "__main__":
    probe_jax()
    probe_flex()
