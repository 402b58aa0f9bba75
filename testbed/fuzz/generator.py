"""Seeded random networks of the domain (video, 3-D, image and token networks), as readable Python source.

``generate(seed)`` draws an input (a video clip, an image, tokens, or a tensor of 6 to 8 dims), then a
chain of ops from ``testbed.fuzz.catalogue``, each applied to the last value and free to read earlier ones
(residuals, ``cat``), and returns a ``Network``: its source (a module defining ``Net``, ``example_inputs``
and ``build``), which is also the repro. The source is the network: the runner builds it by executing the
source, so a repro rebuilds exactly what was run (weights drawn from the seed).

Every candidate op is run eagerly before it is kept: the network so far plus the candidate, built from its
source with the final weights, at two batches (2 and 3). A candidate that raises, makes a non-finite
value, a tensor too large (``MAX_ELEMENTS``), of no elements or more than ``MAX_RANK`` dims, is drawn
again. Running at two batches also finds which dim carries the batch, so that reshapes write it as -1 and
the network runs at any batch and exports with a dynamic one. The same seed gives the same network.
"""

from __future__ import annotations

import math
import random
import types
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from testbed.fuzz.catalogue import CATALOGUE, MAX_RANK, Draw, Step, Value

__all__ = ["MAX_ELEMENTS", "Network", "evaluate", "generate", "load"]

# Per tensor, at the larger of the two batches the generator runs: small programs lower fast.
MAX_ELEMENTS = 8192
ATTEMPTS = 40  # candidates run per step before the chain ends early
RANKED = 2.0  # ops made for the value's rank drawn this much more often than those of any rank
BATCHES = (2, 3)  # the generator runs every candidate at both: 2 is the dynamic-batch example


@dataclass(frozen=True)
class Network:
    """A generated network: its seed, the example batch, the catalogue ops it chains, and its source."""

    seed: int
    batch: int
    ops: tuple[str, ...]
    source: str

    def build(self, batch: int | None = None) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        """The network (weights from the seed) and example inputs at ``batch`` (default: its own)."""
        module = load(self.source, f"fuzz_{self.seed}")
        model, inputs = module.build(self.batch if batch is None else batch)
        return model, inputs


def load(source: str, name: str = "fuzz_network") -> types.ModuleType:
    """``source`` executed as a module of its own (what a repro file is when imported)."""
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


_TEMPLATE = '''"""A network of the xnnguard fuzzer (testbed.fuzz), seed {seed}: {summary}."""

import torch
import torch.nn.functional as F
from torch import nn

SEED = {seed}
BATCH = {batch}  # the example batch


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__(){init}

    def forward(self, {arguments}):
{forward}
        return {outputs}


def example_inputs(batch: int = BATCH) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(SEED)
    return ({inputs},)


def build(batch: int = BATCH) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The network, its weights drawn from SEED, and example inputs at ``batch``."""
    torch.manual_seed(SEED)
    return Net().eval(), example_inputs(batch)
'''


def _render(seed: int, batch: int, inputs: Sequence[Value], steps: Sequence[Step], outputs: Sequence[str]) -> str:
    init = [line for step in steps for line in step.init]
    forward: list[str] = []
    for step in steps:
        forward.append(f"# {step.op}")
        forward.extend(step.forward)
    shapes = [", ".join(["batch", *map(str, value.shape[1:])]) for value in inputs]
    return _TEMPLATE.format(
        seed=seed,
        batch=batch,
        summary=" -> ".join(step.op for step in steps) or "the input",
        init="".join(f"\n        {line}" for line in init),
        arguments=", ".join(value.name for value in inputs),
        forward="\n".join(f"        {line}" for line in forward),
        outputs=", ".join(outputs) if len(outputs) > 1 else outputs[0],
        inputs=", ".join(f"torch.randn({shape}, generator=generator)" for shape in shapes),
    )


def _input_shape(draw: Draw) -> tuple[int, ...]:
    """A video clip (N, C, T, H, W), an image (N, C, H, W), tokens (N, L, C) or a tensor of 6 to 8 dims."""
    kind = draw.choose([("video", 0.35), ("image", 0.3), ("tokens", 0.25), ("high", 0.1)])
    while True:
        if kind == "video":
            shape = (draw.pick([1, 2, 3, 4]), draw.pick([1, 2, 3, 4, 6, 8]), draw.int(2, 12), draw.int(2, 12))
        elif kind == "image":
            shape = (draw.int(1, 8), draw.int(2, 16), draw.int(2, 16))
        elif kind == "tokens":
            shape = (draw.int(1, 16), draw.int(2, 24))
        else:
            shape = tuple(draw.int(1, 4) for _ in range(draw.int(5, MAX_RANK - 1)))
        if math.prod(shape) * max(BATCHES) <= MAX_ELEMENTS // 2:
            return (BATCHES[0], *shape)


def _batch_dim(small: torch.Tensor, large: torch.Tensor) -> tuple[int | None, int] | None:
    """The dim that grows with the batch and by how much per sample; None if the shapes differ otherwise."""
    if small.dim() != large.dim():
        return None
    grown = [d for d, (a, b) in enumerate(zip(small.shape, large.shape)) if a != b]
    if not grown:
        return None, 1
    if len(grown) > 1:
        return None
    (dim,) = grown
    per_batch = large.shape[dim] - small.shape[dim]
    if small.shape[dim] != per_batch * BATCHES[0]:
        return None
    return dim, per_batch


def evaluate(seed: int, inputs: Sequence[Value], steps: Sequence[Step]) -> Value | None:
    """Run the network ending at ``steps[-1]`` at both batches; its value, or None if it is no valid one."""
    source = _render(seed, BATCHES[0], inputs, steps, [steps[-1].out])
    try:
        module = load(source)
        results = []
        for batch in BATCHES:
            model, example = module.build(batch)
            with torch.no_grad():
                results.append(model(*example))
    except Exception:
        return None
    small, large = results
    if not (isinstance(small, torch.Tensor) and small.is_floating_point() and isinstance(large, torch.Tensor)):
        return None
    if not (1 <= small.dim() <= MAX_RANK) or small.numel() == 0 or large.numel() > MAX_ELEMENTS:
        return None
    if not (torch.isfinite(small).all() and torch.isfinite(large).all()):
        return None
    batch = _batch_dim(small, large)
    if batch is None:
        return None
    return Value(steps[-1].out, tuple(small.shape), *batch)


def generate(seed: int, *, steps: int | None = None) -> Network:
    """The network of ``seed``: ``steps`` ops (default: 2 to 7, drawn), fewer if no candidate fits."""
    draw = Draw(random.Random(seed))
    length = steps if steps is not None else draw.int(2, 7)
    x = Value("x", _input_shape(draw))
    inputs = [x]
    if draw.chance(0.1):
        inputs.append(Value("y", x.shape))  # a second input of the same shape, for residuals and cats
    values: list[Value] = inputs[::-1]  # the chain starts at x
    chain: list[Step] = []
    with torch.random.fork_rng():
        for index in range(1, length + 1):
            tried = 0
            while tried < ATTEMPTS:
                op = draw.choose([(op, op.weight * (1 if op.ranks is None else RANKED))
                                  for op in CATALOGUE if op.fits(values[-1].rank)])
                step = Step(op.name, index)
                if not op.make(draw, step, values[-1], values):
                    continue  # the op does not apply to this value: no candidate drawn
                tried += 1
                value = evaluate(seed, inputs, [*chain, step])
                if value is not None:
                    chain.append(step)
                    values.append(value)
                    break
    outputs = [values[-1].name]
    computed = values[len(inputs):-1]
    if computed and draw.chance(0.15):
        outputs.append(draw.pick(computed).name)  # an earlier value as a second output
    batch = draw.pick([1, 2])
    return Network(seed, batch, tuple(step.op for step in chain), _render(seed, batch, inputs, chain, outputs))
