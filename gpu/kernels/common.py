"""Plain numeric constants shared by the FMHA kernels.

Only Python constants live here, on purpose: the CPU simulator runs a kernel by binding
its own ``ct`` into the kernel module's globals, so tile code (anything that calls ``ct.*``)
is kept inside the kernel's own module (fused.py, naive.py), where that binding reaches it.
"""
import math

# exp(x) == exp2(x * LOG2E). The kernels work in the base-2 domain because exp2 is the
# GPU's native transcendental (one MUFU.EX2), and the scale folds into the same multiply.
LOG2E = 1.4426950408889634  # 1 / ln(2)
NEG_INF = -math.inf
FLOAT32_MAX = 3.4028234663852886e38
