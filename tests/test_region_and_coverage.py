"""The declared region (SUPPORTS), TF32 declarations, device names, and the coverage rule."""
from __future__ import annotations

import json
import re
import textwrap
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attention_conformance.conformance.cases import covering
from attention_conformance.conformance.cases.drawing import drawing_inside
from attention_conformance.conformance.cases.limits import KERNEL_SCORE_BUDGET, MASK_KINDS
from attention_conformance.conformance.cases.sdpa import sdpa_cases
from attention_conformance.conformance.reference import oracle, tolerances
from attention_conformance.implementations.region import RegionError, parse_region, shape_facts
from attention_conformance.implementations.registry import ImplementationLoadError, from_object

from .test_cli import pytest_run

pytestmark = pytest.mark.selfcheck

FLASH_LIKE = {"head_dims": {"min": 16, "max": 256, "multiple": 8}, "value_head_dim": "same", "masks": ["none", "bool"],
              "gqa": True, "max_group": 4}


def facts(**shape):
    base = {"op": "sdpa", "mask_kind": "none", "is_causal": False, "B": 1, "Hq": 2, "Hkv": 2, "Lq": 9, "Lk": 9,
            "Dk": 64, "Dv": 64}
    return {**base, **shape}


def test_a_region_says_why_a_case_is_outside():
    region = parse_region(FLASH_LIKE)
    assert region.why_outside(facts()) is None
    assert "head dim Dk 12" in region.why_outside(facts(Dk=12, Dv=12))
    assert "Dv 32 != Dk 64" in region.why_outside(facts(Dv=32))
    assert "float mask" in region.why_outside(facts(mask_kind="float"))
    assert "Hq/Hkv = 8 > declared max_group 4" in region.why_outside(facts(Hq=16, Hkv=2))
    assert region.why_outside({"op": "softmax"}) is None
    assert not region.takes_small_shapes()
    everything = parse_region(None)
    assert everything.why_outside(facts(Dk=1, Dv=3, Lq=1, Lk=1)) is None and everything.takes_small_shapes()


def test_supports_callable_adds_its_own_reason():
    region = parse_region({}, check=lambda f: "decode only" if f["Lq"] != 1 else None)
    assert region.why_outside(facts(Lq=1)) is None
    assert "decode only" in region.why_outside(facts(Lq=3))


@pytest.mark.parametrize("declared, words", [
    ({"head_dim": [64]}, "unknown keys ['head_dim']"),
    ({"head_dims": {"min": 0}}, "min >= 1"),
    ({"head_dims": {"min": 20, "max": 23, "multiple": 8}}, "admits no value"),
    ({"masks": ["boolean"]}, "masks"),
    ({"value_head_dim": "equal"}, "'same' or 'any'"),
    ({"gqa": "yes"}, "True or False"),
])
def test_a_bad_region_is_a_load_error_naming_the_key(declared, words):
    with pytest.raises(RegionError, match=words.replace("[", r"\[").replace("]", r"\]")):
        parse_region(declared)

    class Impl:
        SUPPORTS = declared

        @staticmethod
        def sdpa(q, k, v):
            return q

    with pytest.raises(ImplementationLoadError, match="SUPPORTS"):
        from_object(Impl, "impl", "mod:Impl")


@pytest.mark.parametrize("attribute, value, words", [
    ("DEVICES", ("gpu",), "DEVICES names unknown devices ['gpu']"),
    ("DTYPES", {"gpu": ("float16",)}, "DTYPES names unknown devices ['gpu']"),
    ("FLOAT32_MATMUL", "tf-32", "FLOAT32_MATMUL"),
    ("GRADIENTS", "no", "GRADIENTS must be True or False, got 'no'"),
])
def test_device_names_and_matmul_modes_are_checked_at_load(attribute, value, words):
    impl = type("Impl", (), {attribute: value, "sdpa": staticmethod(lambda q, k, v: q)})
    with pytest.raises(ImplementationLoadError, match=words.replace("[", r"\[").replace("]", r"\]")):
        from_object(impl, "impl", "mod:Impl")


def test_shape_facts_of_mha_are_per_head():
    params = {"w_q": np.zeros((8, 6)), "w_k": np.zeros((5, 6)), "w_v": np.zeros((5, 9)), "w_o": np.zeros((9, 8))}
    got = shape_facts("multi_head_attention", {"query": np.zeros((2, 4, 8)), "key": np.zeros((2, 7, 5)),
                                               "value": np.zeros((2, 7, 5)), "params": params, "num_heads": 3})
    assert (got["Dk"], got["Dv"], got["Lq"], got["Lk"], got["Hq"]) == (2, 3, 4, 7, 3)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=sdpa_cases(mask_kinds=("none", "bool-full", "key-padding", "float")))
def _draw_flash_like(case):
    q, k, v = (case.inputs[name] for name in "qkv")
    found = facts(Dk=q.shape[-1], Dv=v.shape[-1], Lq=q.shape[-2], Lk=k.shape[-2], Hq=q.shape[1], Hkv=k.shape[1],
                  mask_kind=shape_facts("sdpa", case.inputs)["mask_kind"])
    assert parse_region(FLASH_LIKE).why_outside(found) is None, case
    assert q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] <= KERNEL_SCORE_BUDGET


def test_generated_cases_lie_inside_the_region_and_the_score_budget():
    with drawing_inside(parse_region(FLASH_LIKE)):
        _draw_flash_like()


def test_tf32_is_held_to_the_float16_model_never_below_float32():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, 2, 5, 64)), rng.standard_normal((1, 2, 7, 64)), rng.standard_normal((1, 2, 7, 64))
    ieee = tolerances.sdpa_allowed(q, k, v, None, False, None, "float32")
    tf32 = tolerances.sdpa_allowed(q, k, v, None, False, None, "float32", tf32=True)
    half = tolerances.sdpa_allowed(q, k, v, None, False, None, "float16")
    assert (tf32 > 10 * ieee).all()  # 2^-11 against 2^-24: a TF32 path fails the float32 model
    # TF32 rounds float16's unit roundoff on fewer operations: the float16 model (spec/tolerances.yaml, tf32), not the
    # first-order model at 2^-11 that let bfloat16 matmul inputs declared as TF32 pass (tests/test_tf32_declared.py).
    assert np.array_equal(tf32, np.maximum(half, ieee))
    first_order = tolerances._sdpa_terms(oracle.attention(q, k, v), tolerances.unit_roundoff("float16"))
    assert (tf32 < first_order).all()


UNSUPPORTED_EVERYWHERE = textwrap.dedent('''
    def sdpa(q, k, v, mask=None, is_causal=False, scale=None):
        raise NotImplementedError("this build has a kernel for no shape")
''')


def test_an_implementation_judged_on_nothing_fails_the_run(tmp_path):
    (tmp_path / "never_judged.py").write_text(UNSUPPORTED_EVERYWHERE)
    env = {"PYTHONPATH": str(tmp_path)}
    report = tmp_path / "report.json"
    done = pytest_run("conformance/test_properties.py", "--impl", "never_judged", "-k", "default_scale",
                      "--conformance-report", str(report), env=env)
    assert done.returncode == 1, done.stdout[-2000:]
    assert "COVERAGE: never_judged: 0 sdpa case(s) judged" in done.stdout
    written = json.loads(report.read_text())
    assert written["exit_status"] == 1
    assert any(line.startswith("never_judged: 0 sdpa case(s) judged") for line in written["coverage"])
    allowed = pytest_run("conformance/test_properties.py", "--impl", "never_judged", "-k", "default_scale",
                         "--allow-unjudged", env=env)
    assert allowed.returncode == 0 and "COVERAGE:" in allowed.stdout, allowed.stdout[-2000:]


@pytest.mark.parametrize("option, words", [
    (("--device", "cuda"), "--device cuda selects none of the devices it runs on"),
    (("--dtype", "float16"), "no case could run in this run"),
])
def test_a_named_implementation_that_could_run_nothing_fails_the_run(option, words):
    done = pytest_run("conformance/test_properties.py", "--impl", "examples.my_attention", "-k", "default_scale",
                      *option)
    assert done.returncode == 1, done.stdout[-2000:]
    assert words in done.stdout


def test_a_judged_run_passes_the_coverage_rule():
    done = pytest_run("conformance/test_properties.py", "--impl", "examples.my_attention", "-k", "default_scale")
    assert done.returncode == 0 and "COVERAGE" not in done.stdout, done.stdout[-2000:]


def test_operations_deselected_with_k_are_not_expected_judged():
    """numpy_oracle exposes softmax and MHA too; -k keeps only an sdpa property (pytest deselects the rest
    after the plugin's own collection hook: the rule must see the final selection)."""
    done = pytest_run("conformance/test_properties.py", "--impl", "builtin:numpy_oracle", "-k", "default_scale")
    assert done.returncode == 0 and "COVERAGE" not in done.stdout, done.stdout[-2000:]


def test_a_run_for_an_absent_device_is_deselected_and_fails_in_one_line():
    """--device cuda on a machine without a GPU (CUDA hidden here, so the same on a GPU machine): every item is
    for the absent device, deselected and counted in one line; the run judged nothing, so it exits 1, not
    pytest's 5 for "no tests collected", which CI wrappers often let pass."""
    done = pytest_run("conformance/test_properties.py", "-k", "default_scale", "--device", "cuda",
                      env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 1, done.stdout[-2000:]
    lines = done.stdout.splitlines()
    (deselected,) = [line for line in lines if line.startswith("pytest items deselected")]
    assert "cuda is not available on this machine" in deselected and "torch_math" in deselected
    assert "COVERAGE: no case was judged in this run" in done.stdout
    assert "skipped" not in lines[-1] and not any(line.startswith("pytest items skipped") for line in lines)


def test_absent_device_counts_from_workers_are_not_added_twice(monkeypatch):
    """Every xdist worker collects (and deselects) every item: the controller keeps the largest count."""
    from collections import Counter
    from types import SimpleNamespace

    from attention_conformance.conformance.reporting import coverage

    monkeypatch.setattr(coverage, "ABSENT", Counter())
    monkeypatch.setattr(coverage, "COLLECTED", [0])
    monkeypatch.setattr(coverage, "RUNNABLE", set())
    sent = {"conformance_absent": [["cuda", "torch_math", 40], ["cuda", "jax_numpy", 20]], "conformance_collected": 90}
    for _ in range(2):
        coverage.receive(SimpleNamespace(workeroutput=sent))
    assert coverage.absent_lines() == [
        "pytest items deselected (60): cuda is not available on this machine (jax_numpy, torch_math)"]
    assert coverage.COLLECTED == [90]


# ------------------------------------------------------------------ regions a kernel can state
@pytest.mark.parametrize("declared, words", [
    ({"equal_lengths": "yes"}, "SUPPORTS['equal_lengths'] must be True or False, got 'yes'"),
    ({"causal": "lq<lk"}, "SUPPORTS['causal'] must be True, False, 'only' (causal cases only) or one of "
                          "['lq<=lk', 'lq>=lk', 'lq==lk']"),
    ({"scale": "pos"}, "SUPPORTS['scale'] must be one of ['any', 'positive', 'nonnegative'], got 'pos'"),
    ({"variants": "window"}, "SUPPORTS['variants'] must be a list of variant keywords"),
    ({"variants": ["windows"]}, "SUPPORTS['variants'] names unknown variant keywords ['windows']"),
    ({"mha_head_width": "E/H"}, "SUPPORTS['mha_head_width'] must be one of ['any', 'e_over_h'], got 'E/H'"),
])
def test_a_bad_new_region_key_names_implementation_key_and_value(declared, words):
    impl = type("Impl", (), {"SUPPORTS": declared, "sdpa": staticmethod(lambda q, k, v: q)})
    with pytest.raises(ImplementationLoadError) as raised:
        from_object(impl, "impl", "my_kernels:Impl")
    assert str(raised.value).startswith("my_kernels:Impl: ") and words in str(raised.value), raised.value


def test_the_new_region_keys_say_why_a_case_is_outside():
    region = parse_region({"equal_lengths": True, "causal": "lq<=lk", "scale": "positive", "variants": ["window"]})
    assert region.why_outside(facts(Lq=9, Lk=9, is_causal=True, scale=0.5, variants=("window",))) is None
    assert "Lq 9 != Lk 12 (declared equal_lengths: True)" in region.why_outside(facts(Lk=12))
    assert "scale -1.0 (declared scale: 'positive')" in region.why_outside(facts(scale=-1.0))
    assert region.why_outside(facts(scale=None)) is None  # the default scale 1/sqrt(Dk) is positive
    assert "variant keyword(s) softcap (declared variants: window)" in region.why_outside(facts(variants=("softcap",)))
    causal = parse_region({"causal": "lq<=lk"})
    assert causal.why_outside(facts(Lq=3, Lk=9, is_causal=True)) is None
    assert causal.why_outside(facts(Lq=9, Lk=3, is_causal=False)) is None
    assert "declared causal: 'lq<=lk'" in causal.why_outside(facts(Lq=9, Lk=3, is_causal=True))
    assert "scale 0.0" in parse_region({"scale": "positive"}).why_outside(facts(scale=0.0))
    assert parse_region({"scale": "nonnegative"}).why_outside(facts(scale=0.0)) is None
    # shape_facts gives supports(facts) the scale and the variant keywords a case passes
    q = np.zeros((1, 2, 3, 4))
    got = shape_facts("sdpa", {"q": q, "k": q, "v": q, "scale": 0.5, "window": (None, 0), "query_offset": 0})
    assert got["scale"] == 0.5 and got["variants"] == ("window",)


NEW_KEYS = {"equal_lengths": True, "causal": "lq<=lk", "scale": "positive", "masks": ["none", "bool"]}


def _assert_inside(case, region):
    found = shape_facts("sdpa", case.inputs)
    assert region.why_outside(found) is None, (case, region.why_outside(found))


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=sdpa_cases(mask_kinds=("none", "bool-full", "key-padding", "float")))
def _draw_new_keys(case):
    _assert_inside(case, parse_region(NEW_KEYS))


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=sdpa_cases(causal=st.just(True), scale=st.sampled_from([0.0, -1.0, 0.3, 2.0])))
def _draw_causal_lq_ge_lk(case):
    q, k = case.inputs["q"], case.inputs["k"]
    assert q.shape[2] >= k.shape[2] and case.inputs["scale"] >= 0, case


def test_generated_cases_and_corners_lie_inside_the_new_keys():
    with drawing_inside(parse_region(NEW_KEYS)):
        _draw_new_keys()
    with drawing_inside(parse_region({"causal": "lq>=lk", "scale": "nonnegative"})):
        _draw_causal_lq_ge_lk()
    # the covering set: every corner of every mask kind built for these regions lies inside (adjusted, not skipped)
    for declared in (NEW_KEYS, {**NEW_KEYS, "head_dims": {"min": 16, "multiple": 16}, "lengths": {"multiple": 128}},
                     {"causal": "lq==lk"}):
        region = parse_region(declared)
        built = 0
        with drawing_inside(region):
            for hints in covering.covering_hints(region, region.takes_small_shapes()):
                with covering.building(hints):
                    # every mask kind, the one a mask-only corner is about included (it builds only where drawn)
                    case = covering.DeterministicDraw(hints["index"])(
                        sdpa_cases(mask_kinds=MASK_KINDS + ("query-padding",)), "case")
                _assert_inside(case, region)
                built += 1
        assert built == len(covering.CORNERS)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=sdpa_cases(mask_kinds=("none", "bool-full")))
def _draw_supported(case):
    assert case.inputs["k"].shape[2] % 2 == 0 and case.inputs["q"].shape[2] <= 4, case


def test_a_draw_supports_refuses_is_filtered_while_drawing_not_called():
    """supports(facts) is asked while drawing, with the dtype and device of the run, of the derived cases too;
    a refused draw is rejected inside Hypothesis (counted as filtered) and no case outside reaches the test."""
    from attention_conformance.conformance.cases.drawing import DerivedCase

    seen = []

    def supports(found):  # odd key counts, and non-causal cases past 4 queries, are outside
        seen.append(found)
        if found["Lk"] % 2:
            return "odd Lk"
        return "non-causal with Lq > 4" if not found["is_causal"] and found["Lq"] > 4 else None

    region = parse_region({}, check=supports)
    without_causal = DerivedCase("runs the case without is_causal", sets={"is_causal": False})
    with drawing_inside(region, {"dtype": "float32", "device": "cpu"}, (without_causal,)) as drawing:
        _draw_supported()
    assert seen and all(f["dtype"] == "float32" and f["device"] == "cpu" for f in seen)
    reasons = " | ".join(drawing.refused)
    assert "derived case leaves the region: runs the case without is_causal: outside the implementation's " \
           "supports(): non-causal with Lq > 4" in reasons and "odd Lk" in reasons, reasons
    # A derived case that can never lie inside the declared keys is decided at collection (no draw at all).
    shifted = DerivedCase("adds a float mask", sets={"mask_kind": "float"})
    assert shifted.leaves(parse_region({"masks": ["none"]})).startswith("derived case leaves the region: adds a float")
    assert shifted.leaves(region) is None
    # ... and so is one whose mask the signature cannot take (a kernel without a mask parameter that declares no
    # "masks": fla's parallel_attn adapter had 452 examples of test_shift_invariance drawn, each unsupported).
    assert shifted.leaves(region, {"q", "k", "v", "is_causal", "scale"}).endswith(
        "adds a float mask: the signature has no 'mask' parameter")
    assert shifted.leaves(region, {"q", "k", "v", "mask", "is_causal", "scale"}) is None
    assert shifted.leaves(region, None) is None  # **kwargs: any keyword
    assert DerivedCase("runs it causal", sets={"is_causal": True}).leaves(region, {"q", "k", "v"}) is None


# Calls each property makes per example (the stand-ins log every call); batch_and_heads: the case, then each
# batch and head alone.
CALLS_PER_EXAMPLE = {"test_default_scale": 1, "test_causal_top_left": 1, "test_explicit_scale": 1,
                     "test_cross_attention_and_value_dim": 1, "test_shift_invariance": 2, "test_key_permutation": 2,
                     "test_key_lengths_are_a_key_padding_mask": 2}


def _calls_per_example(test: str, label: str) -> int:
    if test == "test_batch_and_heads_independent":
        b, hq = (int(x) for x in re.search(r"B(\d+) Hq(\d+)", label).groups())
        return 1 + b * hq
    return CALLS_PER_EXAMPLE[test]


def test_narrow_regions_lose_no_generated_case_and_no_call(tmp_path):
    """Kernels declaring Lq == Lk, no masks (with causal Lq <= Lk and positive scales), a region only supports()
    knows, key_lengths without query_lengths, and no mask parameter: no generated case is unsupported, every call is of a judged case
    (calls counted per test against the cases judged), and a property whose derived case leaves the region is
    skipped before any call, saying so."""
    log, report = tmp_path / "calls.jsonl", tmp_path / "report.json"
    names = ("EqualLengths", "MasksNone", "EvenKeys", "KeyLengthsOnly", "NoMaskParameter")
    impls = [arg for name in names for arg in ("--impl", f"tests.region_standins:{name}")]
    done = pytest_run("conformance/test_properties.py", "conformance/test_variants.py", *impls, "-rs",
                      "-k", " or ".join([*CALLS_PER_EXAMPLE, "test_batch_and_heads_independent", "test_varlen"]),
                      "--hypothesis-seed", "0", "--conformance-report", str(report),
                      env={"REGION_STANDIN_LOG": str(log)})
    assert done.returncode == 0, done.stdout[-3000:]
    written = json.loads(report.read_text())
    for name, entry in written["summary"].items():
        assert entry["unsupported"] == 0 and entry["judged"] > 0, (name, entry)
    assert not [c for c in written["cases"] if c["status"] != "passed"]
    expected = Counter()
    for case in written["cases"]:
        test = case["test"].split("::")[-1].split("[")[0]
        expected[case["implementation"], test] += _calls_per_example(test, case["case"])
    calls = Counter((c["impl"], c["test"].split("::")[-1].split("[")[0])
                    for c in map(json.loads, log.read_text().splitlines()))
    assert calls == expected  # every call belongs to a judged case: none was discarded
    assert calls["standin_equal_lengths", "test_shift_invariance"] > 0
    assert ("standin_masks_none", "test_shift_invariance") not in calls
    assert ("standin_no_mask_parameter", "test_shift_invariance") not in calls
    skipped = done.stdout.split("short test summary info")[-1]
    assert "derived case leaves the region: adds a float mask to every score: a float mask (declared masks: none)" \
        in skipped
    assert "derived case leaves the region: adds a float mask to every score: the signature has no 'mask' " \
           "parameter" in skipped
    assert "derived case leaves the region: runs each batch and head alone: outside the implementation's " \
           "supports(): one query head (for every draw; nothing was called)" in skipped
    assert "standin_key_lengths_only.sdpa has no 'query_lengths' parameter" in skipped  # test_varlen needs both


def test_mha_head_width_e_over_h_is_said_and_drawn_inside():
    """torch.nn.MultiheadAttention's H*Dk == H*Dv == E: said in SUPPORTS, every generated MHA case lies inside (about
    half were drawn outside and reported unsupported before) and the head-width property does not apply."""
    from attention_conformance.conformance.cases.mha import mha_cases
    from attention_conformance.conformance.test_mha import heads_split_e

    region = parse_region({"mha_head_width": "e_over_h"})
    mha = {"op": "multi_head_attention", "Hq": 2, "Hkv": 2, "Dk": 3, "Dv": 3}
    assert region.why_outside({**mha, "E": 6}) is None
    assert "head widths H*Dk 6, H*Dv 6 with E 7 (declared mha_head_width: 'e_over_h')" in \
        region.why_outside({**mha, "E": 7})
    assert region.why_outside({**mha, "op": "sdpa", "E": 7}) is None  # sdpa has no model width

    drawn = []

    @settings(max_examples=40, database=None, deadline=None)
    @given(case=mha_cases(cross=st.booleans()))
    def draw(case):
        drawn.append(shape_facts("multi_head_attention", case.inputs))

    with drawing_inside(region, {}, (), None):
        draw()
    assert drawn and all(f["Hq"] * f["Dk"] == f["Hq"] * f["Dv"] == f["E"] for f in drawn), drawn
    impl = from_object(type("Mha", (), {"SUPPORTS": {"mha_head_width": "e_over_h"},
                                        "multi_head_attention": staticmethod(lambda *a, **k: None)}), "mha", "mha")
    assert "declares mha_head_width 'e_over_h'" in heads_split_e(impl)


def test_keywords_the_signature_lacks_are_not_drawn():
    """A signature without scale, mask or is_causal gets cases without them (each would only be unsupported: Flax's
    dot_product_attention has no scale, and 1336 of its cases a run were drawn, called and dropped); a property that
    always passes the keyword is outside its reach."""
    drawn = []

    @settings(max_examples=60, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(case=sdpa_cases())
    def draw(case):
        drawn.append(case.inputs)

    with drawing_inside(parse_region(None), {}, (), {"q", "k", "v"}):
        draw()
    assert len(drawn) == 60
    assert not any(i.get("scale") is not None or "mask" in i or i.get("is_causal") for i in drawn), drawn[:3]
    with drawing_inside(parse_region(None), {}, (), {"q", "k", "v", "scale"}):
        draw()
    assert any(i.get("scale") is not None for i in drawn[60:])
