"""`--list-impls` (conformance/list_impls.py): everything the suite reads from an implementation, per implementation."""
from __future__ import annotations

import textwrap

import pytest

from attention_conformance.conformance.reporting.list_impls import describe_lines
from attention_conformance.implementations.contract import VARIANT_DEFAULTS
from attention_conformance.implementations.registry import from_object

from .test_cli import pytest_run

pytestmark = pytest.mark.selfcheck


class Declares:
    NAME = "declares_everything"
    DTYPES = {"cpu": ("float32",), "cuda": ("float16", "bfloat16")}
    DEVICES = ("cpu",)
    COMPILED = True
    FLOAT32_MATMUL = {"cuda": "tf32"}
    REFUSALS = ("out of resource",)
    SUPPORTS = {"equal_lengths": True, "causal": "lq<=lk", "scale": "positive", "masks": ["none", "bool"],
                "variants": ["window", "key_lengths"]}
    KNOWN_DEVIATIONS = [
        {"clause": ("sdpa.finite", "sdpa.definition"), "when": lambda facts: False, "reason": "NaN rows"},
        {"clause": "sdpa.finite", "when": lambda facts: False, "reason": "another"},
    ]

    @staticmethod
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None, *, window=None, softcap=None, key_lengths=None):
        return q

    @staticmethod
    def softmax(x, axis=-1):
        return x


def _listed(obj) -> list[str]:
    return [line.strip() for line in describe_lines(from_object(obj, "x", "mod:X"))]


def test_the_listing_names_keywords_region_and_declarations():
    lines = _listed(Declares)
    assert lines[0].split() == ["declares_everything", "mod:X"]
    assert "dtypes=cpu: float32; cuda: float16,bfloat16" in lines[1]
    sdpa = next(line for line in lines if line.startswith("sdpa keywords:"))
    # accepted, then the variant keywords of the signature, then the ones it lacks
    assert sdpa.startswith("sdpa keywords: mask, is_causal, scale (not: return_lse, dropout_p); variants: window, softcap, key_lengths")
    assert all(name in sdpa.split("(not: ")[-1] for name in VARIANT_DEFAULTS if name not in ("window", "softcap",
                                                                                            "key_lengths"))
    # SUPPORTS lists key_lengths and window: those are drawn; softcap is accepted but not drawn
    assert "sdpa variants declared in SUPPORTS (the only ones drawn): window, key_lengths" in lines
    assert "softmax keywords: axis" in lines
    region = next(line for line in lines if line.startswith("supports:"))
    for words in ("equal_lengths=True", "causal=lq<=lk", "scale=positive", "masks=['none', 'bool']",
                  "variants=['window', 'key_lengths']"):
        assert words in region, region
    declared = next(line for line in lines if line.startswith("DEVICES="))
    assert declared == "DEVICES=cpu LAYOUT=bhld COMPILED=True GRADIENTS=True FLOAT32_MATMUL=cpu: ieee, cuda: tf32"
    assert lines[-2] == "REFUSALS: 'out of resource' (an error holding one: unsupported)"
    assert lines[-1] == "known deviations: 2 (clauses: sdpa.definition, sdpa.finite)"


def test_an_undeclared_region_and_a_kwargs_signature_are_said_so():
    class Open:
        @staticmethod
        def sdpa(q, k, v, **options):
            return q

    lines = _listed(Open)
    assert "supports: everything (no SUPPORTS, no supports())" in lines
    assert f"sdpa keywords: any (**kwargs); variants: all ({', '.join(VARIANT_DEFAULTS)})" in lines
    assert "DEVICES=any of cpu LAYOUT=bhld" in next(line for line in lines if line.startswith("DEVICES="))
    assert lines[-1] == "known deviations: 0"


def test_list_impls_prints_the_declarations_from_the_command_line(tmp_path):
    (tmp_path / "narrow_kernel.py").write_text(textwrap.dedent('''
        SUPPORTS = {"equal_lengths": True, "variants": []}
        GRADIENTS = False
        def sdpa(q, k, v, is_causal=False, *, query_offset=0):
            return q
    '''))
    done = pytest_run("--impl", "narrow_kernel", "--list-impls", env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sdpa keywords: is_causal (not: mask, scale, return_lse, dropout_p); variants: query_offset (not: " in done.stdout
    assert "sdpa variants declared in SUPPORTS (the only ones drawn): none" in done.stdout
    assert "equal_lengths=True" in done.stdout and "GRADIENTS=False" in done.stdout
    assert "collected" not in done.stdout  # it lists and exits before running anything


def test_a_bare_listing_names_every_builtin_the_tour_leaves_out():
    """The dev profile's bare run leaves the reference built-ins out (conformance/plugin.py, builtin_tour); the
    catalogue --list-impls prints still names them."""
    done = pytest_run("--list-impls")
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(f"builtin:{name}" in done.stdout for name in ("numpy_oracle", "numpy_native", "jax_numpy", "torch_math"))
