"""The Implementation wrapper: what the suite knows about one implementation and how it calls it."""
from __future__ import annotations

import importlib
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attention_conformance.implementations import builtin
from attention_conformance.implementations.arrays import (
    ARRAY_KINDS,
    DECLARABLE_DTYPE_NAMES,
    DTYPE_NAMES,
    device_names,
    is_eight_bit,
    numpy_dtype,
)
from attention_conformance.implementations.contract import (
    FLOAT32_MATMUL_MODES,
    FP8_OUTPUT_DTYPES,
    FULLY_MASKED_CAUSES,
    FULLY_MASKED_POLICIES,
    LAYOUT_INPUTS,
    LAYOUT_SHAPES,
    LAYOUTS,
    LSE_CONVENTION_CHOICES,
    LSE_CONVENTION_DEFAULTS,
    MASK_KIND_CAUSES,
    OPERATIONS,
    OPTIONAL_KEYWORDS,
    POSITIONAL,
    SCALAR_POSITIONAL,
    SEQUENCE_ALIGNMENTS,
    VARIANT_DEFAULTS,
    mask_cause,
    missing_keywords_message,
)
from attention_conformance.implementations.region import EVERYTHING, Region, RegionError, parse_region, shape_facts


def _layout_names(op: str) -> tuple[str, ...]:
    """The inputs of ``op`` that LAYOUT orders (and, with OUTPUT_LAYOUT, its output is ordered at all)."""
    return LAYOUT_INPUTS if op == "sdpa" else (("q",) if op == "sdpa_paged" else ())


class ImplementationLoadError(Exception):
    """An --impl that cannot be imported or does not meet the contract; the message is one line."""


@dataclass(repr=False)
class Implementation:
    name: str
    obj: Any
    array: str = "numpy"
    dtypes: tuple[str, ...] = ("float32", "float64")  # every dtype declared on some device
    dtypes_by_device: dict | None = None  # when DTYPES is a dict {device: dtypes}
    declared_devices: tuple[str, ...] | None = None
    fully_masked_rows: Any = "zeros"  # a policy, {cause: policy}, {dtype: policy or {cause: ...}}, callable(facts)
    layout: str = "bhld"  # LAYOUT: the axis order of sdpa's q, k, v and output
    output_layout: str | None = None  # OUTPUT_LAYOUT: the output's, where it differs from LAYOUT's (Hugging Face)
    sequence_alignment: str = "bottom-right"  # SEQUENCE_ALIGNMENT: sdpa_varlen's and sdpa_paged's per-sequence band
    known_deviations: tuple = ()  # ({"clause", "when", "reason"}, ...) declared by the implementation
    spec: str = ""  # how to load it again (module[:attr] or builtin:name), used in repros
    region: Region = EVERYTHING  # SUPPORTS / supports(): what it can run (implementations/region.py)
    float32_matmul: dict = field(default_factory=dict)  # {device: "tf32"} where float32 matmuls run in TF32
    compiled: bool = False  # compiles per input signature (ARRAY="jax", COMPILED=True): fewer examples
    gradients: bool = True  # GRADIENTS=False: a forward-only sdpa, to which the gradient tests do not apply
    fp8_output_dtype: str = "bfloat16"  # FP8_OUTPUT_DTYPE: the output dtype of its 8-bit cases
    refusals: tuple[str, ...] = ()  # REFUSALS: texts of errors by which its compiler refuses a program
    # LSE_CONVENTION: how its log-sum-exp is written ({"base", "empty_row", "sink"}; contract.LSE_CONVENTION_DEFAULTS)
    lse_convention: dict = field(default_factory=lambda: dict(LSE_CONVENTION_DEFAULTS))
    _signatures: dict = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        return f"Implementation({self.spec or self.name!r})"

    def _repr_pretty_(self, printer, cycle) -> None:  # Hypothesis's falsifying-example printer
        printer.text(repr(self))

    # ------------------------------------------------------------------ facts
    def refusal(self, exc: BaseException) -> str | None:
        """The first line of ``exc`` where its text holds one of REFUSALS (a compiler refusing the program, in the
        call or in its gradients): the case is unsupported with that reason, not failed. None otherwise."""
        text = f"{type(exc).__name__}: {exc}"
        if not any(sign in text for sign in self.refusals):
            return None
        return f"{self.name} refused the program ({text.strip().splitlines()[0][:300]})"

    @property
    def skip_reason(self) -> str | None:
        """Why every case is skipped (the framework cannot be imported), or None.

        Asked on first use, not at load: the xdist controller loads every
        implementation but runs no case, and importing torch and JAX there only
        delays the start of the workers (about 5 s on the CI machine).
        """
        return ARRAY_KINDS[self.array].unavailable_reason()

    def operation(self, op: str):
        fn = getattr(self.obj, op, None)
        return fn if callable(fn) else None

    def implements(self, op: str) -> bool:
        return self.operation(op) is not None

    def accepted_keywords(self, op: str) -> set[str] | None:
        """Keyword names the operation accepts; None means anything (``**kwargs`` or no signature)."""
        if op not in self._signatures:
            fn = self.operation(op)
            try:
                params = inspect.signature(fn).parameters.values()
            except (TypeError, ValueError):
                self._signatures[op] = None
            else:
                if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
                    self._signatures[op] = None
                else:
                    self._signatures[op] = {p.name for p in params}
        return self._signatures[op]

    def runs_keyword(self, op: str, name: str) -> bool:
        """Whether the suite may pass keyword ``name`` to ``op``: the signature takes it and, for a variant keyword,
        SUPPORTS["variants"] does not leave it out (what the properties that add a variant where it runs ask)."""
        accepted = self.accepted_keywords(op)
        return (accepted is None or name in accepted) and (name not in VARIANT_DEFAULTS
                                                           or self.region.allows_variant(name))

    def unsupported_reason(self, op: str, kwargs: dict, dtype: str, device: str) -> str | None:
        """Why this implementation cannot run the case (reported as unsupported), or None."""
        if self.skip_reason:
            return self.skip_reason
        if not self.implements(op):
            return f"{self.name} does not implement {op}"
        if dtype not in self.dtypes_on(device):
            return f"{self.name} does not declare dtype {dtype} on {device} (DTYPES={list(self.dtypes_on(device))})"
        if device not in self.devices():
            return f"{self.name} does not run on {device} (devices: {self.devices()})"
        accepted = self.accepted_keywords(op)
        if accepted is not None:
            for key, default in OPTIONAL_KEYWORDS[op].items():
                if key not in accepted and _differs(kwargs.get(key, default), default):
                    return missing_keywords_message(self.name, op, [key])
        outside = self.region.why_outside({**shape_facts(op, kwargs), "dtype": dtype, "device": device})
        if outside:
            return f"outside {self.name}'s declared region: {outside}"
        return None

    def output_dtype(self, dtype: str) -> str:
        """The dtype its result must have in a case of ``dtype``: the input dtype, or FP8_OUTPUT_DTYPE for 8-bit
        inputs (sdpa.fp8-output-dtype)."""
        return self.fp8_output_dtype if is_eight_bit(dtype) else dtype

    def tf32_on(self, device: str) -> bool:
        """Whether float32 matmuls are declared to run in TF32 on ``device`` (FLOAT32_MATMUL)."""
        return self.float32_matmul.get(device) == "tf32"

    def declared_deviation(self, clause: str, facts: dict) -> str | None:
        """The reason of a declared deviation covering a failure of ``clause`` on a case with these facts."""
        for deviation in self.known_deviations:
            named = deviation["clause"]
            if (clause == named or (not isinstance(named, str) and clause in named)) and deviation["when"](facts):
                return deviation["reason"]
        return None

    def dtypes_on(self, device: str) -> tuple[str, ...]:
        if self.dtypes_by_device is None:
            return self.dtypes
        return tuple(self.dtypes_by_device.get(device, ()))

    def policy_for(self, mask, dtype: str = "float32", facts: dict | None = None) -> str:
        """The declared fully-masked-row policy of a row emptied by this mask (None, bool or float) alone, in ``dtype``.

        The judge asks ``row_policy`` for each row's own cause; this is the policy of the case's mask kind.
        """
        kind = mask_cause(mask)
        return self.row_policy(kind, kind, dtype, facts or {"dtype": dtype, "mask_kind": kind})

    def row_policy(self, cause: str, case_kind: str, dtype: str, facts: dict) -> str:
        """FULLY_MASKED_ROWS for one fully masked row: what its ``cause`` (FULLY_MASKED_CAUSES) gives in ``dtype``.

        ``case_kind`` is the case's mask kind, "float" for a float mask and "bool" otherwise: a cause-mapping without
        an entry for a cause other than "bool" and "float" ("key_lengths", "window", "causal", "attention_chunk",
        "key_leftpad") gives those rows the entry of the case's mask kind (the older {"bool", "float"} form, where
        every row of a case followed its mask kind). A missing "bool" or "float"
        entry, and a dtype a by-dtype mapping does not name, give "zeros". A callable gets ``facts`` (those of a
        KNOWN_DEVIATIONS ``when``) with the row's "cause" added.
        """
        declared = self.fully_masked_rows
        if callable(declared):
            policy = declared({**facts, "cause": cause})
            if policy not in FULLY_MASKED_POLICIES:
                raise ImplementationLoadError(
                    f"{self.spec or self.name}: FULLY_MASKED_ROWS returned {policy!r} for a row emptied by {cause!r} "
                    f"(dtype {dtype}); it must return one of {list(FULLY_MASKED_POLICIES)}")
            return policy
        if isinstance(declared, dict) and _by_dtype(declared):
            declared = declared.get(dtype, "zeros")
        if isinstance(declared, str):
            return declared
        if cause in declared:
            return declared[cause]
        return declared.get(cause if cause in MASK_KIND_CAUSES else case_kind, "zeros")

    @property
    def uniform_policy(self) -> str | None:
        """The one policy every fully masked row gets, whatever its cause and dtype (None when it depends on them)."""
        return self.fully_masked_rows if isinstance(self.fully_masked_rows, str) else None

    # ------------------------------------------------------------ layout
    @property
    def result_layout(self) -> str:
        """The axis order of the output of sdpa and sdpa_paged: OUTPUT_LAYOUT, else LAYOUT."""
        return self.output_layout or self.layout

    def layout_inputs(self, op: str) -> tuple[str, ...]:
        """The inputs of ``op`` the suite transposes to hand over in LAYOUT: sdpa's q, k, v, and sdpa_paged's q (its
        caches have a layout of their own, (num_blocks, block_size, Hkv, D))."""
        return () if self.layout == "bhld" else _layout_names(op)

    def output_transposed(self, op: str) -> bool:
        """Whether ``op``'s output comes back in a layout other than (B, H, L, D) (OUTPUT_LAYOUT, else LAYOUT)."""
        return self.result_layout != "bhld" and bool(_layout_names(op))

    def to_layout(self, op: str, name: str, array):
        """A NumPy input of the suite's (B, H, L, D) in the implementation's LAYOUT, C-contiguous (as a framework's
        own call would make it); every other input as it is."""
        if name not in self.layout_inputs(op) or array is None:
            return array
        return np.ascontiguousarray(np.swapaxes(array, 1, 2))

    def from_layout(self, op: str, array):
        """A NumPy input as handed over (or a gradient of q, k, v) in the implementation's LAYOUT back in the suite's
        (B, H, L, D). An array that is not 4-d stays as it is."""
        if not self.layout_inputs(op) or array is None or np.ndim(array) != 4:
            return array
        return np.swapaxes(array, 1, 2)

    def output_from_layout(self, op: str, array):
        """A NumPy output in the implementation's output layout back in the suite's (B, H, L, D). An array that is not
        4-d stays as it is (the shape check names it)."""
        if not self.output_transposed(op) or array is None or np.ndim(array) != 4:
            return array
        return np.swapaxes(array, 1, 2)

    def output_to_layout(self, op: str, array):
        """A (B, H, L, D) array shaped like the output (a gradient's d_out) in the output layout, C-contiguous."""
        if not self.output_transposed(op) or array is None:
            return array
        return np.ascontiguousarray(np.swapaxes(array, 1, 2))

    def output_shape(self, op: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape in the implementation's output layout of a (B, H, L, D) output shape of the suite."""
        if not self.output_transposed(op) or len(shape) != 4:
            return tuple(shape)
        return (shape[0], shape[2], shape[1], shape[3])

    def devices(self) -> list[str]:
        arrays = ARRAY_KINDS[self.array]
        if arrays.unavailable_reason():
            return []
        present = arrays.devices()
        if self.declared_devices is None:
            return list(present)
        return [d for d in present if d in self.declared_devices]

    # ------------------------------------------------------------------- call
    def call(self, op: str, arrays: dict[str, Any], options: dict, device: str):
        """Run ``op`` on NumPy inputs (already in the dtype under test); return a NumPy result.

        ``arrays`` holds q/k/v/mask, x or query/key/value/params; ``options`` the
        scalar arguments. Defaults are left out so optional parameters stay optional.
        The suite's judge calls ``call_raw`` instead, to check the result's type first.
        """
        kind = ARRAY_KINDS[self.array]
        got = self.call_raw(op, arrays, options, device)
        pair = options.get("return_lse") or op == "merge_states"  # (out, lse)
        if pair and isinstance(got, (tuple, list)) and len(got) == 2:
            return self.output_from_layout(op, kind.to_numpy(got[0])), kind.to_numpy(got[1])
        return self.output_from_layout(op, kind.to_numpy(got))

    def call_raw(self, op: str, arrays: dict[str, Any], options: dict, device: str, passed: dict | None = None):
        """As ``call``, but return the result exactly as the implementation returned it (no conversion, in its LAYOUT).

        ``passed``, if given, receives the framework arrays handed to the implementation,
        by input name (``params`` a dict of them), so that a caller can see whether the
        call changed them (q, k, v of an sdpa in LAYOUT "blhd" are its own transposed copies).
        """
        kind = ARRAY_KINDS[self.array]
        passed = {} if passed is None else passed

        def native(value):
            if isinstance(value, dict):
                return {key: native(item) for key, item in value.items()}
            return None if value is None else kind.to_native(value, device)

        positional = POSITIONAL[op]
        merged = {**arrays, **options}
        args = [native(self.to_layout(op, name, merged[name])) if name not in SCALAR_POSITIONAL else merged[name]
                for name in positional]
        passed.update({name: arg for name, arg in zip(positional, args) if name not in SCALAR_POSITIONAL})
        kwargs = {}
        for key, default in OPTIONAL_KEYWORDS[op].items():
            value = merged.get(key, default)
            if _differs(value, default):
                # Array keywords (the mask, ALiBi slopes, per-example lengths) in the implementation's array type.
                kwargs[key] = native(value) if isinstance(value, np.ndarray) else value
                if isinstance(value, np.ndarray):
                    passed[key] = kwargs[key]
        with kind.precision(arrays):  # JAX: x64 for a float64 case only (_arrays.py)
            return self.operation(op)(*args, **kwargs)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "spec": self.spec,
            "array": self.array,
            "dtypes": {d: list(self.dtypes_on(d)) for d in ("cpu", "cuda")} if self.dtypes_by_device else list(self.dtypes),
            "devices": self.devices(),
            "operations": {op: self.implements(op) for op in OPERATIONS},
            "fully_masked_rows": _describe_policy(self.fully_masked_rows),
            "layout": self.layout,
            "output_layout": self.result_layout,
            "sequence_alignment": self.sequence_alignment,
            "known_deviations": [{"clause": d["clause"] if isinstance(d["clause"], str) else ", ".join(d["clause"]),
                                  "reason": d["reason"]} for d in self.known_deviations],
            "supports": self.region.describe() if self.region.declared else "everything",
            "float32_matmul": {d: self.float32_matmul.get(d, "ieee") for d in device_names()},
            "gradients": self.gradients,
            **({"fp8_output_dtype": self.fp8_output_dtype} if any(map(is_eight_bit, self.dtypes)) else {}),
            **({"refusals": list(self.refusals)} if self.refusals else {}),
            **({"lse_convention": self.lse_convention} if self.lse_convention != LSE_CONVENTION_DEFAULTS else {}),
            "skip_reason": self.skip_reason,
        }


def _by_dtype(declared: dict) -> bool:
    return any(key in DECLARABLE_DTYPE_NAMES for key in declared)


def _describe_policy(declared):
    """FULLY_MASKED_ROWS as the report writes it: a callable by its name, mappings as they are."""
    if callable(declared):
        return f"callable {getattr(declared, '__module__', '?')}.{getattr(declared, '__qualname__', repr(declared))}"
    return declared


def parse_fully_masked_rows(declared, spec: str):
    """FULLY_MASKED_ROWS validated (docs/contract.md): a policy; {cause: policy}; {dtype: policy or
    {cause: policy}}; or a callable(facts) returning a policy. An error names the implementation, the attribute and
    the key at fault."""
    def policy(value, where: str) -> None:
        if not isinstance(value, str) or value not in FULLY_MASKED_POLICIES:
            raise ImplementationLoadError(
                f"{spec}: FULLY_MASKED_ROWS{where}={value!r} must be one of {list(FULLY_MASKED_POLICIES)}")

    def causes(mapping: dict, where: str) -> None:
        for key, value in mapping.items():
            if key not in FULLY_MASKED_CAUSES:
                raise ImplementationLoadError(
                    f"{spec}: FULLY_MASKED_ROWS{where} has key {key!r}, which is no cause of a fully masked row "
                    f"({', '.join(FULLY_MASKED_CAUSES)})"
                    + ("" if where else f" and no dtype ({', '.join(DTYPE_NAMES)})"))
            policy(value, f"{where}[{key!r}]")

    if callable(declared) or isinstance(declared, str):
        if isinstance(declared, str):
            policy(declared, "")
        return declared
    if not isinstance(declared, dict) or not declared:
        raise ImplementationLoadError(
            f"{spec}: FULLY_MASKED_ROWS={declared!r} must be one of {list(FULLY_MASKED_POLICIES)}, a dict by cause "
            f"({', '.join(FULLY_MASKED_CAUSES)}) or by dtype ({', '.join(DTYPE_NAMES)}), or a callable(facts)")
    if _by_dtype(declared):
        stray = [key for key in declared if key not in DECLARABLE_DTYPE_NAMES]
        if stray:
            raise ImplementationLoadError(
                f"{spec}: FULLY_MASKED_ROWS mixes dtypes and other keys: {stray[0]!r} is no dtype "
                f"({', '.join(DTYPE_NAMES)}); put causes inside a dtype's entry")
        for dtype, value in declared.items():
            if isinstance(value, dict):
                causes(value, f"[{dtype!r}]")
            else:
                policy(value, f"[{dtype!r}]")
        return declared
    causes(declared, "")
    return declared


def _differs(value, default) -> bool:
    if value is None or default is None:
        return value is not default
    return value != default


# ---------------------------------------------------------------------- loading
def parse_lse_convention(declared, spec: str) -> dict:
    """LSE_CONVENTION as a complete dict (the defaults for the keys it leaves out); a load error naming the key and
    the value where one is not among contract.LSE_CONVENTION_CHOICES."""
    if declared is None:
        return dict(LSE_CONVENTION_DEFAULTS)
    if not isinstance(declared, dict):
        raise ImplementationLoadError(f"{spec}: LSE_CONVENTION must be a dict with keys among "
                                      f"{list(LSE_CONVENTION_CHOICES)}, got {declared!r}")
    for key, value in declared.items():
        if key not in LSE_CONVENTION_CHOICES:
            raise ImplementationLoadError(f"{spec}: LSE_CONVENTION has an unknown key {key!r}; keys: "
                                          f"{list(LSE_CONVENTION_CHOICES)}")
        if value not in LSE_CONVENTION_CHOICES[key]:
            raise ImplementationLoadError(f"{spec}: LSE_CONVENTION[{key!r}] must be one of "
                                          f"{list(LSE_CONVENTION_CHOICES[key])}, got {value!r}")
    return {**LSE_CONVENTION_DEFAULTS, **declared}


def from_object(obj, name: str, spec: str) -> Implementation:
    """Wrap a contract object, validating its declared attributes (one-line errors)."""
    if inspect.isclass(obj):
        # A class is instantiated with no arguments (one with static/class methods constructs
        # fine and works as it is); one whose constructor needs arguments is a load error.
        try:
            obj = obj()
        except Exception as exc:
            cls_name = getattr(obj, "__name__", "the class")
            module_name = spec.partition(":")[0] or "module"
            raise ImplementationLoadError(
                f"{spec}: cannot instantiate class {cls_name} without arguments ({type(exc).__name__}: {exc}); "
                f"pass an instance instead (e.g. --impl {module_name}:instance, with instance = {cls_name}(...) "
                "in the module) or give the constructor's parameters defaults"
            ) from None
    array = getattr(obj, "ARRAY", "numpy")
    if array not in ARRAY_KINDS:
        raise ImplementationLoadError(f"{spec}: ARRAY={array!r} is not one of {sorted(ARRAY_KINDS)}")
    declared_dtypes = getattr(obj, "DTYPES", ("float32", "float64"))
    by_device = None
    if isinstance(declared_dtypes, dict):
        by_device = {device: tuple(names) for device, names in declared_dtypes.items()}
        dtypes = tuple(d for d in DECLARABLE_DTYPE_NAMES if any(d in names for names in by_device.values()))
    else:
        dtypes = tuple(declared_dtypes)
    unknown = [d for d in dtypes if d not in DECLARABLE_DTYPE_NAMES]
    if unknown:
        raise ImplementationLoadError(
            f"{spec}: DTYPES names unknown dtypes {unknown}; allowed: {list(DECLARABLE_DTYPE_NAMES)}")
    fp8_output = getattr(obj, "FP8_OUTPUT_DTYPE", "bfloat16")
    if fp8_output not in FP8_OUTPUT_DTYPES:
        raise ImplementationLoadError(
            f"{spec}: FP8_OUTPUT_DTYPE={fp8_output!r} must be one of {list(FP8_OUTPUT_DTYPES)} (the dtype of the "
            "output of an 8-bit case; FlashAttention 3 returns bfloat16)")
    policy = parse_fully_masked_rows(getattr(obj, "FULLY_MASKED_ROWS", "zeros"), spec)
    layout = getattr(obj, "LAYOUT", "bhld")
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ImplementationLoadError(
            f"{spec}: LAYOUT={layout!r} must be one of {list(LAYOUTS)} (sdpa's q, k, v and output as "
            f"{LAYOUT_SHAPES['bhld']} or {LAYOUT_SHAPES['blhd']})")
    output_layout = getattr(obj, "OUTPUT_LAYOUT", None)
    if output_layout is not None and (not isinstance(output_layout, str) or output_layout not in LAYOUTS):
        raise ImplementationLoadError(
            f"{spec}: OUTPUT_LAYOUT={output_layout!r} must be one of {list(LAYOUTS)} (sdpa's output as "
            f"{LAYOUT_SHAPES['bhld']} or {LAYOUT_SHAPES['blhd']}, where it differs from LAYOUT's)")
    alignment = getattr(obj, "SEQUENCE_ALIGNMENT", "bottom-right")
    if not isinstance(alignment, str) or alignment not in SEQUENCE_ALIGNMENTS:
        raise ImplementationLoadError(
            f"{spec}: SEQUENCE_ALIGNMENT={alignment!r} must be one of {list(SEQUENCE_ALIGNMENTS)} (where each "
            "sequence's queries sit against its keys in sdpa_varlen and sdpa_paged)")
    devices = getattr(obj, "DEVICES", None)
    if devices is not None:
        if isinstance(devices, str) or not all(isinstance(d, str) for d in devices):
            raise ImplementationLoadError(f"{spec}: DEVICES must be a tuple of device names, got {devices!r}")
        unknown_devices = [d for d in devices if d not in device_names()]
        if unknown_devices:
            raise ImplementationLoadError(
                f"{spec}: DEVICES names unknown devices {unknown_devices}; allowed: {list(device_names())}")
    if by_device is not None:
        unknown_devices = [d for d in by_device if d not in device_names()]
        if unknown_devices:
            raise ImplementationLoadError(
                f"{spec}: DTYPES names unknown devices {unknown_devices}; allowed: {list(device_names())}")
    try:
        region = parse_region(getattr(obj, "SUPPORTS", None), getattr(obj, "supports", None))
    except RegionError as exc:
        raise ImplementationLoadError(f"{spec}: {exc}") from None
    matmul = getattr(obj, "FLOAT32_MATMUL", "ieee")
    matmul = {d: matmul for d in device_names()} if isinstance(matmul, str) else dict(matmul)
    if not set(matmul) <= set(device_names()) or any(m not in FLOAT32_MATMUL_MODES for m in matmul.values()):
        raise ImplementationLoadError(
            f"{spec}: FLOAT32_MATMUL={getattr(obj, 'FLOAT32_MATMUL')!r} must be one of {list(FLOAT32_MATMUL_MODES)} "
            f"or a dict mapping devices ({', '.join(device_names())}) to one of them")
    gradients = getattr(obj, "GRADIENTS", True)
    if not isinstance(gradients, bool):
        raise ImplementationLoadError(f"{spec}: GRADIENTS must be True or False, got {gradients!r}")
    refusals = getattr(obj, "REFUSALS", ())
    if isinstance(refusals, str) or not all(isinstance(sign, str) and sign for sign in refusals):
        raise ImplementationLoadError(f"{spec}: REFUSALS must be a tuple of non-empty strings (texts of a compiler's "
                                      f"refusal), got {refusals!r}")
    lse_convention = parse_lse_convention(getattr(obj, "LSE_CONVENTION", None), spec)
    deviations = tuple(getattr(obj, "KNOWN_DEVIATIONS", ()))
    for index, deviation in enumerate(deviations):
        if not (isinstance(deviation, dict) and {"clause", "when", "reason"} <= set(deviation) and callable(deviation["when"])):
            raise ImplementationLoadError(
                f"{spec}: KNOWN_DEVIATIONS[{index}] must be a dict with 'clause', 'when' (a callable) and 'reason'"
            )
    impl = Implementation(
        name=str(getattr(obj, "NAME", name)),
        obj=obj,
        array=array,
        dtypes=dtypes,
        dtypes_by_device=by_device,
        declared_devices=tuple(devices) if devices is not None else None,
        fully_masked_rows=policy,
        layout=layout,
        output_layout=None if output_layout == layout else output_layout,
        sequence_alignment=alignment,
        known_deviations=deviations,
        spec=spec,
        region=region,
        float32_matmul={d: m for d, m in matmul.items() if m != "ieee"},
        compiled=array == "jax" or bool(getattr(obj, "COMPILED", False)),
        gradients=gradients,
        fp8_output_dtype=fp8_output,
        refusals=tuple(refusals),
        lse_convention=lse_convention,
    )
    if not any(impl.implements(op) for op in OPERATIONS):
        raise ImplementationLoadError(f"{spec}: exposes none of {', '.join(OPERATIONS)}")
    return impl


def load_implementation(spec: str) -> Implementation:
    """Load ``MODULE[:ATTR]`` (importable from the current directory or PYTHONPATH) or ``builtin:NAME``."""
    if spec.startswith("builtin:"):
        found = {impl.name: impl for impl in builtin_implementations()}
        name = spec.split(":", 1)[1]
        if name not in found:
            raise ImplementationLoadError(f"{spec}: no built-in named {name!r}; built-ins: {sorted(found)}")
        return found[name]
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ImplementationLoadError(
            f"--impl {spec}: cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    obj = module
    if attr:
        try:
            for part in attr.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            raise ImplementationLoadError(f"--impl {spec}: module {module_name!r} has no attribute {attr!r}") from None
    default_name = (attr or module_name).replace(".", "_").replace(":", "_")
    return from_object(obj, default_name, spec)


def builtin_implementations() -> list[Implementation]:

    impls = []
    for cls in builtin.BUILTINS:
        impl = from_object(cls, cls.NAME, f"builtin:{cls.NAME}")
        impls.append(impl)
    return impls


def cast(array: np.ndarray, dtype: str) -> np.ndarray:
    return np.asarray(array).astype(numpy_dtype(dtype))
