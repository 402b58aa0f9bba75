"""Maxima and minima over any dims of a tensor of at most 6 dims, as slices and ``maximum``/``minimum``.

Invariant established: no float32 or float16 ``amax``/``amin``, values-only ``max.dim``/``min.dim`` or full
``max``/``min`` over static dims of a tensor within XNNPACK's rank limit is left, except the max over H or
W of a 4-D tensor that XNNPACK 1.5.1 takes as a max pooling (``xnnguard.rules.max_reduction``, put in its
written form by ``MaxKeepdimPass``). 1.5.1's partitioner has no config for ``amax`` and takes
``max.dim`` on 4-D tensors only (Hiera's mask-unit pooling is a max over dim 1 of a 4-D and over dim 3
of a 6-D tensor), so each ran on portable kernels between two delegates.

The form (``xnnguard.rewrite.reduce.forms.extremum``): for each reduced dim of length ``R``, where it
lies, ``ceil(log2 R)`` levels of ``maximum(x[..., :h], x[..., R-h:R])`` along it with ``h = ceil(R/2)``;
then a view dropping the reduced dims (without ``keepdim``), and a contiguous copy, as a reduction's own
result is (``xnnguard.rewrite.norm.base.contiguous`` says why; XNNPACK fuses it away). Why it is exact:
a max (min) is one of its elements, whatever the order and however often each element is compared;
the two halves of an odd ``R`` share one element, which changes nothing.

int8: the stock XNNPACK quantizer quantizes neither ``amax`` nor ``max.dim``, so the pieces stay float.
"""

from __future__ import annotations

import torch

from xnnguard.graph.args import int_arg, schema_arguments
from xnnguard.graph.ops import values_only_users
from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.dtypes import rewritten_float
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import high_rank, user_kept_out
from xnnguard.rewrite.reduce.forms import Pick, contiguous_view, extremum
from xnnguard.rewrite.reduce.plan import data_dims, reduced_dims, reduced_size
from xnnguard.rules.max_reduction import max_over_height_or_width

__all__ = ["RewriteExtremumPass"]

_aten = torch.ops.aten

_PICK = {"max": torch.maximum, "min": torch.minimum}
# op -> (max or min, whether it returns (values, indices))
_EXTREMA: dict[object, tuple[str, bool]] = {
    _aten.amax.default: ("max", False),
    _aten.amin.default: ("min", False),
    _aten.max.default: ("max", False),
    _aten.min.default: ("min", False),
    _aten.max.dim: ("max", True),
    _aten.min.dim: ("min", True),
}


def _max_pooling_form(node: torch.fx.Node, x: torch.Tensor) -> bool:
    """A values-only ``max.dim`` over H or W of a 4-D tensor: XNNPACK's max pooling takes it."""
    if node.target is not _aten.max.dim:
        return False
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    return isinstance(dim, int) and max_over_height_or_width(x.dim(), dim) is not None


class RewriteExtremumPass(NodeRewritePass):
    """Replaces each max/min reduction by a (permute,) reshape, a tree of ``maximum``/``minimum``, reshape."""

    rule = Rule.NOT_REWRITTEN
    subject = "max/min reduction"
    pieces_stay_float = True  # the XNNPACK quantizer leaves amax and max.dim float

    def picks(self, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node.target not in _EXTREMA or user_kept_out(node) or high_rank(node):
            return False
        x = tensor_value(node.args[0])
        if x is None or x.dim() == 0 or not rewritten_float(x.dtype):
            return False
        _, with_indices = _EXTREMA[node.target]
        return not (with_indices and values_only_users(node) is not None and _max_pooling_form(node, x))

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        which, with_indices = _EXTREMA[node.target]
        users = values_only_users(node) if with_indices else [node]
        if users is None:
            return "its indices are used"
        arguments = schema_arguments(node) or {}
        x = node.args[0]
        assert isinstance(x, torch.fx.Node)
        value = x.meta["val"]
        dim = arguments.get("dim")
        dims = reduced_dims([int_arg(dim)] if with_indices else dim, value.dim())
        if dims is None:
            return "its dims are not constants"
        keepdim = bool(arguments.get("keepdim", False))
        size = reduced_size(value.shape, dims)
        if isinstance(size, str):
            return size
        reduced = data_dims(value.shape, dims)  # none: a max of one element is that element, a view
        pick: Pick = _PICK[which]

        def replacement(x_: torch.Tensor) -> torch.Tensor:
            sizes = [1 if d in dims else x_.shape[d] for d in range(x_.dim()) if keepdim or d not in dims]
            return contiguous_view(extremum(x_, reduced, pick), sizes)

        output = splice_before(graph_module, node, replacement, [x])
        for user in users:
            user.replace_all_uses_with(output)
            if user is not node:
                graph_module.graph.erase_node(user)
        return None
