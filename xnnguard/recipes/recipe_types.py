"""``XnnguardRecipeType``: the recipe kinds of ExecuTorch's ``XNNPackRecipeType``, served by xnnguard's provider.

``ExportRecipe.get_recipe(recipe_type)`` asks the registry for the provider named by
``recipe_type.get_backend_name()``; these name ``"xnnguard"``, so the stock ``"xnnpack"`` provider and
its recipes stay as they are (a second provider named ``"xnnpack"`` would replace the stock one).
"""

from __future__ import annotations

from executorch.export import RecipeType

__all__ = ["BACKEND_NAME", "XnnguardRecipeType"]

BACKEND_NAME = "xnnguard"


class XnnguardRecipeType(RecipeType):
    """The members of ``XNNPackRecipeType``, by the same names."""

    FP32 = "xnnguard_fp32"
    # pt2e with xnnguard.XNNPACKQuantizer, calibrated on the example inputs
    PT2E_INT8_DYNAMIC_PER_CHANNEL = "xnnguard_pt2e_int8_dynamic_per_channel"
    PT2E_INT8_STATIC_PER_CHANNEL = "xnnguard_pt2e_int8_static_per_channel"
    PT2E_INT8_STATIC_PER_TENSOR = "xnnguard_pt2e_int8_static_per_tensor"
    # torchao int8 dynamic activations, int4 weights: per output channel, or per group (group_size, 32)
    TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_CHANNEL = "xnnguard_torchao_int8da_int4w_per_channel"
    TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR = "xnnguard_torchao_int8da_int4w_per_tensor"

    @classmethod
    def get_backend_name(cls) -> str:
        return BACKEND_NAME
