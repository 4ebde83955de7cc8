"""End-to-end conformance helpers: a small random-weight Llama from Hugging Face
transformers decoding through kvbench's caches and kernels (see `llama_runner`)."""
