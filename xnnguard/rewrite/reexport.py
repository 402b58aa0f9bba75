"""Export a rewritten module again with the inputs and the dynamic dims of the program it came from.

``rewrite_for_xnnpack`` rewrites ``ExportedProgram.module()`` (weights are attributes there, so a rewrite
can add the reshaped ones) and exports the result again: that keeps parameters, buffers and the graph
signature right, and the result exportable again. The program's user inputs line up one to one with
the leaves of its input spec (a tensor input by its placeholder's name, a constant or None by its
value), and that is how each dynamic dim finds its input again.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import Dim, ExportedProgram
from torch.utils._sympy.numbers import int_oo

from xnnguard.rewrite.runner import RewriteError
from xnnguard.rewrite.sym_powers import powers_as_products

__all__ = ["dynamic_shapes", "example_inputs", "export_again"]


def _placeholder_values(ep: ExportedProgram) -> dict[str, Any]:
    return {node.name: node.meta.get("val") for node in ep.graph.nodes if node.op == "placeholder"}


def _user_input_values(ep: ExportedProgram) -> list[Any]:
    """Each user input's value in input-spec order: a placeholder's (fake) tensor, or the constant itself."""
    values = _placeholder_values(ep)
    entries = ep.graph_signature.user_inputs
    return [values[entry] if isinstance(entry, str) and entry in values else entry for entry in entries]


def example_inputs(ep: ExportedProgram) -> tuple[tuple[object, ...], dict[str, object]]:
    """The inputs ``ep`` was exported with, or zeros of its static input shapes when it kept none."""
    if ep.example_inputs is not None:
        return ep.example_inputs
    leaves = []
    for value in _user_input_values(ep):
        if isinstance(value, torch.Tensor):
            if not all(isinstance(size, int) for size in value.shape):
                raise RewriteError("the program keeps no example inputs and has dynamic dims: export it again")
            leaves.append(torch.zeros(tuple(value.shape), dtype=value.dtype))
        else:
            leaves.append(value)
    return pytree.tree_unflatten(leaves, ep.call_spec.in_spec)


def dynamic_shapes(ep: ExportedProgram, module: torch.nn.Module) -> dict[str, object] | None:
    """The dims of ``ep``'s inputs that were dynamic, as ``Dim`` specs by ``module.forward``'s parameter
    names (None if none), for positional and keyword inputs alike.

    The same symbol gets the same ``Dim`` (same range), so equal dims stay equal and keep their bounds.
    """
    dims: dict[object, object] = {}

    def dim_of(size: torch.SymInt) -> object:
        expr = size.node.expr
        if expr not in dims:
            bounds = ep.range_constraints.get(expr)
            if bounds is None or not expr.is_Symbol:
                dims[expr] = Dim.DYNAMIC
            else:
                unbounded = bounds.upper in (int_oo, float("inf")) or not bounds.upper.is_finite
                upper = None if unbounded else int(bounds.upper)
                dims[expr] = Dim(f"xnnguard_{expr}", min=int(bounds.lower), max=upper)
        return dims[expr]

    specs: list[object] = []
    for value in _user_input_values(ep):
        sizes: Sequence[int | torch.SymInt] = value.shape if isinstance(value, torch.Tensor) else ()
        dynamic = {i: dim_of(size) for i, size in enumerate(sizes) if not isinstance(size, int)}
        specs.append(dynamic or None)
    if all(spec is None for spec in specs):
        return None
    shaped_args, shaped_kwargs = pytree.tree_unflatten(specs, ep.call_spec.in_spec)
    try:
        bound = inspect.signature(module.forward).bind(*shaped_args, **shaped_kwargs)
    except TypeError as error:
        raise RewriteError(f"the rewritten module does not take the program's inputs: {error}") from None
    return dict(bound.arguments)


def _as_hints(shapes: dict[str, object]) -> dict[str, Any]:
    """``shapes`` with each ``Dim`` replaced by ``Dim.DYNAMIC`` over the same range: export then derives the
    relations between sizes itself (``Dim.AUTO``'s, or those a rewrite's views add) instead of refusing
    a named dim that one of its guards narrows."""

    def hint(spec: object) -> object:
        if isinstance(spec, dict):
            return {dim: hint(value) for dim, value in spec.items()}
        if isinstance(spec, (list, tuple)):
            return type(spec)(hint(value) for value in spec)
        if isinstance(spec, Dim):
            upper = spec.max if isinstance(spec.max, int) and spec.max < int_oo else None
            return Dim.DYNAMIC(min=spec.min, max=upper)
        return spec

    return {name: hint(spec) for name, spec in shapes.items()}


def export_again(module: torch.nn.Module, ep: ExportedProgram) -> ExportedProgram:
    """``module`` (rewritten from ``ep.module()``) exported with ``ep``'s example inputs and dynamic dims.

    The dims are named ``Dim``s over ``ep``'s ranges, so that equal dims stay one symbol. A program exported
    with ``Dim.AUTO`` carries relations the named dims do not say (a stride-2 conv's ``(s - 1) // 2 + 1 != 1``),
    and the 2-D forms of a dynamic depth add guards of their own; when export refuses the named dims for
    that, the same ranges are given again as hints it may refine. A size the rewrites spell out that export
    writes as a power (``t ** 2``) becomes a product (``xnnguard.rewrite.sym_powers``): ExecuTorch refuses
    ``operator.pow``.
    """
    return powers_as_products(_export(module, ep))


def _export(module: torch.nn.Module, ep: ExportedProgram) -> ExportedProgram:
    args, kwargs = example_inputs(ep)
    shapes = dynamic_shapes(ep, module)
    try:
        return torch.export.export(module, args, kwargs, dynamic_shapes=shapes, strict=False)
    except Exception as error:  # export's errors are many; say which step failed, keep the cause
        if shapes is None or "Constraints violated" not in str(error):
            raise RewriteError(f"the rewritten program could not be exported again: {error}") from error
        first = error
    try:
        return torch.export.export(module, args, kwargs, dynamic_shapes=_as_hints(shapes), strict=False)
    except Exception as error:
        raise RewriteError(
            f"the rewritten program could not be exported again: {first}; with hints: {error}"
        ) from error
