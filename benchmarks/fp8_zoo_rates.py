"""How reliably fresh default runs reject the FP8 zoo members (zoo/broken_fp8_*.py) and accept the correct ones
(zoo/correct_fp8_*.py): FP8 attention.

An FP8 member declares only the 8-bit dtypes (DTYPES = float8_e4m3fn, float8_e5m2), so collection gives it the
8-bit items alone (conformance/test_fp8.py and the fixtures of fixtures/fp8.yaml) and no other: the default
command a user would type,

    python -m pytest conformance --impl zoo.<member> -p no:cacheprovider -q

is already that whole run, and this script runs it fresh each time (benchmarks/kernel_standins.py: no pytest
cache, an empty Hypothesis database, a new random seed), printing per member the rejections, the judged cases and
the clauses the rejections named.

Usage: python benchmarks/fp8_zoo_rates.py [--runs 20] [--members broken_fp8_descale_twice ...]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kernel_standins  # noqa: E402

import zoo  # noqa: E402

MEMBERS = tuple(n for n in zoo.member_names() if n.startswith(("broken_fp8_", "correct_fp8_")))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--members" not in argv:
        argv += ["--members", *MEMBERS]
    return kernel_standins.main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
