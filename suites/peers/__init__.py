"""Peer adapters: kvbench's own and third-party implementations (vLLM, plug-ins found by
the `kvbench.peers` entry points) behind one allocator and one attention interface, so the
conformance properties and benches run on each of them (see suites/peers/base.py)."""
