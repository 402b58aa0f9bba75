"""Ops on tensors above XNNPACK's 6 dims as ops of at most 6: merged dims, transposes, 2-D linears."""
