"""xnnguard's recipes for ``executorch.export``: the XNNPACK recipe kinds, lowered the xnnguard way.

::

    from executorch.export import ExportRecipe, export
    from xnnguard.recipes import XnnguardRecipeType

    session = export(model, [inputs], export_recipe=ExportRecipe.get_recipe(XnnguardRecipeType.FP32))

Importing this package registers ``XnnguardRecipeProvider`` with ExecuTorch's recipe registry under the
backend name ``"xnnguard"``; the stock ``"xnnpack"`` provider stays registered as it was. A release
without the recipe API (``xnnguard.boundary.releases.has_recipe_api``) makes the import fail with that said.
"""

from __future__ import annotations

from xnnguard.boundary import releases

if not releases.has_recipe_api():
    raise ImportError(
        f"xnnguard.recipes needs executorch.export's recipe API (ExportRecipe, BackendRecipeProvider, "
        f"recipe_registry), which ExecuTorch {releases.executorch_version()} does not have: lower with "
        "xnnguard.rewrite_for_xnnpack, xnnguard.XNNPACKQuantizer and xnnguard.XnnpackPartitioner directly"
    )

from executorch.export import recipe_registry

from xnnguard.recipes.provider import XnnguardRecipeProvider
from xnnguard.recipes.recipe_types import BACKEND_NAME, XnnguardRecipeType
from xnnguard.recipes.rewrite_steps import RewriteProgram, RewritingXNNPACKQuantizer

__all__ = [
    "BACKEND_NAME",
    "RewriteProgram",
    "RewritingXNNPACKQuantizer",
    "XnnguardRecipeProvider",
    "XnnguardRecipeType",
]

recipe_registry.register_backend_recipe_provider(XnnguardRecipeProvider())
