"""On a graph no rule of xnnguard's touches, xnnguard's partitions are exactly ExecuTorch's.

The partitioner wraps the stock configs instead of copying the stock matching loop; this is the test of
that: the same partitions (by their nodes), the same number of delegates, the same outputs, on every
supported release (``make compat`` runs it on each).
"""

from __future__ import annotations

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner as StockXnnpackPartitioner
from executorch.exir import EdgeProgramManager, to_edge_transform_and_lower
from executorch.exir.lowered_backend_module import LoweredBackendModule

import xnnguard
from testbed.lowered import run_pte
from testbed.quantize import quantize_pt2e, xnnpack_quantizer
from tests.support import own_records, rows_in_slow_tier
from xnnguard.example_models import LinearModel

pytestmark = pytest.mark.release_sensitive


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, stride=2),
            torch.nn.Hardtanh(),
        )
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class SmallViT(torch.nn.Module):
    """Patch embedding, one pre-norm attention block with 2 heads, an MLP, a classifier: tensors up to 4-D."""

    def __init__(self, dim: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Conv2d(3, dim, 4, stride=4)
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim))
        self.head = torch.nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x).flatten(2).transpose(1, 2)  # (B, T, C)
        batch, length, dim = tokens.shape
        q, k, v = self.qkv(self.norm1(tokens)).reshape(batch, length, 3, self.heads, -1).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        attention = torch.softmax(q @ k.transpose(-2, -1) * (dim // self.heads) ** -0.5, dim=-1)
        tokens = tokens + self.proj((attention @ v).transpose(1, 2).reshape(batch, length, dim))
        tokens = tokens + self.mlp(self.norm2(tokens))
        return self.head(tokens.mean(dim=1))


CASES = {
    "cnn-float": (SmallCNN, (1, 3, 16, 16), None),
    "cnn-static_int8": (SmallCNN, (1, 3, 16, 16), "static"),
    "cnn-dynamic_int8": (SmallCNN, (1, 3, 16, 16), "dynamic"),
    "vit-float": (SmallViT, (1, 3, 16, 16), None),
    "vit-static_int8": (SmallViT, (1, 3, 16, 16), "static"),
    "vit-dynamic_int8": (SmallViT, (1, 3, 16, 16), "dynamic"),
    "linear-static_int8": (LinearModel, (4, 16), "static"),
    "linear-dynamic_int8": (LinearModel, (4, 16), "dynamic"),
}


def _partitions(edge: EdgeProgramManager) -> list[list[str]]:
    """Each delegate's operator nodes, by name: what the partition took."""
    gm = edge.exported_program().graph_module
    return sorted(
        sorted(node.name for node in child.original_module.graph.nodes if node.op == "call_function")
        for _, child in gm.named_children()
        if isinstance(child, LoweredBackendModule)
    )


# The ViT's int8 rows take 15-20 s each: slow; the CNN and linear int8 rows check the same partitioning.
SLOW = ("vit-static_int8", "vit-dynamic_int8")


@pytest.mark.parametrize("case", rows_in_slow_tier(CASES, SLOW))
def test_xnnguards_partitions_are_the_stock_partitions_where_no_rule_fires(case: str) -> None:
    torch.manual_seed(0)
    model_cls, shape, quantization = CASES[case]
    model, inputs = model_cls().eval(), (torch.randn(shape),)
    if quantization is not None:
        quantizer = xnnpack_quantizer(per_channel=True, dynamic=quantization == "dynamic")
        model = quantize_pt2e(model, inputs, quantizer)
    ep = torch.export.export(model, inputs)
    stock = to_edge_transform_and_lower(ep, partitioner=[StockXnnpackPartitioner()])
    partitioner = xnnguard.XnnpackPartitioner()
    guarded = to_edge_transform_and_lower(ep, partitioner=[partitioner])
    assert own_records(partitioner.report) == []  # the premise: no rule of xnnguard's fired
    assert _partitions(guarded) == _partitions(stock)
    assert len(_partitions(guarded)) >= 1
    outputs = [run_pte(edge.to_executorch().buffer, inputs)[0] for edge in (stock, guarded)]
    torch.testing.assert_close(outputs[1], outputs[0], atol=0, rtol=0)
