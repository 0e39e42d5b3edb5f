"""A float32 implementation declared to compute in TF32 is held to the TF32 allowance everywhere it is judged, and to
nothing wider: bfloat16 matmul inputs declared as TF32 are rejected.

The first GPU run to judge jax_dpa with kernel-shaped cases (H200, jax 0.11.2, 2026-11-27) failed it three times where
only the TF32 rounding JAX declares was at work: a fully masked row under its declared 'uniform' policy (the mean of v,
1.6e-5 off, held to the IEEE float32 bound) in test_fully_masked_rows and test_bottom_right_causal_as_mask, and the
printed values of onnx-attention-4d-gqa-scaled (4.9e-5 off, atol 3.4e-6, derived for IEEE float32). The stand-ins of
tests/tf32_standins.py compute as JAX does there; the same three cases failed them before the mend.

The first-order TF32 term then in the model (2 u_in |scale| |q|.|k| per score, linear in the head dim) let a computation
with bfloat16 matmul inputs declared as TF32 (torch's float32_matmul_precision "medium") pass every fixture and property;
a TF32 sdpa is now held to the sixteen_bit model at float16's unit roundoff (spec/tolerances.yaml, tf32). TF32 by
truncation (``DeclaredTruncated``) is correct TF32 too.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from attention_conformance.conformance.specdata import ROOT

pytestmark = pytest.mark.selfcheck


def run_suite(impl: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "ATTENTION_CONFORMANCE_IMPL")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "conformance/test_fixtures.py", "conformance/test_properties.py",
         "conformance/test_mha.py",
         "--impl", impl, "-n", "0", "-v", "-p", "no:cacheprovider", "--hypothesis-profile", "ci"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=environment)


@pytest.mark.parametrize("standin", ["Declared", "DeclaredTruncated"])
def test_a_declared_tf32_computation_passes_fixtures_and_fully_masked_rows(standin):
    done = run_suite(f"tests.tf32_standins:{standin}")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    for test in ("test_fully_masked_rows[", "test_bottom_right_causal_as_mask[", "onnx-attention-4d-gqa-scaled-"):
        assert any(test in line and "PASSED" in line for line in done.stdout.splitlines()), test


def test_the_same_computation_undeclared_is_rejected():
    done = run_suite("tests.tf32_standins:Undeclared")
    assert done.returncode == 1, done.stdout[-4000:]
    assert "[sdpa.definition]" in done.stdout


def test_bfloat16_matmul_inputs_declared_as_tf32_are_rejected():
    done = run_suite("tests.tf32_standins:Bfloat16Inputs")
    assert done.returncode == 1, done.stdout[-4000:]
    failed = [line for line in done.stdout.splitlines() if " FAILED " in line or line.startswith("FAILED")]
    assert len(failed) >= 3, done.stdout[-4000:]  # several properties, not one unlucky draw
