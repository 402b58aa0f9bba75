"""``rewrite_for_xnnpack`` under the import path of xnnguard 0.1 (kept for user code): see ``xnnguard.rewrite``."""

from xnnguard.rewrite.rewrite_for_xnnpack import RewriteError, XnnpackRewriter, default_rewrites, rewrite_for_xnnpack

__all__ = ["RewriteError", "XnnpackRewriter", "default_rewrites", "rewrite_for_xnnpack"]
