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
SMALL_FRACTION = 0.03  # the same for a small program (one_step_errors), at least one element
SEEDS = 5


def _moved_by_one_step(q: torch.Tensor, fraction: float, at_least_one: bool = False) -> torch.Tensor:
    """``fraction`` of ``q``'s elements (``at_least_one``: and one more, picked at random) moved by one step."""
    moved = torch.rand(q.shape) < fraction
    if at_least_one:
        moved.view(-1)[int(torch.randint(q.numel(), ()))] = True
    sign = torch.where(torch.rand(q.shape) < 0.5, -1, 1)
    info = torch.iinfo(q.dtype)
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


def one_step_errors(converted: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...],
                    fraction: float = SMALL_FRACTION, seeds: int = SEEDS) -> list[float]:
    """Per output of ``converted``, the largest max abs error that moving ``fraction`` of every quantize
    op's output, and at least one element, by one step causes in ``seeds`` draws; [] without a quantize op.

    The floor of a small program (a fuzzed one: tens of elements per activation, of which ``FRACTION`` is
    none). Measured: XNNPACK rounds 1.6 % of an average pooling of a quantized add to other sides than
    pt2e, 0.07 % of a linear's outputs; what follows may amplify a step (a norm over nearly equal values
    divides it by their spread; fuzz seeds 390, 453).
    """
    model = _with_moves(converted, _moved_by_one_step, fraction, True)
    if model is None:
        return []
    with torch.no_grad(), torch.random.fork_rng():
        expected = _outputs(converted(*inputs))
        errors = [0.0] * len(expected)
        for seed in range(seeds):
            torch.manual_seed(seed)
            for i, (got, want) in enumerate(zip(_outputs(model(*inputs)), expected)):
                errors[i] = max(errors[i], float((got.float() - want.float()).abs().max()))
    return errors


def _with_moves(converted: torch.fx.GraphModule, move: object, *args: object) -> torch.fx.GraphModule | None:
    """A copy of ``converted`` with ``move(q, *args)`` applied to every quantize op's output ``q``; None
    without a quantize op."""
    model = copy.deepcopy(converted)
    quantizes = [node for node in model.graph.nodes if _is_quantize(node)]
    if not quantizes:
        return None
    for node in quantizes:
        with model.graph.inserting_after(node):
            moved = model.graph.call_function(move, (node, *args))  # type: ignore[arg-type]
        node.replace_all_uses_with(moved, delete_user_cb=lambda user, moved=moved: user is not moved)
    model.recompile()
    return model


def _outputs(output: object) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    return [t for item in output for t in _outputs(item)]  # type: ignore[attr-defined]


def rounding_draws(converted: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...],
                   fraction: float = FRACTION, seeds: int = SEEDS) -> list[float]:
    """Each draw's max error over the output's max abs value (seeded 0 .. seeds-1); [] without a quantize op."""
    model = _with_moves(converted, _moved_by_one_step, fraction)
    if model is None:
        return []
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
