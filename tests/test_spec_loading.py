"""spec/ and fixtures/ are validated when the suite starts; a defect names file, entry and field."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from attention_conformance.conformance.cases.fixtures import (
    fixtures,
    load_fixture_file,
    oracle_disagreement,
    run_oracle,
)
from attention_conformance.conformance.reference import oracle
from attention_conformance.conformance.specdata import SpecError, clauses

pytestmark = pytest.mark.selfcheck

GOOD = """
document: 003_58636e0047490b73.txt
title: test
fixtures:
  - id: tiny-softmax
    kind: example
    op: softmax
    clauses: [softmax.definition]
    source: "In [6]"
    inputs:
      x: [[0.0, 0.0]]
    expected: [[0.5, 0.5]]
    tolerance: {atol: 1.0e-12, reason: "exact halves, nothing rounded"}
"""


def _load(tmp_path, text):
    path = tmp_path / "fixture.yaml"
    path.write_text(textwrap.dedent(text))
    return load_fixture_file(path, clauses())


def test_a_valid_fixture_loads(tmp_path):
    (fx,) = _load(tmp_path, GOOD)
    assert fx.id == "tiny-softmax" and fx.expected.shape == (1, 2)


@pytest.mark.parametrize(
    "change, field, words",
    [
        (("op: softmax", "op: attention"), "op", "is not one of"),
        (("clauses: [softmax.definition]", "clauses: [softmax.nonexistent]"), "clauses[0]", "unknown clause"),
        (("    source: \"In [6]\"\n", ""), None, "'source' is a required property"),
        (("expected: [[0.5, 0.5]]", "expected: [[0.5, 0.5, 0.0]]"), "expected", "shape (1, 3) but the inputs give (1, 2)"),
        (("x: [[0.0, 0.0]]", "x: [[0.0, 0.0], [1.0]]"), "inputs.x", "ragged"),
    ],
)
def test_a_defect_names_file_entry_and_field(tmp_path, change, field, words):
    with pytest.raises(SpecError) as raised:
        _load(tmp_path, GOOD.replace(*change))
    message = str(raised.value)
    assert "fixture.yaml" in message and words in message
    if field:
        assert f"field {field!r}" in message and "entry 'tiny-softmax'" in message


def test_malformed_yaml_names_the_line(tmp_path):
    with pytest.raises(SpecError, match=r"fixture.yaml: malformed YAML at line \d+"):
        _load(tmp_path, GOOD + "  - id: [unclosed\n")


def test_contradictory_sdpa_shapes_are_rejected(tmp_path):
    text = GOOD.replace("op: softmax", "op: sdpa").replace(
        "x: [[0.0, 0.0]]", "q: [[[[1.0, 2.0]]]]\n      k: [[[[1.0, 2.0, 3.0]]]]\n      v: [[[[1.0]]]]"
    ).replace("    expected: [[0.5, 0.5]]\n", "").replace("    tolerance: {atol: 1.0e-12, reason: \"exact halves, nothing rounded\"}\n", "")
    with pytest.raises(SpecError, match=r"field 'inputs.k'.*does not fit q"):
        _load(tmp_path, text)


def test_unsafe_yaml_tags_are_refused(tmp_path):
    with pytest.raises(SpecError, match="malformed YAML"):
        _load(tmp_path, GOOD.replace("title: test", "title: !!python/object/apply:os.system ['true']"))


@pytest.mark.parametrize("fx", [f for f in fixtures()], ids=lambda f: f.id)
def test_fixture_agrees_with_the_oracle(fx):
    """Fixture integrity: the oracle reproduces every printed example and avoids every counterexample
    (the check the loader runs on every fixture, every run; here once more, one test per fixture)."""
    assert oracle_disagreement(fx, run_oracle(fx)) is None


def test_a_wrong_expected_value_is_caught_when_the_fixtures_load(tmp_path):
    with pytest.raises(SpecError) as raised:
        _load(tmp_path, GOOD.replace("expected: [[0.5, 0.5]]", "expected: [[0.5, 0.6]]"))
    message = str(raised.value)
    assert "fixture.yaml: entry 'tiny-softmax': field 'expected'" in message
    assert "the oracle does not reproduce the printed values" in message and "index (0, 1)" in message


def test_a_counterexample_the_oracle_gives_is_caught_when_the_fixtures_load(tmp_path):
    text = GOOD.replace("kind: example", "kind: counterexample")
    with pytest.raises(SpecError, match=r"entry 'tiny-softmax': field 'expected': the oracle reproduces this counterexample"):
        _load(tmp_path, text)


def test_every_problem_of_a_file_is_listed(tmp_path):
    second = GOOD.split("fixtures:\n", 1)[1].replace("tiny-softmax", "second").replace(
        "expected: [[0.5, 0.5]]", "expected: [[0.1, 0.9]]")
    third = GOOD.split("fixtures:\n", 1)[1].replace("tiny-softmax", "third").replace("op: softmax", "op: attention")
    fourth = GOOD.split("fixtures:\n", 1)[1].replace("tiny-softmax", "fourth").replace(
        "clauses: [softmax.definition]", "clauses: [softmax.nonexistent]")
    with pytest.raises(SpecError) as raised:
        _load(tmp_path, GOOD + second + third + fourth)
    lines = str(raised.value).splitlines()
    assert lines[0] == "3 problems in spec/ or fixtures/:", lines
    assert any("entry 'second': field 'expected'" in line and "does not reproduce" in line for line in lines)
    assert any("entry 'third': field 'op'" in line for line in lines)
    assert any("entry 'fourth': field 'clauses[0]'" in line and "unknown clause" in line for line in lines)
    assert not any("tiny-softmax" in line for line in lines)  # the good entry has no problem


@pytest.mark.parametrize("text", ["", "# only a comment\n"])
def test_an_empty_fixture_file_says_so(tmp_path, text):
    with pytest.raises(SpecError, match=r"fixture.yaml: file is empty$"):
        _load(tmp_path, text)


def test_problems_of_several_files_are_listed_together(tmp_path):
    (tmp_path / "a.yaml").write_text("")
    (tmp_path / "b.yaml").write_text(textwrap.dedent(GOOD).replace("expected: [[0.5, 0.5]]", "expected: [[0.5, 0.6]]"))
    with pytest.raises(SpecError) as raised:  # (a raising call is not cached)
        fixtures(tmp_path)
    message = str(raised.value)
    assert "a.yaml: file is empty" in message and "b.yaml: entry 'tiny-softmax': field 'expected'" in message


def test_every_clause_is_exercised_somewhere():
    """Each clause is named by a fixture or a property test (no clause is decoration)."""
    import importlib
    import inspect
    import pkgutil

    from attention_conformance import conformance

    named = {c for fx in fixtures() for c in fx.clauses}
    # Every module of the suite's package (tests, cases, judging, ...): a clause id quoted anywhere is exercised.
    modules = [importlib.import_module(info.name)
               for info in pkgutil.walk_packages(conformance.__path__, conformance.__name__ + ".")]
    sources = "".join(inspect.getsource(module) for module in modules)
    unexercised = [cid for cid in clauses() if cid not in named and f'"{cid}"' not in sources]
    assert not unexercised, f"clauses no test names: {unexercised}"


def test_oracle_fully_masked_rows_policies():
    q = np.ones((1, 1, 2, 2))
    v = np.arange(4.0).reshape(1, 1, 2, 2)
    mask = np.array([[True, True], [False, False]])
    assert np.array_equal(oracle.sdpa(q, q, v, mask)[0, 0, 1], [0.0, 0.0])
    assert np.isnan(oracle.sdpa(q, q, v, mask, fully_masked_rows_policy="nan")[0, 0, 1]).all()
    assert np.array_equal(oracle.sdpa(q, q, v, mask, fully_masked_rows_policy="uniform")[0, 0, 1], [1.0, 2.0])
