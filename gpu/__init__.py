"""SPAK's cuTile kernels (the one source of truth) and their host-side plans.

    gpu.kernels   the @ct.kernel functions (fused FMHA, naive three-stage FMHA)
    gpu.plan      framework-agnostic launch plans: plan_fmha(...) -> [Launch]
    gpu.compile   ahead-of-time compilation to cubin for any arch (no GPU needed)

Nothing here imports torch or the simulator; importing ``gpu`` itself is cheap.
"""
