"""cuTile FMHA forward kernels. Kernel modules import only ``cuda.tile`` and plain
constants; they do not know the simulator exists."""
from .fused import fmha_fwd_kernel
from .naive import naive_pv_kernel, naive_scores_kernel, naive_softmax_kernel

__all__ = ["fmha_fwd_kernel", "naive_scores_kernel", "naive_softmax_kernel",
           "naive_pv_kernel"]
