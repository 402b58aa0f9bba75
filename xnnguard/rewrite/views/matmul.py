"""Batched ``matmul`` and two-operand ``einsum`` as ``reshape`` -> ``bmm`` -> ``reshape``: no ``expand_copy``.

Invariant established: no ``matmul`` of two operands of 3 or more dims, and no ``einsum`` of two
operands whose indices each appear in the output or in both operands (batch, free and contracted
indices), is left, unless its sizes do not allow it (a broadcast batch dim that is dynamic, an index
summed within one operand, a repeated index, ellipsis).

Why: ``to_edge`` decomposes a batched ``matmul`` into ``expand_copy`` of both operands to the broadcast
batch shape, ``view_copy`` to 3-D and ``bmm``. ExecuTorch 1.5.1's XNNPACK partitioner has no config for
``expand_copy``, not even for one that expands nothing (the usual case: ``q @ k.transpose(-2, -1)`` with
equal batch dims), so every attention's two matmuls were cut out of the delegate by two portable
copies each. ``einsum`` decomposes through ``unsqueeze`` and ``permute`` of one more dim than its
operands: MViT's ``einsum("bythwc,hkc->bythwk")`` on a 6-D query became 7-D ops XNNPACK cannot hold.

The forms: operands whose batch dims hold as many elements as the broadcast batch shape are reshaped
to ``(batch, n, k)`` as they are (sizes from the operands, a dynamic batch stays dynamic); an operand
that broadcasts is broadcast first by a multiply with ``ones`` (exact: ``x * 1.0`` is ``x``). An einsum
permutes each operand to ``(batch, free, contracted)`` / ``(batch, contracted, free)``, reshapes to 3-D,
multiplies with ``bmm``, reshapes to its indices and permutes to the output order: every tensor within
the operands' and the output's rank. Same products, same sums: equal up to the order of the
float additions in the dot products.

int8: the stock XNNPACK quantizer quantizes neither ``matmul`` nor ``einsum`` nor ``bmm``; the reshapes
and permutes are its share ops, which round nothing new.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from xnnguard.graph.shapes import same_size, tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.views.base import AliasAwarePass, replace_by, view_sizes

__all__ = ["Einsum", "MatmulAsBmmPass", "einsum_as_bmm", "matmul_as_bmm", "parse_einsum"]

_aten = torch.ops.aten


def _is_one(size: int | torch.SymInt) -> bool:
    return isinstance(size, int) and size == 1


def _broadcast_batch(a: Sequence[int | torch.SymInt], b: Sequence[int | torch.SymInt]) -> list | None:
    """The broadcast of two batch shapes, or None when a dim is neither equal nor 1 on one side."""
    rank = max(len(a), len(b))
    a = [1] * (rank - len(a)) + list(a)
    b = [1] * (rank - len(b)) + list(b)
    out = []
    for x, y in zip(a, b):
        if same_size(x, y) or _is_one(y):
            out.append(x)
        elif _is_one(x):
            out.append(y)
        else:
            return None
    return out


def matmul_as_bmm(
    a: torch.Tensor, b: torch.Tensor, ones_a: torch.Tensor | None, ones_b: torch.Tensor | None
) -> torch.Tensor:
    """``a @ b`` (both at least 3-D) as one ``bmm``; ``ones_*`` broadcast an operand's batch dims first."""
    if ones_a is not None:
        a = a.reshape(view_sizes([1] * (ones_a.dim() - a.dim()) + list(a.shape))) * ones_a
    if ones_b is not None:
        b = b.reshape(view_sizes([1] * (ones_b.dim() - b.dim()) + list(b.shape))) * ones_b
    batch = a.shape[:-2] if a.dim() >= b.dim() else b.shape[:-2]
    n, k, m = a.shape[-2], a.shape[-1], b.shape[-1]
    out = torch.bmm(_as_3d(a, n, k), _as_3d(b, k, m))
    return out if len(batch) == 1 else out.reshape(view_sizes([*batch, n, m]))


def _as_3d(t: torch.Tensor, rows: int | torch.SymInt, columns: int | torch.SymInt) -> torch.Tensor:
    """``t`` as ``(batch, rows, columns)``; a 3-D ``t`` as it is.

    A view to its own sizes moves nothing, but it is one more op, and XNNPACK takes a view with one
    dynamic size only (written -1): an attention's scores over a dynamic token count have two, and each
    such view ran outside the delegate, cutting it.
    """
    return t if t.dim() == 3 else t.reshape(-1, rows, columns)


def _ones_for(batch: Sequence[int | torch.SymInt], own: Sequence[int | torch.SymInt], tail: Sequence[int],
              dtype: torch.dtype) -> torch.Tensor | str | None:
    """The ``ones`` broadcasting an operand's batch dims ``own`` to ``batch`` (None: no broadcast needed)."""
    own = [1] * (len(batch) - len(own)) + list(own)
    if all(same_size(x, y) for x, y in zip(own, batch)):
        return None
    shape = []
    for x, y in zip(own, batch):
        if same_size(x, y):
            shape.append(1)
        elif not isinstance(y, int):
            return "it broadcasts a batch dim of dynamic size"
        else:
            shape.append(y)
    return torch.ones([*shape, *[1] * len(tail)], dtype=dtype)


class Einsum:
    """A two-operand einsum, its indices sorted into batch, free (of each operand) and contracted ones."""

    def __init__(self, a: str, b: str, out: str) -> None:
        self.a, self.b, self.out = a, b, out
        self.batch = [i for i in out if i in a and i in b]
        self.free_a = [i for i in out if i in a and i not in b]
        self.free_b = [i for i in out if i in b and i not in a]
        self.contracted = [i for i in a if i in b and i not in out]

    def why_not(self) -> str | None:
        for word in (self.a, self.b, self.out):
            if len(set(word)) != len(word):
                return "an index repeats within one operand"
        if any(i not in self.out and i not in self.b for i in self.a) or any(
            i not in self.out and i not in self.a for i in self.b
        ):
            return "an index is summed within one operand"
        if any(i not in self.a and i not in self.b for i in self.out):
            return "an output index is in neither operand"
        return None


def parse_einsum(equation: str) -> Einsum | str:
    """The ``Einsum`` of ``"ab,bc->ac"``, or why it has no bmm form here."""
    equation = equation.replace(" ", "")
    if "..." in equation or "->" not in equation:
        return "an implicit output or an ellipsis"
    inputs, out = equation.split("->")
    operands = inputs.split(",")
    if len(operands) != 2:
        return f"{len(operands)} operands"
    parsed = Einsum(operands[0], operands[1], out)
    reason = parsed.why_not()
    return reason if reason is not None else parsed


def einsum_as_bmm(spec: Einsum, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.einsum(spec, a, b)`` as permutes, reshapes and one ``bmm`` (sizes of batch indices equal)."""
    size = {i: a.shape[spec.a.index(i)] for i in spec.a} | {i: b.shape[spec.b.index(i)] for i in spec.b}
    a = a.permute([spec.a.index(i) for i in spec.batch + spec.free_a + spec.contracted])
    b = b.permute([spec.b.index(i) for i in spec.batch + spec.contracted + spec.free_b])

    def prod(indices: list[str]) -> int | torch.SymInt:
        return math.prod(size[i] for i in indices)

    a = a.reshape(view_sizes([prod(spec.batch), prod(spec.free_a), prod(spec.contracted)]))
    b = b.reshape(view_sizes([prod(spec.batch), prod(spec.contracted), prod(spec.free_b)]))
    order = spec.batch + spec.free_a + spec.free_b
    out = torch.bmm(a, b).reshape(view_sizes([size[i] for i in order]))
    return out.permute([order.index(i) for i in spec.out])


class MatmulAsBmmPass(AliasAwarePass):
    """Rewrites batched matmuls and two-operand einsums into reshapes around one ``bmm``."""

    rule = Rule.NOT_REWRITTEN  # reported; the portable kernels run what is left
    tags_what_it_leaves = False  # untagged: XNNPACK still takes what it can of the op as it is
    subject = "batched matmul"

    def chooses(self, node: torch.fx.Node) -> bool:
        if node.target is _aten.matmul.default:
            values = [tensor_value(arg) for arg in node.args[:2]]
            return all(v is not None and v.dim() >= 3 for v in values)
        return node.target is _aten.einsum.default

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        if node.target is _aten.einsum.default:
            return self._einsum(graph_module, node)
        a, b = node.args[:2]
        assert isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node)
        va, vb = tensor_value(a), tensor_value(b)
        assert va is not None and vb is not None
        if va.dtype != vb.dtype or not va.dtype.is_floating_point:
            return "its operands are not of one floating-point dtype"
        batch = _broadcast_batch(va.shape[:-2], vb.shape[:-2])
        if batch is None:
            return "its batch dims do not broadcast without a guard"
        ones_a = _ones_for(batch, va.shape[:-2], va.shape[-2:], va.dtype)
        ones_b = _ones_for(batch, vb.shape[:-2], vb.shape[-2:], vb.dtype)
        for ones in (ones_a, ones_b):
            if isinstance(ones, str):
                return ones
        constants = [o for o in (ones_a, ones_b) if isinstance(o, torch.Tensor)]
        has_a, has_b = isinstance(ones_a, torch.Tensor), isinstance(ones_b, torch.Tensor)

        def replacement(x: torch.Tensor, y: torch.Tensor, *ones: torch.Tensor) -> torch.Tensor:
            found = list(ones)
            oa = found.pop(0) if has_a else None
            ob = found.pop(0) if has_b else None
            return matmul_as_bmm(x, y, oa, ob)

        replace_by(graph_module, node, replacement, [a, b, *constants])
        return None

    @staticmethod
    def _einsum(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        equation, operands = node.args[0], node.args[1]
        if not isinstance(equation, str) or not isinstance(operands, (list, tuple)):
            return "its equation is not a constant"
        spec = parse_einsum(equation)
        if isinstance(spec, str):
            return spec
        a, b = operands
        va, vb = tensor_value(a), tensor_value(b)
        if va is None or vb is None or va.dim() != len(spec.a) or vb.dim() != len(spec.b):
            return "its operands do not match its equation"
        if va.dtype != vb.dtype or not va.dtype.is_floating_point:
            return "its operands are not of one floating-point dtype"
        for i in spec.batch + spec.contracted:
            if not same_size(va.shape[spec.a.index(i)], vb.shape[spec.b.index(i)]):
                return f"index {i} has another size (or a broadcast) in each operand"
        assert isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node)
        replace_by(graph_module, node, lambda x, y: einsum_as_bmm(spec, x, y), [a, b])
        return None
