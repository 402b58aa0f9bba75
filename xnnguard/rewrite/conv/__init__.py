"""2-D convolutions in the forms XNNPACK's own define-time checks take (beyond what ExecuTorch 1.5.1's
configs check)."""

from __future__ import annotations

from xnnguard.rewrite.conv.transposed_output_padding import TransposedOutputPaddingPass

__all__ = ["TransposedOutputPaddingPass"]
