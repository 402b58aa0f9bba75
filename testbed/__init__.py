"""The networks and the lowering flow that xnnguard's tests and benchmarks share (not shipped in the wheel).

* ``networks``: the zoo of video, 3-D and VLM-vision networks (random weights, seeded), at ``test`` and
  ``bench`` size;
* ``lowered``: lower a program with a partitioner and serialize it; run the ``.pte`` with the real runtime;
* ``quantize``: pt2e with ExecuTorch's or xnnguard's XNNPACK quantizer;
* ``tolerance``: how close a program must come to its reference: one policy for float, one for fp16, one
  for int8, and the whole-network verdict built on them;
* ``flow``: export -> rewrite -> quantize -> lower -> load -> run -> compare, for one model or a network;
* ``int8_reference``: a rewritten op's int8 program against the original op quantized the stock way;
* ``rounding_floor``: how far one-step roundings move a converted int8 network's output;
* ``fuzz``: a graph fuzzer: random networks of the domain through the flow in every mode (``make fuzz``).
"""
