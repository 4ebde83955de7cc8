"""Paged KV cache: block pool, block tables, copy-on-write, prefix cache, swap space,
scheduler and `PagedKVCache`, the implementation measured against the reference."""
