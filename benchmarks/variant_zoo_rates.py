"""How reliably fresh runs reject the variant zoo members (zoo/broken_variant_*.py) and accept the correct one.

The variant keywords reach an implementation only through conformance/test_variants.py and the
variant fixtures (conformance/test_fixtures.py); every other test of the default run passes plain
sdpa cases, which these members compute correctly. So a fresh default run rejects a member exactly
when a fresh run of those two modules does, and this script runs only them (about a fifth of the
time), fresh each time as benchmarks/kernel_standins.py does (no pytest cache, an empty Hypothesis
database, a new random seed):

    ATTENTION_CONFORMANCE_FIXTURES=<a directory holding a copy of fixtures/variants.yaml alone> \
    python -m pytest conformance/test_variants.py conformance/test_fixtures.py -n 0 --impl zoo.<member> -p no:cacheprovider -q

(the other fixtures pass no variant keyword; the ONNX-derived fixtures/onnx_attention_variants.yaml could only
add rejections, so the rates here are a lower bound for the default run's.)

The MHA-variant, variant-gradient, lse, merge, pair, softmax-axis and sequence-parallel members are narrowed to the modules that reach them (NARROWED
below).

Usage: python benchmarks/variant_zoo_rates.py [--runs 20] [--members broken_variant_window_top_left ...] [--full]
(--full runs the whole default command, `python -m pytest conformance`, instead).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kernel_standins  # noqa: E402

import zoo  # noqa: E402

MEMBERS = tuple(n for n in zoo.member_names() if "variant" in n)
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
VARIANTS_YAML = FIXTURES / "variants.yaml"
# The MHA-variant and variant-gradient members are reached elsewhere: MHA's variant keywords only through
# conformance/test_mha.py's variant properties and fixtures/mha_variants.yaml; a variant backward only through
# conformance/test_variant_gradients.py (its forward and plain backward are right, and no fixture takes gradients).
# (member name prefix, test modules, the fixture file that passes its keywords or None)
NARROWED = (
    ("broken_mha_window_dropped", ("conformance/test_mha.py", "conformance/test_fixtures.py"), "mha_variants.yaml"),
    ("broken_mha_alibi_scaled", ("conformance/test_mha.py", "conformance/test_fixtures.py"), "mha_variants.yaml"),
    ("correct_mha_variants", ("conformance/test_mha.py", "conformance/test_fixtures.py"), "mha_variants.yaml"),
    ("broken_backward_softcap", ("conformance/test_variant_gradients.py",), None),
    ("broken_backward_sink", ("conformance/test_variant_gradients.py",), None),
    ("broken_backward_window", ("conformance/test_variant_gradients.py",), None),
    ("correct_torch_variant_backward", ("conformance/test_variant_gradients.py",), None),
    # The lse members differ from their reference only in the lse they return with return_lse (test_lse.py and
    # fixtures/lse.yaml); the merge members only have merge_states (test_merge_states.py).
    ("broken_lse_", ("conformance/test_lse.py", "conformance/test_fixtures.py"), "lse.yaml"),
    ("correct_lse_", ("conformance/test_lse.py", "conformance/test_fixtures.py"), "lse.yaml"),
    ("broken_merge_", ("conformance/test_merge_states.py",), None),
    # The pair twins are reached by the pairwise corners beside the variant properties; the softmax twin by
    # the softmax properties.
    ("broken_pair_", ("conformance/test_pairwise.py", "conformance/test_variants.py", "conformance/test_fixtures.py"),
     "variants_2026.yaml"),
    ("broken_softmax_axis", ("conformance/test_pairwise.py", "conformance/test_properties.py"), None),
    # The sequence-parallel members have sdpa_sequence_parallel alone.
    ("sequence_parallel_", ("conformance/test_sequence_parallel.py",), None),
    ("correct_merge_", ("conformance/test_merge_states.py",), None),
)


def narrowing(member: str) -> tuple[tuple[str, ...], Path | None]:
    """The test modules and the fixture file that reach ``member``'s variant keywords (NARROWED; else the sdpa
    variant modules and fixtures/variants.yaml)."""
    for prefix, modules, fixture in NARROWED:
        if member.startswith(prefix):
            return modules, None if fixture is None else FIXTURES / fixture
    return ("conformance/test_variants.py", "conformance/test_fixtures.py"), VARIANTS_YAML


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--members", nargs="+", default=list(MEMBERS))
    parser.add_argument("--full", action="store_true", help="the whole default run, not the variant modules only")
    parser.add_argument("--exitfirst", action="store_true", help="stop each run at its first failure (kernel_standins)")
    args = parser.parse_args(argv)
    if not args.full:
        original = kernel_standins.subprocess.run

        def narrowed(command, **kwargs):
            at = command.index("conformance")
            member = command[command.index("--impl") + 1].removeprefix("zoo.")
            modules, fixture = narrowing(member)
            command = command[:at] + [*modules, "-n", "0"] + command[at + 1:]
            if "conformance/test_mha.py" in modules:  # it reads the documents' fixtures, which are not copied
                command += ["-k", "not test_mha_shapes_of_the_documents"]
            env = kwargs.pop("env")
            if fixture is not None:  # the variant fixtures only: the others pass no variant keyword
                variant_fixtures = Path(tempfile.mkdtemp(prefix="variant-fixtures-"))
                shutil.copy(fixture, variant_fixtures / fixture.name)
                env = dict(env, ATTENTION_CONFORMANCE_FIXTURES=str(variant_fixtures))
            return original(command, env=env, **kwargs)

        kernel_standins.subprocess.run = narrowed
    return kernel_standins.main(["--runs", str(args.runs), "--members", *args.members]
                                + (["--exitfirst"] if args.exitfirst else []))


if __name__ == "__main__":
    raise SystemExit(main())
