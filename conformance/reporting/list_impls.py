"""`pytest --list-impls`: every implementation the run would judge, and everything the suite reads from it.

One block per implementation, its name and spec first. The first lines (array, DTYPES per device,
FULLY_MASKED_ROWS; declared deviations; operations; the region; TF32; the devices present) keep the
order scripts read; then what else decides which cases it gets: the keywords each operation's signature
accepts (a variant keyword it lacks makes those cases unsupported, one SUPPORTS does not list is not
drawn), its declared DEVICES, LAYOUT, COMPILED, GRADIENTS, FLOAT32_MATMUL, any REFUSALS, and the KNOWN_DEVIATIONS count
with the clauses they cover.
"""
from __future__ import annotations

from attention_conformance.implementations.arrays import ARRAY_KINDS, is_eight_bit
from attention_conformance.implementations.contract import (
    DESCALE_DEFAULTS,
    OPERATIONS,
    OPTIONAL_KEYWORDS,
    VARIANT_DEFAULTS,
)
from attention_conformance.implementations.registry import Implementation

EXTRA_KEYWORDS = {"sdpa": ("dropout_p",)}  # keywords a test looks for in the signature (test_dropout.py)


def listing(impls: list[Implementation]) -> str:
    return "\n".join(line for impl in impls for line in describe_lines(impl))


def describe_lines(impl: Implementation) -> list[str]:
    d = impl.describe()
    lines = [f"{d['name']:<16} {d['spec']}"]
    dtypes = d["dtypes"]
    dtypes = ("; ".join(f"{dev}: {','.join(v) or 'none'}" for dev, v in dtypes.items()) if isinstance(dtypes, dict)
              else ",".join(dtypes))
    lines.append(f"    array={d['array']} dtypes={dtypes} fully_masked_rows={d['fully_masked_rows']}")
    lines += [f"    declared deviation of {dev['clause']}: {dev['reason']}" for dev in d["known_deviations"]]
    ops = [op for op, present in d["operations"].items() if present]
    lines.append(f"    operations: {', '.join(ops) or 'none'}")
    if d["supports"] != "everything":
        lines.append(f"    supports: {_region(d['supports'])}")
    tf32 = [dev for dev, mode in d["float32_matmul"].items() if mode == "tf32"]
    if tf32:
        lines.append(f"    float32 matmuls in TF32 on: {', '.join(tf32)}")
    lines.append(f"    skipped: {d['skip_reason']}" if d["skip_reason"] else f"    devices: {', '.join(d['devices']) or 'none'}")
    # What else the suite reads from the object (after the lines above, whose order scripts rely on).
    if d["supports"] == "everything":
        lines.append("    supports: everything (no SUPPORTS, no supports())")
    lines += [f"    {line}" for op in OPERATIONS if impl.implements(op) for line in keyword_lines(impl, op)]
    declared = "any of " + ", ".join(ARRAY_KINDS[impl.array].DEVICES) if impl.declared_devices is None \
        else ", ".join(impl.declared_devices)
    matmul = ", ".join(f"{dev}: {mode}" for dev, mode in d["float32_matmul"].items())
    output = f" OUTPUT_LAYOUT={impl.output_layout}" if impl.output_layout else ""
    lines.append(f"    DEVICES={declared} LAYOUT={impl.layout}{output} COMPILED={impl.compiled} GRADIENTS={impl.gradients} "
                 f"FLOAT32_MATMUL={matmul}")
    if impl.implements("sdpa_varlen") or impl.implements("sdpa_paged"):
        lines.append(f"    SEQUENCE_ALIGNMENT={impl.sequence_alignment} (sdpa_varlen, sdpa_paged)")
    if impl.refusals:
        lines.append(f"    REFUSALS: {', '.join(repr(sign) for sign in impl.refusals)} (an error holding one: unsupported)")
    clauses = sorted({clause for dev in d["known_deviations"] for clause in dev["clause"].split(", ")})
    lines.append(f"    known deviations: {len(d['known_deviations'])}"
                 + (f" (clauses: {', '.join(clauses)})" if clauses else ""))
    return lines


def keyword_lines(impl: Implementation, op: str) -> list[str]:
    """The keywords ``op``'s signature accepts, the variant keywords apart, and the region's variants (sdpa's, and
    those sdpa_varlen and sdpa_paged take per sequence)."""
    accepted = impl.accepted_keywords(op)
    known = [k for k in (*OPTIONAL_KEYWORDS[op], *EXTRA_KEYWORDS.get(op, ()))
             if k not in VARIANT_DEFAULTS and k not in DESCALE_DEFAULTS]
    of_op = [k for k in OPTIONAL_KEYWORDS[op] if k in VARIANT_DEFAULTS]  # the variant keywords this op takes
    if accepted is None:
        line = f"{op} keywords: any (**kwargs)"
        if of_op:
            line += f"; variants: all ({', '.join(of_op)})"
    else:
        line = f"{op} keywords: {', '.join(k for k in known if k in accepted) or 'none'}"
        missing = [k for k in known if k not in accepted]
        if missing:
            line += f" (not: {', '.join(missing)})"
        if of_op:
            variants = [k for k in of_op if k in accepted]
            line += f"; variants: {', '.join(variants) or 'none'}"
            if len(variants) < len(of_op):
                line += f" (not: {', '.join(k for k in of_op if k not in accepted)})"
    lines = [line]
    eight_bit = [d for d in impl.dtypes if is_eight_bit(d)]
    if op == "sdpa" and eight_bit:  # FP8 attention: what its 8-bit cases need
        missing = [k for k in DESCALE_DEFAULTS if accepted is not None and k not in accepted]
        descales = f"missing: {', '.join(missing)} (every 8-bit case unsupported)" if missing \
            else ", ".join(DESCALE_DEFAULTS)
        lines.append(f"8-bit cases ({', '.join(eight_bit)}): descales {descales}; "
                     f"output dtype {impl.fp8_output_dtype} (FP8_OUTPUT_DTYPE)")
    if of_op and impl.region.variants is not None:
        drawn = [k for k in impl.region.variants if k in of_op and (accepted is None or k in accepted)]
        lines.append(f"{op} variants declared in SUPPORTS (the only ones drawn): {', '.join(drawn) or 'none'}")
    return lines


def _region(described: dict) -> str:
    return ", ".join(f"{key}={value}" for key, value in described.items() if key != "supports()" or value)
