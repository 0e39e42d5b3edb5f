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
VARIANTS_YAML = Path(__file__).resolve().parent.parent / "fixtures" / "variants.yaml"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--members", nargs="+", default=list(MEMBERS))
    parser.add_argument("--full", action="store_true", help="the whole default run, not the variant modules only")
    args = parser.parse_args(argv)
    if not args.full:
        original = kernel_standins.subprocess.run
        variant_fixtures = Path(tempfile.mkdtemp(prefix="variant-fixtures-"))
        shutil.copy(VARIANTS_YAML, variant_fixtures / VARIANTS_YAML.name)

        def narrowed(command, **kwargs):
            at = command.index("conformance")
            command = command[:at] + ["conformance/test_variants.py", "conformance/test_fixtures.py", "-n", "0"] \
                + command[at + 1:]
            # The variant fixtures only (fixtures/variants.yaml): the others pass no variant keyword.
            env = dict(kwargs.pop("env"), ATTENTION_CONFORMANCE_FIXTURES=str(variant_fixtures))
            return original(command, env=env, **kwargs)

        kernel_standins.subprocess.run = narrowed
    return kernel_standins.main(["--runs", str(args.runs), "--members", *args.members])


if __name__ == "__main__":
    raise SystemExit(main())
