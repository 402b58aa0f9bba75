"""``scaled_dot_product_attention`` as the two ``bmm`` and the softmax it computes.

Invariant established: no ``scaled_dot_product_attention`` with a constant ``attn_mask`` or none (or
``is_causal`` over static lengths), ``dropout_p=0``, no grouped-query broadcast and equal batch dims of
query, key and value is left. ``to_edge`` decomposes it into the math form, whose ``_safe_softmax`` (``eq``,
``logical_not``, ``any``, ``full_like``, ``where``: rows that are all ``-inf`` give 0 instead of NaN),
``mul.Scalar`` scalings and ``expand_copy`` operands ExecuTorch 1.5.1's XNNPACK partitioner has no
configs for: each attention of Hiera, of an SDPA ViT (Hugging Face's VideoMAE) and of every tower that
passes a padding mask (Hugging Face's vision towers build one from the input's shape: a constant once
``FoldConstantsPass`` ran) was cut into pieces around them.

The form: ``softmax((q * scale) @ k^T + mask, -1) @ v`` with both products as one ``bmm`` each on the batch
dims flattened (``xnnguard.rewrite.views.matmul.matmul_as_bmm``); ``scale`` is the op's own (default
``1/sqrt(E)``); a boolean mask is the additive one it stands for (0 where true, ``-inf`` where false); a
causal attention's mask is PyTorch's own lower triangle of ones (fuzz seed 204: its decomposition's
``arange``/``full`` arithmetic cut the program in three). Why it
is exact: a constant mask is known here, so are its rows that are all ``-inf``; where there are such rows they
are added as 0s (a softmax of all ``-inf`` is NaN, which no multiply takes back) and the output is multiplied
by a constant that is 0 on them and 1 elsewhere: the 0 the safe softmax gives them (eager PyTorch too); every
other row has a finite score, so there the softmax is the safe one. Exact up to the rounding of the scaled
scores (the math form scales q and k by ``sqrt(scale)`` each). A mask computed at run time is left as it is:
which rows are all ``-inf`` is known only then.

int8: the stock quantizer leaves attention float; so are its pieces (``pieces_stay_float``): a
quantized scaling multiply would round where the original does not.
"""

from __future__ import annotations

import math

import torch

from xnnguard.graph.shapes import same_size, tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.constants import constant_value
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.views.base import replace_by
from xnnguard.rewrite.views.matmul import matmul_as_bmm
from xnnguard.rules.tagged import tag_of

__all__ = ["AttentionAsBmmPass", "additive_mask", "attention_as_bmm", "rows_kept"]

_aten = torch.ops.aten
_SDPA = _aten.scaled_dot_product_attention.default
_DEFAULTS: dict[str, object] = {
    "attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False,
}
_POSITIONS = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal"]


def attention_as_bmm(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """``softmax(q @ k^T * scale + mask) @ v`` with two ``bmm`` (batch dims of q, k, v equal), times ``keep``."""
    scores = matmul_as_bmm(q * scale, k.transpose(-2, -1), None, None)
    if mask is not None:
        scores = scores + mask
    out = matmul_as_bmm(torch.softmax(scores, -1), v, None, None)
    return out if keep is None else out * keep


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The float mask added to the scores: a boolean mask is 0 where true, ``-inf`` where false."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float("-inf"))
    return mask.to(dtype)


def rows_kept(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The mask to add, and 1 on its rows with a finite score, 0 on those all ``-inf`` (None if none is).

    A row all ``-inf`` is added as 0s instead: its softmax would be NaN (``-inf - -inf``), which no
    multiply by 0 takes back; its output row is then multiplied by 0, which is what eager gives.
    """
    masked = torch.isneginf(mask).all(dim=-1, keepdim=True)
    if not bool(masked.any()):
        return mask, None
    return mask.masked_fill(masked, 0.0), (~masked).to(mask.dtype)


def _arguments(node: torch.fx.Node) -> dict[str, object]:
    found: dict[str, object] = dict(_DEFAULTS)
    found.update(zip(_POSITIONS, node.args))
    found.update(node.kwargs)
    return found


class AttentionAsBmmPass(NodeRewritePass):
    """Rewrites each scaled dot-product attention with a constant mask, a causal one or none into bmm, softmax, bmm."""

    rule = Rule.NOT_REWRITTEN  # reported; the portable kernels run what is left
    tags_what_it_leaves = False  # untagged: XNNPACK still takes what it can of the op as it is
    subject = "scaled dot-product attention"
    pieces_stay_float = True

    def picks(self, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and node.target is _SDPA and not tag_of(node)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        found = _arguments(node)
        if found["dropout_p"] or found["enable_gqa"]:
            return "it drops out or broadcasts key/value heads"
        q, k, v = found["query"], found["key"], found["value"]
        values = [tensor_value(t) for t in (q, k, v)]
        if any(value is None for value in values) or not all(isinstance(t, torch.fx.Node) for t in (q, k, v)):
            return "its operands are not tensors"
        vq, vk, vv = values
        assert vq is not None and vk is not None and vv is not None
        if not (vq.dim() == vk.dim() == vv.dim() >= 3) or len({vq.dtype, vk.dtype, vv.dtype}) != 1:
            return "its operands differ in rank or dtype"
        batches = [vq.shape[:-2], vk.shape[:-2], vv.shape[:-2]]
        if not all(same_size(a, b) for other in batches[1:] for a, b in zip(batches[0], other)):
            return "its batch dims differ (a broadcast)"
        embed = vq.shape[-1]
        scale = found["scale"]
        if scale is None:
            if not isinstance(embed, int):
                return "a dynamic head dim"
            scale = 1.0 / math.sqrt(embed)
        if not isinstance(scale, (int, float)):
            return "its scale is not a constant"
        factor = float(scale)
        assert isinstance(q, torch.fx.Node) and isinstance(k, torch.fx.Node) and isinstance(v, torch.fx.Node)
        inputs: list[torch.fx.Node | torch.Tensor] = [q, k, v]
        if found["is_causal"]:
            if found["attn_mask"] is not None:
                return "it is causal and masked (PyTorch refuses both)"
            length, source = vq.shape[-2], vk.shape[-2]
            if not (isinstance(length, int) and isinstance(source, int)):
                return "it is causal over a dynamic length (its mask's size is known only at run time)"
            causal = torch.ones(length, source, dtype=torch.bool).tril()  # PyTorch's own causal mask
            mask, keep = rows_kept(additive_mask(causal, vq.dtype))
            inputs += [mask] if keep is None else [mask, keep]
        elif found["attn_mask"] is not None:
            value = constant_value(graph_module, found["attn_mask"])
            if value is None:
                return "its mask is computed at run time (which rows are all -inf is known only then)"
            mask, keep = rows_kept(additive_mask(value, vq.dtype))
            inputs += [mask] if keep is None else [mask, keep]
        replace_by(graph_module, node, lambda a, b, c, *more: attention_as_bmm(a, b, c, factor, *more), inputs)
        graph_module.graph.erase_node(node)  # its dropout makes it impure: dead code elimination keeps it
        return None
