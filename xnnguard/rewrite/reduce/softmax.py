"""Softmax over any dim, and log-softmax, in the forms XNNPACK runs.

Invariant established: no ``softmax`` over a dim that is not the last, no float ``log_softmax``, and no
4-D softmax on a tensor ExecuTorch may hold channels-last is left on a tensor within XNNPACK's rank
limit. ExecuTorch 1.5.1's ``SoftmaxConfig`` takes the last dim only ("dim must be the last dim"), and no
config takes ``log_softmax``: a channel softmax (a segmentation head, a spatial attention over dim 1) and
every log-softmax ran on portable kernels between delegates. And its channels-last pass takes softmax
for layout-agnostic: after a conv, a softmax over the width normalized over the channels, without a word
(``xnnguard.graph.channels_last``).

The forms:

* softmax over dim ``d`` is the softmax over the last dim of the tensor with ``d`` moved last, moved
  back: two transposes around the op XNNPACK takes;
* a 4-D softmax (over the last dim, or moved there) of a tensor that may be channels-last runs on the 3-D
  view that merges dims 1 and 2: a view is laid out NCHW, so the pass converts the tensor back first;
* ``log_softmax(x, d)`` is ``s - log(sum(exp(s), d))`` with ``s = x - amax(x, d)``, both reductions keeping
  ``d``: PyTorch's own CPU kernel computes these steps; the reduction rewrites of this family run after
  this pass and put the ``amax`` and the ``sum`` in their XNNPACK forms.

Why it is exact: the transposes move values only; the log-softmax form is the kernel's arithmetic, up to
the order the sum adds in. In float16 the sum of exponentials (each at most 1, the largest exactly 1)
accumulates in the float16 stages of the sum rewrite where PyTorch's kernel accumulates in float32: a few
roundings of the log-probabilities' scale apart (it was left to portable kernels, and cut the program in
two: fuzz seeds 106, 126, 225, 251, 261). A ``dtype`` argument is a cast first, as in eager.
int8: the stock quantizer leaves softmax float; so are the pieces (``pieces_stay_float``).
"""

from __future__ import annotations

import torch

from xnnguard.graph.args import int_arg
from xnnguard.graph.channels_last import may_be_channels_last
from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import high_rank
from xnnguard.rewrite.views.base import replace_by
from xnnguard.rules.tagged import tag_of

__all__ = ["SoftmaxAnyDimPass", "log_softmax_form", "softmax_over", "softmax_over_rows"]

_aten = torch.ops.aten
_SOFTMAX = {_aten.softmax.int, _aten._softmax.default}
_LOG_SOFTMAX = {_aten.log_softmax.int, _aten._log_softmax.default}


def softmax_over(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax over ``dim`` as a softmax over the last dim between two transposes."""
    last = x.dim() - 1
    return torch.softmax(x.movedim(dim, last), last).movedim(last, dim)


def softmax_over_rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax of 4-D ``x`` over ``dim`` as the softmax over the last dim of a 3-D view, which ExecuTorch
    lays out NCHW whatever layout ``x`` has (dims 1 and 2 merge; the batch stays free to be dynamic)."""
    moved = x.movedim(dim, 3) if dim != 3 else x
    rows = torch.softmax(moved.flatten(1, 2), 2).unflatten(1, moved.shape[1:3])
    return rows.movedim(3, dim) if dim != 3 else rows


def log_softmax_form(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``log_softmax(x, dim)`` as the steps PyTorch's CPU kernel takes."""
    shifted = x - torch.amax(x, dim, keepdim=True)
    return shifted - torch.log(torch.sum(torch.exp(shifted), dim, keepdim=True))


def _result_dtype(node: torch.fx.Node, source: torch.dtype) -> torch.dtype:
    """The dtype the op computes in: its ``dtype`` argument, or float32 for ``half_to_float``."""
    if node.target in (_aten.softmax.int, _aten.log_softmax.int):
        given = node.args[2] if len(node.args) > 2 else node.kwargs.get("dtype")
        return given if isinstance(given, torch.dtype) else source
    return torch.float32 if len(node.args) > 2 and node.args[2] else source


class SoftmaxAnyDimPass(NodeRewritePass):
    """Rewrites each softmax over a dim that is not the last, and each log-softmax."""

    rule = Rule.NOT_REWRITTEN  # reported; the portable kernels run what is left
    tags_what_it_leaves = False
    subject = "softmax"
    pieces_stay_float = True

    def picks(self, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or tag_of(node) or node.target not in _SOFTMAX | _LOG_SOFTMAX:
            return False
        value = tensor_value(node.args[0])
        if value is None or value.dim() == 0 or high_rank(node):
            return False
        last = int_arg(node.args[1]) % value.dim() == value.dim() - 1
        return node.target in _LOG_SOFTMAX or not last or self._may_misplace(node)

    @staticmethod
    def _may_misplace(node: torch.fx.Node) -> bool:
        x = node.args[0]
        return tensor_value(x).dim() == 4 and isinstance(x, torch.fx.Node) and may_be_channels_last(x)  # type: ignore[union-attr]

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        x = node.args[0]
        value = tensor_value(x)
        assert isinstance(x, torch.fx.Node) and value is not None
        dtype = _result_dtype(node, value.dtype)
        if not dtype.is_floating_point:
            return f"it computes in {dtype}"
        dim = int_arg(node.args[1]) % value.dim()
        logarithm = node.target in _LOG_SOFTMAX
        form = log_softmax_form if logarithm else softmax_over_rows if self._may_misplace(node) else softmax_over
        replace_by(graph_module, node, lambda v: form(v.to(dtype), dim), [x])
        return None
