"""Rank reduction: ops above XNNPACK's rank limit become ops within it, same numbers, fully delegated, and they run."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import xnnguard
from testbed import flow
from testbed.lowered import lower, run_pte
from testbed.quantize import Precision, xnnpack_quantizer
from testbed.tolerance import float_tolerance, int8_tolerance
from tests.support import dynamic_int8_in_slow_tier, rows_in_slow_tier
from xnnguard.example_models import HighRankLinear, Patchify
from xnnguard.graph.ops import target_name
from xnnguard.report import Rule
from xnnguard.rewrite.rank.dim_groups import merge_permutation, permute_steps
from xnnguard.rewrite.rank.reduce_rank import ReduceRankPass
from xnnguard.rewrite.rewrite_for_xnnpack import XnnpackRewriter, rewrite_for_xnnpack
from xnnguard.rules.rank_limit import XNN_MAX_TENSOR_DIMS, exceeds_rank_limit, rank_violation
from xnnguard.tagging import DO_NOT_DELEGATE

PRECISIONS = ("float", "static int8", "dynamic int8")
Shape = tuple[int, ...]


# ---------------------------------------------------------------- models


class ReshapePermute(torch.nn.Module):
    """A low-rank input viewed at ``shape`` (rank 7-10), permuted, and flattened back to 2-D."""

    def __init__(self, shape: tuple[int, ...], perm: tuple[int, ...], *, flat: bool = False) -> None:
        super().__init__()
        self.shape, self.perm, self.flat = shape, perm, flat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.reshape(self.shape).permute(self.perm)
        # flat: to 1-D, as export guards a dynamic batch reshaped back from where a permute moved it
        return y.reshape(-1) if self.flat else y.reshape(x.shape[0], -1)


class SwinWindowPartition(torch.nn.Module):
    """Swin3D's window partition: (B, D, H, W, C) into (2, 4, 4) windows, then a Linear over channels."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, d, h, w, c = x.shape
        windows = x.view(b, d // 2, 2, h // 4, 4, w // 4, 4, c).permute(0, 1, 3, 5, 2, 4, 6, 7)
        return self.linear(windows.reshape(-1, 2 * 4 * 4, c))

    @staticmethod
    def example_inputs() -> tuple[torch.Tensor, ...]:
        return (torch.randn(2, 4, 8, 8, 16),)


class BroadcastAdd(torch.nn.Module):
    """An 8-D add of a full tensor and a broadcast one, both viewed from low-rank inputs."""

    def __init__(self, shape: tuple[int, ...], broadcast: tuple[int, ...]) -> None:
        super().__init__()
        self.shape, self.broadcast = shape, broadcast

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x.reshape(self.shape) + y.reshape(self.broadcast)).reshape(self.shape[0], -1)


class HighRankReductions(torch.nn.Module):
    """Softmax, reductions and a cat on an 8-D view of a 2-D input; ``op`` picks which."""

    shape = (2, 3, 2, 2, 3, 2, 2, 4)

    def __init__(self, op: str) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.reshape(-1, *self.shape[1:])  # the batch as -1: exported with a dynamic batch, it stays dynamic
        if self.op == "softmax over the last dim":
            z = torch.softmax(y, dim=-1)
        elif self.op == "softmax over a middle dim":
            z = torch.log_softmax(y, dim=4)
        elif self.op == "mean over the trailing dims":
            z = y.mean(dim=(6, 7), keepdim=True)
        elif self.op == "sum over adjacent middle dims":
            z = y.sum(dim=(4, 5))
        elif self.op == "amax over all dims":
            z = y.amax(dim=(0, 1, 2, 3, 4, 5, 6, 7))
        elif self.op == "cat":
            z = torch.cat([y, y * 2, y[:, :, :, :1] - 1], dim=3)
        elif self.op == "layer norm over the trailing dims":
            z = torch.nn.functional.layer_norm(y, (2, 4), torch.linspace(0.5, 2, 8).reshape(2, 4))
        else:
            raise ValueError(self.op)
        return z.reshape(x.shape[0], -1) if z.dim() else z

    @classmethod
    def example_inputs(cls) -> tuple[torch.Tensor, ...]:
        return (torch.randn(2, math.prod(cls.shape[1:])),)


REDUCTIONS = ["softmax over the last dim", "softmax over a middle dim", "mean over the trailing dims",
              "sum over adjacent middle dims", "amax over all dims", "cat", "layer norm over the trailing dims"]


def reduce_rank(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.export.ExportedProgram:
    """Export ``model`` and run ``ReduceRankPass`` the way ``rewrite_for_xnnpack`` runs its passes."""
    return XnnpackRewriter([ReduceRankPass(strict=True)], strict=True)(torch.export.export(model.eval(), inputs))


def assert_every_tensor_within_the_limit(graph: torch.fx.Graph) -> None:
    over = [f"{n.name}: {rank_violation(n)}" for n in graph.nodes if n.op == "call_function" and rank_violation(n)]
    assert not over, over


# What may stay outside XNNPACK at the graph's own I/O: views and (de)quantizations of an input or
# output that is itself above the limit, and the dtype copy ExecuTorch makes of a lifted scalar constant.
IO_OPS = {"view", "view_copy", "quantize_per_tensor", "dequantize_per_tensor", "_to_dim_order_copy"}


def outside_nodes_not_at_the_io(lowered) -> list[str]:  # type: ignore[no-untyped-def]
    """Ops outside XNNPACK other than ``IO_OPS`` on a chain of outside ops from a graph input or to a graph output."""
    graph = lowered.edge.exported_program().graph

    def short(node: torch.fx.Node) -> str:
        return target_name(node).split(".")[-2] if "." in target_name(node) else target_name(node)

    def memory_or_delegate(node: torch.fx.Node) -> bool:
        delegate_call = any(w in str(node.target) for w in ("executorch_call_delegate", "getitem"))
        return target_name(node) == "alloc" or delegate_call

    outside = [n for n in graph.nodes if n.op == "call_function" and not memory_or_delegate(n)]
    from_input: set[torch.fx.Node] = set()
    for node in outside:
        if all(a.op == "placeholder" or a in from_input or memory_or_delegate(a) for a in node.all_input_nodes):
            from_input.add(node)
    to_output: set[torch.fx.Node] = set()
    for node in reversed(outside):
        if all(u.op == "output" or u in to_output for u in node.users):
            to_output.add(node)
    return [
        f"{node.name} ({target_name(node)})"
        for node in outside
        if not (short(node) in IO_OPS and (node in from_input or node in to_output))
    ]


def _rank_reduced_run(
    model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], precision: Precision, *, rewrite: bool = True
) -> flow.Run:
    """The flow with rank reduction alone (or no rewrite), ExecuTorch's own quantizer after it."""
    passes = [ReduceRankPass(strict=True)] if rewrite else False
    return flow.lower_and_run(model, inputs, precision, rewrite=passes, quantizer="stock")


# ---------------------------------------------------------------- the dim arithmetic


@st.composite
def permutes(draw: st.DrawFn, min_rank: int = 7, max_rank: int = 10) -> tuple[Shape, Shape]:
    """A random shape of rank 7-10 (sizes 1-4, at most ~5k elements) and a random permutation of it."""
    rank = draw(st.integers(min_rank, max_rank))
    shape = [draw(st.integers(1, 4)) for _ in range(rank)]
    while math.prod(shape) > 5000:
        shape[shape.index(max(shape))] -= 1
    perm = tuple(draw(st.permutations(range(rank))))
    return tuple(shape), perm


@settings(derandomize=True, max_examples=40, deadline=None)
@given(permutes())
def test_permute_steps_equal_the_permute_and_each_stays_within_the_limit(case: tuple[Shape, Shape]) -> None:
    shape, perm = case
    x = torch.arange(math.prod(shape)).reshape(shape)
    y = x
    steps = permute_steps(shape, perm, XNN_MAX_TENSOR_DIMS)
    for step in steps:
        assert not exceeds_rank_limit(len(step.input_shape))
        y = y.reshape(step.input_shape).permute(step.perm)
    assert torch.equal(y.reshape(x.permute(perm).shape), x.permute(perm))
    # the fewest: one transpose when the merged permute fits, else two (enough up to 10 merged dims)
    merged_rank = len(merge_permutation(shape, perm)[0])
    assert len(steps) == (0 if merged_rank <= 1 else 1 if not exceeds_rank_limit(merged_rank) else 2)


def test_dims_that_move_together_merge() -> None:
    # Swin3D's window partition: (0, 1) stay together, and so do (6, 7): 8 dims become 6.
    merged = merge_permutation((2, 2, 2, 2, 4, 2, 4, 16), (0, 1, 3, 5, 2, 4, 6, 7))
    assert merged == ((4, 2, 2, 4, 2, 64), (0, 2, 4, 1, 3, 5))


def test_the_patchify_permute_takes_two_transposes() -> None:
    """No two of its dims stay together, so it cannot merge; it splits into a 6-D and a 4-D transpose."""
    steps = permute_steps((2, 6, 8, 2, 16, 8, 2, 16), (0, 2, 5, 3, 6, 1, 4, 7), XNN_MAX_TENSOR_DIMS)
    assert [len(step.input_shape) for step in steps] == [6, 4]


# ---------------------------------------------------------------- rewritten graphs, in eager


@settings(derandomize=True, max_examples=30, deadline=None)
@given(permutes())
def test_rewritten_permute_equals_eager_exactly_with_no_tensor_above_the_limit(case: tuple[Shape, Shape]) -> None:
    shape, perm = case
    model, x = ReshapePermute(shape, perm), torch.randn(shape[0], math.prod(shape[1:]))
    ep = reduce_rank(model, (x,))
    assert_every_tensor_within_the_limit(ep.graph)
    assert torch.equal(ep.module()(x), model(x))


@st.composite
def broadcasts(draw: st.DrawFn) -> tuple[Shape, Shape]:
    """An 8-D shape and one broadcast along some pairs of its dims (leading dims may be missing)."""
    shape = tuple(draw(st.integers(2, 3)) for _ in range(8))
    runs = draw(st.lists(st.booleans(), min_size=4, max_size=4))  # broadcast along dims (2i, 2i+1)?
    broadcast = tuple(1 if runs[d // 2] else size for d, size in enumerate(shape))
    return shape, broadcast[draw(st.integers(0, 2)) :]


@settings(derandomize=True, max_examples=25, deadline=None)
@given(broadcasts())
def test_rewritten_broadcasting_elementwise_ops_equal_eager_with_no_tensor_above_the_limit(
    case: tuple[Shape, Shape],
) -> None:
    shape, broadcast = case
    model = BroadcastAdd(shape, broadcast)
    inputs = (torch.randn(shape[0], math.prod(shape[1:])), torch.randn(math.prod(broadcast)))
    ep = reduce_rank(model, inputs)
    assert_every_tensor_within_the_limit(ep.graph)
    assert torch.equal(ep.module()(*inputs), model(*inputs))


class CastCompareWhere(torch.nn.Module):
    """A comparison with broadcasting, a dtype cast (export adds a dtype assertion) and a where, all 8-D."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a, b = x.reshape(2, 3, 2, 2, 3, 2, 2, 4), y.reshape(1, 3, 1, 1, 3, 2, 1, 4)
        return torch.where(a > b, a.to(torch.float64), torch.erf(b).double().reciprocal()).reshape(2, -1)


def test_rewritten_casts_comparisons_and_where_equal_eager_with_no_tensor_above_the_limit() -> None:
    model, inputs = CastCompareWhere(), (torch.randn(2, 576), torch.randn(72))
    ep = reduce_rank(model, inputs)
    assert_every_tensor_within_the_limit(ep.graph)
    assert torch.equal(ep.module()(*inputs), model(*inputs))


@pytest.mark.parametrize("op", REDUCTIONS)
def test_rewritten_softmax_reduction_or_cat_equals_eager_with_no_tensor_above_the_limit(op: str) -> None:
    model, inputs = HighRankReductions(op), HighRankReductions.example_inputs()
    ep = reduce_rank(model, inputs)
    assert_every_tensor_within_the_limit(ep.graph)
    torch.testing.assert_close(ep.module()(*inputs), model(*inputs), atol=1e-6, rtol=1e-6)


class OneDimOp(torch.nn.Module):
    """``op`` along ``dim`` of a high-rank view of a 2-D input: softmax, sum, mean, amax, cat or slice."""

    def __init__(self, shape: Shape, op: str, dim: int) -> None:
        super().__init__()
        self.shape, self.op, self.dim = shape, op, dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, dim = x.reshape(self.shape), self.dim
        if self.op == "softmax":
            z = torch.softmax(y, dim)
        elif self.op in ("sum", "mean", "amax"):
            z = getattr(y, self.op)(dim=(dim, dim + 1) if dim + 1 < len(self.shape) else dim)
        elif self.op == "cat":
            z = torch.cat([y, -y], dim)
        else:
            z = y.narrow(dim, 1, self.shape[dim] - 1)
        return z.reshape(-1)


@settings(derandomize=True, max_examples=30, deadline=None)
@given(permutes(max_rank=8), st.sampled_from(["softmax", "sum", "mean", "amax", "cat", "slice"]), st.data())
def test_rewritten_one_dim_ops_equal_eager_with_no_tensor_above_the_limit(
    case: tuple[Shape, Shape], op: str, data: st.DataObject
) -> None:
    shape = tuple(max(2, size) for size in case[0])  # a slice needs 2 along its dim
    while math.prod(shape) > 5000:
        shape = shape[:-1]
    dim = data.draw(st.integers(0, len(shape) - 1))
    model, x = OneDimOp(shape, op, dim), torch.randn(shape[0], math.prod(shape[1:]))
    ep = reduce_rank(model, (x,))
    assert_every_tensor_within_the_limit(ep.graph)
    torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op", ["softmax over the last dim", "mean over the trailing dims", "cat"])
def test_softmax_mean_and_cat_in_xnnpack_form_lower_fully_and_run(op: str) -> None:
    """Rank is not all: XNNPACK takes softmax over the last dim and mean as 4-D pooling only."""
    model, inputs = HighRankReductions(op), HighRankReductions.example_inputs()
    lowered, out, reference, tolerance = _rank_reduced_run(model, inputs, "float")
    assert set(lowered.outside_ops()) <= {"_to_dim_order_copy"}  # cat's scalar 2, a lifted constant
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


def test_pass_works_in_place_on_the_lifted_graph_right_before_lowering() -> None:
    """No re-export needed: the pass inserts only views and the reduced ops, with their meta."""
    model, (x,) = Patchify().eval(), Patchify.example_inputs()
    ep = torch.export.export(model, (x,))
    result = ReduceRankPass()(ep.graph_module)
    assert result.modified and result.report == ()
    assert_every_tensor_within_the_limit(ep.graph)
    lowered = lower(ep, (x,), xnnguard.XnnpackPartitioner())
    assert outside_nodes_not_at_the_io(lowered) == []
    torch.testing.assert_close(run_pte(lowered.buffer, (x,))[0], model(x), atol=0, rtol=0)


# ---------------------------------------------------------------- lowered, loaded and run


@settings(derandomize=True, max_examples=3, deadline=None)
@given(permutes(min_rank=8, max_rank=10))
def test_random_permutes_lower_fully_to_xnnpack_and_run_exactly(case: tuple[Shape, Shape]) -> None:
    shape, perm = case
    model, x = ReshapePermute(shape, perm), torch.randn(shape[0], math.prod(shape[1:]))
    lowered, out, reference, _ = _rank_reduced_run(model, (x,), "float")
    assert lowered.outside_ops() == {}
    assert torch.equal(out, reference)


E2E_MODELS = {
    "patchify": (Patchify, Patchify.example_inputs),
    "swin3d-window-partition": (SwinWindowPartition, SwinWindowPartition.example_inputs),
    "8-D-linear": (HighRankLinear, HighRankLinear.example_inputs),
}


@pytest.mark.parametrize("precision", dynamic_int8_in_slow_tier(PRECISIONS))
@pytest.mark.parametrize("name", E2E_MODELS)
def test_model_runs_fully_delegated_and_matches(name: str, precision: str) -> None:
    torch.manual_seed(0)
    build, example_inputs = E2E_MODELS[name]
    model, inputs = build(), example_inputs()
    lowered, out, reference, tolerance = _rank_reduced_run(model, inputs, precision)
    assert outside_nodes_not_at_the_io(lowered) == []
    if name != "8-D-linear":  # its own input and output are 8-D: their views (and q/dq) may stay outside
        assert set(lowered.outside_ops()) <= {"_to_dim_order_copy"}  # patchify's scalar 2, a lifted constant
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


@pytest.mark.parametrize(
    "name, precision",
    # A float 8-D linear is not here: ExecuTorch's own decomposition (view -> addmm -> view) already
    # flattens it. Quantized, the 8-D q/dq keep the whole linear out of XNNPACK.
    # The dynamic-int8 rows in the slow tier (tests.support.dynamic_int8_in_slow_tier says why).
    rows_in_slow_tier([(name, p) for name in E2E_MODELS for p in PRECISIONS if (name, p) != ("8-D-linear", "float")],
                      lambda name, precision: "dynamic" in precision),
)
def test_without_the_rewrite_high_rank_ops_run_outside_xnnpack(name: str, precision: str) -> None:
    """What the tests above catch: with tags only, the high-rank ops run on portable kernels."""
    torch.manual_seed(0)
    build, example_inputs = E2E_MODELS[name]
    lowered, *_ = _rank_reduced_run(build(), example_inputs(), precision, rewrite=False)
    assert outside_nodes_not_at_the_io(lowered) != []


def test_broadcasting_add_lowers_fully_to_xnnpack() -> None:
    shape, broadcast = (2, 3, 2, 3, 2, 2, 3, 2), (3, 1, 1, 2, 2, 1, 1)
    model = BroadcastAdd(shape, broadcast)
    inputs = (torch.randn(2, math.prod(shape[1:])), torch.randn(math.prod(broadcast)))
    lowered, out, reference, tolerance = _rank_reduced_run(model, inputs, "float")
    assert lowered.outside_ops() == {}
    torch.testing.assert_close(out, reference, atol=tolerance, rtol=0)


@pytest.mark.parametrize("precision", ["static int8", "dynamic int8"])
def test_pt2e_flow_with_xnnguards_quantizer_after_rewrite_for_xnnpack_runs_fully_delegated(precision: str) -> None:
    """The documented flow: rewrite_for_xnnpack(export(m)) -> prepare_pt2e -> calibrate -> convert -> export
    -> lower."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    model, inputs = SwinWindowPartition().eval(), SwinWindowPartition.example_inputs()
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=precision == "dynamic int8")
    prepared = prepare_pt2e(rewrite_for_xnnpack(torch.export.export(model, inputs), strict=True).module(),
                            xnnguard.XNNPACKQuantizer().set_global(config))
    prepared(*inputs)
    converted = convert_pt2e(prepared)
    lowered = lower(torch.export.export(converted, inputs), inputs, xnnguard.XnnpackPartitioner())
    assert lowered.outside_ops() == {}
    reference = converted(*inputs).detach()
    (out,) = run_pte(lowered.buffer, inputs)
    torch.testing.assert_close(out, reference, atol=int8_tolerance(converted, reference, dynamic=False), rtol=0)


def torchao_quantized_high_rank_linear(weight: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """An 8-D linear quantized with torchao (dynamic int8 activations per token; int8 per channel or int4 per group)."""
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.utils import unwrap_tensor_subclass

    torch.manual_seed(0)
    model = HighRankLinear(in_features=64, out_features=32).eval()
    granularity = PerAxis(0) if weight == "int8" else PerGroup(32)
    config = Int8DynamicActivationIntxWeightConfig(weight_dtype=getattr(torch, weight), weight_granularity=granularity)
    quantize_(model, config)
    unwrap_tensor_subclass(model)
    return model, (torch.randn(2, 1, 2, 3, 1, 2, 3, 64),)


@pytest.mark.parametrize("weight", ["int8", "int4"])
def test_torchao_quantized_8d_linear_runs_fully_delegated_and_matches(weight: str) -> None:
    model, inputs = torchao_quantized_high_rank_linear(weight)
    lowered = lower(reduce_rank(model, inputs), inputs, xnnguard.XnnpackPartitioner())
    assert outside_nodes_not_at_the_io(lowered) == [] and set(lowered.outside_ops()) == {"view_copy"}
    assert lowered.delegated_ops()["choose_qparams_affine"] == 1 and lowered.delegated_ops()["linear"] == 1
    (out,) = run_pte(lowered.buffer, inputs)
    reference = model(*inputs).detach()
    torch.testing.assert_close(out, reference, atol=2 * float(reference.max() - reference.min()) / 255, rtol=0)


def test_without_the_rewrite_a_torchao_quantized_8d_linear_cannot_become_a_program() -> None:
    """Its 8-D affine q/dq stay out of XNNPACK, and 1.5.1 has no portable kernel for them."""
    model, inputs = torchao_quantized_high_rank_linear("int8")
    with pytest.raises(RuntimeError, match="Missing out variants"):
        lower(torch.export.export(model, inputs), inputs, xnnguard.XnnpackPartitioner())


class VideoWindows(torch.nn.Module):
    """A Conv3d tubelet embedding, then Swin3D's 8-D window partition, a ReLU and a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Conv3d(3, 16, (2, 4, 4), stride=(2, 4, 4))
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.embed(x).permute(0, 2, 3, 4, 1)
        b, d, h, w, c = y.shape
        windows = y.reshape(b, d // 2, 2, h // 4, 4, w // 4, 4, c).permute(0, 1, 3, 5, 2, 4, 6, 7)
        return self.linear(torch.relu(windows.reshape(-1, 32, c)))


def test_rewrite_for_xnnpack_runs_a_video_model_fully_delegated() -> None:
    """ReduceRankPass at the end of ``rewrite_for_xnnpack``'s list: the 3-D conv and the 8-D window both go."""
    torch.manual_seed(0)
    model, x = VideoWindows().eval(), torch.randn(1, 3, 8, 32, 32)
    ep = rewrite_for_xnnpack(torch.export.export(model, (x,)), strict=True)
    lowered = lower(ep, (x,), xnnguard.XnnpackPartitioner())
    assert lowered.outside_ops() == {}
    torch.testing.assert_close(run_pte(lowered.buffer, (x,))[0], model(x), atol=1e-5, rtol=0)


# ---------------------------------------------------------------- a dynamic batch

BATCH = torch.export.Dim("batch", min=1, max=16)
BATCHES = (1, 3, 7)


def reduce_rank_dynamic(model: torch.nn.Module, x: torch.Tensor) -> torch.export.ExportedProgram:
    """``reduce_rank`` on ``model`` exported with a dynamic batch (dim 0 of its one input)."""
    ep = torch.export.export(model.eval(), (x,), dynamic_shapes=({0: BATCH},))
    return XnnpackRewriter([ReduceRankPass(strict=True)], strict=True)(ep)


def assert_equal_at_every_batch(ep: torch.export.ExportedProgram, model: torch.nn.Module, x: torch.Tensor) -> None:
    for batch in BATCHES:
        other = torch.randn(batch, *x.shape[1:])
        torch.testing.assert_close(ep.module()(other), model(other), atol=1e-5, rtol=1e-5)


@settings(derandomize=True, max_examples=12, deadline=None)
@given(permutes(max_rank=9))
def test_a_permute_with_a_dynamic_batch_is_reduced_and_equals_eager_at_every_batch(case: tuple[Shape, Shape]) -> None:
    """The batch moves anywhere: its merged group becomes the one -1 of each reshape."""
    shape, perm = case
    sizes = [max(2, size) for size in shape[1:]]  # a size of 1 next to the batch makes export specialize it
    while math.prod(sizes) > 2000:
        sizes[sizes.index(max(sizes))] -= 1
    model, x = ReshapePermute((-1, *sizes), perm, flat=True), torch.randn(3, math.prod(sizes))
    ep = reduce_rank_dynamic(model, x)
    assert_every_tensor_within_the_limit(ep.graph)
    assert_equal_at_every_batch(ep, model, x)


DYNAMIC_BATCH_OPS = ["softmax over the last dim", "softmax over a middle dim", "mean over the trailing dims",
                     "sum over adjacent middle dims", "cat", "layer norm over the trailing dims"]


@pytest.mark.parametrize("op", DYNAMIC_BATCH_OPS)
def test_a_reduction_cat_or_layer_norm_with_a_dynamic_batch_is_reduced_and_equals_eager_at_every_batch(
    op: str,
) -> None:
    model, (x,) = HighRankReductions(op), HighRankReductions.example_inputs()
    ep = reduce_rank_dynamic(model, x)
    assert_every_tensor_within_the_limit(ep.graph)
    assert_equal_at_every_batch(ep, model, x)


class SwinWindowBlock(torch.nn.Module):
    """Swin3D's window partition, a layer norm, an affine and a softmax on the 8-D windows, and the reverse."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.partition, self.norm = SwinWindowPartition(channels), torch.nn.LayerNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, d, h, w, c = x.shape
        windows = self.partition(x).view(b, d // 2, h // 4, w // 4, 2, 4, 4, c)
        y = torch.softmax(self.norm(windows) * 2 + 1, dim=-1)
        return y.permute(0, 1, 4, 2, 5, 3, 6, 7).reshape(b, d, h, w, c)


# static int8 slow (13 s): its dynamic-int8 row runs the block at every batch; the static-int8 window block
# with a static batch is test_model_runs_fully_delegated_and_matches's
@pytest.mark.parametrize("precision", rows_in_slow_tier(PRECISIONS, ["static int8"]))
def test_a_swin_window_block_with_a_dynamic_batch_runs_fully_delegated_at_every_batch(precision: str) -> None:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    model, (x,) = SwinWindowBlock().eval(), SwinWindowPartition.example_inputs()
    exported = torch.export.export(model, (x,), dynamic_shapes=({0: BATCH},))
    ep, reference = rewrite_for_xnnpack(exported, strict=True), model  # the layer norm as XNNPACK ops too
    if precision != "float":
        prepared = prepare_pt2e(ep.module(), xnnpack_quantizer(dynamic=precision == "dynamic int8"))
        prepared(x)
        reference = convert_pt2e(prepared)
        ep = torch.export.export(reference, (x,), dynamic_shapes=({0: BATCH},))
    lowered = lower(ep, (x,), xnnguard.XnnpackPartitioner())
    assert lowered.num_delegates == 1 and outside_nodes_not_at_the_io(lowered) == []
    for batch in BATCHES:
        other = torch.randn(batch, *x.shape[1:])
        out, expected = run_pte(lowered.buffer, (other,))[0], reference(other)
        if precision == "dynamic int8":
            # XNNPACK quantizes each row of a dynamically quantized linear on its own, the converted model
            # the whole tensor at once: the program is to be no further from float than its reference is
            # (the verdict of ``network_report``; the conv's case is in tests/test_networks.py).
            floats = model(other)
            assert (out - floats).abs().max() <= (expected - floats).abs().max()
            continue
        tolerance = (float_tolerance(expected) if precision == "float"
                     else int8_tolerance(reference, expected, dynamic=False))  # type: ignore[arg-type]
        torch.testing.assert_close(out, expected, atol=tolerance, rtol=0)


# ---------------------------------------------------------------- what is left, and why


def test_an_intermediate_high_rank_tensor_that_is_a_graph_output_is_left_and_reported() -> None:
    class PermuteAlsoReturned(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = x.reshape(2, 2, 2, 2, 2, 2, 2, 3)
            return y.permute(7, 6, 5, 4, 3, 2, 1, 0).reshape(2, -1), y

    model, x = PermuteAlsoReturned(), torch.randn(2, 192)
    rewriter = XnnpackRewriter([ReduceRankPass(strict=True)], strict=True)
    ep = rewriter(torch.export.export(model, (x,)))
    (record,) = rewriter.report
    assert record.rule is Rule.HIGH_RANK and "graph output" in record.reason
    assert not any(n.target == torch.ops.aten.permute.default and rank_violation(n) for n in ep.graph.nodes)
    for got, want in zip(ep.module()(x), model(x)):
        assert torch.equal(got, want)


def test_a_permute_with_two_dynamic_dims_is_left_tagged_and_reported() -> None:
    """A dynamic batch and a dynamic frame count: a reshape could infer only one of them (-1)."""

    class FramesPermute(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            return x.reshape(b, t, 2, 2, 2, 2, 2, 3).permute(0, 1, 7, 6, 5, 4, 3, 2).reshape(b, t, -1)

    model, x = FramesPermute(), torch.randn(4, 3, 96)
    frames = torch.export.Dim("frames", min=2, max=16)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: BATCH, 1: frames},))
    rewriter = XnnpackRewriter([ReduceRankPass(strict=True)], strict=True)
    result = rewriter(ep)
    reasons = {record.node: record.reason for record in rewriter.report}
    (permute,) = [n for n in result.graph.nodes if n.target == torch.ops.aten.permute.default]
    assert "more than one dynamic size" in reasons[permute.name]
    assert permute.meta[DO_NOT_DELEGATE] == reasons[permute.name]
    other = torch.randn(7, 5, 96)
    assert torch.equal(result.module()(other), model(other))


def test_a_reduction_over_dims_that_are_not_adjacent_is_left_and_reported() -> None:
    class SumOfTwoApartDims(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(2, 3, 2, 2, 3, 2, 2, 4).sum(dim=(2, 5)).reshape(2, -1)

    model, x = SumOfTwoApartDims(), torch.randn(2, 576)
    rewriter = XnnpackRewriter([ReduceRankPass(strict=True)], strict=True)
    ep = rewriter(torch.export.export(model, (x,)))
    assert any("not adjacent" in record.reason for record in rewriter.report)
    torch.testing.assert_close(ep.module()(x), model(x))


def test_a_reduction_whose_dims_are_apart_only_across_dims_of_size_one_is_merged_and_exact() -> None:
    """Fuzz seed 88: ``amin`` over dims (2, 6) of a (1, 2, 1, 1, 3, 4, 2) tensor: dim 2 holds one element."""

    class MinOverASizeOneDim(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.amin(dim=(2, -1), keepdim=True).softmax(0)

    model, x = MinOverASizeOneDim(), torch.randn(1, 2, 1, 1, 3, 4, 2)
    rewriter = XnnpackRewriter([ReduceRankPass(strict=True)], strict=True)
    ep = rewriter(torch.export.export(model, (x,)))
    assert not any("amin" in record.node for record in rewriter.report), rewriter.report
    assert torch.equal(ep.module()(x), model(x))


class PatchifyAndReturnedView(torch.nn.Module):
    """The patchify, and an 8-D view that is a graph output (so it must stay)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return Patchify()(a), b.reshape(2, 2, 2, 2, 2, 2, 2, 3)


def test_a_left_node_carries_its_tag_through_re_export() -> None:
    """The tag is in ``meta["custom"]`` too: ``torch.export`` keeps that, while it renumbers node names."""

    inputs = (*Patchify.example_inputs(), torch.randn(2, 192))
    module = torch.export.export(PatchifyAndReturnedView(), inputs).module()
    ReduceRankPass()(module)
    again = torch.export.export(module, inputs, strict=False)
    tagged = [n for n in again.graph.nodes if n.meta.get("custom", {}).get(DO_NOT_DELEGATE)]
    assert [tuple(n.meta["val"].shape) for n in tagged] == [(2, 2, 2, 2, 2, 2, 2, 3)]


def test_rewrite_for_xnnpack_tags_only_the_node_left_above_the_limit() -> None:
    inputs = (*Patchify.example_inputs(), torch.randn(2, 192))
    rewriter = XnnpackRewriter([ReduceRankPass(strict=True)], strict=True)
    ep = rewriter(torch.export.export(PatchifyAndReturnedView(), inputs))
    tagged = [n for n in ep.graph.nodes if n.meta.get(DO_NOT_DELEGATE)]
    assert [tuple(n.meta["val"].shape) for n in tagged] == [(2, 2, 2, 2, 2, 2, 2, 3)]


def test_a_permute_tagged_do_not_delegate_is_left_as_it_is() -> None:
    model, x = ReshapePermute((2, 2, 2, 2, 2, 2, 2, 3), (0, 7, 6, 5, 4, 3, 2, 1)), torch.randn(2, 192)
    ep = torch.export.export(model, (x,))
    (permute,) = [n for n in ep.graph.nodes if n.target == torch.ops.aten.permute.default]
    permute.meta[DO_NOT_DELEGATE] = "kept out by its owner"
    result = ReduceRankPass()(ep.graph_module)
    assert permute in ep.graph.nodes
    assert any(r.node == permute.name and "kept out by its owner" in r.reason for r in result.report)


def test_on_an_edge_program_nothing_changes_and_every_high_rank_op_is_reported() -> None:
    """The passes rewrite ATen programs; on the edge dialect they say so instead of failing."""
    from executorch.exir import to_edge

    edge = to_edge(torch.export.export(Patchify(), Patchify.example_inputs()))
    result = ReduceRankPass()(edge.exported_program().graph_module)
    assert not result.modified and result.report
    assert all("edge-dialect" in record.reason for record in result.report)


def test_a_rewrite_that_fails_midway_leaves_the_node_as_it_was_and_reports_it() -> None:
    """A rewrite that raises after inserting nodes: they are erased, the node stays, the failure is reported."""
    from xnnguard.rewrite.rank.base import HighRankRewritePass

    class FailsAfterInserting(HighRankRewritePass):
        def picks(self, node: torch.fx.Node) -> bool:
            return node.target == torch.ops.aten.permute.default

        def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
            with graph_module.graph.inserting_before(node):
                graph_module.graph.call_function(torch.ops.aten.reshape.default, (node.args[0], [-1]))
            raise RuntimeError("no fake kernel")

    model = ReshapePermute((2, 2, 2, 2, 2, 2, 2, 3), (0, 7, 6, 5, 4, 3, 2, 1))
    ep = torch.export.export(model, (torch.randn(2, 192),))
    graph = ep.graph_module.graph
    before = [n.format_node() for n in graph.nodes]
    result = FailsAfterInserting()(ep.graph_module)
    assert not result.modified and [n.format_node() for n in graph.nodes] == before
    (record,) = result.report
    assert "the rewrite failed (RuntimeError: no fake kernel)" in record.reason


def test_running_the_pass_twice_changes_nothing_the_second_time() -> None:
    module = torch.export.export(PatchifyAndReturnedView(), (*Patchify.example_inputs(), torch.randn(2, 192))).module()
    first = ReduceRankPass()(module)
    graph = [n.format_node() for n in module.graph.nodes]
    second = ReduceRankPass()(module)
    assert first.modified and not second.modified
    assert second.report == first.report and [n.format_node() for n in module.graph.nodes] == graph


def test_a_graph_without_high_rank_ops_is_left_unchanged() -> None:
    ep = torch.export.export(ReshapePermute((2, 3, 4, 5), (0, 2, 1, 3)), (torch.randn(2, 60),))
    result = ReduceRankPass()(ep.graph_module)
    assert not result.modified and result.report == ()
