"""Nearest upsampling, 1-D, 2-D and 3-D, as broadcasting multiplies (integer factors) or gathers, which XNNPACK runs.

Invariant established: no ``upsample_nearest{1,2,3}d`` / ``_upsample_nearest_exact{1,2,3}d`` with static
spatial sizes is left. XNNPACK
has no nearest resize; ExecuTorch 1.5.1 ran the 2-D one on its portable kernel and decomposed the 3-D one
(VAE and 3-D UNet decoders) into ``arange`` / ``index`` gathers with ``unsqueeze`` and dtype casts around
them, all outside the delegates.

The form: upsampling by ``f`` along a dim repeats each element ``f`` times in place (``repeat_interleave``),
which is the tensor viewed with a size-1 dim after that dim, multiplied by ``ones`` of size ``f`` there
(XNNPACK's multiply broadcasts), and reshaped (``xnnguard.rewrite.views.expand.broadcast_form``: dims that
are not upsampled merge). The leading (batch, channel) dims merge into one, so a 2-D upsampling is a 5-D
multiply at most; a 3-D one runs in two stages, (H, W) with the frames merged into the rows and then D,
each within 6 dims. A dynamic batch stays dynamic; so does one dynamic spatial dim (a clip's frames) with a
static batch and channels, where each reshape infers that dim alone.

Why it is exact: ``x * 1.0`` is ``x``, and the reshapes move no element. Which source element each output
element takes is checked against the op itself at rewrite time: the op is run on a tensor of its input's
spatial shape holding each element's index, and the rewrite applies only when that gives the integer
replication (``nearest`` and ``nearest-exact`` both do for integer factors; a scale that is not the size
ratio would not).

Any other nearest upsampling with static spatial sizes (an output size that is no multiple of the
input's, fuzz seed 175; a scale of its own) picks each output element's source dim by dim too, just not
by equal repeats: it becomes one gather by constant indices per dim, written as the slices and in-place
repeats of its index runs (``xnnguard.rewrite.views.constant_gather``). The indices are read from the op
itself, run on each element's flat index, and the form is checked against it the same way.

int8: the stock quantizer leaves nearest upsampling float; so are its pieces (``pieces_stay_float``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch

from xnnguard.graph.shapes import tensor_value
from xnnguard.report import Rule
from xnnguard.rewrite.node_rewrite import NodeRewritePass
from xnnguard.rewrite.views.base import replace_by, view_sizes
from xnnguard.rewrite.views.constant_gather import MAX_RUNS, Run, gather_by_runs, gather_constants, index_runs
from xnnguard.rewrite.views.expand import broadcast_form
from xnnguard.rules.tagged import tag_of

__all__ = ["NearestUpsamplePass", "nearest_upsample", "upsample_stages"]

_aten = torch.ops.aten
NEAREST_UPSAMPLES = frozenset({
    _aten.upsample_nearest1d.vec, _aten.upsample_nearest2d.vec, _aten.upsample_nearest3d.vec,
    _aten.upsample_nearest1d.default, _aten.upsample_nearest2d.default, _aten.upsample_nearest3d.default,
    _aten._upsample_nearest_exact1d.vec, _aten._upsample_nearest_exact2d.vec, _aten._upsample_nearest_exact3d.vec,
    _aten._upsample_nearest_exact1d.default, _aten._upsample_nearest_exact2d.default,
    _aten._upsample_nearest_exact3d.default,
})


def upsample_stages(spatial: Sequence[int], factors: Sequence[int]) -> list[tuple[int, int]]:
    """The ``(first, last)`` spatial dims of each stage: the last two dims, then the one before them."""
    rank = len(spatial)
    stages = [(max(0, rank - 2), rank)]
    if rank == 3:
        stages.insert(0, (0, 1))
    return [(a, b) for a, b in stages if any(f != 1 for f in factors[a:b])][::-1]


def _stage_ones(sizes: Sequence[int], factors: Sequence[int]) -> torch.Tensor:
    _, ones = broadcast_form(sizes, factors, interleave=True)
    return torch.ones([1, *ones])


def nearest_upsample(
    x: torch.Tensor, factors: Sequence[int], ones: Sequence[torch.Tensor] | None = None
) -> torch.Tensor:
    """``x`` (N, C, *spatial, static spatial sizes) upsampled by integer ``factors``, nearest.

    ``ones`` are the broadcast constants of each stage (``stage_constants``), made here when not given.
    """
    lead = list(x.shape[:2])
    spatial = list(x.shape[2:])
    stages = upsample_stages(spatial, factors)
    constants = list(ones) if ones is not None else stage_constants(spatial, factors, x.dtype)
    sizes = list(spatial)
    for (first, last), constant in zip(stages, constants):
        view, _ = broadcast_form(sizes[first:last], factors[first:last], interleave=True)
        inner = math.prod(sizes[last:])
        rows = math.prod([*lead, *sizes[:first]])
        # the rows merge into -1 (a dynamic batch stays dynamic); with a dynamic spatial dim they are
        # static and written out, so that the one size the reshape infers is that dim
        rows = rows if isinstance(rows, int) and any(not isinstance(v, int) for v in view) else -1
        y = x.reshape(view_sizes([rows, *view, inner] if inner != 1 else [rows, *view]))
        y = y * (constant.reshape(*constant.shape, 1) if inner != 1 else constant)
        for d in range(first, last):
            sizes[d] *= factors[d]
        x = y.reshape(view_sizes([*lead, *sizes]))
    return x


def stage_constants(spatial: Sequence[int], factors: Sequence[int], dtype: torch.dtype) -> list[torch.Tensor]:
    """The ``ones`` of each stage of ``nearest_upsample``."""
    sizes = list(spatial)
    constants = []
    for first, last in upsample_stages(spatial, factors):
        constants.append(_stage_ones(sizes[first:last], factors[first:last]).to(dtype))
        for d in range(first, last):
            sizes[d] *= factors[d]
    return constants


def _replicates(node: torch.fx.Node, spatial: Sequence[int], factors: Sequence[int]) -> bool:
    """True when the op picks, for each output element, the source element integer replication picks."""
    index = torch.arange(math.prod(spatial), dtype=torch.float64).reshape(1, 1, *spatial)
    assert callable(node.target)
    with torch.no_grad():
        try:
            picked = node.target(index, *node.args[1:], **node.kwargs)
        except RuntimeError:
            return False
    return torch.equal(picked, nearest_upsample(index, factors))


class NearestUpsamplePass(NodeRewritePass):
    """Rewrites each nearest upsampling by integer factors into broadcasting multiplies and reshapes."""

    rule = Rule.NOT_REWRITTEN  # reported; the portable kernels run what is left
    tags_what_it_leaves = False  # untagged: XNNPACK still takes what it can of the op as it is
    subject = "nearest upsampling"
    pieces_stay_float = True

    def picks(self, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and node.target in NEAREST_UPSAMPLES and not tag_of(node)

    def left_node_fails(self, node: torch.fx.Node) -> str | None:
        """A 3-D one left over a dynamic height or width: to_edge decomposes it (there is no core ATen
        upsample_nearest3d) into size arithmetic with ``sym_float``, which its verifier refuses with a bare
        ``AssertionError``; stock ExecuTorch fails the same way."""
        value = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.dim() != 5:
            return None
        if all(isinstance(size, int) for size in value.shape[3:]):
            return None
        return ("ExecuTorch 1.5.1's to_edge cannot lower a 3-D nearest upsampling over a dynamic height or width "
                "(its verifier fails with a bare AssertionError on the decomposition's sym_float): export with "
                "static height and width")

    def rewrite(self, graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> str | None:
        x = node.args[0]
        before, after = tensor_value(x), tensor_value(node)
        if not isinstance(x, torch.fx.Node) or before is None or after is None:
            return "its input is not a tensor"
        if not before.dtype.is_floating_point:
            return f"a {before.dtype} tensor (XNNPACK multiplies floating-point ones)"
        if before.dim() < 3:
            return "an unbatched input"
        spatial, out = before.shape[2:], after.shape[2:]
        if not all(isinstance(s, int) for s in [*spatial, *out, before.shape[1]]):
            return self._rewrite_dynamic(graph_module, node, x, before, after)
        factors = [o // s for s, o in zip(spatial, out)]
        if any(o % s for s, o in zip(spatial, out)) or not _replicates(node, spatial, factors):
            return self._rewrite_as_gathers(graph_module, node, x, spatial)
        constants = stage_constants(spatial, factors, before.dtype)

        def replacement(v: torch.Tensor, *ones: torch.Tensor) -> torch.Tensor:
            return nearest_upsample(v, factors, ones)

        replace_by(graph_module, node, replacement, [x, *constants])
        return None

    @staticmethod
    def _rewrite_dynamic(graph_module: torch.fx.GraphModule, node: torch.fx.Node, x: torch.fx.Node,
                         before: torch.Tensor, after: torch.Tensor) -> str | None:
        """Integer factors with one dynamic spatial dim (a clip's frames) and a static batch and channels: the
        same broadcasting form, its reshapes inferring that dim only."""
        if not all(isinstance(s, int) for s in before.shape[:2]):
            return "a dynamic batch or channel count with a dynamic spatial size: a reshape would infer two sizes"
        spatial, out = list(before.shape[2:]), list(after.shape[2:])
        if sum(not isinstance(s, int) for s in spatial) != 1:
            return "more than one dynamic spatial size"
        factors = [_integer_ratio(o, s) for s, o in zip(spatial, out)]
        if any(f is None for f in factors):
            return "a dynamic spatial size upsampled by a factor that is not an integer"
        picked = [s if isinstance(s, int) else _example(s) for s in spatial]
        if not _replicates(node, picked, factors):  # type: ignore[arg-type]
            return "it does not repeat each element by its integer factor"
        constants = stage_constants(spatial, factors, before.dtype)  # type: ignore[arg-type]

        def replacement(v: torch.Tensor, *ones: torch.Tensor) -> torch.Tensor:
            return nearest_upsample(v, factors, ones)  # type: ignore[arg-type]

        replace_by(graph_module, node, replacement, [x, *constants])
        return None

    @staticmethod
    def _rewrite_as_gathers(
        graph_module: torch.fx.GraphModule, node: torch.fx.Node, x: torch.fx.Node, spatial: Sequence[int]
    ) -> str | None:
        """Any other nearest upsampling (a size that is no multiple, a scale of its own): one gather by
        constant indices per spatial dim, each as the slices and in-place repeats of its index runs."""
        sources = _sources_per_dim(node, spatial)
        if sources is None:
            return "it does not pick its source elements dim by dim"
        runs = {2 + d: index_runs(indices) for d, indices in enumerate(sources) if indices != list(range(spatial[d]))}
        if any(len(r) > MAX_RUNS for r in runs.values()):
            return f"its indices fall into more than {MAX_RUNS} runs along a dim"
        value = x.meta["val"]
        shape, constants = list(value.shape), []
        for dim, dim_runs in runs.items():  # the ones of each dim's repeats, at the sizes the dims before made
            constants += gather_constants(shape, dim, dim_runs, value.dtype)
            shape[dim] = sum(count * repeat for _, count, repeat in dim_runs)

        def replacement(v: torch.Tensor, *ones: torch.Tensor) -> torch.Tensor:
            return _gathered(v, runs, iter(ones))

        replace_by(graph_module, node, replacement, [x, *constants])
        return None


def _integer_ratio(out: int | torch.SymInt, size: int | torch.SymInt) -> int | None:
    """``out / size`` when it is an integer for every size (``2*s / s``), else None."""
    if isinstance(out, int) and isinstance(size, int):
        return out // size if size and out % size == 0 else None
    factor = _example(out) // max(_example(size), 1)
    rest = out - factor * size  # 0 for every size when out is factor * size
    exact = rest == 0 if isinstance(rest, int) else bool(rest.node.expr == 0)
    return factor if factor > 0 and exact else None


def _example(size: int | torch.SymInt) -> int:
    """The size the program was exported with (a run at it checks the form), or 3 without one."""
    if isinstance(size, int):
        return size
    hint = size.node.hint
    return int(hint) if hint is not None else 3


def _gathered(x: torch.Tensor, runs: dict[int, list[Run]], ones: Iterator[torch.Tensor] | None = None) -> torch.Tensor:
    """``x`` gathered along each dim of ``runs`` in turn (``ones``: their ``gather_constants``, in order)."""
    for dim, dim_runs in runs.items():
        x = gather_by_runs(x, dim, dim_runs, ones)
    return x


def _sources_per_dim(node: torch.fx.Node, spatial: Sequence[int]) -> list[list[int]] | None:
    """The source index of each output position, per spatial dim, when the op picks its elements so
    (as every nearest mode does), else None. Read from the op itself, run on each element's flat index."""
    index = torch.arange(math.prod(spatial), dtype=torch.float64).reshape(1, 1, *spatial)
    assert callable(node.target)
    with torch.no_grad():
        try:
            picked = node.target(index, *node.args[1:], **node.kwargs)[0, 0].long()
        except RuntimeError:
            return None
    sources: list[list[int]] = []
    stride = math.prod(spatial)
    for d, size in enumerate(spatial):
        stride //= size
        coordinate = (picked // stride) % size
        line = coordinate[tuple(slice(None) if e == d else 0 for e in range(len(spatial)))]
        shape = [-1 if e == d else 1 for e in range(len(spatial))]
        if not torch.equal(coordinate, line.reshape(shape).expand_as(coordinate)):
            return None
        sources.append(line.tolist())
    if not torch.equal(_gathered(index, {2 + d: index_runs(s) for d, s in enumerate(sources)})[0, 0].long(), picked):
        return None
    return sources
