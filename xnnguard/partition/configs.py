"""ExecuTorch's XNNPACK partitioner configs where xnnguard's partitioner needs them to decide otherwise.

Each is a subclass of the stock config it replaces (``GUARDED_CONFIGS`` maps one to the other), so the
stock matching, checks and dependencies stay ExecuTorch's; a subclass changes one decision, says which
and why.
"""

from __future__ import annotations

from typing import Any

import torch
from executorch.backends.xnnpack.partition.config.gemm_configs import AddmmConfig, MMConfig
from executorch.backends.xnnpack.partition.config.generic_node_configs import ConstantPadConfig, SliceCopyConfig
from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType, XNNPartitionerConfig
from executorch.backends.xnnpack.utils.quant_utils import is_dequant
from torch.export import ExportedProgram

from xnnguard.partition.symbolic_slice import keeps_symbolic_dims_whole
from xnnguard.rules.quantization_match import quantization_mismatch

__all__ = ["GUARDED_CONFIGS"]


class _QuantAwareForceFlag:
    """``force_non_static_weights_for_f32_linear`` concerns float linears.

    1.5.1 intersects a linear's dependencies with its source partition whenever the flag is set, which
    drops the dequantize nodes of a *quantized* linear: a static one then fails to lower ("Weight and
    Input should both be quantized"), a dynamic one runs as a float matmul. The flag is ignored here
    when the linear's weight comes from a dequantize.
    """

    force_non_static_weights_for_f32_linear: bool
    weight_idx: int

    def get_deps_from_src_partition(self, node: torch.fx.Node, ep: ExportedProgram, src_partition: Any) -> Any:
        force = self.force_non_static_weights_for_f32_linear
        if not (force and self._weight_is_quantized(node, src_partition)):
            return super().get_deps_from_src_partition(node, ep, src_partition)  # type: ignore[misc]
        self.force_non_static_weights_for_f32_linear = False
        try:
            return super().get_deps_from_src_partition(node, ep, src_partition)  # type: ignore[misc]
        finally:
            self.force_non_static_weights_for_f32_linear = force

    def _weight_is_quantized(self, node: torch.fx.Node, src_partition: Any) -> bool:
        # The same walk 1.5.1 does to find the linear's weight among the source partition's inputs.
        weight = node.args[self.weight_idx]
        while isinstance(weight, torch.fx.Node) and weight.all_input_nodes and weight not in src_partition.input_nodes:
            weight = weight.all_input_nodes[0]
        return isinstance(weight, torch.fx.Node) and is_dequant(weight)


class _AddmmConfig(_QuantAwareForceFlag, AddmmConfig):
    pass


class _MMConfig(_QuantAwareForceFlag, MMConfig):
    pass


class _Int8ConstantPadConfig(ConstantPadConfig):
    """A constant pad also int8: ``dequantize -> pad -> quantize`` with one quantization is an int8 pad.

    1.5.1 takes a pad as a float op only, so a pad between two int8 ops costs two converts (and, read by
    a float op, trips ``InsertPadQDQPass``: ``xnnguard.rules.quantized_pad``). XNNPACK's static constant
    pad runs int8 when its input and output share one quantization (the partitioner checks that match,
    ``xnnguard.rules.quantization_match``); xnnguard's quantizer gives a zero pad its input's.
    """

    def supported_precision_types(self) -> list[ConfigPrecisionType]:
        return [ConfigPrecisionType.FP32, ConfigPrecisionType.STATIC_QUANT]


class _SliceConfig(SliceCopyConfig):
    """Two slices 1.5.1 refuses are taken; the other checks are the stock ones (1.4 makes only those).

    * A slice between a dequantize and a quantize of other parameters, as the float op it also is.
      XNNPACK slices int8 only within one quantization, and 1.5.1 refuses such a slice outright: a
      delegate boundary for each class token a ``cat`` quantizes anew (MViT). xnnguard's guard takes
      it as a float slice, its q/dq conversions of their own (``xnnguard.rules.quantization_match``),
      as it does a transpose.
    * A slice along a static dim of a tensor with a dynamic batch, which keeps the symbolic dims whole:
      exact on XNNPACK at every batch (``xnnguard.partition.symbolic_slice``).
    """

    def check_constraints(self, node: torch.fx.Node, ep: ExportedProgram) -> bool:
        if super().check_constraints(node, ep):
            return True
        if not self.check_common_constraints(node, ep):
            return False
        if keeps_symbolic_dims_whole(node):
            return True
        around = {*node.all_input_nodes, *node.users}
        if quantization_mismatch(node, around) is None:
            return False  # refused for another reason
        stride = node.args[4] if len(node.args) > 4 else 1
        shapes = (node.all_input_nodes[0].meta["val"].shape, node.meta["val"].shape)
        static = all(isinstance(size, int) and size != 0 for shape in shapes for size in shape)
        return bool(stride == 1 and static)


GUARDED_CONFIGS: dict[type[XNNPartitionerConfig], type[XNNPartitionerConfig]] = {
    AddmmConfig: _AddmmConfig,
    MMConfig: _MMConfig,
    ConstantPadConfig: _Int8ConstantPadConfig,
    SliceCopyConfig: _SliceConfig,
}
