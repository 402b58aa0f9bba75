"""float16: what ExecuTorch's XNNPACK lowering leaves outside XNNPACK only because a program is float16.

``RewriteHalfGeluPass`` (``gelu``): 1.4 and 1.5's ``GeluConfig`` refuses a float16 GELU.
``RewriteHalfActivationsPass`` (``activations``): ``to_edge`` decomposes a float16 SiLU or hardsigmoid
through float32 and back, conversions no XNNPACK config takes. ``ScalarOperandsPass``
(``scalars``): ``to_edge`` turns a number operand (``x * 0.5``) into a float32 tensor and a conversion to
float16 (or bfloat16) that no XNNPACK config takes. Neither pass touches float32 programs, which lower
these whole.
"""

from __future__ import annotations

from xnnguard.rewrite.half.activations import RewriteHalfActivationsPass
from xnnguard.rewrite.half.gelu import RewriteHalfGeluPass
from xnnguard.rewrite.half.scalars import ScalarOperandsPass

__all__ = ["RewriteHalfActivationsPass", "RewriteHalfGeluPass", "ScalarOperandsPass"]
