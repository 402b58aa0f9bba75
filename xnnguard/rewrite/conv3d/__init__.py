"""3-D convolutions, transposed convolutions and poolings as 2-D ops XNNPACK runs; the batch norms around them."""
