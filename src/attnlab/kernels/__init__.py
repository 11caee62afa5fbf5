"""The attention kernels: the argument checks, the naive reference, the tiled (FlashAttention) kernel,
the decode step, the fused numba loops, softmax and masks, and `attention`, the front door that picks one."""
