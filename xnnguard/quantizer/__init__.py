"""Quantizers: ExecuTorch's XNNPACK quantizer, made to leave in float what XNNPACK cannot run quantized."""

from xnnguard.quantizer.xnnpack_quantizer import QuantizedConv3dError, XNNPACKQuantizer

__all__ = ["QuantizedConv3dError", "XNNPACKQuantizer"]
