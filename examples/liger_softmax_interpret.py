"""Liger-Kernel's Triton softmax (``liger_kernel.ops.softmax.LigerSoftmaxFunction``), run on the CPU by Triton's
interpreter (TRITON_INTERPRET=1): its single-block kernel, its two-pass online kernel for rows past one block, and
their Triton backward, over the last axis.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is first imported: kernels run on the CPU

from liger_kernel.ops.softmax import LigerSoftmaxFunction  # noqa: E402

ARRAY = "torch"
DTYPES = ("float32", "float16", "bfloat16")  # no tl.dot: the interpreter's bfloat16 defect (fla_...) is not met


def softmax(x, axis=-1):
    if axis not in (-1, x.dim() - 1):
        raise NotImplementedError("LigerSoftmaxFunction normalises the last axis")
    return LigerSoftmaxFunction.apply(x)
