"""The fuzzer's op catalogue: each entry writes one op of a network as Python source, with random parameters.

An entry is a function ``make(draw, step, x, earlier) -> bool``: it draws the op's parameters (kernel,
stride, dims, masks...) for the value ``x`` it is applied to, writes the ``__init__`` lines (modules,
parameters, constant index buffers) and the ``forward`` lines into ``step``, and says False when the op
does not apply to ``x`` (a Conv3d to a 3-D tensor). It may read ``earlier`` values (a residual add, a
``cat``). Whether the drawn op is valid PyTorch is not its concern: the generator runs every candidate
eagerly and keeps only those that run, at two batches, with finite values.

Sizes a reshape writes are literal except the dim that carries the batch, written ``-1`` (or
``x.shape[d]`` where a size is needed), so that a network runs at every batch and exports with a
dynamic one. Tensors made in ``forward`` take their dtype from the input (``full_like``, ``dtype=x.dtype``)
so that the network casts to fp16 whole.

The families follow the domain: video and 3-D networks (Conv3d, ConvTranspose3d, 3-D pooling, patchify
and window partitions up to 8-D), image networks (Conv2d, 2-D pooling, upsampling) and token networks
(norms, linears, attention with HF-style masks), with the idioms that have split XNNPACK programs
(issue 32): masks built from the input's shape, broadcasts, gathers by constant indices, softmax over a
dim other than the last, aliases, a one-input ``cat``, reductions over the batch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["CATALOGUE", "MAX_RANK", "Draw", "Op", "Step", "Value"]

MAX_RANK = 8
T = TypeVar("T")


@dataclass(frozen=True)
class Value:
    """A tensor of the network: its name in ``forward``, its shape at the generator's reference batch, and
    which dim grows with the batch (None once reduced away) by how much per sample (frames folded in: T)."""

    name: str
    shape: tuple[int, ...]
    batch_dim: int | None = 0
    per_batch: int = 1

    @property
    def rank(self) -> int:
        return len(self.shape)

    def channel_first(self, *ranks: int) -> bool:
        """(N, C, ...) of one of ``ranks`` with the batch (if any) in front: what convs and poolings take."""
        return self.rank in ranks and self.batch_dim in (0, None)

    def sizes(self, shape: Sequence[int], batch_at: int | None) -> str:
        """``shape`` as reshape arguments: literal, but ``-1`` at ``batch_at`` (the batch's new place)."""
        return ", ".join("-1" if i == batch_at else str(size) for i, size in enumerate(shape))

    def size(self, dim: int) -> str:
        """Dim ``dim``'s size as code: literal, or ``x.shape[d]`` for the batch's dim."""
        return f"{self.name}.shape[{dim}]" if dim == self.batch_dim else str(self.shape[dim])


class Draw:
    """The generator's random choices (one ``random.Random`` per network: the seed decides everything)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def int(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def pick(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def dims(self, rank: int, low: int = 1, high: int | None = None) -> list[int]:
        """Between ``low`` and ``high`` distinct dims of ``rank``, sorted."""
        count = self.int(low, min(high or rank, rank))
        return sorted(self.rng.sample(range(rank), count))

    def permutation(self, rank: int) -> list[int]:
        order = list(range(rank))
        while order == sorted(order) and rank > 1:
            self.rng.shuffle(order)
        return order

    def choose(self, weighted: Sequence[tuple[T, float]]) -> T:
        items, weights = zip(*weighted)
        return self.rng.choices(items, weights=weights)[0]


@dataclass
class Step:
    """One op of a network as source: ``__init__`` lines, ``forward`` lines, and the value it makes (``v<i>``)."""

    op: str
    index: int
    init: list[str] = field(default_factory=list)
    forward: list[str] = field(default_factory=list)

    @property
    def out(self) -> str:
        return f"v{self.index}"

    def local(self, stem: str) -> str:
        """A name for a temporary of this step in ``forward`` (``q3``, ``mask3``)."""
        return f"{stem}{self.index}"

    def attr(self, stem: str, expression: str) -> str:
        """``self.<stem><i> = expression`` in ``__init__``; returns ``self.<stem><i>``."""
        name = f"self.{stem}{self.index}"
        self.init.append(f"{name} = {expression}")
        return name

    def buffer(self, stem: str, expression: str) -> str:
        """A constant tensor (index list, ...) registered as a buffer; returns ``self.<stem><i>``."""
        self.init.append(f'self.register_buffer("{stem}{self.index}", {expression})')
        return f"self.{stem}{self.index}"

    def line(self, text: str) -> None:
        self.forward.append(text)

    def set(self, expression: str) -> bool:
        """The step's value is ``expression``; True (the op applies)."""
        self.forward.append(f"{self.out} = {expression}")
        return True


Make = Callable[[Draw, Step, Value, Sequence[Value]], bool]


@dataclass(frozen=True)
class Op:
    """A catalogue entry: its name, its family, how often to draw it, the maker, and the ranks it is made for
    (None: any; the generator draws an op for the rank of the value at hand)."""

    name: str
    family: str
    weight: float
    make: Make
    ranks: tuple[int, ...] | None = None

    def fits(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks


def _tuple(values: Sequence[int]) -> str:
    """An int when every entry is the same, else a tuple (``3`` or ``(1, 3, 3)``), as PyTorch's modules take."""
    return str(values[0]) if len(set(values)) == 1 else str(tuple(values))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _dim_code(dim: int, rank: int, draw: Draw) -> int:
    """``dim`` or its negative spelling: both reach export, as in real models."""
    return dim - rank if draw.chance(0.3) else dim


def _spatial(x: Value) -> tuple[int, ...]:
    return x.shape[2:]


# ---------------------------------------------------------------- convolutions


def _conv_parameters(draw: Draw, x: Value, transposed: bool) -> str | None:
    channels, spatial = x.shape[1], _spatial(x)
    groups = 1
    if draw.chance(0.3):
        groups = draw.pick(_divisors(channels))
    out = groups * draw.int(1, max(1, 8 // groups))
    if out > 16:
        return None
    kernel = [draw.pick([1, 2, 3, 3]) for _ in spatial]
    if len(spatial) == 3 and draw.chance(0.3):  # R(2+1)D: a spatial (1, k, k) and a temporal (k, 1, 1) conv
        kernel = [1, 3, 3] if draw.chance(0.5) else [3, 1, 1]
    stride = [draw.pick([1, 1, 2]) for _ in spatial]
    if draw.chance(0.2):
        stride = list(kernel)  # a patch embedding: stride = kernel
    dilation = [draw.pick([1, 1, 1, 2]) for _ in spatial]
    arguments = [f"{channels}, {out}", f"kernel_size={_tuple(kernel)}"]
    if any(s != 1 for s in stride):
        arguments.append(f"stride={_tuple(stride)}")
    if not transposed and all(s == 1 for s in stride) and draw.chance(0.3):
        arguments.append("padding='same'")
    elif draw.chance(0.6):
        padding = [draw.int(0, (k - 1) * d) if k > 1 else 0 for k, d in zip(kernel, dilation)]
        arguments.append(f"padding={_tuple(padding)}")
    if transposed and draw.chance(0.4):
        output_padding = [draw.int(0, max(s, d) - 1) for s, d in zip(stride, dilation)]
        arguments.append(f"output_padding={_tuple(output_padding)}")
    if any(d != 1 for d in dilation):
        arguments.append(f"dilation={_tuple(dilation)}")
    if groups > 1:
        arguments.append(f"groups={groups}")
    if draw.chance(0.3):
        arguments.append("bias=False")
    return ", ".join(arguments)


def _conv(dims: int, transposed: bool) -> Make:
    kind = f"nn.ConvTranspose{dims}d" if transposed else f"nn.Conv{dims}d"

    def make(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
        if not x.channel_first(dims + 2):
            return False
        arguments = _conv_parameters(draw, x, transposed)
        if arguments is None:
            return False
        conv = step.attr("conv", f"{kind}({arguments})")
        computed = f"{conv}({x.name})"
        if draw.chance(0.35):  # the block of ResNets and video networks: conv, batch norm, ReLU
            out = int(arguments.split(", ")[1])
            norm = step.attr("bn", f"nn.BatchNorm{dims}d({out})")
            _randomized(step, norm, weight=True, running=True)
            computed = f"{norm}({computed})"
            if draw.chance(0.6):
                computed = f"F.relu({computed})"
        return step.set(computed)

    return make


# ---------------------------------------------------------------- pooling


def _max_pool(dims: int) -> Make:
    def make(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
        if not x.channel_first(dims + 2):
            return False
        kernel = [min(draw.pick([1, 2, 2, 3]), size) for size in _spatial(x)]
        if dims == 3 and draw.chance(0.3):
            kernel = [1, *kernel[1:]]  # S3D/R3D: pool space only
        stride = [draw.pick([k, k, 1, 2]) for k in kernel]
        padding = [draw.int(0, k // 2) for k in kernel]
        arguments = f"kernel_size={_tuple(kernel)}, stride={_tuple(stride)}"
        if any(padding):
            arguments += f", padding={_tuple(padding)}"
        if draw.chance(0.1):
            arguments += ", dilation=2"
        if draw.chance(0.3):
            arguments += ", ceil_mode=True"
        if draw.chance(0.15):  # indices asked for, then dropped (or kept for an unpooling nobody runs)
            return step.set(f"F.max_pool{dims}d({x.name}, {arguments}, return_indices=True)[0]")
        if draw.chance(0.5):
            return step.set(f"F.max_pool{dims}d({x.name}, {arguments})")
        pool = step.attr("pool", f"nn.MaxPool{dims}d({arguments})")
        return step.set(f"{pool}({x.name})")

    return make


def _avg_pool(dims: int) -> Make:
    def make(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
        if not x.channel_first(dims + 2):
            return False
        kernel = [min(draw.pick([1, 2, 2, 3]), size) for size in _spatial(x)]
        stride = [draw.pick([k, k, 1, 2]) for k in kernel]
        padding = [draw.int(0, k // 2) for k in kernel]
        arguments = f"kernel_size={_tuple(kernel)}, stride={_tuple(stride)}"
        if any(padding):
            arguments += f", padding={_tuple(padding)}"
            if draw.chance(0.5):
                arguments += ", count_include_pad=False"
        if draw.chance(0.3):
            arguments += ", ceil_mode=True"
        pool = step.attr("pool", f"nn.AvgPool{dims}d({arguments})")
        return step.set(f"{pool}({x.name})")

    return make


def _adaptive_pool(dims: int, kind: str) -> Make:
    def make(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
        if not x.channel_first(dims + 2):
            return False
        shape = draw.pick(["global", "divides", "any"])
        if shape == "global":
            out = [1] * dims
        elif shape == "divides":
            out = [draw.pick(_divisors(size)) for size in _spatial(x)]
        else:
            out = [draw.int(1, size) for size in _spatial(x)]
        pool = step.attr("pool", f"nn.Adaptive{kind}Pool{dims}d({_tuple(out)})")
        return step.set(f"{pool}({x.name})")

    return make


# ---------------------------------------------------------------- normalizations


def _randomized(step: Step, module: str, weight: bool, running: bool) -> None:
    """A norm's affine parameters and running statistics drawn, not left at 1 and 0."""
    if weight:
        step.init.append(f"nn.init.uniform_({module}.weight, 0.5, 1.5)")
        step.init.append(f"nn.init.uniform_({module}.bias, -0.5, 0.5)")
    if running:
        step.init.append(f"nn.init.uniform_({module}.running_mean, -0.5, 0.5)")
        step.init.append(f"nn.init.uniform_({module}.running_var, 0.5, 2.0)")


def _batch_norm(dims: int) -> Make:
    def make(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
        if not x.channel_first(dims + 2):
            return False
        norm = step.attr("bn", f"nn.BatchNorm{dims}d({x.shape[1]})")
        _randomized(step, norm, weight=True, running=True)
        return step.set(f"{norm}({x.name})")

    return make


def _group_norm(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    if x.rank < 3 or x.batch_dim not in (0, None):
        return False
    channels = x.shape[1]
    groups = draw.pick(_divisors(channels))
    affine = draw.chance(0.8)
    norm = step.attr("gn", f"nn.GroupNorm({groups}, {channels}{'' if affine else ', affine=False'})")
    _randomized(step, norm, weight=affine, running=False)
    return step.set(f"{norm}({x.name})")


def _instance_norm(dims: int) -> Make:
    def make(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
        if not x.channel_first(dims + 2):
            return False
        affine, running = draw.chance(0.5), draw.chance(0.3)
        options = (", affine=True" if affine else "") + (", track_running_stats=True" if running else "")
        norm = step.attr("inorm", f"nn.InstanceNorm{dims}d({x.shape[1]}{options})")
        _randomized(step, norm, weight=affine, running=running)
        return step.set(f"{norm}({x.name})")

    return make


def _trailing_dims(draw: Draw, x: Value, most: int) -> int:
    """How many trailing dims an op may normalize over: not the batch's, at least one; 0 if none."""
    free = x.rank - (x.batch_dim + 1) if x.batch_dim is not None else x.rank
    return draw.int(1, min(most, free)) if free >= 1 else 0


def _layer_norm(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    count = _trailing_dims(draw, x, 2 if draw.chance(0.7) else 3)
    if not count:
        return False
    shape = list(x.shape[x.rank - count:])
    affine, bias = draw.chance(0.8), draw.chance(0.8)
    options = ("" if affine else ", elementwise_affine=False") + ("" if bias or not affine else ", bias=False")
    norm = step.attr("ln", f"nn.LayerNorm({shape[0] if count == 1 else shape}{options})")
    if affine:
        step.init.append(f"nn.init.uniform_({norm}.weight, 0.5, 1.5)")
        if bias:
            step.init.append(f"nn.init.uniform_({norm}.bias, -0.5, 0.5)")
    return step.set(f"{norm}({x.name})")


def _rms_norm(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    if not _trailing_dims(draw, x, 1):
        return False
    size = x.shape[-1]
    if draw.chance(0.5):
        norm = step.attr("rms", f"nn.RMSNorm({size}, eps=1e-6)")
        step.init.append(f"nn.init.uniform_({norm}.weight, 0.5, 1.5)")
        return step.set(f"{norm}({x.name})")
    gain = step.attr("gain", f"nn.Parameter(torch.rand({size}) + 0.5)")  # the hand-written form (Llama, Qwen)
    variance = step.local("variance")
    step.line(f"{variance} = {x.name}.pow(2).mean(-1, keepdim=True)")
    return step.set(f"{x.name} * torch.rsqrt({variance} + 1e-6) * {gain}")


# ---------------------------------------------------------------- reductions and softmax


def _reduce(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    dims = [d for d in draw.dims(x.rank, 1, 3) if d != x.batch_dim or draw.chance(0.3)]
    keepdim = draw.chance(0.5)
    if not dims or (not keepdim and len(dims) >= x.rank):
        return False
    codes = [_dim_code(d, x.rank, draw) for d in dims]
    dim = f"({', '.join(map(str, codes))})" if len(codes) > 1 else str(codes[0])
    op = draw.pick(["sum", "mean", "amax", "amin", "var", "std", "max", "min"])
    if op in ("var", "std"):
        correction = draw.pick([0, 1])
        return step.set(f"torch.{op}({x.name}, dim={dim}, correction={correction}, keepdim={keepdim})")
    if op in ("max", "min"):  # torch.max(x, dim): values and indices, the values taken
        return step.set(f"torch.{op}({x.name}, dim={codes[0]}, keepdim={keepdim})[0]")
    return step.set(f"{x.name}.{op}(dim={dim}, keepdim={keepdim})")


def _softmax(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    dim = _dim_code(draw.int(0, x.rank - 1), x.rank, draw)
    if draw.chance(0.3):
        return step.set(f"F.log_softmax({x.name}, dim={dim})")
    return step.set(f"torch.softmax({x.name}, dim={dim})" if draw.chance(0.5) else f"{x.name}.softmax({dim})")


# ---------------------------------------------------------------- views: patchify, windows, frames, reshapes


def _patchify(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """(N, C, *S) -> patches (N, *S/p, *p, C) at 2 * len(S) + 2 dims -> tokens (N, L, prod(p) * C)."""
    if not x.channel_first(4, 5):
        return False
    channels, spatial = x.shape[1], _spatial(x)
    patch = [draw.pick(_divisors(size)) for size in spatial]
    grid = [size // p for size, p in zip(spatial, patch)]
    split = [x.shape[0], channels]
    for g, p in zip(grid, patch):
        split += [g, p]
    n = len(spatial)
    order = [0, *(2 + 2 * i for i in range(n)), *(3 + 2 * i for i in range(n)), 1]
    patches = step.local("patches")
    step.line(f"{patches} = {x.name}.reshape({x.sizes(split, x.batch_dim)}).permute{tuple(order)}")
    if draw.chance(0.25):
        return step.set(patches)  # the high-rank patches themselves go on
    tokens = [x.shape[0], math.prod(grid), math.prod(patch) * channels]
    return step.set(f"{patches}.reshape({x.sizes(tokens, x.batch_dim)})")


def _window_partition(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """Swin: (N, C, *S) channels-last, cut into windows of w, each window a batch entry of w**n tokens."""
    if not x.channel_first(4, 5):
        return False
    channels, spatial = x.shape[1], _spatial(x)
    window = [draw.pick(_divisors(size)) for size in spatial]
    n = len(spatial)
    split = [x.shape[0]]
    for size, w in zip(spatial, window):
        split += [size // w, w]
    split.append(channels)
    last = step.local("last")
    windows = step.local("windows")
    step.line(f"{last} = {x.name}.permute(0, {', '.join(str(2 + i) for i in range(n))}, 1)")
    order = [0, *(1 + 2 * i for i in range(n)), *(2 + 2 * i for i in range(n)), 2 * n + 1]
    step.line(f"{windows} = {last}.reshape({x.sizes(split, x.batch_dim)}).permute{tuple(order)}")
    return step.set(f"{windows}.reshape(-1, {math.prod(window)}, {channels})")  # windows into the batch


def _zero_pad(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """``F.pad`` with zeros of the dims a conv or pooling slides over: a causal video conv's (all temporal
    padding in front: Wan, CogVideoX), Swin's to a multiple of its window, a crop (a negative width)."""
    if not x.channel_first(4, 5):
        return False
    widths: list[int] = []
    for size in reversed(x.shape[2:]):  # the last dim first, as F.pad takes them
        low = -1 if size > 2 and draw.chance(0.2) else 0
        widths += [draw.int(low, 2), draw.int(low, 2)]
    if x.rank == 5 and draw.chance(0.5):
        widths[-2:] = [draw.int(1, 2), 0]  # causal
    return step.set(f"F.pad({x.name}, {tuple(widths)})")


def _fold_frames(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """(N, C, T, H, W) -> (N * T, C, H, W): the frames into the batch, for 2-D ops (R(2+1)D, video VAEs)."""
    if not x.channel_first(5):
        return False
    _, channels, _, height, width = x.shape
    return step.set(f"{x.name}.permute(0, 2, 1, 3, 4).reshape(-1, {channels}, {height}, {width})")


def _unfold_frames(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """(N * T, C, H, W) -> (N, C, T, H, W): the frames folded into the batch back out."""
    if not (x.rank == 4 and x.batch_dim == 0 and x.per_batch > 1):
        return False
    frames = x.per_batch
    return step.set(f"{x.name}.reshape(-1, {frames}, {', '.join(map(str, x.shape[1:]))}).permute(0, 2, 1, 3, 4)")


def _to_tokens(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    if not x.channel_first(4, 5):
        return False
    return step.set(f"{x.name}.flatten(2).transpose(1, 2)")


def _to_image(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """(N, L, C) -> (N, C, h, w) with h * w = L (a ViT's tokens back onto a grid)."""
    if not (x.rank == 3 and x.batch_dim in (0, None)):
        return False
    _, length, channels = x.shape
    height = draw.pick(_divisors(length))
    shape = [x.shape[0], channels, height, length // height]
    return step.set(f"{x.name}.transpose(1, 2).reshape({x.sizes(shape, x.batch_dim)})")


def _split_dim(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """One dim (not the batch's) split in two: a head split, a window split; up to MAX_RANK dims."""
    candidates = [d for d in range(x.rank) if d != x.batch_dim]
    if x.rank >= MAX_RANK or not candidates:
        return False
    dim = draw.pick(candidates)
    first = draw.pick(_divisors(x.shape[dim]))
    shape = [*x.shape[:dim], first, x.shape[dim] // first, *x.shape[dim + 1:]]
    batch_at = None if x.batch_dim is None else x.batch_dim + (x.batch_dim > dim)
    if draw.chance(0.3):
        return step.set(f"{x.name}.unflatten({dim}, ({first}, {x.shape[dim] // first}))")
    return step.set(f"{x.name}.reshape({x.sizes(shape, batch_at)})")


def _merge_dims(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    if x.rank < 2:
        return False
    dim = draw.int(0, x.rank - 2)
    if draw.chance(0.3):
        return step.set(f"{x.name}.flatten({dim}, {dim + 1})")
    shape = [*x.shape[:dim], x.shape[dim] * x.shape[dim + 1], *x.shape[dim + 2:]]
    batch_at = None
    if x.batch_dim is not None:
        batch_at = x.batch_dim if x.batch_dim <= dim else x.batch_dim - 1
    return step.set(f"{x.name}.reshape({x.sizes(shape, batch_at)})")


def _permute(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    if x.rank < 2:
        return False
    if draw.chance(0.3):
        first, second = draw.rng.sample(range(x.rank), 2)
        return step.set(f"{x.name}.transpose({first}, {second})")
    return step.set(f"{x.name}.permute{tuple(draw.permutation(x.rank))}")


def _unsqueeze(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    if x.rank >= MAX_RANK:
        return False
    return step.set(f"{x.name}.unsqueeze({draw.int(0, x.rank)})")


def _alias(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """An alias of the whole tensor (``aten.alias``): ``detach`` or ``x[...]``."""
    return step.set(f"{x.name}.detach()" if draw.chance(0.5) else f"{x.name}[...]")


# ---------------------------------------------------------------- linears and upsampling


def _linear(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """A linear on the last dim of a tensor of any rank (a patch projection on 8-D patches too)."""
    if x.batch_dim == x.rank - 1:
        return False
    out = draw.int(1, 16)
    linear = step.attr("fc", f"nn.Linear({x.shape[-1]}, {out}{'' if draw.chance(0.7) else ', bias=False'})")
    if draw.chance(0.3):  # an MLP: linear, activation, linear back
        back = step.attr("fc_out", f"nn.Linear({out}, {x.shape[-1]})")
        return step.set(f"{back}(F.{draw.pick(['gelu', 'silu', 'relu'])}({linear}({x.name})))")
    return step.set(f"{linear}({x.name})")


def _upsample(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    if not x.channel_first(4, 5):
        return False
    dims = x.rank - 2
    mode = draw.pick(["nearest", "nearest", "bilinear" if dims == 2 else "trilinear"])
    if draw.chance(0.6):
        factors = [draw.pick([1, 2, 2]) for _ in range(dims)]
        if dims == 3 and draw.chance(0.5):
            factors[0] = 1  # space only, a video decoder's spatial upsampling
        where = f"scale_factor={_tuple([float(f) for f in factors])}"
    else:
        where = f"size={tuple(size * draw.pick([1, 2]) + draw.pick([0, 0, 1]) for size in _spatial(x))}"
    corners = ", align_corners=True" if mode != "nearest" and draw.chance(0.3) else ""
    if draw.chance(0.3):
        upsample = step.attr("up", f"nn.Upsample({where}, mode='{mode}'{corners})")
        return step.set(f"{upsample}({x.name})")
    return step.set(f"F.interpolate({x.name}, {where}, mode='{mode}'{corners})")


# ---------------------------------------------------------------- attention


def _mask(draw: Draw, step: Step, x: Value, length: int, dtype_of: str) -> tuple[str, str] | None:
    """A mask built from the input's shape, HF-style: (kind, name), kind "bool" (True: attend) or "float"
    (added to the scores); None for no mask. Every query keeps at least one key."""
    kind = draw.pick(["none", "causal", "padding", "padding", "causal padding"])
    if kind == "none":
        return None
    mask = step.local("mask")
    positions = step.local("positions")
    step.line(f"{positions} = torch.arange({length}, device={x.name}.device)")
    keep = None
    if "padding" in kind:  # the last tokens are padding: a per-sample key mask from the batch size
        padded = draw.int(0, length - 1)
        batch = x.size(0) if x.batch_dim == 0 else str(x.shape[0])
        step.line(f"{mask} = torch.ones({batch}, {length}, dtype=torch.bool, device={x.name}.device)")
        step.line(f"{mask} = ({mask} & ({positions} < {length - padded}))[:, None, None, :]")
        keep = mask
    if "causal" in kind:
        causal = step.local("causal")
        if draw.chance(0.5):
            step.line(f"{causal} = {positions}[None, :] <= {positions}[:, None]")
        else:
            step.line(f"{causal} = torch.ones({length}, {length}, dtype=torch.bool, device={x.name}.device).tril()")
        keep = causal if keep is None else f"({keep} & {causal})"
        step.line(f"{mask} = {keep}")
    if draw.chance(0.3):  # HF's guard: a query that sees no key sees every key (any, then or)
        step.line(f"{mask} = {mask} | ~{mask}.any(dim=-1, keepdim=True)")
    if draw.chance(0.5):  # the additive form: 0 where attended, the dtype's minimum elsewhere
        additive = step.local("bias")
        if draw.chance(0.5):
            step.line(f"{additive} = torch.where({mask}, 0.0, torch.finfo({dtype_of}.dtype).min).to({dtype_of}.dtype)")
        else:
            step.line(f"{additive} = torch.zeros_like({mask}, dtype={dtype_of}.dtype).masked_fill(~{mask}, "
                      f"torch.finfo({dtype_of}.dtype).min)")
        return "float", additive
    return "bool", mask


def _attention(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """Multi-head self-attention on (N, L, C): SDPA, or matmul -> mask -> softmax -> matmul."""
    if not (x.rank == 3 and x.batch_dim in (0, None)):
        return False
    _, length, channels = x.shape
    heads = draw.pick([h for h in _divisors(channels) if h <= 4])
    head_dim = channels // heads
    qkv = step.attr("qkv", f"nn.Linear({channels}, {3 * channels})")
    proj = step.attr("proj", f"nn.Linear({channels}, {channels})")
    q, k, v = step.local("q"), step.local("k"), step.local("v")
    packed = step.local("qkv")
    step.line(f"{packed} = {qkv}({x.name}).reshape({x.sizes([x.shape[0], length, 3, heads, head_dim], x.batch_dim)})"
              ".permute(2, 0, 3, 1, 4)")
    if draw.chance(0.5):
        step.line(f"{q}, {k}, {v} = {packed}.unbind(0)")
    else:
        step.line(f"{q}, {k}, {v} = {packed}[0], {packed}[1], {packed}[2]")
    attended = step.local("attended")
    if draw.chance(0.5):
        mask = _mask(draw, step, x, length, q)
        if mask is None and draw.chance(0.5):
            step.line(f"{attended} = F.scaled_dot_product_attention({q}, {k}, {v}, is_causal=True)")
        else:
            argument = "" if mask is None else f", attn_mask={mask[1]}"
            step.line(f"{attended} = F.scaled_dot_product_attention({q}, {k}, {v}{argument})")
    else:
        scores = step.local("scores")
        step.line(f"{scores} = ({q} @ {k}.transpose(-2, -1)) * {head_dim ** -0.5!r}")
        mask = _mask(draw, step, x, length, scores)
        if mask is not None and mask[0] == "bool":
            step.line(f"{scores} = {scores}.masked_fill(~{mask[1]}, torch.finfo({scores}.dtype).min)")
        elif mask is not None:
            step.line(f"{scores} = {scores} + {mask[1]}")
        step.line(f"{attended} = {scores}.softmax(dim=-1) @ {v}")
    merged = x.sizes([x.shape[0], length, channels], x.batch_dim)
    return step.set(f"{proj}({attended}.transpose(1, 2).reshape({merged}))")


# ---------------------------------------------------------------- broadcasts, gathers, cat


def _class_token(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """A learned token expanded to the batch and put in front along dim 1 (ViT, MViT): expand into cat."""
    if x.rank < 2 or x.batch_dim != 0:
        return False
    rest = x.shape[2:]
    token = step.attr("token", f"nn.Parameter(torch.randn(1, 1{''.join(f', {s}' for s in rest)}) * 0.5)")
    expanded = ", ".join([x.size(0)] + ["-1"] * (x.rank - 1))
    return step.set(f"torch.cat([{token}.expand({expanded}), {x.name}], dim=1)")


def _expand_binary(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """A broadcast made explicit, into an elementwise op: a statistic or a parameter ``expand``ed to ``x``."""
    if x.rank < 1:
        return False
    if draw.chance(0.5):
        dim = draw.int(0, x.rank - 1)
        source = f"{x.name}.{draw.pick(['mean', 'amax', 'sum'])}(dim={dim}, keepdim=True)"
    else:
        shape = [1 if draw.chance(0.5) else size for size in x.shape]
        shape = [1 if d == x.batch_dim else size for d, size in enumerate(shape)]
        source = step.attr("scale", f"nn.Parameter(torch.rand({', '.join(map(str, shape))}) + 0.5)")
    if draw.chance(0.5):
        expanded = f"{source}.expand_as({x.name})"
    else:
        expanded = f"{source}.expand({', '.join(x.size(d) for d in range(x.rank))})"
    return step.set(f"{x.name} {draw.pick(['*', '+', '-'])} {expanded}")


def _expand(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """A new dim, broadcast: ``unsqueeze(d).expand(..., n, ...)`` (as an output when it is the last op)."""
    if x.rank >= MAX_RANK:
        return False
    dim = draw.int(0, x.rank)
    sizes = ["-1"] * (x.rank + 1)
    sizes[dim] = str(draw.int(2, 4))
    return step.set(f"{x.name}.unsqueeze({dim}).expand({', '.join(sizes)})")


def _repeat_dim(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """Llama's ``repeat_kv``: each entry of a dim repeated n times by unsqueeze, expand and reshape."""
    candidates = [d for d in range(x.rank) if d != x.batch_dim]
    if x.rank >= MAX_RANK or not candidates:
        return False
    dim = draw.pick(candidates)
    times = draw.int(2, 3)
    sizes = ["-1"] * (x.rank + 1)
    sizes[dim + 1] = str(times)
    shape = [*x.shape[:dim], x.shape[dim] * times, *x.shape[dim + 1:]]
    return step.set(f"{x.name}.unsqueeze({dim + 1}).expand({', '.join(sizes)}).reshape({x.sizes(shape, x.batch_dim)})")


def _gather(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """A gather along a dim (not the batch's) by indices fixed when the network is built."""
    candidates = [d for d in range(x.rank) if d != x.batch_dim]
    if not candidates:
        return False
    dim = draw.pick(candidates)
    size = x.shape[dim]
    form = draw.pick(["index_select", "list", "arange"])
    if form == "arange":  # arange -> clamp -> index: positions shifted and clamped to the edge
        count, shift = draw.int(1, size + 2), draw.int(-2, 2)
        indices = step.local("index")
        step.line(f"{indices} = (torch.arange({count}, device={x.name}.device) + {shift}).clamp(0, {size - 1})")
    else:
        chosen = [draw.int(0, size - 1) for _ in range(draw.int(1, size + 1))]
        if form == "list":
            where = ", ".join([":"] * dim + [str(chosen)])
            return step.set(f"{x.name}[{where}]")
        indices = step.buffer("index", f"torch.tensor({chosen})")
    if draw.chance(0.5):
        return step.set(f"torch.index_select({x.name}, {dim}, {indices})")
    return step.set(f"{x.name}[{', '.join([':'] * dim + [indices])}]")


def _alike(x: Value, earlier: Sequence[Value], dim: int | None = None) -> list[Value]:
    """Earlier values of ``x``'s shape (but along ``dim``) and batch dim: what a residual or a cat takes."""
    return [
        e for e in earlier
        if e.name != x.name and e.rank == x.rank and e.batch_dim == x.batch_dim and e.per_batch == x.per_batch
        and all(a == b or d == dim for d, (a, b) in enumerate(zip(e.shape, x.shape)))
    ]


def _cat(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    dim = draw.int(0, x.rank - 1)
    if dim == x.batch_dim and not draw.chance(0.2):
        dim = (dim + 1) % x.rank
    code = _dim_code(dim, x.rank, draw)
    form = draw.pick(["one", "earlier", "itself"])
    if form == "one":
        return step.set(f"torch.cat([{x.name}], dim={code})")
    others = _alike(x, earlier, dim)
    if form == "earlier" and others:
        other = draw.pick(others).name
        return step.set(f"torch.cat([{x.name}, {other}], dim={code})" if draw.chance(0.5)
                        else f"torch.cat([{other}, {x.name}], dim={code})")
    return step.set(f"torch.cat([{x.name}, F.relu({x.name})], dim={code})")


def _residual(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """An add (or mul, sub) with an earlier value of the same shape; without one, around an activation."""
    others = _alike(x, earlier)
    op = draw.choose([("+", 0.6), ("*", 0.2), ("-", 0.2)])
    if others:
        return step.set(f"{x.name} {op} {draw.pick(others).name}")
    return step.set(f"{x.name} {op} F.silu({x.name})")


# ---------------------------------------------------------------- elementwise


def _activation(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    kind = draw.pick(["relu", "relu_inplace", "gelu", "gelu_tanh", "silu", "hardswish", "leaky_relu", "prelu",
                      "sigmoid", "tanh", "relu6"])
    if kind == "relu_inplace":  # torchvision's ReLU(inplace=True)
        relu = step.attr("relu", "nn.ReLU(inplace=True)")
        return step.set(f"{relu}({x.name})")
    if kind == "gelu_tanh":
        return step.set(f"F.gelu({x.name}, approximate='tanh')")
    if kind == "leaky_relu":
        return step.set(f"F.leaky_relu({x.name}, {draw.pick([0.01, 0.1, 0.2])})")
    if kind == "prelu":
        channels = x.shape[1] if x.rank >= 2 and x.batch_dim != 1 and draw.chance(0.6) else 1
        prelu = step.attr("prelu", f"nn.PReLU({channels})")
        step.init.append(f"nn.init.uniform_({prelu}.weight, 0.0, 0.5)")
        return step.set(f"{prelu}({x.name})")
    if kind == "relu6":
        return step.set(f"F.relu6({x.name})")
    if kind in ("sigmoid", "tanh", "relu"):
        return step.set(f"torch.{kind}({x.name})")
    return step.set(f"F.{kind}({x.name})")


def _scalar(draw: Draw, step: Step, x: Value, earlier: Sequence[Value]) -> bool:
    """An elementwise op with a Python scalar."""
    value = draw.pick([0.5, 2.0, 0.25, 1.5, 3.0])
    form = draw.pick(["*", "+", "-", "/", "rsub", "clamp"])
    if form == "rsub":
        return step.set(f"{value} - {x.name}")
    if form == "clamp":
        return step.set(f"{x.name}.clamp({-value}, {value})")
    return step.set(f"{x.name} {form} {value}")


CATALOGUE: tuple[Op, ...] = (
    Op("conv3d", "conv", 3.0, _conv(3, transposed=False), (5,)),
    Op("conv_transpose3d", "conv", 1.5, _conv(3, transposed=True), (5,)),
    Op("conv2d", "conv", 3.0, _conv(2, transposed=False), (4,)),
    Op("conv_transpose2d", "conv", 0.5, _conv(2, transposed=True), (4,)),
    Op("max_pool3d", "pool", 1.0, _max_pool(3), (5,)),
    Op("avg_pool3d", "pool", 1.0, _avg_pool(3), (5,)),
    Op("adaptive_avg_pool3d", "pool", 0.7, _adaptive_pool(3, "Avg"), (5,)),
    Op("adaptive_max_pool3d", "pool", 0.5, _adaptive_pool(3, "Max"), (5,)),
    Op("max_pool2d", "pool", 1.0, _max_pool(2), (4,)),
    Op("avg_pool2d", "pool", 1.0, _avg_pool(2), (4,)),
    Op("adaptive_avg_pool2d", "pool", 0.7, _adaptive_pool(2, "Avg"), (4,)),
    Op("adaptive_max_pool2d", "pool", 0.3, _adaptive_pool(2, "Max"), (4,)),
    Op("batch_norm3d", "norm", 0.4, _batch_norm(3), (5,)),
    Op("batch_norm2d", "norm", 0.4, _batch_norm(2), (4,)),
    Op("group_norm", "norm", 1.0, _group_norm, (3, 4, 5)),
    Op("instance_norm3d", "norm", 0.7, _instance_norm(3), (5,)),
    Op("instance_norm2d", "norm", 0.5, _instance_norm(2), (4,)),
    Op("layer_norm", "norm", 1.5, _layer_norm),
    Op("rms_norm", "norm", 1.0, _rms_norm),
    Op("reduce", "reduce", 2.0, _reduce),
    Op("softmax", "softmax", 1.5, _softmax),
    Op("patchify", "view", 1.2, _patchify, (4, 5)),
    Op("window_partition", "view", 1.0, _window_partition, (4, 5)),
    Op("zero_pad", "view", 0.8, _zero_pad, (4, 5)),
    Op("fold_frames", "view", 0.8, _fold_frames, (5,)),
    Op("unfold_frames", "view", 4.0, _unfold_frames, (4,)),
    Op("to_tokens", "view", 0.8, _to_tokens, (4, 5)),
    Op("to_image", "view", 0.8, _to_image, (3,)),
    Op("split_dim", "view", 1.0, _split_dim),
    Op("merge_dims", "view", 1.0, _merge_dims),
    Op("permute", "view", 1.0, _permute),
    Op("unsqueeze", "view", 0.4, _unsqueeze),
    Op("alias", "view", 0.4, _alias),
    Op("linear", "linear", 2.0, _linear),
    Op("upsample", "upsample", 1.0, _upsample, (4, 5)),
    Op("attention", "attention", 2.0, _attention, (3,)),
    Op("class_token", "broadcast", 0.7, _class_token),
    Op("expand_binary", "broadcast", 0.8, _expand_binary),
    Op("expand", "broadcast", 0.5, _expand),
    Op("repeat_dim", "broadcast", 0.5, _repeat_dim),
    Op("gather", "gather", 1.2, _gather),
    Op("cat", "cat", 1.0, _cat),
    Op("residual", "residual", 1.5, _residual),
    Op("activation", "activation", 2.0, _activation),
    Op("scalar", "scalar", 1.0, _scalar),
)
