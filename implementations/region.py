"""The supported region an implementation declares: which sdpa shapes, masks and layouts it can run.

Kernels refuse shapes for reasons of their own (flash: head dims a multiple of 8 up
to 256; cuDNN: Dv == Dk; Pallas: lengths a multiple of its block; the Triton tutorial
kernel: Lq == Lk). An implementation states that once, as ``SUPPORTS`` (a dict, all keys
optional)::

    SUPPORTS = {
        "head_dims": {"min": 16, "max": 256, "multiple": 8},   # Dk (and Dv); or a list [64, 128]
        "value_head_dim": "same",        # "same" (Dv == Dk) or "any" (default)
        "lengths": {"min": 1, "max": 4096, "multiple": 1},      # Lq and Lk
        "equal_lengths": True,           # Lq == Lk only (default False); packed or paged: every sequence's
        "masks": ["none", "bool", "float"],                     # mask kinds it takes (default all)
        "causal": True,                  # accepts is_causal=True (default True); False; "only" (every case
                                         # causal); or causal only with "lq<=lk", "lq>=lk" or "lq==lk"
        "scale": "any",                  # "any" (default), "positive" or "nonnegative" (None, the
                                         # default 1/sqrt(Dk), is positive)
        "gqa": True,                     # Hq a multiple of Hkv > 1 head per kv head (default True)
        "max_group": 8,                  # the largest Hq / Hkv (default: no limit)
        "variants": ["window", "softcap"],  # the variant keywords it runs (default: those its
                                         # signature accepts); [] for none
    }

and/or a method ``supports(facts) -> str | None`` returning why a case is outside
(None: inside); facts are those of ``KNOWN_DEVIATIONS`` but ``fully_masked`` (docs/declarations.md, "Facts":
op, dtype, device, scale, is_causal, mask_kind, B, Hq, Hkv, Lq, Lk, Dk, Dv, variants, variant_values,
query_offset_is_bottom_right).

The suite draws generated cases *inside* the region (conformance/cases/), so an
implementation that cannot run tiny shapes is judged on kernel-shaped ones instead of
being starved; a drawn case that ``supports(facts)`` refuses is filtered out while drawing
(Hypothesis counts it filtered), never called. A case outside it (a fixture, say) is
reported unsupported with the reason, never failed. The region describes sdpa and the
per-head attention inside multi_head_attention; softmax has none.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

MASK_KINDS = ("none", "bool", "float")


KEYS = ("head_dims", "value_head_dim", "lengths", "equal_lengths", "masks", "causal", "scale", "gqa", "max_group",
        "variants", "mha_head_width")


# "mha_head_width": "e_over_h" for multi-head attention whose heads split the model width (H * Dk == H * Dv == E, as
# torch.nn.MultiheadAttention requires); "any" (default) for projections of any width.
MHA_HEAD_WIDTHS = ("any", "e_over_h")


# "causal": a kernel whose causal path assumes one length relation (a flash kernel's query-block loop that
# stops at the diagonal) declares it; the top-left band of the contract is the same for all three.
CAUSAL_RELATIONS = ("lq<=lk", "lq>=lk", "lq==lk")


# "causal": "only" for a kernel that runs causal attention alone (gpt-oss's Triton attention masks every key past the
# query's position, with no flag to turn it off): every case is drawn causal, a non-causal one is outside.
CAUSAL_ONLY = "only"


# "scale": kernels that take log2 of the scale or fold it into exp2 refuse a zero or negative one.
SCALE_SIGNS = ("any", "positive", "nonnegative")


def causal_lengths_ok(relation: str | None, lq: int, lk: int) -> bool:
    """Whether a causal case of lengths (Lq, Lk) meets the declared relation (None: any)."""
    return relation is None or {"lq<=lk": lq <= lk, "lq>=lk": lq >= lk, "lq==lk": lq == lk}[relation]


def scale_ok(sign: str, scale) -> bool:
    """Whether an explicit scale (None: the default 1/sqrt(Dk), positive) has the declared sign."""
    if scale is None or sign == "any":
        return True
    return scale > 0 if sign == "positive" else scale >= 0


def variant_keywords() -> tuple[str, ...]:
    """The variant keywords of sdpa (docs/contract.md): the names a "variants" declaration may list."""
    from attention_conformance.implementations.contract import VARIANT_DEFAULTS

    return tuple(VARIANT_DEFAULTS)


def variant_options(inputs: dict) -> dict:
    """The variant keywords a case's inputs use (a non-default value), by name: the oracle's options and, sorted,
    facts["variants"]."""
    from attention_conformance.implementations.contract import VARIANT_DEFAULTS

    return {name: inputs[name] for name, default in VARIANT_DEFAULTS.items()
            if inputs.get(name) is not None and not (default is not None and _equal(inputs[name], default))}


def variant_values(inputs: dict) -> dict:
    """The values of the variant keywords a case passes (variant_options), as plain Python: facts["variant_values"].

    window a (left, right) tuple of ints or None; softcap a float; query_offset, sink_token_length and
    attention_chunk ints; the arrays (alibi_slopes, learnable_sink, query_lengths, key_lengths, key_leftpad) nested
    tuples of their entries ((Hq,) or (B, Hq) slopes keep their shape)."""
    import numpy as np  # noqa: PLC0415 -- facts of cases only

    def plain(name: str, value):
        if name == "window":
            return tuple(None if edge is None else int(edge) for edge in value)
        if name == "softcap":
            return float(value)
        if name in ("query_offset", "sink_token_length", "attention_chunk"):
            return int(value)
        return _tuples(np.asarray(value).tolist())

    return {name: plain(name, value) for name, value in sorted(variant_options(inputs).items())}


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _equal(value, default) -> bool:
    try:
        return bool(value == default)
    except (TypeError, ValueError):  # an array compared with a scalar default
        return False


class RegionError(ValueError):
    """A SUPPORTS declaration that does not parse; the message names the key."""


@dataclass(frozen=True)
class IntRange:
    """Integers min..max that are a multiple of ``multiple``, or exactly ``values`` when given."""

    min: int = 1
    max: int | None = None
    multiple: int = 1
    values: tuple[int, ...] | None = None

    def contains(self, n: int) -> bool:
        if self.values is not None:
            return n in self.values
        return n >= self.min and (self.max is None or n <= self.max) and n % self.multiple == 0

    def why_not(self, n: int, what: str) -> str | None:
        if self.contains(n):
            return None
        return f"{what} {n} is outside the declared {self.describe()}"

    def describe(self) -> str:
        if self.values is not None:
            return "{" + ", ".join(map(str, self.values)) + "}"
        top = "" if self.max is None else str(self.max)
        step = f" step {self.multiple}" if self.multiple > 1 else ""
        return f"{self.min}..{top}{step}"

    def members(self, candidates) -> list[int]:
        """The candidates inside this range, in their order (duplicates dropped)."""
        seen: list[int] = []
        for n in candidates:
            if self.contains(n) and n not in seen:
                seen.append(n)
        return seen

    @classmethod
    def parse(cls, value, key: str) -> "IntRange":
        if isinstance(value, (list, tuple)):
            if not value or not all(isinstance(v, int) and v > 0 for v in value):
                raise RegionError(f"SUPPORTS[{key!r}] must be a non-empty list of positive ints, got {value!r}")
            return cls(min=min(value), max=max(value), values=tuple(sorted(set(value))))
        if isinstance(value, dict):
            unknown = set(value) - {"min", "max", "multiple"}
            if unknown:
                raise RegionError(f"SUPPORTS[{key!r}] has unknown keys {sorted(unknown)}; allowed: min, max, multiple")
            lo, hi, step = value.get("min", 1), value.get("max"), value.get("multiple", 1)
            if not (isinstance(lo, int) and lo >= 1 and isinstance(step, int) and step >= 1
                    and (hi is None or (isinstance(hi, int) and hi >= lo))):
                raise RegionError(f"SUPPORTS[{key!r}]={value!r}: min >= 1, max >= min (or absent), multiple >= 1")
            lo = -(-lo // step) * step  # the smallest allowed value
            if hi is not None and lo > hi:
                raise RegionError(f"SUPPORTS[{key!r}]={value!r} admits no value")
            return cls(min=lo, max=hi, multiple=step)
        raise RegionError(f"SUPPORTS[{key!r}] must be a list of ints or a dict with min/max/multiple, got {value!r}")


@dataclass(frozen=True)
class Region:
    head_dims: IntRange = field(default_factory=IntRange)
    same_value_dim: bool = False
    lengths: IntRange = field(default_factory=IntRange)
    masks: tuple[str, ...] = MASK_KINDS
    causal: bool = True
    gqa: bool = True
    max_group: int | None = None
    check: Callable[[dict], Any] | None = None  # the implementation's supports(facts)
    equal_lengths: bool = False  # Lq == Lk only
    causal_lengths: str | None = None  # one of CAUSAL_RELATIONS: causal cases only with it
    scale: str = "any"  # one of SCALE_SIGNS
    variants: tuple[str, ...] | None = None  # the variant keywords it runs (None: those its signature accepts)
    mha_head_width_e_over_h: bool = False  # multi_head_attention only with H * Dk == H * Dv == E
    causal_only: bool = False  # is_causal=True only (SUPPORTS["causal"] "only")

    # ------------------------------------------------------------ questions
    @property
    def declared(self) -> bool:
        return self != Region(check=self.check) or self.check is not None

    def why_outside(self, facts: dict, ask_supports: bool = True) -> str | None:
        """Why a case with these facts is outside the region (None: inside). Only the facts present are looked at,
        so a partial set (a derived case's changes, say) asks whether those alone leave the region.
        ``ask_supports``: False leaves the implementation's supports(facts) out (the declared keys only)."""
        if facts.get("op") == "softmax":
            return None
        for name in ("Dk", "Dv"):
            if name in facts:
                reason = self.head_dims.why_not(facts[name], f"head dim {name}")
                if reason:
                    return reason
        if self.same_value_dim and "Dk" in facts and facts.get("Dv", facts["Dk"]) != facts["Dk"]:
            return f"Dv {facts['Dv']} != Dk {facts['Dk']} (declared value_head_dim: same)"
        for name in ("Lq", "Lk"):
            if name in facts:
                reason = self.lengths.why_not(facts[name], f"length {name}")
                if reason:
                    return reason
        if facts.get("mask_kind", "none") not in self.masks:
            return f"a {facts['mask_kind']} mask (declared masks: {', '.join(self.masks)})"
        if self.equal_lengths and "Lq" in facts and "Lk" in facts and facts["Lq"] != facts["Lk"]:
            return f"Lq {facts['Lq']} != Lk {facts['Lk']} (declared equal_lengths: True)"
        if facts.get("equal_sequences") is False:  # packed or paged: each sequence's own lengths
            if self.equal_lengths:
                return "a sequence with Lq_b != Lk_b (declared equal_lengths: True)"
            if facts.get("is_causal") and self.causal_lengths == "lq==lk":
                return "is_causal=True with a sequence of Lq_b != Lk_b (declared causal: 'lq==lk')"
        if facts.get("is_causal") and not self.causal:
            return "is_causal=True (declared causal: False)"
        if self.causal_only and "is_causal" in facts and not facts["is_causal"]:
            return f"is_causal=False (declared causal: {CAUSAL_ONLY!r})"
        if facts.get("is_causal") and "Lq" in facts and "Lk" in facts \
                and not causal_lengths_ok(self.causal_lengths, facts["Lq"], facts["Lk"]):
            return (f"is_causal=True with Lq {facts['Lq']}, Lk {facts['Lk']} "
                    f"(declared causal: {self.causal_lengths!r})")
        if not scale_ok(self.scale, facts.get("scale")):
            return f"scale {facts['scale']!r} (declared scale: {self.scale!r})"
        if self.variants is not None:
            undeclared = [name for name in facts.get("variants", ()) if name not in self.variants]
            if undeclared:
                return (f"variant keyword(s) {', '.join(undeclared)} (declared variants: "
                        f"{', '.join(self.variants) or 'none'})")
        if self.mha_head_width_e_over_h and facts.get("op") == "multi_head_attention" \
                and {"Hq", "Dk", "Dv", "E"} <= set(facts) \
                and not facts["Hq"] * facts["Dk"] == facts["Hq"] * facts["Dv"] == facts["E"]:
            return (f"head widths H*Dk {facts['Hq'] * facts['Dk']}, H*Dv {facts['Hq'] * facts['Dv']} with E {facts['E']} "
                    "(declared mha_head_width: 'e_over_h')")
        if "Hq" in facts and "Hkv" in facts and facts["Hkv"] and facts["Hq"] != facts["Hkv"]:
            group = facts["Hq"] // facts["Hkv"]
            if not self.gqa:
                return f"grouped-query attention Hq/Hkv = {group} (declared gqa: False)"
            if self.max_group is not None and group > self.max_group:
                return f"Hq/Hkv = {group} > declared max_group {self.max_group}"
        if self.check is not None and ask_supports:
            reason = self.check(dict(facts))
            if reason:
                return f"outside the implementation's supports(): {reason}"
        return None

    def takes_small_shapes(self) -> bool:
        """Whether the suite's small generated shapes (head dims and lengths 1..7) are inside."""
        return self.head_dims.contains(1) and self.head_dims.contains(6) and self.lengths.contains(1) \
            and self.lengths.contains(7) and not self.same_value_dim

    def describe(self) -> dict:
        return {
            "head_dims": self.head_dims.describe(),
            "value_head_dim": "same" if self.same_value_dim else "any",
            "lengths": self.lengths.describe(),
            "equal_lengths": self.equal_lengths,
            "masks": list(self.masks),
            "causal": CAUSAL_ONLY if self.causal_only else (self.causal_lengths if self.causal and self.causal_lengths
                                                             else self.causal),
            "scale": self.scale,
            "gqa": self.gqa,
            "max_group": self.max_group,
            "variants": "per signature" if self.variants is None else list(self.variants),
            "mha_head_width": "e_over_h" if self.mha_head_width_e_over_h else "any",
            "supports()": self.check is not None,
        }

    def allows_variant(self, name: str) -> bool:
        """Whether the region lets the suite draw the variant keyword ``name`` (the signature is asked apart)."""
        return self.variants is None or name in self.variants


def parse_region(declared, check=None, where: str = "SUPPORTS") -> Region:
    """Region from the SUPPORTS dict (None: everything) and an optional supports(facts) callable.

    ``where`` names the declaration in errors (the loader passes "<spec>: SUPPORTS")."""
    if declared is None:
        declared = {}
    if not isinstance(declared, dict):
        raise RegionError(f"{where} must be a dict, got {type(declared).__name__}")
    unknown = set(declared) - set(KEYS)
    if unknown:
        raise RegionError(f"{where} has unknown keys {sorted(unknown)}; allowed: {', '.join(KEYS)}")
    kwargs: dict[str, Any] = {}
    if "head_dims" in declared:
        kwargs["head_dims"] = IntRange.parse(declared["head_dims"], "head_dims")
    if "lengths" in declared:
        kwargs["lengths"] = IntRange.parse(declared["lengths"], "lengths")
    if "value_head_dim" in declared:
        if declared["value_head_dim"] not in ("same", "any"):
            raise RegionError(f"{where}['value_head_dim'] must be 'same' or 'any', got {declared['value_head_dim']!r}")
        kwargs["same_value_dim"] = declared["value_head_dim"] == "same"
    if "masks" in declared:
        masks = tuple(declared["masks"])
        bad = [m for m in masks if m not in MASK_KINDS]
        if bad or not masks:
            raise RegionError(f"{where}['masks'] must list some of {list(MASK_KINDS)}, got {list(masks)!r}")
        kwargs["masks"] = tuple(m for m in MASK_KINDS if m in masks)
    for key in ("gqa", "equal_lengths"):
        if key in declared:
            if not isinstance(declared[key], bool):
                raise RegionError(f"{where}[{key!r}] must be True or False, got {declared[key]!r}")
            kwargs[key] = declared[key]
    if "causal" in declared:
        causal = declared["causal"]
        if isinstance(causal, bool):
            kwargs["causal"] = causal
        elif isinstance(causal, str) and causal.replace(" ", "").lower() in CAUSAL_RELATIONS:
            kwargs["causal_lengths"] = causal.replace(" ", "").lower()
        elif isinstance(causal, str) and causal.strip().lower() == CAUSAL_ONLY:
            kwargs["causal_only"] = True
        else:
            raise RegionError(f"{where}['causal'] must be True, False, {CAUSAL_ONLY!r} (causal cases only) or one of "
                              f"{list(CAUSAL_RELATIONS)} (causal only with that length relation), got {causal!r}")
    if "scale" in declared:
        if declared["scale"] not in SCALE_SIGNS:
            raise RegionError(f"{where}['scale'] must be one of {list(SCALE_SIGNS)}, got {declared['scale']!r}")
        kwargs["scale"] = declared["scale"]
    if "variants" in declared:
        names = declared["variants"]
        known = variant_keywords()
        if isinstance(names, str) or not isinstance(names, (list, tuple)):
            raise RegionError(f"{where}['variants'] must be a list of variant keywords (some of {list(known)}), "
                              f"got {names!r}")
        unknown = [n for n in names if n not in known]
        if unknown:
            raise RegionError(f"{where}['variants'] names unknown variant keywords {unknown}; allowed: {list(known)}")
        kwargs["variants"] = tuple(n for n in known if n in names)
    if "mha_head_width" in declared:
        if declared["mha_head_width"] not in MHA_HEAD_WIDTHS:
            raise RegionError(f"{where}['mha_head_width'] must be one of {list(MHA_HEAD_WIDTHS)}, "
                              f"got {declared['mha_head_width']!r}")
        kwargs["mha_head_width_e_over_h"] = declared["mha_head_width"] == "e_over_h"
    if "max_group" in declared:
        if not (isinstance(declared["max_group"], int) and declared["max_group"] >= 1):
            raise RegionError(f"{where}['max_group'] must be an int >= 1, got {declared['max_group']!r}")
        kwargs["max_group"] = declared["max_group"]
    if check is not None and not callable(check):
        raise RegionError("supports must be a callable supports(facts) -> reason or None")
    return Region(check=check, **kwargs)


EVERYTHING = Region()


# The operations whose facts hold "variants" and "variant_values" (sdpa_sequence_parallel's: its own region_facts).
VARIANT_OPS = ("sdpa", "multi_head_attention", "sdpa_varlen", "sdpa_paged")


def shape_facts(op: str, inputs: dict) -> dict:
    """The facts a region looks at, read off a case's inputs (arrays in the contract's layout)."""
    facts: dict[str, Any] = {"op": op}
    mask = inputs.get("mask")
    facts["mask_kind"] = "none" if mask is None else ("bool" if str(getattr(mask, "dtype", "")) == "bool" else "float")
    facts["is_causal"] = bool(inputs.get("is_causal", False))
    if op in ("sdpa", "sdpa_varlen", "sdpa_paged"):
        facts["scale"] = inputs.get("scale")
    if op in VARIANT_OPS:  # mha.variants: the same keywords, per head; packed and paged: per sequence
        values = variant_values(inputs)
        facts["variants"] = tuple(values)  # the names, sorted
        facts["variant_values"] = values
    if op == "sdpa" and "q" in inputs:
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        facts.update(B=q.shape[0], Hq=q.shape[1], Hkv=k.shape[1], Lq=q.shape[-2], Lk=k.shape[-2],
                     Dk=q.shape[-1], Dv=v.shape[-1])
    elif op in ("sdpa_varlen", "sdpa_paged") and "q" in inputs:
        facts.update(sequence_facts(op, inputs))
    elif op == "merge_states" and "out" in inputs:  # P stacked states of (B, Hq, Lq, Dv); lengths are sdpa's
        parts, b, hq, _, dv = inputs["out"].shape
        facts.update(P=parts, B=b, Hq=hq, Dv=dv)
    elif op == "multi_head_attention" and "query" in inputs:
        heads, params = inputs["num_heads"], inputs["params"]
        facts.update(B=inputs["query"].shape[0], Hq=heads, Hkv=heads, Lq=inputs["query"].shape[1],
                     Lk=inputs["key"].shape[1], Dk=params["w_q"].shape[1] // heads, Dv=params["w_v"].shape[1] // heads,
                     E=inputs["query"].shape[-1], E_k=inputs["key"].shape[-1], E_v=inputs["value"].shape[-1],
                     E_out=params["w_o"].shape[1])
    if op in ("sdpa", "multi_head_attention") and "Lq" in facts:
        # FlashAttention's alignment: the last query beside the last key (0 with Lq == Lk and no offset).
        facts["query_offset_is_bottom_right"] = facts["variant_values"].get("query_offset", 0) == \
            facts["Lk"] - facts["Lq"]
    return facts


def sequence_facts(op: str, inputs: dict) -> dict:
    """The shape facts of an sdpa_varlen or sdpa_paged case: B the sequences, Hq, Hkv, Dk, Dv, and Lq, Lk the longest
    sequence's query and key lengths (what a kernel's lengths declaration is about: a packed batch is run sequence
    by sequence); sdpa_paged adds block_size, sdpa_varlen total_q and total_k (the packed rows); equal_sequences:
    whether every sequence has as many queries as keys (equal_lengths is about each sequence)."""
    import numpy as np  # noqa: PLC0415 -- facts of packed batches only

    q, k_name = inputs["q"], "k" if op == "sdpa_varlen" else "k_cache"
    k, v = inputs[k_name], inputs["v" if op == "sdpa_varlen" else "v_cache"]
    if op == "sdpa_varlen":
        starts_q = np.asarray(inputs["cu_seqlens_q"]).astype(np.int64).reshape(-1)
        starts_k = np.asarray(inputs["cu_seqlens_k"]).astype(np.int64).reshape(-1)
        used = np.diff(starts_k) if inputs.get("seqused_k") is None else np.asarray(inputs["seqused_k"]).reshape(-1)
        lengths_q = np.diff(starts_q)
        return dict(B=len(starts_q) - 1, Hq=q.shape[1], Hkv=k.shape[1], Lq=int(lengths_q.max(initial=0)),
                    Lk=int(np.max(used, initial=0)), Dk=q.shape[-1], Dv=v.shape[-1], total_q=q.shape[0],
                    total_k=k.shape[0], equal_sequences=bool(np.array_equal(lengths_q, used)))
    used = np.asarray(inputs["seqused_k"]).reshape(-1)
    return dict(B=q.shape[0], Hq=q.shape[1], Hkv=k.shape[2], Lq=q.shape[2], Lk=int(np.max(used, initial=0)),
                Dk=q.shape[-1], Dv=v.shape[-1], block_size=k.shape[1], equal_sequences=bool((used == q.shape[2]).all()))
