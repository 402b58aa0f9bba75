"""How far XNNPACK's float16 kernels may move a program: eager float16 with each op's result moved by the
error its XNNPACK kernel makes.

PyTorch's float16 CPU ops compute in float32 and round once: their results are off by 0.29 units in the
last place (ulp) on average (the root mean square), 0.5 at most. XNNPACK's are not all (measured on this
machine's x86 build; ``tests/test_fp16_kernels.py`` holds this table to them):

* its float16 GEMMs (fully connected, convolution, batch matmul) round the accumulator to float16 after
  every multiply-add, as native fp16 arithmetic does: a sum of ``n`` products is off by about
  ``0.3 * sqrt(n)`` ulp on average (4.8 to 5.0 for 256 terms, whose worst is 40 ulp; PyTorch's 0.6 and 3.7);
* attention (two GEMMs and a softmax) 1.8 ulp; its softmax, with a low-degree ``exp``, 1.4; xnnguard's
  layer norm form 1.4 to 1.7; ``tanh`` and ``sigmoid`` 1.2; ``gelu`` 0.4.

The table below takes these, rounded up a little. They are the errors of XNNPACK's *native* float16
kernels, which it picks on a CPU with float16 arithmetic (x86 AVX512-FP16, as the Sapphire Rapids Xeon the
table was measured on; Arm's FP16 extension). On a CPU without it (AVX2 with F16C only: the AMD EPYC CI
machines) XNNPACK converts to float32, computes there and rounds once, and errs less (a GEMM of 256 terms
0.7 ulp): the table is an upper bound there (``native_fp16_arithmetic`` tells which machine this is).

A float16 program is as right as its kernels when it is about as far from the float32 model as eager
float16 is with those errors propagated through the network. ``kernel_error_outputs`` propagates them: it
runs the half model eagerly with every op's result moved by a normal draw (seeded) with its kernel's
average error, and returns the outputs of ``TRIALS`` such runs. A deep or ill-conditioned network (a layer
norm over two nearly equal values multiplies its input's rounding by ``1 / sqrt(eps)``) moves as far as
its kernels make it move; a wrong program (a wrong channel, a missed mask) is off by the values' own
scale, orders above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "ACCUMULATION_ULPS",
    "ATTENTION_ULPS",
    "ELEMENTWISE_ULPS",
    "NORM_ULPS",
    "SOFTMAX_ULPS",
    "TRANSCENDENTAL_ULPS",
    "TRIALS",
    "accumulation_ulps",
    "call_in_half",
    "kernel_error_outputs",
    "native_fp16_arithmetic",
]

# Average (root mean square) errors of XNNPACK's float16 kernels, in ulp of each result, rounded up.
TRIALS = 4
ELEMENTWISE_ULPS = 0.3  # one rounding, as eager's, but in another place
TRANSCENDENTAL_ULPS = 1.25
SOFTMAX_ULPS = 1.5
ATTENTION_ULPS = 2.0
NORM_ULPS = 2.0
ACCUMULATION_ULPS = 0.35  # times the square root of a sum's length

_aten = torch.ops.aten


def native_fp16_arithmetic() -> bool:
    """True when this CPU computes in float16 (x86 ``avx512fp16``; Arm ``asimdhp``), so XNNPACK's float16
    kernels round where the table above says; False on an x86 CPU with F16C conversions only."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = {flag for line in cpuinfo if line.lower().startswith(("flags", "features"))
                     for flag in line.split(":", 1)[1].split()}
    except OSError:
        return True  # no way to tell: the table as measured
    return bool(flags & {"avx512fp16", "asimdhp"})


# Ops whose float16 result XNNPACK sums in float16: the length of the sum each output element takes.
_GEMMS = {
    _aten.mm.default: lambda args: args[0].shape[-1],
    _aten.bmm.default: lambda args: args[0].shape[-1],
    _aten.addmm.default: lambda args: args[1].shape[-1],
    _aten.baddbmm.default: lambda args: args[1].shape[-1],
    _aten.convolution.default: lambda args: math.prod(args[1].shape[1:]) * (
        args[1].shape[0] // args[1].shape[1] if args[6] else 1),
    _aten.mean.dim: lambda args: _reduced(args),
    _aten.sum.dim_IntList: lambda args: _reduced(args),
}
_SOFTMAXES = {_aten._softmax.default, _aten._log_softmax.default}
_ATTENTION = {_aten._scaled_dot_product_flash_attention_for_cpu.default}
_NORMS = {_aten.native_layer_norm.default, _aten.native_group_norm.default, _aten.native_batch_norm.default,
          _aten._native_batch_norm_legit_no_training.default}
_TRANSCENDENTAL = {_aten.tanh.default, _aten.sigmoid.default, _aten.gelu.default, _aten.silu.default,
                   _aten.exp.default, _aten.log.default, _aten.elu.default, _aten.hardswish.default,
                   _aten.mish.default, _aten.softplus.default}


def _reduced(args: Sequence[Any]) -> int:
    dims = args[1] if len(args) > 1 and args[1] is not None else range(args[0].dim())
    return math.prod(args[0].shape[d] for d in dims) if args[0].dim() else 1


def accumulation_ulps(length: int) -> float:
    """The average error of a float16 sum of ``length`` terms accumulated in float16, in ulp of its
    result: each addition rounds, and the roundings add up like a random walk. A sum of one term is
    exact (a product still rounds once)."""
    return max(ELEMENTWISE_ULPS, ACCUMULATION_ULPS * math.sqrt(length)) if length > 1 else ELEMENTWISE_ULPS


def _kernel_ulps(func: Any, args: Sequence[Any]) -> float:
    if func in _GEMMS:
        return accumulation_ulps(int(_GEMMS[func](args)))
    if func in _SOFTMAXES:  # over one element: exactly 1 (or 0), on both sides
        return SOFTMAX_ULPS if args[0].dim() and args[0].shape[args[1]] > 1 else 0.0
    if func in _ATTENTION:
        return ATTENTION_ULPS
    if func in _NORMS:
        return NORM_ULPS
    if func in _TRANSCENDENTAL:
        return TRANSCENDENTAL_ULPS
    if torch.Tag.pointwise in getattr(func, "tags", ()):
        return ELEMENTWISE_ULPS
    return 0.0  # views, copies, selections, pooling by max: the same values on both sides


def call_in_half(func: Any, args: Any, kwargs: Any) -> Any:
    """``func(*args, **kwargs)``; an op PyTorch has no float16 CPU kernel for (``avg_pool3d``) runs on
    float32 copies, rounded back to float16, as PyTorch's float16 ops compute."""
    try:
        return func(*args, **kwargs)
    except (NotImplementedError, RuntimeError) as error:
        if "Half" not in str(error):
            raise
    up = pytree.tree_map_only(torch.Tensor, lambda t: t.float() if t.dtype == torch.float16 else t, (args, kwargs))
    out = func(*up[0], **up[1])
    return pytree.tree_map_only(torch.Tensor, lambda t: t.half() if t.dtype == torch.float32 else t, out)


class _KernelError(TorchDispatchMode):
    """Moves every float16 op result by a normal draw with its XNNPACK kernel's average error (``_kernel_ulps``).

    An op PyTorch has no float16 CPU kernel for runs on float32 copies (``call_in_half``).
    """

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.generator = generator

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = call_in_half(func, args, kwargs or {})
        ulps = _kernel_ulps(func, args)
        if ulps == 0.0:
            return out
        first = out[0] if isinstance(out, (tuple, list)) else out  # a norm's stats and attention's lse: unread
        if not isinstance(first, torch.Tensor) or first.dtype != torch.float16:
            return out
        moved = self._move(first, ulps)
        return (moved, *out[1:]) if isinstance(out, (tuple, list)) else moved

    def _move(self, t: torch.Tensor, ulps: float) -> torch.Tensor:
        value = t.float()
        ulp = torch.finfo(torch.float16).eps * torch.exp2(torch.floor(torch.log2(
            value.abs().clamp_min(torch.finfo(torch.float16).tiny))))
        fraction = torch.randn(t.shape, generator=self.generator)
        moved = (value + fraction * ulps * ulp).half()
        return torch.where(torch.isfinite(t) & torch.isfinite(moved), moved, t)


def kernel_error_outputs(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[Any]:
    """``TRIALS`` runs of the half ``model`` on half ``inputs``, each op's result moved by its kernel's error."""
    outputs = []
    for trial in range(TRIALS):
        with torch.no_grad(), _KernelError(torch.Generator().manual_seed(trial)):
            outputs.append(model(*inputs))
    return outputs
