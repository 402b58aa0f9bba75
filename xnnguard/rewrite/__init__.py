"""Rewrites that keep on XNNPACK what it has no kernel for, in equivalent forms it runs.

``rewrite_for_xnnpack`` composes them. Each family has a room: ``conv3d/`` (3-D convolutions,
transposed convolutions, poolings and the batch norms around them), ``rank/`` (ops above 6 dims as
ops of at most 6), ``forms/`` (ops XNNPACK runs in one written form only). The shared parts: the pass
skeleton (``node_rewrite``), the runner of ordered passes (``runner``), node insertion (``insert``),
module attributes (``attributes``) and constant evaluation (``constants``).
"""

from xnnguard.rewrite.rewrite_for_xnnpack import RewriteError, XnnpackRewriter, default_rewrites, rewrite_for_xnnpack

__all__ = ["RewriteError", "XnnpackRewriter", "default_rewrites", "rewrite_for_xnnpack"]
