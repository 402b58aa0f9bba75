"""``expand``, ``repeat`` and ``repeat_interleave`` as broadcasts XNNPACK runs.

Invariant established: no ``expand`` (or ``expand_as``) is left except one whose tensor is not
floating-point or that broadcasts along a dynamic size no graph input of its dtype carries (or along two),
no ``fill`` of a tensor nothing else reads whose readers are all broadcasting binary ops that broadcast its
value to their own output, and no ``repeat`` / ``repeat_interleave`` (by an int) with static shapes and a
floating-point tensor. ExecuTorch 1.5.1's XNNPACK
partitioner has no config for ``expand_copy``, ``repeat`` or ``fill``: they ran on the portable kernels,
between delegates.

The forms:

* an expand to its own input's shape is its input;
* an expand read only by broadcasting binary ops (``add``, ``mul``...) that broadcast its input to the
  same result is dropped: they read its input (``xnnguard.graph.broadcast``);
* a ``fill`` of a tensor nothing else reads is its value expanded: read only by such ops, it is dropped
  the same way (an attention mask of a dynamic token count made by ``full`` and a slice assignment
  that covers it, added to the scores, is the one value added to them);
* any other expand is ``reshape(x) * ones``, the ``ones`` constant 1 except along the broadcast dims:
  XNNPACK's multiply broadcasts;
* an expand along one dynamic dim (a ViT's class token to a dynamic batch; fuzz seeds 163, 171, 187) takes
  that size from a graph input that has it: one element of the input per index of that dim, ``s``, and
  ``minimum(maximum(s, x), x)`` (``constant_where.select_by_bounds`` with ``x`` as both bounds), which is
  ``x`` broadcast to ``s``'s size wherever ``s`` holds a number (infinities too; a NaN among those input
  elements would give NaN there). XNNPACK has no broadcast node, but its binary ops size their output from
  their inputs at run time;
* ``repeat(x, r)`` along dim ``d`` is ``x`` viewed with a new size-1 dim in front of ``d``, multiplied by
  ``ones`` of size ``r`` there, then reshaped: copy ``k`` of the tensor is the k-th slice of the new dim,
  which is what ``repeat`` lays out. Adjacent dims that are not repeated merge, so the broadcast stays
  within 6 dims;
* ``repeat_interleave(x, r, d)`` is the same with the new dim *after* ``d``: each element's ``r`` copies
  are adjacent.

Why it is exact: ``x * 1.0`` is ``x`` bit for bit (NaN and infinities included), and the reshapes move
no element. int8: the stock quantizer leaves these ops float, and so are their pieces
(``pieces_stay_float``): a quantized multiply would round where the original does not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from xnnguard.graph.args import int_arg, int_list
from xnnguard.graph.broadcast import broadcasts_in_place_of
from xnnguard.graph.shapes import dynamic_broadcast_dim, same_size, tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.views.base import AliasAwarePass, replace_by, view_sizes
from xnnguard.rewrite.views.constant_where import select_by_bounds

__all__ = ["BroadcastViewsPass", "broadcast_form", "repeat_by_broadcast"]

_aten = torch.ops.aten
_EXPANDS = {_aten.expand.default, _aten.expand_as.default}  # expand_as: F.normalize's, for one
_REPEATS = {_aten.repeat.default}
_INTERLEAVES = {_aten.repeat_interleave.self_int}
_FILLS = {_aten.fill_.Tensor, _aten.fill.Tensor}
TARGETS = frozenset(_EXPANDS | _REPEATS | _INTERLEAVES | _FILLS)


def broadcast_form(
    shape: Sequence[int | torch.SymInt], repeats: Sequence[int], interleave: bool
) -> tuple[list[int | torch.SymInt], list[int]]:
    """The view of ``x`` (of ``shape``) and the shape of the ``ones`` that repeat it by ``repeats``.

    Runs of unrepeated dims merge into one; each repeated dim gets a size-1 neighbour (after it when
    ``interleave``: each element's copies adjacent; before it otherwise: whole copies in sequence), where
    ``ones`` has the repeat count.
    """
    view: list[int | torch.SymInt] = []
    ones: list[int] = []
    run: int | torch.SymInt = 1
    for size, r in zip(shape, repeats):
        if r == 1:
            run = run * size
            continue
        if not (isinstance(run, int) and run == 1):
            view.append(run)
            ones.append(1)
        run = 1
        view += [size, 1] if interleave else [1, size]
        ones += [1, r] if interleave else [r, 1]
    if not (isinstance(run, int) and run == 1) or not view:
        view.append(run)
        ones.append(1)
    return view, ones


def repeat_by_broadcast(
    x: torch.Tensor, repeats: Sequence[int], *, interleave: bool, ones: torch.Tensor | None = None
) -> torch.Tensor:
    """``x`` repeated ``repeats[d]`` times along each dim (``repeat``, or ``repeat_interleave`` when
    ``interleave``) by one broadcasting multiply. ``repeats`` may be longer than ``x``'s rank."""
    shape = [1] * (len(repeats) - x.dim()) + list(x.shape)
    view, ones_shape = broadcast_form(shape, repeats, interleave)
    if ones is None:
        ones = torch.ones(ones_shape, dtype=x.dtype)
    return (x.reshape(view_sizes(view)) * ones).reshape(view_sizes([size * r for size, r in zip(shape, repeats)]))


class BroadcastViewsPass(AliasAwarePass):
    """Rewrites expand / repeat / repeat_interleave into broadcasts of their consumers or of a multiply."""

    rule = Rule.NOT_REWRITTEN  # reported; the portable kernels run what is left
    tags_what_it_leaves = False  # untagged: XNNPACK still takes what it can of the op as it is
    subject = "broadcast"
    pieces_stay_float = True

    def chooses(self, node: torch.fx.Node) -> bool:
        targeted = node.target in TARGETS and isinstance(node.args[0], torch.fx.Node)
        return targeted and not self.aliasing.written_after(node)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        x = node.args[0]
        assert isinstance(x, torch.fx.Node)
        before, after = tensor_value(x), tensor_value(node)
        if before is None or after is None:
            return "its input is not a tensor"
        if node.target in _EXPANDS:
            return self._expand(graph_module, node, x, before, after)
        if node.target in _FILLS:
            return self._fill(graph_module, node, x)
        if not before.dtype.is_floating_point:
            return f"a {before.dtype} tensor (XNNPACK multiplies floating-point ones)"
        shape = list(before.shape)
        if node.target in _REPEATS:
            repeats = int_list(node.args[1])
            interleave = False
        else:
            dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim")
            if not isinstance(node.args[1], int):
                return "its repeats are not an int"
            if dim is None:  # repeat_interleave of the flattened tensor
                shape, dim = [math.prod(shape)], 0
            dim = int_arg(dim) % max(len(shape), 1)
            repeats = [int_arg(node.args[1]) if d == dim else 1 for d in range(len(shape))]
            interleave = True
        aligned = [1] * (len(repeats) - len(shape)) + shape
        view, ones_shape = broadcast_form(aligned, repeats, interleave)
        if len(view) > 6:
            return f"its broadcast needs {len(view)} dims > 6"
        ones = torch.ones(ones_shape, dtype=before.dtype)

        def replacement(v: torch.Tensor, ones_: torch.Tensor) -> torch.Tensor:
            flat = v.reshape(-1) if len(repeats) < v.dim() else v
            return repeat_by_broadcast(flat, repeats, interleave=interleave, ones=ones_)

        replace_by(graph_module, node, replacement, [x, ones])
        return None

    @staticmethod
    def _fill(graph_module: torch.fx.GraphModule, node: torch.fx.Node, filled: torch.fx.Node) -> str | None:
        """A tensor nothing else reads, filled with one value: that value, broadcast by its readers."""
        value = node.args[1]
        if not isinstance(value, torch.fx.Node):
            return "its value is not a tensor in the graph"
        if list(filled.users) != [node]:
            return "the tensor it fills is read elsewhere too"
        users = list(node.users)
        if not users or not all(broadcasts_in_place_of(user, node, value) for user in users):
            return "a reader of it does not broadcast its value to its own shape"
        for user in users:
            user.replace_input_with(node, value)
        graph_module.graph.erase_node(node)  # in place: no dead code to DCE
        return None

    @staticmethod
    def _expand(
        graph_module: torch.fx.GraphModule,
        node: torch.fx.Node,
        x: torch.fx.Node,
        before: torch.Tensor,
        after: torch.Tensor,
    ) -> str | None:
        if tuple(before.shape) == tuple(after.shape):
            node.replace_all_uses_with(x)
            return None
        users = list(node.users)
        if users and all(broadcasts_in_place_of(user, node, x) for user in users):
            for user in users:
                user.replace_input_with(node, x)
            return None
        if not before.dtype.is_floating_point:
            return f"a {before.dtype} tensor (XNNPACK multiplies floating-point ones)"
        rank = after.dim()
        lead = rank - before.dim()
        aligned = [1] * lead + list(before.shape)
        # the static broadcast dims: a multiply by ones; a dynamic one: sized by the graph input carrying it
        ones_shape = [int(large) if isinstance(small, int) and small == 1 and isinstance(large, int) else 1
                      for small, large in zip(aligned, after.shape)]
        ones = torch.ones(ones_shape, dtype=before.dtype)
        sized: tuple[torch.fx.Node, int, int] | None = None
        if dynamic_broadcast_dim(before.shape, after.shape) is not None:
            found = _dynamic_size(graph_module, aligned, after)
            if isinstance(found, str):
                return found
            sized = found

        def replacement(v: torch.Tensor, ones_: torch.Tensor, *source: torch.Tensor) -> torch.Tensor:
            y = v.reshape(view_sizes([1] * lead + list(v.shape))) * ones_
            if sized is None:
                return y
            _, dim, at = sized
            # y wherever the input's element is a number, finite or infinite, along its run-time size
            return select_by_bounds(sized_like(source[0], dim, rank, at), y, y)

        replace_by(graph_module, node, replacement, [x, ones, *([sized[0]] if sized is not None else [])])
        return None


def _size_source(
    graph_module: torch.fx.GraphModule, size: int | torch.SymInt, dtype: torch.dtype
) -> tuple[torch.fx.Node, int] | None:
    """A graph input of ``dtype`` with a dim of ``size`` (the same symbol), and that dim: where the run-time
    size is read (of the same dtype: a conversion would run outside XNNPACK)."""
    for placeholder in graph_module.graph.find_nodes(op="placeholder"):
        value = tensor_value(placeholder)
        if value is None or value.dtype != dtype:
            continue
        for dim, candidate in enumerate(value.shape):
            if same_size(candidate, size):
                return placeholder, dim
    return None


def sized_like(source: torch.Tensor, dim: int, rank: int, at: int) -> torch.Tensor:
    """One element of ``source`` per index of its ``dim``, viewed at dim ``at`` of ``rank`` size-1 dims."""
    piece = source
    for d in range(source.dim()):
        if d != dim:
            piece = piece.narrow(d, 0, 1)
    sizes = [1] * rank
    sizes[at] = -1
    return piece.reshape(sizes)


def _dynamic_size(
    graph_module: torch.fx.GraphModule, aligned: Sequence[object], after: torch.Tensor
) -> tuple[torch.fx.Node, int, int] | str:
    """``(graph input, its dim, the result's dim)`` that sizes an expand along one dynamic dim (a class token
    to a dynamic batch), or why there is none. XNNPACK has no broadcast node, but its binary ops take their
    run-time size from an input."""
    dynamic = [d for d, (small, large) in enumerate(zip(aligned, after.shape))
               if isinstance(small, int) and small == 1 and not isinstance(large, int)]
    if len(dynamic) != 1:
        return "it broadcasts along several dynamic dims (each XNNPACK reshape infers one)"
    (at,) = dynamic
    found = _size_source(graph_module, after.shape[at], after.dtype)
    if found is None:
        return f"it broadcasts along a dynamic dim no {after.dtype} graph input carries"
    return (*found, at)
