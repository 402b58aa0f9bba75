"""``xnnguard.XNNPACKQuantizer``: ExecuTorch's XNNPACK quantizer that leaves 3-D convolutions in float.

A drop-in for ``executorch.backends.xnnpack.quantizer.xnnpack_quantizer.XNNPACKQuantizer`` (same
constructor, same ``set_*`` methods, used with torchao's ``prepare_pt2e`` / ``convert_pt2e``). XNNPACK has
no 3-D convolution, so quantize/dequantize steps around one only add error and work; ExecuTorch 1.5.1
annotates them anyway. Here:

* a 3-D convolution or 3-D transposed convolution (``xnnguard.rules.conv3d``) is never annotated, and so
  neither is a ReLU or batch norm fused with it: the stock annotators are handed a filter that refuses
  the 3-D convolution, so each pattern holding one is skipped whole. The neighbours are then annotated
  by the stock code as next to any float op: nothing has to be stripped or re-pointed afterwards;
* ``set_operator_type(aten.conv3d | aten.conv_transpose3d, config)`` configures 3-D convolutions only,
  which stay float. (1.5.1 looks operator types up in a table that lists 1-D, 2-D and 3-D transposed
  convolutions together, so there the config reaches every transposed convolution.)
* ``report`` lists every 3-D convolution after ``annotate``, and an INFO line says so;
* the pieces of a rewritten op are quantized as that op (``xnnguard.quantizer.rewritten_ops``): those
  of an op left float stay float, those of a mean end at its input's quantization when that is
  quantized, so quantizing after ``rewrite_for_xnnpack`` adds no rounding;
* a zero pad keeps its input's quantization (``xnnguard.quantizer.shared_quantization``), so XNNPACK runs
  it int8 instead of failing to load it;
* with dynamic configs only, a 2-D convolution whose input 1.5.1 would lay out wrong (behind a view)
  reads it through a ``cat`` (``xnnguard.quantizer.dynamic_conv_input``), so it stays on XNNPACK, and a
  linear on a 4-D tensor 1.5.1 may hold channels-last (a conv's or pooling's output) reads it as 2-D rows
  (``xnnguard.quantizer.dynamic_linear_input``), so that its lowering does not fail;
* on a graph without batch norm the stock conv + batch norm patterns, which cannot match there, are not
  traced (``xnnguard.quantizer.batch_norm_patterns``): ``prepare_pt2e`` of a small model takes
  milliseconds instead of some 3 s, with the same annotation;
* ``annotate`` raises ``QuantizedConv3dError`` if a 3-D convolution is annotated all the same (by a
  quantizer that ran before this one).
"""

from __future__ import annotations

import logging

import torch
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils import propagate_annotation
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantizer import QuantizationConfig
from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

from xnnguard.boundary.stock_quantizer import ConfigFilteringQuantizer, NodeFilter
from xnnguard.quantizer.batch_norm_patterns import only_patterns_that_can_match
from xnnguard.quantizer.dynamic_conv_input import give_convs_cat_inputs
from xnnguard.quantizer.dynamic_linear_input import give_linears_2d_inputs
from xnnguard.quantizer.rewritten_ops import (
    keep_float_pieces,
    observe_inputs_as_the_original,
    rounding_notes,
    share_input_quantization_of_rewritten_ops,
)
from xnnguard.quantizer.shared_quantization import share_input_quantization
from xnnguard.report import KeptOut, Rule
from xnnguard.rules.conv3d import ConvKind, conv3d_kind, is_3d_convolution, is_3d_convolution_operator
from xnnguard.rules.dynamic_conv_kind import dynamic_quantization_refuses

__all__ = ["QuantizedConv3dError", "XNNPACKQuantizer"]

logger = logging.getLogger("xnnguard.quantizer")

_NO_3D_CONV = "XNNPACK has no 3-D convolution"


class QuantizedConv3dError(ValueError):
    """A 3-D convolution carries a quantization annotation although XNNPACK cannot run it quantized."""


class XNNPACKQuantizer(ConfigFilteringQuantizer):
    """ExecuTorch's ``XNNPACKQuantizer`` that quantizes everything it would, except 3-D convolutions.

    After ``annotate`` (called for you by ``prepare_pt2e``), ``report`` lists the 3-D convolutions of
    the model, which stay float (``left_in_float`` is the same list).
    """

    def __init__(self) -> None:
        super().__init__()
        self.report: list[KeptOut] = []

    @property
    def left_in_float(self) -> list[KeptOut]:
        """``report``, under its xnnguard 0.1 name."""
        return self.report

    def set_operator_type(
        self,
        operator_type: torch._ops.OpOverloadPacket,
        quantization_config: QuantizationConfig,
    ) -> XNNPACKQuantizer:
        if is_3d_convolution_operator(operator_type):
            logger.warning(
                "xnnguard: set_operator_type(%s) has no effect: 3-D convolutions stay float (%s); "
                "1-D/2-D convolutions keep the config they get otherwise",
                operator_type,
                _NO_3D_CONV,
            )
        super().set_operator_type(operator_type, quantization_config)
        return self

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        """The stock transform; with dynamic configs only, a cat input for the convs 1.5.1 would lay out wrong,
        and a 2-D input for the linears whose channels-last input it would take for float.

        Only then: a static config would quantize the cat, a rounding the model does not have.
        """
        if self._only_dynamic_configs():  # first: the stock transform turns scalar operands into tensors
            changed = give_convs_cat_inputs(model)
            if changed:
                logger.info("xnnguard: %d dynamically quantized conv(s) read their input through a cat: %s",
                            len(changed), ", ".join(changed))
            linears = give_linears_2d_inputs(model)
            if linears:
                logger.info("xnnguard: %d dynamically quantized linear(s) read their 4-D input as rows: %s",
                            len(linears), ", ".join(linears))
        return super().transform_for_annotation(model)

    def _configs(self) -> list[QuantizationConfig]:
        """Every config given: ``set_global``, and per operator type, module type and module name."""
        tables = ("operator_type_config", "module_type_config", "module_name_config")
        configs = [self.global_config, *(c for table in tables for c in getattr(self, table, {}).values())]
        return [config for config in configs if config is not None]

    def _only_dynamic_configs(self) -> bool:
        given = self._configs()
        return bool(given) and all(_is_dynamic(config) for config in given)

    def annotate(self, model: GraphModule) -> GraphModule:
        """The stock annotation, with every 3-D convolution left float and listed in ``left_in_float``.

        Postcondition (``QuantizedConv3dError`` otherwise): no 3-D convolution carries a quantization spec.
        It can only fail when something else annotated the graph first (an earlier quantizer of a
        ``ComposableQuantizer``), or when an ExecuTorch release annotates convolutions outside the
        filtered hook.
        """
        self.report = []
        keep_float_pieces(model)
        with only_patterns_that_can_match(self, model):  # a graph without batch norm: 3 s less
            model = super().annotate(model)
        # A rewritten mean and a zero pad share their input's quantization, and so must the share ops
        # (views, slices) after them, which the stock pass visited before either was annotated.
        while share_input_quantization_of_rewritten_ops(model) or share_input_quantization(model):
            propagate_annotation(model)
        observe_inputs_as_the_original(model)
        for node in model.graph.nodes:
            if is_3d_convolution(node) and _is_quantized(node):
                raise QuantizedConv3dError(
                    f"{node.name} ({node.target}) is annotated for quantization, but {_NO_3D_CONV}; was it "
                    "annotated before this quantizer ran (e.g. by an earlier quantizer of a ComposableQuantizer)?"
                )
        kinds = ((node, conv3d_kind(node)) for node in model.graph.nodes)
        left = [_left_in_float(node, kind) for node, kind in kinds if kind is not None]
        notes = rounding_notes(model)
        dynamic = any(_is_dynamic(config) for config in self._configs())
        self.report = left + (_dynamic_kinds_left_float(model) if dynamic else []) + notes
        names = ", ".join(record.node for record in left) or "none"
        noun = "convolution" if len(left) == 1 else "convolutions"
        logger.info("xnnguard: %d 3-D %s left in float (%s)", len(left), noun, names)
        for note in notes:
            logger.warning("xnnguard: %s", note)
        return model

    def config_filter(
        self,
        filter_fn: NodeFilter | None,
        operator_target: torch._ops.OpOverloadPacket | None,
        quantization_config: QuantizationConfig | None = None,
    ) -> NodeFilter | None:
        """Every config (``set_global``, ``set_operator_type``, ...) with 3-D convolutions filtered out, and a
        dynamic one with the convolutions XNNPACK does not run dynamically quantized too."""
        if operator_target is not None and is_3d_convolution_operator(operator_target):
            return None  # the config is meant for 3-D convolutions, which stay float: it must reach no other node
        dynamic = quantization_config is not None and _is_dynamic(quantization_config)
        return _refusing_3d_convolutions(filter_fn, refuse_dynamic_kinds=dynamic)


def _is_dynamic(config: QuantizationConfig) -> bool:
    return config.input_activation is not None and bool(config.input_activation.is_dynamic)


def _refusing_3d_convolutions(filter_fn: NodeFilter | None, *, refuse_dynamic_kinds: bool = False) -> NodeFilter:
    """``filter_fn``, except that it refuses every 3-D convolution (and with ``refuse_dynamic_kinds`` every
    convolution XNNPACK does not run dynamically quantized, ``xnnguard.rules.dynamic_conv_kind``).

    The stock annotators ask the filter about the nodes of a pattern, its convolution among them, before
    annotating any of them: one refusal leaves the whole pattern (with its fused ReLU) float.
    """

    def accepts(node: Node) -> bool:
        if is_3d_convolution(node) or (refuse_dynamic_kinds and dynamic_quantization_refuses(node) is not None):
            return False
        return filter_fn is None or filter_fn(node)

    return accepts


def _dynamic_kinds_left_float(model: GraphModule) -> list[KeptOut]:
    """A record for each convolution a dynamic config reached but XNNPACK does not run so: it stayed float."""
    records = []
    for node in model.graph.nodes:
        reason = dynamic_quantization_refuses(node)
        if reason is None or is_3d_convolution(node) or _is_quantized(node):
            continue
        records.append(KeptOut(node.name, str(node.target), Rule.DYNAMIC_CONV_KIND, f"left in float: {reason}"))
    return records


def _is_quantized(node: Node) -> bool:
    annotation = node.meta.get(Q_ANNOTATION_KEY)
    if annotation is None:
        return False
    has_input_spec = any(spec is not None for spec in annotation.input_qspec_map.values())
    return has_input_spec or annotation.output_qspec is not None


def _left_in_float(node: Node, kind: ConvKind) -> KeptOut:
    reason = f"{kind.value} at node {node.name} left in float: {_NO_3D_CONV}"
    return KeptOut(node.name, str(node.target), Rule.CONV3D, reason)  # aten.conv3d.default
