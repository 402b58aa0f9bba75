"""Ops XNNPACK lowers in one written form only, rewritten into it by the partitioner."""
