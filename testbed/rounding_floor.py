"""How far one-step rounding differences in a quantized network's activations move its output: the floor
below which an int8 program's error against the converted pt2e model says nothing.

XNNPACK requantizes in its own arithmetic (an int32 accumulator times a float scale, rounded), the converted
pt2e model in float ops between fake quantizations. The two round a value lying near the middle between two
steps to different sides now and then: a one-step difference in a few activations. A deep network can amplify
that much: in a five-block MViT, moving 0.1 % of the activations by one step moves the output by 8-12 % of
its scale. ``rounding_floor`` measures this on the converted model itself. It moves a random ``fraction``
of every quantize op's outputs by one step, ``seeds`` times (``rounding_draws``), and reports the largest
max error over the output's max abs value. An int8 network that differs from its converted model by less
than that matches it as closely as rounding lets anything match it. The largest, not the median: the
program's own error is one draw of this kind, and a median calls half of such draws a mismatch (the
bench-size MViT in static int8: ten draws from 7.3 % to 10.2 %, a median of three 8.8 %, the program
10.2 %, and 0.63-0.83 of the floor on four other inputs).
"""

from __future__ import annotations

import copy

import torch

FRACTION = 0.001  # of each quantized activation's elements moved by one step
SEEDS = 5


def _moved_by_one_step(q: torch.Tensor, fraction: float) -> torch.Tensor:
    info = torch.iinfo(q.dtype)
    moved = torch.rand(q.shape) < fraction
    sign = torch.where(torch.rand(q.shape) < 0.5, -1, 1)
    return (q.to(torch.int32) + moved * sign).clamp(info.min, info.max).to(q.dtype)


def _is_quantize(node: torch.fx.Node) -> bool:
    name = str(node.target)
    return node.op == "call_function" and "quantize_per_tensor" in name and "dequantize" not in name


def rounding_floor(converted: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...],
                   fraction: float = FRACTION, seeds: int = SEEDS) -> float | None:
    """The largest max error (over the output's max abs) one-step moves of ``fraction`` of the activations
    cause in ``converted`` (left unchanged) in ``seeds`` draws; None when it has no per-tensor quantize op."""
    draws = rounding_draws(converted, inputs, fraction, seeds)
    return max(draws) if draws else None


def rounding_draws(converted: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...],
                   fraction: float = FRACTION, seeds: int = SEEDS) -> list[float]:
    """Each draw's max error over the output's max abs value (seeded 0 .. seeds-1); [] without a quantize op."""
    model = copy.deepcopy(converted)
    quantizes = [node for node in model.graph.nodes if _is_quantize(node)]
    if not quantizes:
        return []
    for node in quantizes:
        with model.graph.inserting_after(node):
            moved = model.graph.call_function(_moved_by_one_step, (node, fraction))
        node.replace_all_uses_with(moved, delete_user_cb=lambda user, moved=moved: user is not moved)
    model.recompile()
    with torch.no_grad(), torch.random.fork_rng():  # the caller's random state is left as it was
        expected = _first(converted(*inputs))
        scale = max(expected.abs().max().item(), 1e-6)
        errors = []
        for seed in range(seeds):
            torch.manual_seed(seed)
            errors.append((_first(model(*inputs)) - expected).abs().max().item() / scale)
    return errors


def _first(output: object) -> torch.Tensor:
    while not isinstance(output, torch.Tensor):
        output = output[0]  # type: ignore[index]
    return output
