"""Fused float containers (``mqbench.nn.intrinsic``)."""
