"""Where the elements of a reduction lie, and how XNNPACK's ops reach them: the arithmetic, no graphs.

A sum over ``dims`` of a tensor of at most 6 dims runs as ``linear`` ops (XNNPACK's fully connected,
its fastest op), each summing the last dim against a constant ``(1, size)`` vector: the reduced dims
are permuted behind the kept ones (``SumPlan.perm``; none when they trail already), then summed one
after the other, the last first, each linear's output viewed without its trailing 1. A max or a min
runs over each reduced dim where it lies (slices along that dim: no permute at all).

No dims of the reduced tensor are ever merged by a view: only the outputs of the linears (fresh,
contiguous tensors) are reshaped, and the one view of the input splits a dim too long for one linear.
Merging dims is a view only for some strides, and the strides of a tensor an elementwise op computes
from two differently laid-out operands (a residual add of a permuted tensor) differ between PyTorch's
meta functions and the decompositions ``to_edge`` traces with: a view decided on one fails on the
other.

XNNPACK packs a linear's ``(1, size)`` vector into a ``size x 8..16`` panel, so a dim longer than
``MAX_STAGE`` is summed in stages (``stages``): viewed as ``(size / s1, s1)``, summed over ``s1``, then
over the rest. A sum of partial sums of equal-sized blocks is the sum. In float16 the stages are at
most ``xnnguard.rewrite.dtypes.HALF_MAX_STAGE`` long (``SumPlan.limit``; the dtypes module says why), and
a dim no such stages divide (a prime, 197 tokens) is summed as the next length they do, padded with
zeros (``SumPlan.pad``): zeros add nothing to a sum.

Why it is exact: a permute moves elements without changing them, and a sum (max, min) treats the
elements it reduces as an unordered set, so summing dim after dim changes only the order of a float
sum (a rounding per partial sum).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MAX_STAGE", "SumPlan", "chain_stages", "data_dims", "reduced_dims", "stages", "sum_plan"]

MAX_STAGE = 4096  # the longest dim one linear sums: a 16 KB constant, packed by XNNPACK into at most 256 KB

Size = object  # an int, or a torch.SymInt for a dynamic dim


def reduced_dims(dims: object, rank: int) -> list[int] | None:
    """An op's ``dim`` argument as sorted non-negative dims (None or ``[]``: every dim); None if not ints."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) and -rank <= d < rank for d in dims):
        return None
    return sorted({d % rank for d in dims})


def _is_static(size: Size) -> bool:
    return isinstance(size, int)


def stages(size: int, limit: int = MAX_STAGE, pad: bool = False) -> tuple[int, ...]:
    """``size`` as a product of stage lengths, innermost first, each at most ``limit`` when ``size`` allows it.

    Two stages near ``sqrt(size)`` rather than one long and one short: the first stage then has many rows
    to spread over threads, and its constant stays small. A ``size`` with no divisor up to ``limit`` (a
    large prime) is one stage, or with ``pad`` the stages of the next size that has them (their product
    is then above ``size``: the sum is taken over the dim padded with zeros). A dim of size 1 needs none:
    it is dropped by a view.
    """
    if pad:
        padded = size
        while max(stages(padded, limit), default=1) > limit:
            padded += 1
        return stages(padded, limit)
    if size == 1:
        return ()
    if size <= limit:
        return (size,)
    root = math.isqrt(size)
    divisors = [d for d in range(2, min(limit, size - 1) + 1) if size % d == 0 and size // d > 1]
    if not divisors:
        return (size,)
    first = min(divisors, key=lambda d: (abs(d - root), -d))
    return (first, *stages(size // first, limit))


def chain_stages(sizes: Sequence[int], limit: int = MAX_STAGE, pad: bool = False) -> tuple[int, ...]:
    """The stage lengths, in the order the linears run, that sum trailing dims of ``sizes``: the last first."""
    return tuple(s for size in reversed(sizes) for s in stages(size, limit, pad))


def data_dims(shape: Sequence[Size], dims: Sequence[int]) -> list[int]:
    """The dims of ``dims`` that hold data: a dim of size 1 is reduced by a view."""
    return [d for d in dims if not (_is_static(shape[d]) and shape[d] == 1)]


@dataclass(frozen=True)
class SumPlan:
    """``x.permute(perm)`` (if any), then the trailing dims of ``sizes`` summed one by one, the last first,
    in stages of at most ``limit`` (with ``pad``, also a dim that needs padding to have them)."""

    perm: tuple[int, ...] | None
    sizes: tuple[int, ...]
    limit: int = MAX_STAGE
    pad: bool = False

    @property
    def k(self) -> int:
        return math.prod(self.sizes)

    @property
    def stages(self) -> tuple[int, ...]:
        return chain_stages(self.sizes, self.limit, self.pad)


def reduced_size(shape: Sequence[Size], dims: Sequence[int]) -> int | str:
    """How many elements one output of a reduction over ``dims`` reads, or why this cannot be said."""
    sizes = [shape[d] for d in dims]
    if not all(_is_static(size) for size in sizes):
        return "it reduces over a dynamic dim"
    k = math.prod(int(size) for size in sizes)  # type: ignore[call-overload]
    if k == 0 or any(_is_static(size) and size == 0 for size in shape):
        return "it reduces an empty tensor"
    return k


def sum_plan(shape: Sequence[Size], dims: Sequence[int], limit: int = MAX_STAGE, pad: bool = False) -> SumPlan | str:
    """How to sum ``shape`` over ``dims`` (non-negative, distinct) with linears of at most ``limit``
    (``pad``: as ``stages``), or why not.

    When no kept dim holding data lies behind a reduced one, there is no permute, and the trailing dims
    from the first reduced one on are summed (dims of size 1 among them, kept or not, take no linear).
    """
    k = reduced_size(shape, dims)
    if isinstance(k, str):
        return k
    reduced = data_dims(shape, dims)
    if not reduced:
        return "it reduces dims of size 1 only (a view)"
    kept_data = [d for d in data_dims(shape, range(len(shape))) if d not in reduced]
    if all(d < reduced[0] for d in kept_data):
        return SumPlan(None, tuple(int(size) for size in shape[reduced[0] :]), limit, pad)  # type: ignore[call-overload]
    order = tuple(d for d in range(len(shape)) if d not in reduced) + tuple(reduced)
    return SumPlan(order, tuple(int(shape[d]) for d in reduced), limit, pad)  # type: ignore[call-overload]
