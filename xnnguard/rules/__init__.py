"""What XNNPACK (as ExecuTorch 1.5.x lowers to it) cannot take: one rule per module, one list of them all.

* ``rule``: what a rule is (a check, its scope, its effect); ``registry``: every rule, in the order asked;
* ``rank_limit``: tensors of at most ``XNN_MAX_TENSOR_DIMS`` (6) dims;
* ``conv3d``: a convolution is 3-D when its weight has rank 5, and XNNPACK has none;
* ``max_reduction``: a max over one dim keeps it, written 2 or 3 of a 4-D tensor;
* ``prelu_rank``: PReLU on 4-D tensors only;
* ``tanh_gelu``: a GELU only as the erf GELU (1.5.1 drops ``approximate="tanh"``);
* ``tagged``: a node tagged do-not-delegate stays out (the tag names the rule that set it);
* ``passthrough_output``: a partition output stays a value of its own once copies are dropped;
* ``quantized_pad``, ``dynamic_conv_source``, ``dynamic_linear_layout``, ``quantization_match``: what an
  int8 match needs;
* ``no_equivalent``: what no XNNPACK node computes (integer tensors, gathers by run-time indices);
* ``dynamic_conv_kind``: the convolutions XNNPACK runs dynamically quantized (2-D, not depthwise), which
  ``xnnguard.XNNPACKQuantizer`` asks (the partitioner has ExecuTorch's config for it);
* ``conv_batch_range``: a float32 conv over a dynamic batch narrows its range while lowered (no node
  stays out for it: ``xnnguard.keep_dynamic_ranges`` lowers without the narrowing);
* ``keep_out``: ``keep_out_reason``, the one function the tag passes, the partitioner and the
  rewrites ask about a node.

Every module imports torch only inside the functions that look at graph nodes, so the verifier
(which reads flatbuffers, not graphs) can ask the rules without importing torch.
"""
