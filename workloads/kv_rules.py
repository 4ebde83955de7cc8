"""Attention kinds as rules: one rule object per `AttentionKind`, found in one table.

Every decision that depends on what a layer's attention reads asks the rule of its kind
(`rule_for(spec)`, an instance bound to the spec's parameters), the way vLLM's
`spec_manager_map` maps a KV cache spec type to the manager that allocates for it:

* the capacity plan (`workloads.spec_capacity`: blocks held per step, the steps a peak
  lies among, the all-full-attention baseline) and prefix hits (`workloads.spec_prefix`);
* the layer-group cache (`paged.layer_groups`: releases, the newest token's view, the
  kernels' window) and the serving cache (`paged.spec_serving`: prefill reservation,
  releases, the next event);
* the time model's layout (`paged.serving.attention_layout`: KV read per query, chunk and
  decode step);
* the kernels' launch (`rule_for_window`: the first position or block read, the span a
  launch is sized by, and the device parameters: which compiled variant runs and the
  `window` int the Triton and C++ kernel bodies take, `device_variant`, `device_reach`,
  `cpu_window`), so no kernel module names a kind.

The float64 oracle (`reference.oracle`) keeps its own mask on purpose, so a wrong rule
here cannot hide behind an oracle built from it; its callers pass the spec's window.

The rules (positions are 0-based token positions; a query at p reads positions
`first_kept(p) .. p` of its own sequence, or the whole encoder output):

| kind | first_kept(p) | blocks held while a step computes n tokens after c |
|---|---|---|
| full | 0 | ceil((c + n) / block) |
| sliding window W | max(0, p - W + 1) | blocks touched by first_kept(c) .. c + n - 1 |
| chunked local C | floor(p / C) x C | blocks touched by first_kept(c) .. c + n - 1 |
| cross-attention E | 0 (the encoder's) | ceil(E / block), from admission to finish |

A new kind is a `KindRule` subclass and its row in `RULES` (docs/extending.md);
`suites/tests/workloads/test_kv_rules.py` holds every rule to a brute-force definition
and checks that every `AttentionKind` has exactly one rule.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from functools import lru_cache
from math import gcd
from types import MappingProxyType
from typing import ClassVar

import torch

from kvbench.workloads.capacity import blocks_for_tokens
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.kv_spec import AttentionKind, KernelWindow, KVCacheSpec


def capped_sum(a: int, b: int, cap: int | None) -> int:
    """sum of min(q, cap) for q in a .. b (None: no cap), exactly."""
    if b < a:
        return 0
    if cap is None or b <= cap:
        return (a + b) * (b - a + 1) // 2
    if a > cap:
        return (b - a + 1) * cap
    return (a + cap) * (cap - a + 1) // 2 + (b - cap) * cap


class KindRule(ABC):
    """What one attention kind reads and holds (bound to one spec's parameters).

    Attributes:
        kind: the `AttentionKind` this rule answers for.
        spec: the spec it is bound to.
        reach: the most of its own sequence's tokens a query reads (None: unbounded, or
            not its own sequence); the windows the time model tracks.
        bounded: blocks wholly before a query's first kept position are never read:
            caches release them, kernels skip them (the windowed kernel variants).
        self_attention: a decoder step writes this kind's KV (False: written once at
            admission, e.g. the encoder output).
        device_variant: the keywords that select this kind's compiled Triton variant in
            `kernels.configs` (empty: the full-attention variant); the variant's kernel
            body applies the kind's first key itself (device code cannot call the rule).
    """

    kind: ClassVar[AttentionKind]
    reach: int | None = None
    bounded: ClassVar[bool] = False
    self_attention: ClassVar[bool] = True
    device_variant: ClassVar[Mapping[str, bool]] = MappingProxyType({})

    def __init__(self, spec: KVCacheSpec) -> None:
        if spec.kind is not self.kind:
            raise TypeError(f"{type(self).__name__} answers for {self.kind.value}, got {spec}")
        self.spec = spec

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec.describe()})"

    # ------------------------------------------------------------------ positions
    def first_kept(self, query_position: int) -> int:
        """The first position a query at `query_position` reads (its own sequence)."""
        return 0

    def first_kept_many(self, positions: torch.Tensor) -> torch.Tensor:
        """`first_kept` of every element of an integer tensor (the kernels' form)."""
        return positions.clamp(min=0, max=0)

    @property
    def kernel_window(self) -> KernelWindow:
        """The `window` the kernels take for this kind (None: every position; an int: a
        sliding window; a spec: any other kind that bounds what a query reads)."""
        return self.reach

    # ------------------------------------------------------------------ device parameters
    @property
    def device_reach(self) -> int:
        """The `window` int the Triton kernel bodies take in `device_variant`: the
        kind's reach where it bounds what a query reads, 0 otherwise."""
        return self.reach if self.bounded and self.reach is not None else 0

    @property
    def cpu_window(self) -> int:
        """The C++ kernels' `window` argument (`first_key` in kernels/cpu_ext/
        paged_attn.cpp): 0 for every position, W > 0 for a sliding window of W tokens;
        a kind the C++ kernels read another way gives its own encoding."""
        return self.device_reach

    # ------------------------------------------------------------------ blocks
    def blocks_in_step(self, computed: int, new: int, block_size: int) -> int:
        """Blocks one sequence's group holds while a step computes `new` tokens after
        `computed` cached ones: those touched by first_kept(computed) .. computed + new - 1
        (blocks wholly before the first kept position are released before the step)."""
        end = computed + new
        if end == 0:
            return 0
        return (end - 1) // block_size - self.first_kept(computed) // block_size + 1

    def blocks_to_grow(self, table_len: int, seq_len: int, n: int, block_size: int) -> int:
        """New blocks a table of `table_len` entries (released ones included) holding
        `seq_len` tokens takes to append `n` more (copy-on-write aside)."""
        return max(0, -(-(seq_len + n) // block_size) - table_len)

    def phase_ends(self, step: int) -> tuple[int, ...]:
        """Step indices (of `step` tokens each) where the held count stops growing and
        starts repeating (the capacity planner's candidates; () when it only grows)."""
        return ()

    def period(self, step: int, block_size: int) -> int:
        """Steps (of `step` tokens) after which the held count repeats once past
        `phase_ends`: a window's two ends move by whole blocks every block_size /
        gcd(step, block_size) steps (the planner evaluates that many before each end)."""
        return block_size // gcd(step, block_size)

    def release_point(self, block: int, block_size: int) -> int | None:
        """The first query position that no longer reads logical block `block` (so the
        block can be released once a query there is computed); None: never."""
        return None

    def admission_blocks(self, block_size: int) -> int:
        """Blocks taken at admission whatever the prompt (the encoder output)."""
        return 0

    def prefill_pages(self, prompt_len: int, chunk: int, block_size: int) -> int:
        """Most blocks the group holds while a prompt of `prompt_len` tokens is computed
        in chunks of at most `chunk` tokens (a serving cache's prefill reservation)."""
        return blocks_for_tokens(prompt_len, block_size)

    def hit_blocks(self, hit_blocks: int, block_size: int) -> range:
        """Logical blocks a prefix hit of `hit_blocks` whole blocks needs cached: those
        the first computed token (at position hit_blocks x block_size) reads, and always
        the hit's last block, so a cold cache never hits (vLLM's rule)."""
        if hit_blocks == 0:
            return range(0)
        first = self.first_kept(hit_blocks * block_size) // block_size
        return range(min(first, hit_blocks - 1), hit_blocks)

    def read_span(self, max_seq_len: int, block_size: int, max_q_len: int = 1) -> int:
        """Tokens a kernel launch covers from a sequence's first read block, for
        sequences of at most `max_seq_len` tokens with at most `max_q_len` new queries
        (decode: 1; the launch size)."""
        return max_seq_len

    def as_full(self) -> KVCacheSpec:
        """The spec this kind's savings are measured against (full attention for a kind
        that skips positions; itself otherwise)."""
        return self.spec

    # ------------------------------------------------------------------ KV reads (time model)
    def reads(self, query_position: int) -> int:
        """Keys a query at `query_position` reads."""
        return query_position + 1 - self.first_kept(query_position)

    def chunk_reads(self, ctx: int, n: int) -> int:
        """Distinct positions the queries at ctx .. ctx + n - 1 read together."""
        return ctx + n - self.first_kept(ctx)

    @abstractmethod
    def chunk_pairs(self, ctx: int, n: int) -> int:
        """(query, key) pairs of the queries at ctx .. ctx + n - 1 (sum of `reads`)."""

    def decode_reads(self, decoders: int, kv_read: int, excess: int) -> int:
        """Keys `decoders` decoding queries read, whose full contexts (c + 1 each) sum to
        `kv_read`, with `excess` their sum of max(0, c + 1 - reach) (0 without reach)."""
        return kv_read - excess

    def decode_slope(self, decoders: int, above: int) -> int:
        """How much `decode_reads` grows per step when every decoder gains a token and
        `above` of them are already past `reach`."""
        return decoders - above


class FullAttentionRule(KindRule):
    """Full attention: every position from 0 is read and kept."""

    kind = AttentionKind.FULL

    def chunk_pairs(self, ctx: int, n: int) -> int:
        return capped_sum(ctx + 1, ctx + n, None)


class SlidingWindowRule(KindRule):
    """A sliding window of W tokens: the query at p reads p - W + 1 .. p (HF, vLLM)."""

    kind = AttentionKind.SLIDING_WINDOW
    bounded = True
    device_variant = MappingProxyType({"windowed": True})

    def __init__(self, spec: KVCacheSpec) -> None:
        super().__init__(spec)
        assert spec.window is not None  # KVCacheSpec checks it
        self.window = self.reach = spec.window

    def first_kept(self, query_position: int) -> int:
        return max(0, query_position - self.window + 1)

    def first_kept_many(self, positions: torch.Tensor) -> torch.Tensor:
        return (positions - self.window + 1).clamp(min=0)

    def phase_ends(self, step: int) -> tuple[int, ...]:
        return ((self.window - 1) // step,)  # the step whose window first fills

    def release_point(self, block: int, block_size: int) -> int | None:
        return (block + 1) * block_size + self.window - 1

    def prefill_pages(self, prompt_len: int, chunk: int, block_size: int) -> int:
        """min(prompt blocks, the blocks a span of W - 1 + chunk tokens can touch)."""
        span = min(prompt_len, self.window - 1 + chunk)  # tokens one step's range covers
        held = -(-(span - 1) // block_size) + 1
        return min(blocks_for_tokens(prompt_len, block_size), held)

    def read_span(self, max_seq_len: int, block_size: int, max_q_len: int = 1) -> int:
        """The first query's window from its first block plus the later queries' keys:
        at most W + block_size - 1 + max_q_len - 1 tokens (decode: W + block_size - 1)."""
        return min(max_seq_len, self.window + block_size - 1 + max_q_len - 1)

    def as_full(self) -> KVCacheSpec:
        return KVCacheSpec.full()

    def chunk_pairs(self, ctx: int, n: int) -> int:
        return capped_sum(ctx + 1, ctx + n, self.window)


class ChunkedLocalRule(KindRule):
    """Chunked local attention of C tokens (Llama 4's `attention_chunk_size`, vLLM's
    ChunkedLocalAttentionSpec): the query at p reads floor(p / C) x C .. p, so the blocks
    of every earlier chunk are never read again."""

    kind = AttentionKind.CHUNKED_LOCAL
    bounded = True
    device_variant = MappingProxyType({"windowed": True, "chunked": True})

    def __init__(self, spec: KVCacheSpec) -> None:
        super().__init__(spec)
        assert spec.chunk is not None  # KVCacheSpec checks it
        self.chunk = self.reach = spec.chunk

    def first_kept(self, query_position: int) -> int:
        return max(0, query_position - query_position % self.chunk)

    def first_kept_many(self, positions: torch.Tensor) -> torch.Tensor:
        return (positions - torch.remainder(positions, self.chunk)).clamp(min=0)

    @property
    def kernel_window(self) -> KernelWindow:
        return self.spec

    @property
    def cpu_window(self) -> int:
        """-C: paged_attn.cpp's `first_key` reads a negative window as a chunk of C."""
        return -self.chunk

    def period(self, step: int, block_size: int) -> int:
        """Every C / gcd(step, C) steps both ends have moved by a whole number of chunks
        (hence of blocks, C being a multiple of the block size where pages are planned)."""
        return max(super().period(step, block_size), self.chunk // gcd(step, self.chunk))

    def release_point(self, block: int, block_size: int) -> int | None:
        """The first chunk start at or after the block's end."""
        return -(-(block + 1) * block_size // self.chunk) * self.chunk

    def prefill_pages(self, prompt_len: int, chunk: int, block_size: int) -> int:
        """The most blocks a step starting anywhere in one attention chunk touches: from
        the chunk's start to C - 1 + chunk tokens later (capped by the prompt); the
        chunk starts' offsets in a block repeat, so a few are tried."""
        starts = range(0, prompt_len, self.chunk)
        held = 0
        for s in starts[: block_size + 1]:
            end = min(s + self.chunk - 1 + chunk, prompt_len)
            held = max(held, (end - 1) // block_size - s // block_size + 1)
        return held

    def hit_blocks(self, hit_blocks: int, block_size: int) -> range:
        """vLLM's ChunkedLocalAttentionManager: the blocks of the first computed token's
        chunk below it only, with no block required when that token starts a chunk
        (vLLM marks every block before the chunk computed, as null blocks: a cold
        cache hits up to the last chunk start)."""
        first = self.first_kept(hit_blocks * block_size) // block_size
        return range(min(first, hit_blocks), hit_blocks)

    def read_span(self, max_seq_len: int, block_size: int, max_q_len: int = 1) -> int:
        """The most of L - (block of first_kept(L - 1)) x block_size over L <= max_seq_len
        (C where the chunk is a whole number of blocks), plus the later queries' keys."""
        last_chunk = (max_seq_len - 1) // self.chunk
        span = 0
        for k in range(max(0, last_chunk - block_size), last_chunk + 1):
            start = k * self.chunk
            end = min(start + self.chunk, max_seq_len)  # the longest L in chunk k
            span = max(span, end - start // block_size * block_size)
        return min(max_seq_len, span + max_q_len - 1)

    def as_full(self) -> KVCacheSpec:
        return KVCacheSpec.full()

    def chunk_pairs(self, ctx: int, n: int) -> int:
        return _mod_sum(ctx + n, self.chunk) - _mod_sum(ctx, self.chunk) + n

    def decode_reads(self, decoders: int, kv_read: int, excess: int) -> int:
        """An upper bound: sum of min(c + 1, C), the reads of a query at its chunk's last
        position (the engine's aggregate tracks the decoders past each reach, not each
        context mod C; over a long decode the exact reads average (C + 1) / 2 against
        this C). Modeled, documented in docs/kv-specs.md."""
        return kv_read - excess


def _mod_sum(x: int, m: int) -> int:
    """sum of (p mod m) for p in 0 .. x - 1, exactly."""
    whole, rest = divmod(x, m)
    return whole * m * (m - 1) // 2 + rest * (rest - 1) // 2


class CrossAttentionRule(KindRule):
    """Cross-attention: E encoder tokens written once at admission, read by every query."""

    kind = AttentionKind.CROSS
    self_attention = False

    def __init__(self, spec: KVCacheSpec) -> None:
        super().__init__(spec)
        assert spec.encoder_len is not None  # KVCacheSpec checks it
        self.encoder_len = spec.encoder_len

    def blocks_in_step(self, computed: int, new: int, block_size: int) -> int:
        return blocks_for_tokens(self.encoder_len, block_size)

    def admission_blocks(self, block_size: int) -> int:
        return blocks_for_tokens(self.encoder_len, block_size)

    def blocks_to_grow(self, table_len: int, seq_len: int, n: int, block_size: int) -> int:
        return 0  # written once at admission

    def prefill_pages(self, prompt_len: int, chunk: int, block_size: int) -> int:
        return 0  # its pages are `admission_blocks`

    def hit_blocks(self, hit_blocks: int, block_size: int) -> range:
        return range(0)  # never prefix-cached (its output is given at admission)

    def reads(self, query_position: int) -> int:
        return self.encoder_len

    def chunk_reads(self, ctx: int, n: int) -> int:
        return self.encoder_len

    def chunk_pairs(self, ctx: int, n: int) -> int:
        return n * self.encoder_len

    def decode_reads(self, decoders: int, kv_read: int, excess: int) -> int:
        return decoders * self.encoder_len

    def decode_slope(self, decoders: int, above: int) -> int:
        return 0


#: The table: each attention kind's rule class (one per kind; test_kv_rules checks it).
RULES: Mapping[AttentionKind, type[KindRule]] = MappingProxyType(
    {
        AttentionKind.FULL: FullAttentionRule,
        AttentionKind.SLIDING_WINDOW: SlidingWindowRule,
        AttentionKind.CHUNKED_LOCAL: ChunkedLocalRule,
        AttentionKind.CROSS: CrossAttentionRule,
    }
)


@lru_cache(maxsize=256)
def rule_for(spec: KVCacheSpec) -> KindRule:
    """The rule of `spec`'s kind, bound to its parameters (looked up in `RULES`)."""
    return RULES[spec.kind](spec)


def rule_for_window(window: KernelWindow) -> KindRule:
    """The rule of the kernels' `window` argument: a sliding window of `window` tokens,
    full attention for None, the spec's own kind for a `KVCacheSpec` (ConfigError naming
    anything else, or a spec whose kind writes no self-attention KV). The one place the
    kernels' argument becomes a kind."""
    if isinstance(window, KVCacheSpec):
        rule = rule_for(window)
        if not rule.self_attention:
            raise ConfigError(f"window={window.describe()!r}: the kernels read self-attention KV")
        return rule
    spec = _FULL if window is None else KVCacheSpec.sliding_window(window)
    return rule_for(spec)


_FULL = KVCacheSpec.full()
