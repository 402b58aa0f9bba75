"""Linear and trilinear upsampling as gathers and a weighted sum per dim, which XNNPACK runs.

Invariant established: no ``upsample_linear1d`` or ``upsample_trilinear3d`` with static spatial sizes is
left on a floating-point tensor, nor an ``upsample_bilinear2d`` under a dynamic batch. XNNPACK has a
bilinear resize only: ExecuTorch 1.5.1 decomposed the others into ``arange`` / ``clamp`` / ``index``
gathers and dtype casts, all outside the delegates (fuzz seeds 41, 61, 94: a trilinear upsampling in a 3-D
UNet decoder, stock too), and its ``UpsampleBilinear2dConfig`` refuses the bilinear one when any size is
dynamic (fuzz seed 40, a dynamic batch), which then ran on the portable kernel.

Linear interpolation is separable: along each dim, output position ``o`` is ``w0[o] * x[i0[o]] + w1[o] *
x[i1[o]]``. The form takes each dim in turn: two gathers by constant indices (``i0``, ``i1``, written as
slices and in-place repeats: ``xnnguard.rewrite.views.constant_gather``), each multiplied by its constant
weights broadcast along the other dims, and added. The indices and weights are read from the op itself,
run on one-hot inputs along the dim, one per channel (constant along the others, whose weights sum to 1), so
``align_corners`` and a given scale are whatever the op does; the form is then checked against the op on
a random tensor. Exact up to float rounding: PyTorch weighs the same two (eight, in 3-D) elements, in
another order.

int8: the stock quantizer leaves these upsamplings float; so are the pieces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.views.base import replace_by
from xnnguard.rewrite.views.constant_gather import MAX_RUNS, Run, gather_by_runs, gather_constants, index_runs

__all__ = ["Interpolation", "LinearUpsamplePass", "interpolated"]

_aten = torch.ops.aten
LINEAR_UPSAMPLES = frozenset({
    _aten.upsample_linear1d.vec, _aten.upsample_linear1d.default,
    _aten.upsample_trilinear3d.vec, _aten.upsample_trilinear3d.default,
})
# XNNPACK's own bilinear resize, which 1.5.1's UpsampleBilinear2dConfig refuses under any dynamic size
BILINEAR_UPSAMPLES = frozenset({_aten.upsample_bilinear2d.vec, _aten.upsample_bilinear2d.default})


@dataclass(frozen=True)
class Interpolation:
    """One dim's linear interpolation: output ``o`` is ``w0[o] * x[i0[o]] + w1[o] * x[i1[o]]``."""

    dim: int  # of the tensor (2 = the first spatial dim)
    first: list[Run]  # index runs of i0
    second: list[Run]  # index runs of i1
    w0: torch.Tensor  # float64, (out,)
    w1: torch.Tensor


def _weights(matrix: torch.Tensor) -> tuple[list[int], list[int], list[float], list[float]] | None:
    """``(i0, i1, w0, w1)`` of an ``(out, in)`` interpolation matrix with one or two neighbours per row."""
    i0, i1, w0, w1 = [], [], [], []
    for row in matrix:
        nonzero = torch.nonzero(row).flatten().tolist()
        if not 1 <= len(nonzero) <= 2:
            return None
        first, second = nonzero[0], nonzero[-1]
        i0.append(first)
        i1.append(second)
        w0.append(float(row[first]))
        w1.append(float(row[second]) if second != first else 0.0)
    return i0, i1, w0, w1


def _interpolations(node: torch.fx.Node, spatial: Sequence[int]) -> list[Interpolation] | None:
    """Each spatial dim's interpolation, read from the op, or None when it is not linear dim by dim."""
    assert callable(node.target)
    found = []
    for d, size in enumerate(spatial):
        # channel i: 1 at index i along dim d, 0 elsewhere along it, constant along the other dims
        along = [size if e == d else 1 for e in range(len(spatial))]
        one_hots = torch.eye(size, dtype=torch.float64).reshape(1, size, *along).expand(1, size, *spatial)
        with torch.no_grad():
            try:
                lines = node.target(one_hots.contiguous(), *node.args[1:], **node.kwargs)[0]
            except RuntimeError:
                return None
        for other in reversed(range(len(spatial))):
            if other != d:
                lines = lines.select(1 + other, 0)
        weights = _weights(lines.T)  # (out, in)
        if weights is None:
            return None
        i0, i1, w0, w1 = weights
        found.append(Interpolation(2 + d, index_runs(i0), index_runs(i1), torch.tensor(w0, dtype=torch.float64),
                                   torch.tensor(w1, dtype=torch.float64)))
    return found


def interpolated(x: torch.Tensor, steps: Sequence[Interpolation], constants: Sequence[torch.Tensor]) -> torch.Tensor:
    """``x`` interpolated along each step's dim in turn (``constants``: ``step_constants``, in order)."""
    pending = iter(constants)
    for step in steps:
        first = gather_by_runs(x, step.dim, step.first, pending)
        second = gather_by_runs(x, step.dim, step.second, pending)
        x = first * next(pending) + second * next(pending)
    return x


def step_constants(shape: Sequence[int], steps: Sequence[Interpolation], dtype: torch.dtype) -> list[torch.Tensor]:
    """The constants of ``interpolated``: per step the gathers' ones, then the weights shaped to broadcast."""
    shape = list(shape)
    constants: list[torch.Tensor] = []
    for step in steps:
        constants += gather_constants(shape, step.dim, step.first, dtype)
        constants += gather_constants(shape, step.dim, step.second, dtype)
        view = [len(step.w0) if d == step.dim else 1 for d in range(len(shape))]
        constants += [step.w0.reshape(view).to(dtype), step.w1.reshape(view).to(dtype)]
        shape[step.dim] = len(step.w0)
    return constants


class LinearUpsamplePass(NodeRewritePass):
    """Rewrites each linear / trilinear upsampling into gathers and a weighted sum per spatial dim."""

    rule = Rule.NOT_REWRITTEN  # reported; the portable kernels run what is left
    tags_what_it_leaves = False
    subject = "linear upsampling"
    pieces_stay_float = True

    def picks(self, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if node.target in BILINEAR_UPSAMPLES:  # only where XNNPACK's own resize is refused: a dynamic batch
            value = tensor_value(node)
            return value is not None and not all(isinstance(size, int) for size in value.shape)
        return node.target in LINEAR_UPSAMPLES

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        x = node.args[0]
        before = tensor_value(x)
        if not isinstance(x, torch.fx.Node) or before is None or not before.dtype.is_floating_point:
            return "its input is not a floating-point tensor"
        spatial = before.shape[2:]
        if before.dim() < 3 or not all(isinstance(s, int) for s in [*spatial, before.shape[1]]):
            return "a dynamic spatial or channel size, or an unbatched input"
        steps = _interpolations(node, [int(s) for s in spatial])
        if steps is None:
            return "it does not interpolate dim by dim between two neighbours"
        steps = [s for s in steps if not _is_identity(s)]
        if any(len(s.first) > MAX_RUNS or len(s.second) > MAX_RUNS for s in steps):
            return f"its indices fall into more than {MAX_RUNS} runs along a dim"
        probe = torch.randn(1, 2, *spatial, dtype=torch.float64)
        with torch.no_grad():
            assert callable(node.target)
            expected = node.target(probe, *node.args[1:], **node.kwargs)
        got = interpolated(probe, steps, step_constants(probe.shape, steps, torch.float64))
        if got.shape != expected.shape or not torch.allclose(got, expected, rtol=1e-9, atol=1e-9):
            return "its form does not give the op's values"
        constants = step_constants(before.shape, steps, before.dtype)

        def replacement(v: torch.Tensor, *constants_: torch.Tensor) -> torch.Tensor:
            return interpolated(v, steps, constants_)

        replace_by(graph_module, node, replacement, [x, *constants])
        return None


def _is_identity(step: Interpolation) -> bool:
    return (len(step.first) == 1 and step.first[0][2] == 1 and step.first[0][0] == 0
            and bool((step.w0 == 1).all()) and bool((step.w1 == 0).all()))
