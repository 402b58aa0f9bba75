"""The one boundary between xnnguard and ExecuTorch: every ExecuTorch name xnnguard uses, why, and since when.

When ExecuTorch ships a release, this is the list to read. Two kinds of names are used:

* **public** ones (a module path and a name without a leading underscore), imported where they are used;
* **private** ones (a leading underscore anywhere in the path, an attribute the stock code keeps for
  itself, a file read inside the package, text ExecuTorch only logs), reached only through the modules of
  this package: ``releases`` (the supported releases and what differs between them), ``runtime`` (the
  pybindings), ``package_files`` (schemas, constants and ``flatc`` inside the package),
  ``xnnpack_constants``, ``edge_ops``, ``stock_quantizer`` (the quantizer's per-config hook and pattern
  list) and ``why_no_partition`` (a stock config's reason for refusing a node).

``REACHED`` lists both kinds. ``tests/test_boundary.py`` fails when a module outside this package
imports a name the list lacks, imports or calls a private one, or reads a file inside the ExecuTorch
package; on each supported release it checks that every listed name resolves there from its ``since``.
Nothing here is imported at ``import xnnguard`` time but ``releases`` and ``package_files``, which import
neither torch nor ExecuTorch.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["REACHED", "Reached"]


@dataclass(frozen=True)
class Reached:
    """One ExecuTorch name (a dotted path, or ``file:`` and a path inside the package) xnnguard depends on."""

    name: str
    why: str
    since: str = "1.4.0"  # the first supported release that has it; "1.4.0": every supported release

    @property
    def is_file(self) -> bool:
        return self.name.startswith("file:")

    @property
    def private(self) -> bool:
        """A file, or a name with a leading underscore in its path: reached only through this package."""
        return self.is_file or any(part.startswith("_") for part in self.name.split("."))


_XNNPACK = "executorch.backends.xnnpack"
_PYBINDINGS = "executorch.extension.pybindings.portable_lib"
_CONFIG_PARTITIONER = "executorch.exir.backend.canonical_partitioners.config_partitioner"
_QUANT_UTILS = f"{_XNNPACK}.utils.quant_utils"
_STOCK_QUANTIZER = f"{_XNNPACK}.quantizer.xnnpack_quantizer"

REACHED: tuple[Reached, ...] = (
    # The runtime (boundary.runtime): every pybindings function is underscored, the documented ones too.
    Reached(_PYBINDINGS, "ExecuTorch's Python runtime: load and run programs for real"),
    Reached(f"{_PYBINDINGS}._load_program", "load a .pte file's methods one by one (verify --load/--run)"),
    Reached(f"{_PYBINDINGS}.Verification", "load with InternalConsistency, the strictest level a program meets"),
    Reached(f"{_PYBINDINGS}._load_program_from_buffer", "the same from bytes (the demo, tests)"),
    Reached(f"{_PYBINDINGS}._load_for_executorch", "a Module from a file: benchmarks time forward()"),
    Reached(f"{_PYBINDINGS}._load_for_executorch_from_buffer", "a Module from bytes: lower-run-compare flows"),
    Reached(f"{_PYBINDINGS}._get_operator_names", "the kernel registry: operators with no kernel (verify)"),
    Reached(f"{_PYBINDINGS}._get_registered_backend_names", "the backend registry: delegates no backend loads"),
    Reached(f"{_PYBINDINGS}._unsafe_reset_threadpool", "size the thread pool per verify worker and benchmark"),
    # Files inside the package (boundary.package_files), read without importing the export stack.
    Reached("file:exir/_serialize/program.fbs", "the Program flatbuffer's layout, for verify's reader"),
    Reached("file:backends/xnnpack/serialization/runtime_schema.fbs", "the XNNPACK graph's layout, for verify"),
    Reached("file:include/executorch/runtime/executor/program.h",
            "kMaxSupportedSchemaVersion: the newest Program version the runtime loads (absent before 1.5)"),
    Reached("file:include/executorch/extension/flat_tensor/flat_tensor_data_map.h",
            "kMaxSupportedSchemaVersion: the newest .ptd version the runtime loads", "1.5.1"),
    Reached("file:extension/flat_tensor/serialize/flat_tensor.fbs",
            "a .ptd file's layout: the named data verify --data resolves constants in"),
    Reached("file:backends/xnnpack/utils/xnnpack_constants.py", "XNN_MAX_TENSOR_DIMS and value flags, for the rules"),
    Reached("file:data/bin/flatc", "FLATC_EXECUTABLE for releases that look for flatc on PATH only"),
    # Internals of the lowering stack.
    Reached("executorch.exir.dialects.edge._ops.EdgeOpOverload", "tell an edge-dialect op from an ATen one"),
    Reached(f"{_STOCK_QUANTIZER}.XNNPACKQuantizer._annotate_all_patterns",
            "the per-config hook every set_* config goes through: 3-D convolutions filtered out"),
    Reached(f"{_STOCK_QUANTIZER}.XNNPACKQuantizer.SUPPORTED_PATTERNS",
            "the pattern list that hook loops over: conv + batch norm patterns skipped on graphs without one"),
    Reached("executorch.exir.backend.utils.WhyNoPartition",
            "a stock config's reason for refusing a node, logged at DEBUG only: caught for the report"),
    Reached("executorch.exir.backend.partitioner.Partitioner.transform_for_pre_decomposition",
            "the pre-decomposition hook the partitioner's forms run from (1.4: ops_to_not_decompose)", "1.5.0"),
    Reached("executorch.kernels.quantized", "q/dq kernels for q/dq left outside XNNPACK (1.4.0 needs a reload)"),
    # Public names, imported where they are used.
    Reached("executorch.exir.to_edge_transform_and_lower", "the demo lowers the way users do"),
    Reached(f"{_XNNPACK}.partition.xnnpack_partitioner.XnnpackPartitioner", "the class the drop-in extends"),
    Reached(f"{_XNNPACK}.partition.config.ALL_PARTITIONER_CONFIGS", "the stock configs, each wrapped in a guard"),
    Reached(f"{_XNNPACK}.partition.config.xnnpack_config.XNNPartitionerConfig", "what a config is"),
    Reached(f"{_XNNPACK}.partition.config.xnnpack_config.ConfigPrecisionType", "a config's precisions"),
    Reached(f"{_XNNPACK}.partition.config.gemm_configs.AddmmConfig", "replaced: float linears only"),
    Reached(f"{_XNNPACK}.partition.config.gemm_configs.MMConfig", "replaced: float linears only"),
    Reached(f"{_XNNPACK}.partition.config.generic_node_configs.ConstantPadConfig", "replaced: int8 pads"),
    Reached(f"{_XNNPACK}.partition.config.generic_node_configs.SliceCopyConfig", "replaced: symbolic slices"),
    Reached(f"{_CONFIG_PARTITIONER}.PartitionerConfig", "the guard is a config the stock loop asks"),
    Reached(f"{_CONFIG_PARTITIONER}.format_target_name", "the target name a config is registered under"),
    Reached(f"{_CONFIG_PARTITIONER}.is_constant_data", "constants follow their partition"),
    Reached("executorch.exir.backend.partitioner.PartitionResult", "what partition() returns"),
    Reached(f"{_QUANT_UTILS}.IS_IMPLICIT_Q_DQ_TAG", "the implicit q/dq mark, set once a partition is taken"),
    Reached(f"{_QUANT_UTILS}.tag_as_implicit_q_dq", "set that mark"),
    Reached(f"{_QUANT_UTILS}.is_quant", "what a quantize node is"),
    Reached(f"{_QUANT_UTILS}.is_dequant", "what a dequantize node is"),
    Reached(f"{_QUANT_UTILS}.is_qparam", "what a choose_qparams node is"),
    Reached(f"{_STOCK_QUANTIZER}.XNNPACKQuantizer", "the class the drop-in quantizer extends"),
    Reached(f"{_STOCK_QUANTIZER}.get_symmetric_quantization_config", "the demo's and the recipes' int8 config"),
    Reached(f"{_XNNPACK}.quantizer.xnnpack_quantizer_utils.propagate_annotation",
            "share ops after a rewritten mean or a zero pad take its quantization"),
    Reached(f"{_XNNPACK}.utils.configs.get_xnnpack_edge_compile_config", "the recipes lower as the stock ones"),
    Reached(f"{_XNNPACK}.utils.configs.get_xnnpack_executorch_backend_config", "the same, for to_executorch"),
    Reached("executorch.export.recipe_registry", "register the 'xnnguard' recipe provider"),
    Reached("executorch.export.BackendRecipeProvider", "the provider's base class"),
    Reached("executorch.export.ExportRecipe", "a recipe"),
    Reached("executorch.export.LoweringRecipe", "a recipe's lowering stage"),
    Reached("executorch.export.QuantizationRecipe", "a recipe's quantization stage"),
    Reached("executorch.export.AOQuantizationConfig", "torchao quantization in a recipe"),
    Reached("executorch.export.RecipeType", "the recipe kinds' base enum"),
)
