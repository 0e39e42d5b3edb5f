"""Broken: a 16-bit softmax whose normaliser Z = sum exp(x - max) runs in the input dtype, term by term.

exp is computed in float32 and rounded once; only the running sum is 16-bit, and it stagnates: in float16 once Z
passes 2048 every further term below 1 is lost, in bfloat16 from Z = 256. Rows of 2049 unit-normal bfloat16 inputs
sum to 1.87, float16 rows of 4097 to 1.11. An absolute softmax tolerance, u (4 + sqrt(n)) * 4 per element, lies
above the probabilities of long rows and passes it; the relative one of spec/tolerances.yaml (softmax) does not.
"""
import numpy as np

BUG = "the softmax normaliser summed term by term in the 16-bit input dtype (float32 elsewhere)"
SOURCE = "zoo extra: an independently written 16-bit softmax (2026-11-27); an absolute softmax tolerance passes it"
EXPECTED_CLAUSES = frozenset({"softmax.definition", "softmax.rows-sum-to-one", "softmax.last-axis",
                              "softmax.masked-exact-zero", "softmax.large-inputs"})
DTYPES = ("float16", "bfloat16")


def softmax(x, axis=-1):
    x = np.asarray(x)
    rows = np.moveaxis(x.astype(np.float32), axis, -1)
    with np.errstate(invalid="ignore"):
        top = rows.max(axis=-1, keepdims=True)
        e = np.exp(rows - np.where(np.isneginf(top), np.float32(0), top))
        total = np.zeros(e.shape[:-1] + (1,), x.dtype)
        for j in range(e.shape[-1]):
            total = (total.astype(np.float32) + e[..., j:j + 1]).astype(x.dtype)  # BUG: a 16-bit running sum
        total = total.astype(np.float32)
        out = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return np.moveaxis(out, -1, axis).astype(x.dtype)
