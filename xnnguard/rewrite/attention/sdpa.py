"""``scaled_dot_product_attention`` without a mask as the two ``bmm`` and the softmax it computes.

Invariant established: no ``scaled_dot_product_attention`` with no ``attn_mask``, ``is_causal=False``,
``dropout_p=0``, no grouped-query broadcast and equal batch dims of query, key and value is left.
``to_edge`` decomposes it into the math form, whose ``_safe_softmax`` (``eq``, ``logical_not``, ``any``,
``full_like``, ``where``: rows that are all ``-inf`` give 0 instead of NaN), ``mul.Scalar`` scalings and
``expand_copy`` operands ExecuTorch 1.5.1's XNNPACK partitioner has no configs for: each attention of
Hiera or of an SDPA ViT (Hugging Face's VideoMAE) was cut into pieces around them.

The form: ``softmax((q * scale) @ k^T, -1) @ v`` with both products as one ``bmm`` each on the batch dims
flattened (``xnnguard.rewrite.views.matmul.matmul_as_bmm``); ``scale`` is the op's own (default
``1/sqrt(E)``). Without a mask no score is ``-inf``, so the safe softmax is the softmax. Exact up to the
rounding of the scaled scores (the math form scales q and k by ``sqrt(scale)`` each).

int8: the stock quantizer leaves attention float; so are its pieces (``pieces_stay_float``): a
quantized scaling multiply would round where the original does not.
"""

from __future__ import annotations

import math

import torch

from xnnguard.graph.shapes import same_size, tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.views.base import replace_by
from xnnguard.rewrite.views.matmul import matmul_as_bmm
from xnnguard.rules.tagged import tag_of

__all__ = ["AttentionAsBmmPass", "attention_as_bmm"]

_aten = torch.ops.aten
_SDPA = _aten.scaled_dot_product_attention.default
_DEFAULTS: dict[str, object] = {
    "attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False,
}
_POSITIONS = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal"]


def attention_as_bmm(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """``softmax(q @ k^T * scale) @ v`` with two ``bmm`` (batch dims of q, k, v equal)."""
    scores = matmul_as_bmm(q * scale, k.transpose(-2, -1), None, None)
    return matmul_as_bmm(torch.softmax(scores, -1), v, None, None)


def _arguments(node: torch.fx.Node) -> dict[str, object]:
    found: dict[str, object] = dict(_DEFAULTS)
    found.update(zip(_POSITIONS, node.args))
    found.update(node.kwargs)
    return found


class AttentionAsBmmPass(NodeRewritePass):
    """Rewrites each unmasked, non-causal scaled dot-product attention into bmm, softmax, bmm."""

    rule = Rule.NOT_REWRITTEN  # reported; the portable kernels run what is left
    tags_what_it_leaves = False  # untagged: XNNPACK still takes what it can of the op as it is
    subject = "scaled dot-product attention"
    pieces_stay_float = True

    def picks(self, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and node.target is _SDPA and not tag_of(node)

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        found = _arguments(node)
        if found["attn_mask"] is not None:
            return "it has a mask (a row that is all -inf would differ)"
        if found["is_causal"] or found["dropout_p"] or found["enable_gqa"]:
            return "it is causal, drops out, or broadcasts key/value heads"
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
        replace_by(graph_module, node, lambda a, b, c: attention_as_bmm(a, b, c, factor), [q, k, v])
        graph_module.graph.erase_node(node)  # its dropout makes it impure: dead code elimination keeps it
        return None
