"""Ops XNNPACK 1.5.1 lowers in one written form only, rewritten into it (run before decomposition)."""
