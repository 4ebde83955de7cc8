"""A cache built on a bare device name ("cuda") holds its pools on that device and passes
its own `check()`: the cache keeps the resolved device ("cuda:N"), since tensors report
"cuda:N" and torch.device("cuda") != torch.device("cuda:0").

The first GPU run (an H200, 2026-11-28) found every CUDA cache failing `check()` on this
(6 gpu tests). The resolution is tested here on any machine by standing in for CUDA's
device queries, and for real by the `cuda` cases on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from kvbench.paged.cache import PagedKVCache
from kvbench.reference.contiguous import ContiguousKVCache
from kvbench.reference.validation import validate_device
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry

G = KVGeometry(num_layers=2, num_kv_heads=2, head_dim=4, dtype="float32", num_q_heads=4)


@pytest.mark.parametrize(
    ("name", "current", "want"),
    [
        ("cuda", 0, torch.device("cuda", 0)),
        ("cuda", 3, torch.device("cuda", 3)),
        ("cuda:1", 3, torch.device("cuda", 1)),
        (torch.device("cuda"), 2, torch.device("cuda", 2)),
        ("cpu", 0, torch.device("cpu")),
    ],
)
def test_bare_cuda_resolves_to_the_current_device(
    monkeypatch: pytest.MonkeyPatch, name: object, current: int, want: torch.device
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    got = validate_device(name)
    assert got == want and got.index == want.index


def test_bare_cuda_is_kept_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CUDA: nothing to resolve against (allocation fails later with its own error)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert validate_device("cuda") == torch.device("cuda")


def test_unknown_device_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="'warp-drive'"):
        validate_device("warp-drive")


@pytest.mark.parametrize("cache_kind", ["paged", "contiguous"])
def test_cache_on_a_bare_device_name_passes_check(device: torch.device, cache_kind: str) -> None:
    """Built with the bare name (device.type: "cuda", never "cuda:0"), the cache's pools
    and its recorded device agree: check() passes after writes, and gather returns the
    written K/V on the device the tensors report."""
    if cache_kind == "paged":
        cache: PagedKVCache | ContiguousKVCache = PagedKVCache(G, 8, 4, device=device.type)
    else:
        cache = ContiguousKVCache(G, 64, 16, device=device.type)
    cache.admit("r", [1, 2, 3, 4, 5])
    k = torch.randn(2, 5, 2, 4, device=device.type)
    cache.append("r", k, k.clone())
    if isinstance(cache, PagedKVCache):  # the contiguous reference keeps no check()
        cache.check()
    got_k, got_v = cache.gather("r")
    assert got_k.device == k.device
    assert torch.equal(got_k, k) and torch.equal(got_v, k)
