"""Views XNNPACK has no config for, as the slices and reshapes it runs.

Invariant established: no ``select``, ``squeeze``, ``unsqueeze`` (other than on the trailing dim), ``alias``,
``contiguous``, ``clone``, one-input ``cat``, ``unbind``, ``split``, ``split_with_sizes`` or ``chunk`` with
static sizes along the dims it takes apart is left (unless its storage is written in place after it: then a
copy would lose the write, and it stays). ``to_edge`` turns them into ``select_copy``, ``squeeze_copy``,
``unsqueeze_copy``, ``alias_copy``, ``split_with_sizes_copy``, for which ExecuTorch 1.5.1's XNNPACK
partitioner has no config (``unsqueeze_copy`` only on the last dim): each ran on the portable kernels and cut
the delegate in two. Transformers unpack ``q, k, v = qkv.unbind(0)`` or ``qkv[0], qkv[1], qkv[2]`` in every
block.

The forms, each exact (they move the same elements, in the same order):

* ``select(x, d, i)`` -> ``slice(x, d, i, i + 1)`` -> ``reshape`` without dim ``d``;
* ``squeeze`` / ``unsqueeze`` -> ``reshape`` to the op's own output shape (sizes taken from the input,
  so a dynamic batch stays dynamic);
* ``unbind(x, d)[k]`` -> ``select(x, d, k)`` as above; ``split*(x, sizes, d)[k]`` -> ``slice`` of the
  k-th range (``chunk`` and ``split`` by their output sizes);
* ``alias(x)``, ``x.contiguous()`` and ``x.clone()`` (contiguous memory format) -> ``x``: they change no
  value, and a copy left in a chain of views stopped the rank reduction (an 8-D ``contiguous`` after a window
  partition's permute); ``cat([x])`` (a concatenation of one tensor, which 1.5.1's ``CatConfig`` refuses:
  "only support concatenation of > 2 tensors, got 1") -> ``x``.

int8: ``slice`` and ``reshape`` are share ops of the XNNPACK quantizer (their output takes their input's
quantization), so the rewritten form quantizes nothing new; the original ops were float (``squeeze.dim``
a share op too), and requantizing at the producer's own scale rounds nothing.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch

from xnnguard.graph.args import int_arg, int_list
from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.views.base import AliasAwarePass, replace_by, view_sizes

__all__ = ["ViewsAsSlicesPass"]

_aten = torch.ops.aten

_SELECTS = {_aten.select.int}
_SQUEEZES = {_aten.squeeze.default, _aten.squeeze.dim, _aten.squeeze.dims}
_UNSQUEEZES = {_aten.unsqueeze.default}
_ALIASES = {_aten.alias.default}
_CATS = {_aten.cat.default}  # of one tensor only
# Copies that change no value and, in a contiguous memory format, no dim order: ``x.contiguous()`` after
# a permute (a window partition's), ``x.clone()``.
_COPIES = {_aten.contiguous.default, _aten.clone.default}
_UNBINDS = {_aten.unbind.int}
_SPLITS = {_aten.split.Tensor, _aten.split_with_sizes.default, _aten.chunk.default}
TARGETS = frozenset(_SELECTS | _SQUEEZES | _UNSQUEEZES | _ALIASES | _CATS | _COPIES | _UNBINDS | _SPLITS)


def _dim(node: torch.fx.Node, position: int, default: int = 0) -> int:
    value = node.args[position] if len(node.args) > position else node.kwargs.get("dim", default)
    source = tensor_value(node.args[0])
    assert source is not None
    return int_arg(value) % max(source.dim(), 1)


def _static_dim(node: torch.fx.Node, dim: int) -> int | None:
    value = tensor_value(node.args[0])
    size = value.shape[dim] if value is not None else None
    return size if isinstance(size, int) else None


def _items(node: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The ``getitem`` users of a multi-output view (``unbind``, ``split``), or None if another op reads it."""
    users = list(node.users)
    if not all(u.target is operator.getitem and isinstance(u.args[1], int) for u in users):
        return None
    return users


def _single_cat_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """The one tensor a ``cat`` of one tensor concatenates, else None."""
    tensors = node.args[0]
    if node.target not in _CATS or not isinstance(tensors, (list, tuple)) or len(tensors) != 1:
        return None
    return tensors[0] if isinstance(tensors[0], torch.fx.Node) else None


def _value_copy_source(node: torch.fx.Node) -> torch.fx.Node | None:
    """The tensor a ``contiguous`` / ``clone`` copies, when the copy keeps a contiguous dim order, else None."""
    memory_format = node.kwargs.get("memory_format", node.args[1] if len(node.args) > 1 else None)
    source = node.args[0]
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        return None
    return source if isinstance(source, torch.fx.Node) and tensor_value(source) is not None else None


def _select(x: torch.Tensor, dim: int, index: int) -> torch.Tensor:
    piece = torch.ops.aten.slice.Tensor(x, dim, index, index + 1)
    return piece.reshape(view_sizes([*x.shape[:dim], *x.shape[dim + 1 :]]))


def _selecting(dim: int, index: int) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda v: _select(v, dim, index)


def _slicing(dim: int, start: int, end: int) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda v: torch.ops.aten.slice.Tensor(v, dim, start, end)


class ViewsAsSlicesPass(AliasAwarePass):
    """Rewrites select / squeeze / unsqueeze / alias / unbind / split into slices and reshapes."""

    rule = Rule.NOT_REWRITTEN  # reported; the portable kernels run what is left
    tags_what_it_leaves = False  # untagged: XNNPACK still takes what it can of the op as it is
    subject = "view"

    def chooses(self, node: torch.fx.Node) -> bool:
        if node.target in _CATS | _COPIES:  # a copy: neither it nor its source may be written in place
            copied = _single_cat_source(node) if node.target in _CATS else _value_copy_source(node)
            return copied is not None and not self.aliasing.is_written(copied) and not self.aliasing.is_written(node)
        if node.target not in TARGETS or not isinstance(node.args[0], torch.fx.Node):
            return False
        if self.aliasing.written_after(node):
            return False
        if node.target in _UNSQUEEZES:  # XNNPACK takes an unsqueeze of the trailing dim as it is
            source = tensor_value(node.args[0])
            return source is not None and int_arg(node.args[1]) % (source.dim() + 1) != source.dim()
        return True

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        if node.target in _CATS | _COPIES:
            source = _single_cat_source(node) if node.target in _CATS else _value_copy_source(node)
            assert source is not None
            node.replace_all_uses_with(source)
            return None
        x = node.args[0]
        assert isinstance(x, torch.fx.Node)
        if tensor_value(x) is None:
            return "its input is not a tensor"
        if node.target in _ALIASES:
            node.replace_all_uses_with(x)
            return None
        if node.target in _SQUEEZES | _UNSQUEEZES:
            return self._reshape(graph_module, node, x)
        if node.target in _SELECTS:
            dim = _dim(node, 1)
            size = _static_dim(node, dim)
            if size is None:
                return "the selected dim has a dynamic size"
            index = int_arg(node.args[2]) % size
            replace_by(graph_module, node, _selecting(dim, index), [x])
            return None
        items = _items(node)
        if items is None:
            return "an op other than getitem reads its outputs"
        if node.target in _UNBINDS:
            dim = _dim(node, 1)
            for item in items:
                index = int_arg(item.args[1])
                replace_by(graph_module, item, _selecting(dim, index), [x])
            return None
        return self._split(graph_module, node, x, items)

    @staticmethod
    def _reshape(graph_module: torch.fx.GraphModule, node: torch.fx.Node, x: torch.fx.Node) -> str | None:
        """``squeeze`` / ``unsqueeze`` as a reshape to its output shape, each size taken from the input."""
        before, after = tensor_value(x), tensor_value(node)
        assert before is not None
        if after is None:
            return "its output is not a tensor"
        kept = [
            d for d, size in enumerate(before.shape)
            if not (isinstance(size, int) and size == 1 and _squeezed(node, d, before.dim()))
        ]
        if node.target in _SQUEEZES:
            if len(kept) != after.dim():
                return "a squeezed dim has a dynamic size"
            sources: list[int | None] = list(kept)
        else:
            dim = int_arg(node.args[1]) % (before.dim() + 1)
            sources = [*range(dim), None, *range(dim, before.dim())]

        def reshape(v: torch.Tensor) -> torch.Tensor:
            return v.reshape(view_sizes([1 if d is None else v.shape[d] for d in sources]))

        replace_by(graph_module, node, reshape, [x])
        return None

    @staticmethod
    def _split(
        graph_module: torch.fx.GraphModule, node: torch.fx.Node, x: torch.fx.Node, items: list[torch.fx.Node]
    ) -> str | None:
        """``split*(x, ..., dim)[k]`` as the slice of the k-th range (the ranges from the outputs' sizes)."""
        dim = _dim(node, 2)
        pieces = node.meta.get("val")
        sizes = [piece.shape[dim] for piece in pieces] if isinstance(pieces, (list, tuple)) else None
        if sizes is None or not all(isinstance(size, int) for size in sizes):
            return "the split dim has a dynamic size"
        starts = [sum(sizes[:k]) for k in range(len(sizes))]
        for item in items:
            k = int_arg(item.args[1])
            start, end = starts[k], starts[k] + sizes[k]
            replace_by(graph_module, item, _slicing(dim, start, end), [x])
        return None


def _squeezed(node: torch.fx.Node, dim: int, rank: int) -> bool:
    """True when ``squeeze`` ``node`` squeezes ``dim`` (if its size is 1); False for an unsqueeze."""
    if node.target is _aten.squeeze.default:
        return True
    if node.target is _aten.squeeze.dim:
        return int_arg(node.args[1]) % max(rank, 1) == dim
    if node.target is _aten.squeeze.dims:
        return dim in {d % max(rank, 1) for d in int_list(node.args[1])}
    return False

