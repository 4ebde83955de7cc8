"""Kernels: Triton kernels and torch versions of the same ops (KV write, block copy, swap,
paged decode and prefill attention), pure functions on tensors, plus ahead-of-time compile
checks. They know nothing of requests or pools.

Modules:
    ops            the entry points (validate, plan, then dispatch to the chosen backend)
    validation     checks shared by both versions; errors name the bad value
    launch_plan    the immutable plan of one attention call (dtypes, window, span, ...)
    backends       which backend runs a plan and why (each answers `supports(plan)`)
    window_rule    where a kernel starts reading (first key, first block) and the span
    torch_ops      the torch versions
    triton_kernels the Triton kernel bodies (compiled and interpreted wrappers)
    triton_ops     their launchers
    configs        which compiled variant each call uses (shared with aot)
    aot            sm_80 / sm_90 compilation without a GPU: registers, spills, shared, SASS
"""
