"""The network zoo (``testbed.networks``) builds, runs and exports at its "test" size.

Lowering each network takes tens of seconds (``test_networks_lowered.py``; ``python -m
benchmarks.network_report --size test``); here only what the flow relies on: a builder gives an eval
model and its inputs, the same ones in every process (the timing protocol rebuilds the network in
fresh processes), and ``torch.export`` takes it (with its dynamic dims, where it declares some).
"""

from __future__ import annotations

import pytest
import torch

from testbed.networks import NETWORKS


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_network_builds_deterministically_and_exports(name: str) -> None:
    model, inputs = NETWORKS[name]("test")
    assert not model.training
    again, inputs_again = NETWORKS[name]("test")
    with torch.no_grad():
        out = model(*inputs)
        torch.testing.assert_close(again(*inputs_again), out, atol=0, rtol=0)
    ep = torch.export.export(model, inputs, dynamic_shapes=getattr(model, "export_dynamic_shapes", None))
    torch.testing.assert_close(ep.module()(*inputs), out, atol=1e-5, rtol=1e-5)


def test_unknown_size_names_the_sizes() -> None:
    with pytest.raises(ValueError, match="bench, test"):
        NETWORKS["mvit"]("huge")


def _converted_conv_relu_conv() -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, ...]]:
    """A small static int8 converted pt2e model (seeded) and its calibration input."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from testbed.quantize import xnnpack_quantizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3)).eval()
    inputs = (torch.randn(1, 3, 16, 16),)
    prepared = prepare_pt2e(torch.export.export(model, inputs).module(), xnnpack_quantizer())
    prepared(*inputs)
    return convert_pt2e(prepared), inputs


def test_the_rounding_floor_is_zero_when_no_activation_moves_and_grows_as_more_do() -> None:
    from testbed.rounding_floor import rounding_floor

    converted, inputs = _converted_conv_relu_conv()
    before = converted(*inputs)
    floors = [rounding_floor(converted, inputs, fraction) for fraction in (0.0, 0.01, 0.5)]
    assert floors[0] == 0.0 and 0.0 < floors[1] < floors[2]  # type: ignore[operator]
    torch.testing.assert_close(converted(*inputs), before, atol=0, rtol=0)  # the model itself is left as it was


def test_the_rounding_floor_is_the_largest_of_its_draws() -> None:
    """A program's rounding error is one draw of the floor's kind: a median would call half of them a mismatch."""
    from testbed.rounding_floor import rounding_draws, rounding_floor

    converted, inputs = _converted_conv_relu_conv()
    draws = sorted(rounding_draws(converted, inputs, 0.01, seeds=3))
    assert draws[2] > 1.5 * draws[1]  # one output step more than the median in one draw of three
    assert rounding_floor(converted, inputs, 0.01, seeds=3) == draws[2]


def test_a_small_programs_one_step_floor_moves_at_least_one_element_of_every_activation() -> None:
    """Of a small network's activations, ``FRACTION`` of the elements is none: the small floor still moves one."""
    from testbed.rounding_floor import one_step_errors, rounding_floor

    converted, inputs = _converted_conv_relu_conv()
    assert rounding_floor(converted, inputs, 0.0) == 0.0
    assert one_step_errors(converted, inputs, fraction=0.0)[0] > 0.0


def test_an_int8_result_within_the_network_tolerance_is_judged_without_measuring_its_rounding_floor() -> None:
    """The floor costs five forwards of the converted model (minutes at full size): measured only when needed."""
    from testbed.network_flow import Result, verdict_tolerance

    measured: list[bool] = []
    result = Result("net", "test", "static", "xnnguard", max_err=0.01)
    assert verdict_tolerance(result, lambda: measured.append(True) or 0.2) == 0.05
    assert not measured and result.rounding_floor is None


def test_an_int8_result_beyond_the_network_tolerance_is_judged_by_its_rounding_floor_when_larger() -> None:
    from testbed.network_flow import Result, verdict_tolerance

    result = Result("net", "test", "static", "xnnguard", max_err=0.1)
    assert verdict_tolerance(result, lambda: 0.2) == 0.2 and result.rounding_floor == 0.2
    assert verdict_tolerance(Result("net", "test", "static", "xnnguard", max_err=0.1), lambda: 0.01) == 0.05


def test_a_float_result_is_judged_by_the_network_tolerance_alone() -> None:
    from testbed.network_flow import Result, verdict_tolerance

    result = Result("net", "test", "float", "xnnguard", max_err=0.1)
    assert verdict_tolerance(result, lambda: 0.2) == 1e-3 and result.rounding_floor is None


def test_xnnpacks_dynamically_quantized_conv_quantizes_each_image_of_the_batch_on_its_own() -> None:
    """Why ``network_report`` takes a dynamic int8 result no further from float than its reference.

    The converted model picks one scale for the whole batch; XNNPACK one per image, so an image of a
    small range comes out much closer to float than in the reference.
    """
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config

    import xnnguard
    from testbed.lowered import lower, run_pte
    from testbed.quantize import quantize_pt2e

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 8, 3).eval()
    x = torch.randn(4, 8, 6, 6) * torch.tensor([0.01, 0.1, 1.0, 10.0]).view(4, 1, 1, 1)
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
    converted = quantize_pt2e(conv, (x,), xnnguard.XNNPACKQuantizer().set_global(config))
    out = run_pte(lower(torch.export.export(converted, (x,)), (x,), xnnguard.XnnpackPartitioner()).buffer, (x,))[0]
    with torch.no_grad():
        eager, reference = conv(x), converted(x)
    small = 0  # the image of range 0.01
    assert (out[small] - eager[small]).abs().max() < (reference[small] - eager[small]).abs().max() / 10


def test_a_dynamic_int8_result_as_close_to_float_as_its_reference_matches_and_a_farther_one_does_not() -> None:
    from testbed.network_flow import Result, matches

    def result(precision: str, max_err: float, float_err: float, mean_err: float = 0.005) -> Result:
        return Result("n", "test", precision, "xnnguard", max_err=max_err, float_err=float_err,
                      reference_float_err=0.1, float_mean_err=mean_err, reference_float_mean_err=0.006)

    assert matches(result("dynamic", 0.2, 0.09), tolerance=0.05)
    assert matches(result("dynamic", 0.2, 0.15), tolerance=0.05)  # one element further off, the whole closer
    assert not matches(result("dynamic", 0.2, 0.09, mean_err=0.007), tolerance=0.05)  # the whole further off
    assert not matches(result("dynamic", 0.4, 0.25), tolerance=0.05)  # an element far off: a wrong channel
    assert not matches(result("static", 0.2, 0.09), tolerance=0.05)  # static int8 has one scale per tensor too
    assert matches(result("static", 0.04, 0.5), tolerance=0.05)


# Published multiply-adds (GMAC; torchvision's "GFLOPS" column counts multiply-adds, at 16 frames) and
# parameters (M) of the networks the "full" size is: torchvision's model table, the VideoMAE and Hiera papers.
PUBLISHED = {"mvit": (64.22, 34.54), "s3d": (17.98, 8.32), "r2plus1d": (40.52, 31.51), "videomae": (180.0, 86.5),
             "hiera": (102.0, 51.2)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_full_size_is_the_published_network(name: str) -> None:
    """Counted on the meta device: shapes only, so a full-size network costs no memory and no arithmetic."""
    from testbed.macs import count_macs

    gmac, params = PUBLISHED[name]
    with torch.device("meta"):
        model, _ = NETWORKS[name]("full")
    assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(params, rel=0.01)
    assert count_macs(name, "full") / 1e9 == pytest.approx(gmac, rel=0.01)


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_every_network_has_a_full_size_that_runs_on_the_meta_device(name: str) -> None:
    from testbed.macs import count_macs

    assert count_macs(name, "full") > count_macs(name, "bench")
