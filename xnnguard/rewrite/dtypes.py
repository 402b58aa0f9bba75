"""Which floating-point dtypes the rewrites rewrite, and what changes in 16 bits.

The rewrites rewrite float32 and float16 programs: ExecuTorch 1.4 and 1.5's XNNPACK configs take both.
bfloat16 is left as it was (but for its number operands, ``xnnguard.rewrite.half.scalars``): 1.5's configs
take it only with ``enable_bf16=True``, and XNNPACK then runs few ops in it (``xnnguard.rules.bfloat16``
says which, and keeps the others out), so a rewritten norm would mostly run its pieces on portable kernels.

In float16 a form must not overflow (65504 is the largest value) nor lose a sum to rounding where
PyTorch's own float16 kernels do neither. PyTorch computes on CPU a float16 ``mean``, ``sum``,
``layer_norm``, ``group_norm`` and ``batch_norm`` in float32 (``at::opmath_type<Half>`` is float:
statistics and accumulators in float32, the result rounded to float16 once). A program cannot do the
same on XNNPACK: ExecuTorch 1.5.1 delegates no conversion between float16 and float32
(``ToDimOrderCopyConfig`` refuses a dtype change; ``XNNConvert`` is only written for quantize and
dequantize), so float32 statistics would cut every norm out of its delegate. XNNPACK's float16 fully
connected accumulates in float32 on x86 without AVX512-FP16 (``f16_f32acc`` kernels) and in float16 on
ARM with FP16 arithmetic (``neonfp16arith``), the phones float16 is exported for. So the float16 forms
scale before they sum (``xnnguard.rewrite.reduce.forms``):

* a sum runs in stages of at most ``HALF_MAX_STAGE`` elements, each weighted by a power of two
  ``2^-ceil(log2 k)`` (exact): every partial result is at most the largest input, whatever the length,
  and no stage adds an element below the accumulator's rounding step; the last stage's weights carry
  what is left of the op's own scale (``1/K`` for a mean), rounded once. A length no such stages divide
  (a prime: 197 tokens) is padded with zeros to the next one they do;
* a second moment (a variance, an RMS) squares ``d / s``, ``s`` eight times the mean absolute value
  (at least ``1/32``), never ``d``: ``d * d`` overflows from ``|d| = 256`` and loses all precision
  below ``|d| = 2^-12``; then ``rsqrt(q + eps/s/s)/s`` or ``q*s*s``, which overflow only where the
  result itself does;
* deviations are taken from the mean of ``x - x0`` (``x0`` the first element of the block) and a norm
  is ``d * scale + bias``: a float16 mean is a rounding of ``|mean|`` off, which ``rsqrt`` of a small
  variance magnifies up to ``1/sqrt(eps)`` times, and ``x * scale + shift`` loses the bias of a block
  of equal values to the rounding of ``x * scale``; PyTorch gives such a block exactly its bias.
"""

from __future__ import annotations

import torch

__all__ = ["HALF_MAX_STAGE", "REWRITTEN_FLOATS", "SIXTEEN_BIT_FLOATS", "is_half", "rewritten_float"]

REWRITTEN_FLOATS = (torch.float32, torch.float16)
SIXTEEN_BIT_FLOATS = (torch.float16, torch.bfloat16)  # whose number operands to_edge converts at run time
# The longest sum one float16 fully connected op adds: with FP16 accumulation the rounding error of a
# stage grows with its length (at most length/2 steps of the result), so 16 keeps it within a few steps.
HALF_MAX_STAGE = 16


def rewritten_float(dtype: torch.dtype) -> bool:
    """True for a dtype the rewrites rewrite (float32, float16)."""
    return dtype in REWRITTEN_FLOATS


def is_half(dtype: torch.dtype) -> bool:
    """True for float16: its forms scale before they sum (see the module docstring)."""
    return dtype == torch.float16
