"""What the normalization rewrites share: the pass skeleton, the statistics, and the affine operands.

A normalization normalizes groups of elements that share one mean and one variance (a token's
channels for a layer norm, a group's channels and positions for a group norm). Each rewrite computes
them with ops XNNPACK 1.5.1 runs (``statistics``), summing the normalized dims as a reduction does
(``xnnguard.rewrite.reduce.plan``: a permute only if they do not trail, then a chain of linears):

    mean = sum(x, 1/K)                           # fully connected ops against constant vectors
    d    = x - mean
    rstd = rsqrt(sum(d * d, 1/K) + eps)          # the biased variance, two-pass like PyTorch's

In float16 (``xnnguard.rewrite.dtypes`` says why): each mean in stages that never exceed the input, the
deviations from the mean of ``x - x0`` (``shifted_deviations``: a block of equal values deviates by
exactly 0), ``rstd = rsqrt(q + eps/s/s) / s`` with ``q * s * s`` the second moment taken without
overflow (``second_moment``), and every norm ``d * scale + bias``: ``x * scale + shift`` would lose the
bias of a block of equal values, whose ``scale`` reaches ``1/sqrt(eps)``, to the rounding of ``x * scale``.

Then ``d * rstd * weight + bias`` for a layer norm (the weight varies along the row), and ``d * scale +
bias`` per channel for the others (``scale = rstd * weight``): one multiply and one add over the tensor.
Not ``x * scale + (bias - mean * scale)``, PyTorch's CPU kernels' form, which they compute in one fused
multiply-add: XNNPACK's multiply rounds ``x * scale`` at ``|x| / std``, far above the result for a block
of nearly equal values (fuzz seed 455). The sums add the same elements in another order. ``eps`` and
``1/K`` are constant tensors (attributes), so XNNPACK reads them as static values and no scalar is left
for a portable kernel to convert. As in the reductions, no dims of the input are merged by a view; a
group norm splits the channels into ``(groups, channels per group)``, which is a view for any strides.

An affine weight or bias computed from parameters alone (a parameter, or the ``repeat`` of one that an
instance norm decomposes into) becomes a constant of the shape it is broadcast at; any other is
reshaped in the graph.

int8: the stock XNNPACK quantizer leaves every normalization float, so every piece stays float
(``pieces_stay_float``): no rounding inside a norm that the original does not have.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch

from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.constants import constant_value
from xnnguard.rewrite.dtypes import is_half, rewritten_float
from xnnguard.rewrite.insert import splice_before
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.rank.base import high_rank, user_kept_out
from xnnguard.rewrite.reduce.forms import second_moment, shifted_deviations, trailing_sum
from xnnguard.rewrite.reduce.plan import SumPlan

__all__ = [
    "Form", "NormRewritePass", "Operand", "affine_operand", "contiguous", "dtype_of", "eps_constant", "shaped",
    "statistics",
]

Operand = torch.fx.Node | torch.Tensor
Form = tuple[Callable[..., torch.Tensor], list[Operand]]  # f and its inputs, for ``splice_before``


def statistics(
    x: torch.Tensor, plan: SumPlan, weights: Sequence[torch.Tensor], eps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(mean, x - mean, 1 / sqrt(var + eps))`` over ``plan``'s dims, ``weights`` summing to a mean.

    Mean and rstd keep the reduced dims (as 1) in the layout of ``x.permute(plan.perm)``, and so does
    the centered tensor: without a permute, they broadcast against ``x``.
    """
    gathered = x.permute(plan.perm) if plan.perm is not None else x

    def average(t: torch.Tensor) -> torch.Tensor:
        return trailing_sum(t, plan.sizes, weights)

    # deviations from each block's first element: a block of equal values centers to exactly 0, as in
    # PyTorch's kernels, where a mean taken against weights 1/K (no exact float value) is a rounding off,
    # which 1/sqrt(eps) multiplies (fuzz seed 271: a layer norm of a softmax over one element)
    centered, mean = shifted_deviations(gathered, len(plan.sizes), average)
    if not is_half(x.dtype):
        return mean, centered, torch.rsqrt(average(centered * centered) + eps)
    q, s = second_moment(centered, average)
    return mean, centered, torch.rsqrt(q + eps / s / s) / s


def contiguous(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``function`` whose result is copied to a contiguous tensor, as a normalization's own result is.

    The elementwise ops of a form lay their result out as their input is, and PyTorch lays out the
    result of a binary op of two differently laid-out inputs (a residual add of a permuted tensor) one
    way in its meta functions and another in the decompositions ``to_edge`` traces with: a later view
    of the norm's output could then be a view on one and not on the other. The copy costs nothing on
    XNNPACK, which fuses a copy of an internal value into the op that produces it.
    """

    def copied(*args: torch.Tensor) -> torch.Tensor:
        return torch.clone(function(*args), memory_format=torch.contiguous_format)

    return copied


def shaped(t: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """``t`` viewed at ``shape`` (a constant is made at that shape already, then nothing is added)."""
    return t if tuple(t.shape) == tuple(shape) else t.reshape(list(shape))


def affine_operand(graph_module: torch.fx.GraphModule, arg: object, shape: Sequence[int]) -> Operand | None:
    """A norm's weight or bias as an input of its form: a constant at ``shape`` when it can be one."""
    if not isinstance(arg, torch.fx.Node):
        return None
    value = constant_value(graph_module, arg)
    if value is not None and value.numel() == torch.Size(shape).numel():
        return value.detach().reshape(list(shape)).clone()
    return arg


def eps_constant(eps: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor([eps], dtype=dtype)


def dtype_of(node: object) -> torch.dtype:
    """The dtype of ``node``'s tensor (the form's constants are made in it)."""
    value = tensor_value(node)
    assert value is not None
    return value.dtype


def _is_getitem(node: torch.fx.Node, index: int) -> bool:
    return node.target is operator.getitem and bool(node.args[1] == index)


class NormRewritePass(NodeRewritePass):
    """A normalization rewritten into ``form(graph_module, node)``; a native op's statistics must be unused.

    ``targets`` maps each op to whether it returns ``(out, mean, rstd)`` (the ``native_*`` ops of a
    decomposed program) rather than the normalized tensor alone.
    """

    rule = Rule.NOT_REWRITTEN
    pieces_stay_float = True  # the XNNPACK quantizer leaves every normalization float
    targets: ClassVar[dict[object, bool]] = {}

    def picks(self, node: torch.fx.Node) -> bool:
        if node.op != "call_function" or node.target not in self.targets or user_kept_out(node) or high_rank(node):
            return False
        x = tensor_value(node.args[0])
        return x is not None and rewritten_float(x.dtype) and x.dim() > 0

    def form(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> Form | str:
        """The plain-PyTorch form of ``node`` and its inputs, or why there is none."""
        raise NotImplementedError

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        users = [node]
        if self.targets[node.target]:
            statistics = (1, 2)
            read = [u for u in node.users if u.users or not any(_is_getitem(u, i) for i in statistics)]
            if not all(_is_getitem(user, 0) for user in read):
                return "its mean or inverse standard deviation output is used"
            users = read
        form = self.form(graph_module, node)
        if isinstance(form, str):
            return form
        function, inputs = form
        output = splice_before(graph_module, node, contiguous(function), inputs)
        for user in users:
            user.replace_all_uses_with(output)
            if user is not node:
                graph_module.graph.erase_node(user)
        return None
