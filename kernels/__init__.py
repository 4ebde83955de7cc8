"""Kernels: Triton kernels and torch versions of the same ops (KV write, block copy, swap,
paged decode and prefill attention), pure functions on tensors, plus ahead-of-time compile
checks. They know nothing of requests or pools."""
