"""``XnnguardRecipeProvider``: ExecuTorch's XNNPACK recipes, with xnnguard's rewrite, quantizer and partitioner.

Each recipe is the stock one of the same kind (same quantization configs, same edge compile config,
same ExecuTorch backend config), with three parts replaced:

* ``rewrite_for_xnnpack`` runs on the ATen program before pt2e quantization (``rewrite_steps``);
* ``xnnguard.XNNPACKQuantizer`` in place of the stock quantizer;
* ``xnnguard.XnnpackPartitioner`` in place of the stock partitioner. The stock recipes pass it a
  ``precision_type`` that no config reads (every precision stays enabled); xnnguard's recipes give the
  partitioner no precision either, so they partition as the stock ones do.

The recipes use only the recipe fields every release with the recipe API has (1.4 and 1.5:
``quantizers``, ``ao_quantization_configs``, ``aten_transform_passes``, ``lowering_recipe``,
``executorch_backend_config``), so they behave the same on each; 1.5's additions (calibration inputs,
QAT, ``*_passes``) can be set on the returned recipe as on a stock one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config
from executorch.backends.xnnpack.utils.configs import (
    get_xnnpack_edge_compile_config,
    get_xnnpack_executorch_backend_config,
)
from executorch.export import (
    AOQuantizationConfig,
    BackendRecipeProvider,
    ExportRecipe,
    LoweringRecipe,
    QuantizationRecipe,
    RecipeType,
)

from xnnguard.partition import XnnpackPartitioner
from xnnguard.recipes.int4_linears import INT4_BLOCK, Int4WhereXnnpackTakesIt
from xnnguard.recipes.recipe_types import BACKEND_NAME, XnnguardRecipeType
from xnnguard.recipes.rewrite_steps import RewriteProgram, RewritingXNNPACKQuantizer

__all__ = ["XnnguardRecipeProvider"]

_PT2E = {  # recipe -> (per channel, dynamic)
    XnnguardRecipeType.PT2E_INT8_DYNAMIC_PER_CHANNEL: (True, True),
    XnnguardRecipeType.PT2E_INT8_STATIC_PER_CHANNEL: (True, False),
    XnnguardRecipeType.PT2E_INT8_STATIC_PER_TENSOR: (False, False),
}
_TORCHAO = (
    XnnguardRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_CHANNEL,
    XnnguardRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR,
)
_DEFAULT_GROUP_SIZE = 32  # the stock per-tensor (per-group) torchao recipe's


class XnnguardRecipeProvider(BackendRecipeProvider):
    """Serves ``XnnguardRecipeType`` to ``executorch.export``'s recipe registry, under the name ``"xnnguard"``."""

    @property
    def backend_name(self) -> str:
        return BACKEND_NAME

    def get_supported_recipes(self) -> Sequence[RecipeType]:
        return list(XnnguardRecipeType)

    def create_recipe(self, recipe_type: RecipeType, **kwargs: Any) -> ExportRecipe | None:
        """The recipe of ``recipe_type`` (None for a type of another backend, as the registry expects).

        Only the per-tensor torchao recipe takes a parameter, ``group_size`` (an int, 32 by default); any
        other keyword raises ``TypeError`` instead of being ignored.
        """
        if recipe_type not in self.get_supported_recipes():
            return None
        per_group = recipe_type is XnnguardRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_TENSOR
        accepted = {"group_size"} if per_group else set()
        unexpected = sorted(set(kwargs) - accepted)
        if unexpected:
            takes = "only group_size" if accepted else "no parameters"
            raise TypeError(f"recipe {recipe_type.value} takes {takes}, not {', '.join(unexpected)}")
        if recipe_type is XnnguardRecipeType.FP32:
            return _recipe(recipe_type, None, aten_rewrite=True)
        if recipe_type in _PT2E:
            per_channel, dynamic = _PT2E[recipe_type]
            quantizer = RewritingXNNPACKQuantizer()
            quantizer.set_global(get_symmetric_quantization_config(is_per_channel=per_channel, is_dynamic=dynamic))
            return _recipe(recipe_type, QuantizationRecipe(quantizers=[quantizer]), aten_rewrite=False)
        group_size = kwargs.get("group_size", _DEFAULT_GROUP_SIZE)
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive int, not {group_size!r}")
        if group_size % INT4_BLOCK:
            raise ValueError(f"group_size must be a multiple of {INT4_BLOCK}: XNNPACK takes int4 weights in blocks of "
                             f"a multiple of {INT4_BLOCK} input features, not {group_size}")
        per_channel = recipe_type is XnnguardRecipeType.TORCHAO_INT8_DYNAMIC_ACT_INT4_WEIGHT_PER_CHANNEL
        return _recipe(recipe_type, _torchao_int8_int4(per_channel, group_size), aten_rewrite=True)


def _recipe(recipe_type: RecipeType, quantization: QuantizationRecipe | None, *, aten_rewrite: bool) -> ExportRecipe:
    lowering = LoweringRecipe(
        partitioners=[XnnpackPartitioner()], edge_compile_config=get_xnnpack_edge_compile_config()
    )
    return ExportRecipe(
        name=recipe_type.value,
        quantization_recipe=quantization,
        aten_transform_passes=[RewriteProgram()] if aten_rewrite else None,
        lowering_recipe=lowering,
        executorch_backend_config=get_xnnpack_executorch_backend_config(),
    )


def _torchao_int8_int4(per_channel: bool, group_size: int) -> QuantizationRecipe:
    """torchao's int8 dynamic activation, int4 weight scheme (per output channel, or per group of inputs) on
    the linears XNNPACK takes it for, int8 weights on the others (``xnnguard.recipes.int4_linears``)."""
    config = Int4WhereXnnpackTakesIt(None if per_channel else group_size)
    return QuantizationRecipe(quantizers=None, ao_quantization_configs=[AOQuantizationConfig(config, config.select)])
