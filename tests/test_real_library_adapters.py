"""The real-library adapters of examples/ (README, "Real libraries"; benchmarks/real_libraries.py runs them).

Read as source, everywhere: each is at most 40 lines, transposes nothing itself (it declares LAYOUT instead), and takes
its KNOWN_DEVIATIONS entries and FULLY_MASKED_ROWS from the ready-made library (implementations/deviations.py) rather
than writing a ``when`` lambda. Loaded, where its library is installed (the ``[examples]`` extra): through the
registry, as ``--list-impls`` does; a missing library skips with its name, as any framework that is not installed.
"""
from __future__ import annotations

import ast
import importlib.util

import pytest

from .test_cli import ROOT, pytest_run

pytestmark = pytest.mark.selfcheck


def _benchmark():
    spec = importlib.util.spec_from_file_location("real_libraries", ROOT / "benchmarks" / "real_libraries.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REAL_LIBRARIES = _benchmark()
ADAPTERS = {name: module for name, _, module in REAL_LIBRARIES.ADAPTERS}
MAX_LINES = 40
TRANSPOSES = {"transpose", "swapaxes", "swapdims", "permute", "moveaxis", "movedim", "rollaxis", "T", "mT", "mH", "H"}
# Hugging Face's attention functions take q, k, v as (B, H, L, D) and return (B, Lq, H, D) (their last line is
# `attn_output.transpose(1, 2).contiguous()`): these adapters declare OUTPUT_LAYOUT "blhd" beside the default LAYOUT.
OUTPUT_IN_ANOTHER_LAYOUT = {"hf_eager_attention", "hf_sdpa_attention"}


def _source(name: str) -> str:
    return (ROOT / "examples" / f"{name}.py").read_text()


def _assigned(tree: ast.Module, target: str):
    return next((node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == target for t in node.targets)), None)


def _takes_heads(tree: ast.Module) -> bool:
    """Whether the adapter exposes an operation on (B, H, L, D) arrays, whose layout it must declare."""
    return any(isinstance(node, ast.FunctionDef) and node.name in ("sdpa", "sdpa_paged", "multi_head_attention")
               for node in tree.body)


def _is_library_attribute(node) -> bool:
    """``deviations.NAME`` or ``deviations.NAME(...)``: taken from implementations/deviations.py."""
    node = node.func if isinstance(node, ast.Call) else node
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "deviations"


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_an_adapter_is_at_most_40_lines(name):
    lines = _source(name).splitlines()
    assert len(lines) <= MAX_LINES, f"examples/{name}.py has {len(lines)} lines (an adapter stays short: at most {MAX_LINES})"


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_an_adapter_transposes_nothing_itself(name):
    tree = ast.parse(_source(name))
    found = [node for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr in TRANSPOSES]
    einsums = [node for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "einsum"]
    assert not einsums, f"examples/{name}.py calls einsum itself"
    where = [f"line {node.lineno}: .{node.attr}" for node in found]
    assert not found, f"examples/{name}.py transposes itself ({', '.join(where)}): declare LAYOUT/OUTPUT_LAYOUT instead"
    if not _takes_heads(tree):
        return  # softmax alone has no layout (liger_softmax_interpret)
    declared = "OUTPUT_LAYOUT" if name in OUTPUT_IN_ANOTHER_LAYOUT else "LAYOUT"
    assert isinstance(_assigned(tree, declared), ast.Constant), f"examples/{name}.py declares no {declared}"


def test_the_static_check_sees_a_transpose():
    tree = ast.parse("def sdpa(q, k, v):\n    return f(q.swapaxes(1, 2), k.mT, v).transpose(1, 2)\n")
    assert {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)} & TRANSPOSES == {
        "swapaxes", "mT", "transpose"}


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_an_adapter_takes_its_deviations_from_the_library(name):
    source = _source(name)
    tree = ast.parse(source)
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.Lambda)], f"examples/{name}.py has a lambda"
    declared = _assigned(tree, "KNOWN_DEVIATIONS")
    if declared is not None:
        assert isinstance(declared, ast.Tuple)
        assert all(_is_library_attribute(entry) for entry in declared.elts), \
            f"examples/{name}.py: every KNOWN_DEVIATIONS entry comes from implementations/deviations.py"
    rows = _assigned(tree, "FULLY_MASKED_ROWS")
    assert rows is None or _is_library_attribute(rows) or isinstance(rows, ast.Constant)
    if declared is not None or rows is not None:
        assert "from attention_conformance.implementations import deviations" in source


@pytest.fixture(scope="module")
def listed() -> str:
    """One `--list-impls` run of every adapter whose library is installed (each imports torch or JAX: one process)."""
    installed = [name for name, module in ADAPTERS.items() if REAL_LIBRARIES._installed(module)]
    if not installed:
        pytest.skip("no library of the [examples] extra is installed")
    done = pytest_run(*[arg for name in installed for arg in ("--impl", f"examples.{name}")], "--list-impls")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_an_installed_adapter_loads_through_the_registry(name, listed):
    if not REAL_LIBRARIES._installed(ADAPTERS[name]):
        pytest.skip(f"{ADAPTERS[name]} is not installed (the [examples] extra installs it)")
    from attention_conformance.conformance.reporting.list_impls import describe_lines
    from attention_conformance.implementations import deviations
    from attention_conformance.implementations.registry import load_implementation

    impl = load_implementation(f"examples.{name}")
    assert describe_lines(impl)[0].split()[0] in listed
    tree = ast.parse(_source(name))
    layout = _assigned(tree, "LAYOUT")
    layout = "bhld" if layout is None else layout.value
    expected = (layout, "blhd") if name in OUTPUT_IN_ANOTHER_LAYOUT else (layout, layout)
    assert (impl.layout, impl.result_layout) == expected
    assert all(entry["when"].__module__ == deviations.__name__ for entry in impl.known_deviations)
    assert f"examples.{name}" in listed and f"known deviations: {len(impl.known_deviations)}" in listed
