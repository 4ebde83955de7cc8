"""The peer registry: every peer by name, kvbench's built-in adapters first, then the
`kvbench.peers` entry points of installed plug-ins.

Kept apart from `base` (the interfaces) so that the adapters import `base` and this
module imports the adapters, never the other way round. Names are resolved on each call
(cheap: the built-in factories import their libraries lazily), so a plug-in installed
into a running environment is seen by the next lookup.
"""

from __future__ import annotations

import importlib.metadata
import logging

from kvbench.suites.peers.base import AllocatorAdapter, AttentionAdapter, PeerSpec
from kvbench.workloads.errors import ConfigError

log = logging.getLogger(__name__)

#: Entry-point group a third-party package registers its `PeerSpec` factory under.
ENTRY_POINT_GROUP = "kvbench.peers"


def _builtin_specs() -> list[PeerSpec]:
    from kvbench.suites.peers import flex_adapter, kvbench_adapter, vllm_adapter, vllm_triton

    return [
        kvbench_adapter.peer_spec(),
        vllm_adapter.peer_spec(),
        vllm_adapter.split_kv_peer_spec(),
        *vllm_triton.peer_specs(),
        flex_adapter.peer_spec(),
    ]


def _entry_point_specs() -> list[PeerSpec]:
    specs = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            spec = ep.load()()
        except Exception as exc:  # a broken plug-in must not break the suites
            log.warning(
                "peer entry point %s (%s) failed to load: %s: %s",
                ep.name,
                ep.value,
                type(exc).__name__,
                exc,
            )
            continue
        if not isinstance(spec, PeerSpec):
            log.warning("peer entry point %s returned %r, not a PeerSpec", ep.name, spec)
            continue
        specs.append(spec)
    return specs


def peer_specs() -> dict[str, PeerSpec]:
    """Every known peer by name: built-ins first, then entry points (a plug-in may not
    replace a built-in name; it is skipped with a warning)."""
    out: dict[str, PeerSpec] = {}
    for spec in _builtin_specs() + _entry_point_specs():
        if spec.name in out:
            log.warning("peer %r is registered twice; keeping the first", spec.name)
            continue
        out[spec.name] = spec
    return out


def _spec(name: str) -> PeerSpec:
    specs = peer_specs()
    if name not in specs:
        raise ConfigError(f"unknown peer {name!r}; known: {', '.join(specs)}")
    return specs[name]


def allocator_names() -> list[str]:
    """Peers that provide an allocator adapter."""
    return [n for n, s in peer_specs().items() if s.allocator is not None]


def attention_names() -> list[str]:
    """Peers that provide an attention adapter."""
    return [n for n, s in peer_specs().items() if s.attention is not None]


def load_allocator(name: str, num_blocks: int, block_size: int) -> AllocatorAdapter:
    """A fresh allocator of peer `name` with `num_blocks` usable blocks of `block_size`
    tokens (PeerUnavailableError when its library is missing)."""
    spec = _spec(name)
    if spec.allocator is None:
        raise ConfigError(f"peer {name!r} has no allocator adapter")
    return spec.allocator(num_blocks, block_size)


def load_attention(name: str) -> AttentionAdapter:
    """The attention adapter of peer `name` (PeerUnavailableError when unavailable)."""
    spec = _spec(name)
    if spec.attention is None:
        raise ConfigError(f"peer {name!r} has no attention adapter")
    return spec.attention()


def is_timed(name: str) -> bool:
    """Whether peer `name` belongs in the timed benches (see `PeerSpec.timed`)."""
    return _spec(name).timed


def unavailable_reason(name: str) -> str | None:
    """None when peer `name` looks usable here (its cheap `probe`), else why not. A probe
    that raises counts as unavailable. A peer that passes may still fail on first use
    (a broken install); its factories then raise PeerUnavailableError."""
    spec = _spec(name)
    if spec.probe is None:
        return None
    try:
        return spec.probe()
    except Exception as exc:  # a plug-in's probe must not break planning
        return f"probe failed: {type(exc).__name__}: {exc}"


def peer_version(name: str) -> str:
    """The version string of peer `name`'s library ("unknown" when it does not say)."""
    spec = _spec(name)
    if spec.version is None:
        return "unknown"
    try:
        return str(spec.version())
    except Exception:  # version metadata is informative only
        return "unknown"
