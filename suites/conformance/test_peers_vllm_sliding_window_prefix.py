"""kvbench's sliding-window prefix caching against vLLM's SlidingWindowManager on the
same random request streams (`suites.peers.window_prefix_diff`; runs in `nox -s peers`,
skipped where vLLM is not importable).

With a pool no stream can fill (nothing evicted) the two must agree on every hit and on
the blocks every request holds after every step: that isolates the hit rule
(`workloads.spec_prefix`) and the release rule (`workloads.spec_capacity`).
"""

from __future__ import annotations

import pytest

from kvbench.suites.peers.base import PeerUnavailableError
from kvbench.suites.peers.vllm_adapter import load_vllm
from kvbench.workloads.kv_spec import KVCacheSpec


@pytest.fixture(scope="module")
def vllm_loaded() -> None:
    try:
        load_vllm()
    except PeerUnavailableError as exc:
        pytest.skip(f"vLLM unavailable: {exc}")


@pytest.mark.parametrize("window", [2, 3, 5, 16, 37])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_sliding_window_prefix_hits_match_vllm(
    vllm_loaded: None, window: int, block_size: int
) -> None:
    from kvbench.suites.peers.window_prefix_diff import run_stream

    for seed in range(2):
        counts = run_stream(seed, window, block_size, num_blocks=4096)
        assert counts.hits_differ == 0 and counts.held_differ == 0, counts.examples
        assert counts.refused_both == counts.refused_one == 0
        assert counts.hits_equal == 40


@pytest.mark.parametrize(("chunk", "block_size"), [(4, 4), (8, 4), (16, 4), (16, 16), (3, 1)])
def test_chunked_local_prefix_hits_match_vllm(
    vllm_loaded: None, chunk: int, block_size: int
) -> None:
    """vLLM's ChunkedLocalAttentionManager: blocks before the next token's chunk count
    as computed (a cold cache hits up to the last chunk start), the chunk's own blocks
    must be cached; kvbench's `ChunkedLocalRule.hit_blocks` and release rule agree."""
    from kvbench.suites.peers.window_prefix_diff import run_stream

    for seed in range(2):
        counts = run_stream(seed, KVCacheSpec.chunked_local(chunk), block_size, num_blocks=4096)
        assert counts.hits_differ == 0 and counts.held_differ == 0, counts.examples
        assert counts.refused_both == counts.refused_one == 0
        assert counts.hits_equal == 40
