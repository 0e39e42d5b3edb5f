"""The suite checks itself: every broken zoo member is rejected by the clause it breaks,
every correct member passes (operations it lacks are unsupported, not failed)."""
from __future__ import annotations

import pytest

import zoo
from attention_conformance.implementations.registry import load_implementation

from .battery import run_battery

pytestmark = pytest.mark.selfcheck


def kernel_members(kind: str) -> list[str]:
    """The CPU stand-ins for GPU kernels, zoo/kernel_*.py (kernel_correct*, kernel_broken_*): members
    that declare a kernel's SUPPORTS region, so every generated case they meet is kernel-shaped."""
    import pkgutil

    names = sorted(m.name for m in pkgutil.iter_modules(zoo.__path__) if m.name.startswith("kernel_"))
    broken = [n for n in names if n.startswith("kernel_broken_")]
    return broken if kind == "broken" else [n for n in names if n not in broken]


def precision_members() -> list[str]:
    """The 16-bit precision defects, zoo/precision_*.py: kernel stand-ins (kernel_correct's SUPPORTS) that the
    16-bit tolerance (spec/tolerances.yaml, sixteen_bit) must reject; all are broken members."""
    import pkgutil

    return sorted(m.name for m in pkgutil.iter_modules(zoo.__path__) if m.name.startswith("precision_"))


@pytest.mark.parametrize("member", precision_members())
def test_precision_member_declares_what_a_broken_member_declares(member):
    module = zoo.load(member)
    for name in ("BUG", "SOURCE", "EXPECTED_CLAUSES", "DTYPES"):
        assert hasattr(module, name), f"zoo/{member}.py lacks {name}"
    assert module.EXPECTED_CLAUSES and set(module.DTYPES) <= {"float16", "bfloat16"}


@pytest.mark.parametrize("member", zoo.member_names("broken") + kernel_members("broken") + precision_members())
def test_broken_member_is_rejected_by_its_clause(member):
    module = zoo.load(member)
    impl = load_implementation(f"zoo.{member}")
    verdicts = run_battery(impl, dtypes=tuple(impl.dtypes), stop_on=module.EXPECTED_CLAUSES)
    assert not verdicts.errors, f"the suite itself errored: {verdicts.errors[:3]}"
    assert verdicts.failures, f"{member} ({module.BUG}) passed every case: the suite does not catch it"
    assert verdicts.clauses & module.EXPECTED_CLAUSES, (
        f"{member} was rejected, but by {sorted(verdicts.clauses)}, not by its bug's clause "
        f"{sorted(module.EXPECTED_CLAUSES)} ({module.BUG})"
    )


def correct_member_examples() -> int:
    """Examples per property for a correct member: a fifth of the active profile's
    (3 in dev, 5 in ci, 20 in thorough); its fixtures run in full regardless. The built-ins
    run the same properties at the full profile; a third (8 in ci) had cost CI about 25 s more
    (correct_torch 23.6 s against 9.9 s)."""
    from hypothesis import settings

    return max(3, settings.default.max_examples // 5)


@pytest.mark.parametrize("member", zoo.member_names("correct") + kernel_members("correct"))
def test_correct_member_passes(member):
    impl = load_implementation(f"zoo.{member}")
    verdicts = run_battery(impl, dtypes=tuple(impl.dtypes), max_examples=correct_member_examples(), brief=True)
    assert not verdicts.errors, f"the suite itself errored: {verdicts.errors[:3]}"
    assert not verdicts.failures, f"a correct implementation was rejected: {verdicts.failures[:5]}"
    assert verdicts.passed > 0
