"""vLLM v1's Scheduler and kvbench's engine (policy vllm-v1) in lockstep, memory-only.

vLLM 0.32's `vllm.v1.core.sched.scheduler.Scheduler` is driven in-process with no model,
as vLLM's own scheduler tests do (docs/plugins.md): a folder with a tiny Llama
`config.json`, one full-attention KV group of `num_blocks` blocks, prefix caching on,
FCFS, recompute. Each step it is answered with one sampled token for every request whose
computed tokens reached its tokens (the token id kvbench's engine gives that position).

Arrivals: both sides run on one clock of `STEP_S` modeled seconds a step (`UnitClock`:
every step costs exactly that). kvbench's engine lets a request join at the first step
whose start time reaches its arrival (jumping the clock when idle); the same request is
added to vLLM's scheduler just before that step's `schedule()`. The pair is compared
after EVERY step (`Decision`): scheduled ids with their token counts (in scheduling
order), preempted ids, finished ids, the prefix-hit tokens of each admission, and the
blocks in use (vLLM: the pool's blocks less its free ones, the null block aside; kvbench:
the same count of a pool one block smaller, as vLLM's null block is never usable).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvbench.paged.cache import PagedKVCache
from kvbench.paged.serving.engine import Engine
from kvbench.paged.serving.engine.v1 import V1Decision
from kvbench.paged.serving.time_model import SchedulerConfig
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.trace import Trace

#: Modeled seconds of one step on both sides (arrivals fall in steps of this length).
STEP_S = 0.02
GEOM = KVGeometry(1, 1, 4, "float32")
MAX_MODEL_LEN = 65_536
STAT_KEYS = (
    "requests",
    "queries",
    "hits",
    "preempted_requests",
    "preempted_queries",
    "preempted_hits",
)


def vllm_missing() -> str | None:
    """Why vLLM's v1 scheduler cannot be driven here (None: it can)."""
    try:
        import einops  # noqa: F401  (ModelConfig imports it while it reads the model)
        from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401
    except Exception as exc:
        return f"vLLM v1 scheduler not importable ({type(exc).__name__}: {exc})"
    return None


class UnitClock:
    """A time model whose every step costs STEP_S (arrivals land on step boundaries)."""

    windows: tuple[int, ...] = ()
    PS = round(STEP_S * 1e12)

    def step_ps(self, *args: object) -> int:
        return self.PS

    def decode_span_ps(self, d: int, kv: int, k: int, *rest: object) -> int:
        return self.PS * k

    def for_cache(self, cache_block_size: int, can_swap: bool) -> UnitClock:
        """Itself: a step costs STEP_S whatever the cache's block size (TimeModel's
        `for_cache`, which the engine asks)."""
        return self


@dataclass(frozen=True)
class Case:
    """One differential run: a trace and the budgets both sides get."""

    name: str
    trace: Trace
    block_size: int
    num_blocks: int  # vLLM's pool, null block included
    max_num_seqs: int
    max_batched_tokens: int
    long_prefill_token_threshold: int = 0
    chunked_prefill: bool = True
    #: vLLM refuses a budget under max_model_len without chunked prefill
    max_model_len: int = MAX_MODEL_LEN


@dataclass
class Decision:
    """What one step decided (comparable with ==)."""

    scheduled: list[tuple[str, int]]
    preempted: list[str]
    finished: list[str]
    hits: dict[str, int]
    used_blocks: int


@dataclass
class PairResult:
    steps: int = 0
    divergence: str | None = None
    kv_hits: int = 0
    vllm_hits: int = 0
    kv_stats: dict[str, int] = field(default_factory=dict)
    vllm_stats: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
    seconds: float = 0.0


def engine_for(case: Case, mode: str = "token", index_duplicates: bool = True) -> Engine:
    """kvbench's engine in vllm-v1 mode over a memory-only cache the size of vLLM's
    usable pool; `index_duplicates=False` is kvbench's default rule for a block that
    fills with content already cached (left unindexed), which parts from vLLM's."""
    cache = PagedKVCache(
        GEOM,
        case.num_blocks - 1,
        case.block_size,
        max_seq_len=case.max_model_len,
        store_kv=False,
        enable_prefix_caching=True,
        index_duplicates=index_duplicates,  # vLLM's BlockHashToBlockMap (docs/serving.md)
    )
    cfg = SchedulerConfig(
        max_batched_tokens=case.max_batched_tokens,
        max_num_seqs=case.max_num_seqs,
        chunked_prefill=case.chunked_prefill,
        preemption="recompute",
        policy="vllm-v1",
        long_prefill_token_threshold=case.long_prefill_token_threshold,
        mode=mode,
    )
    return Engine(cache, cfg, UnitClock())  # type: ignore[arg-type]


class VllmDriver:
    """vLLM's Scheduler for one case, built without a model (module docstring)."""

    def __init__(self, case: Case, folder: str) -> None:
        import torch
        from vllm.config import CacheConfig, ModelConfig, VllmConfig
        from vllm.config import SchedulerConfig as VSched
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
        )
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request
        from vllm.v1.structured_output import StructuredOutputManager

        cfg_path = os.path.join(folder, "config.json")
        if not os.path.exists(cfg_path):
            with open(cfg_path, "w") as f:
                json.dump(_LLAMA, f)
        model = ModelConfig(model=folder, skip_tokenizer_init=True, dtype="float32", seed=0)
        model.max_model_len = case.max_model_len
        sched = VSched(
            max_num_seqs=case.max_num_seqs,
            max_num_batched_tokens=case.max_batched_tokens,
            max_model_len=case.max_model_len,
            enable_chunked_prefill=case.chunked_prefill,
            long_prefill_token_threshold=case.long_prefill_token_threshold,
            is_encoder_decoder=False,
        )
        bs = case.block_size
        cache = CacheConfig(block_size=bs, enable_prefix_caching=True, cache_dtype="auto")
        cache.num_gpu_blocks = case.num_blocks
        vcfg = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache)
        spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32)
        kv = KVCacheConfig(
            num_blocks=case.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
        )
        self.s = Scheduler(
            vllm_config=vcfg,
            kv_cache_config=kv,
            log_stats=True,
            structured_output_manager=StructuredOutputManager(vcfg),
            block_size=bs,
        )
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(bs, sha256)
        self.Request, self.SamplingParams = Request, SamplingParams
        self.Output = ModelRunnerOutput
        self.pool_blocks = case.num_blocks - 1
        self.hits = 0
        self.stats = {k: 0 for k in STAT_KEYS}

    def add_stats(self, stats: Any) -> None:
        """Sum vLLM's PrefixCacheStats (each update hands over and resets them)."""
        for k in self.stats:
            self.stats[k] += getattr(stats, k)

    def drain_stats(self) -> None:
        stats = self.s.make_stats()
        if stats is not None:
            self.add_stats(stats.prefix_cache_stats)

    def add(self, rid: str, prompt: list[int], output_len: int) -> None:
        sp = self.SamplingParams(max_tokens=output_len, ignore_eos=True)
        req = self.Request(
            request_id=rid,
            prompt_token_ids=prompt,
            sampling_params=sp,
            pooling_params=None,
            block_hasher=self.hasher,
        )
        self.s.add_request(req)

    def step(self, token_of: Callable[[str, int], int]) -> Decision:
        """One schedule() and its update; `token_of(id, position)` names sampled ids."""
        s = self.s
        before = {r.request_id for r in s.running}
        out = s.schedule()
        sched = list(out.num_scheduled_tokens.items())
        hits = {}
        ids, sampled = [], []
        for rid, n in sched:
            req = s.requests[rid]
            if rid not in before:
                hits[rid] = req.num_computed_tokens - n  # computed was advanced by n
            ids.append(rid)
            done = req.num_computed_tokens >= req.num_tokens
            sampled.append([token_of(rid, req.num_tokens)] if done else [])
        runner = self.Output(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        for eco in s.update_from_output(out, runner).values():
            if eco.scheduler_stats is not None:
                self.add_stats(eco.scheduler_stats.prefix_cache_stats)
        finished = sorted(s.finished_req_ids)
        free = s.kv_cache_manager.block_pool.get_num_free_blocks()
        return Decision(
            sched, sorted(out.preempted_req_ids or ()), finished, hits, self.pool_blocks - free
        )


_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "num_hidden_layers": 1,
    "vocab_size": 1000,
    "max_position_embeddings": MAX_MODEL_LEN,
    "torch_dtype": "float32",
}


def vllm_loop(drv: VllmDriver, trace: Trace, token_of: Callable[[int, int], int]) -> int:
    """vLLM's scheduler serving `trace` (every request added at once) to the end, with
    nothing but the loop itself: add, schedule, answer, update. Returns the steps."""
    s = drv.s
    index = {}
    for i, r in enumerate(trace.requests):
        drv.add(str(r.id), list(r.prompt_ids(i)), r.output_len)
        index[str(r.id)] = i
    steps = 0
    requests, output = s.requests, drv.Output
    while s.has_unfinished_requests():
        out = s.schedule()
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = requests[rid]
            done = req.num_computed_tokens >= req.num_tokens
            sampled.append([token_of(index[rid], req.num_tokens)] if done else [])
        s.update_from_output(
            out,
            output(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=sampled,
            ),
        )
        steps += 1
    return steps


def uses(steps: list[V1Decision]) -> dict[str, int]:
    """What a replay's steps exercised: prefix-hit tokens, preemptions, and chunked
    admissions (more than one token scheduled for a request with no hit); the chain and
    identity tests assert each is reached."""
    return {
        "hits": sum(h for d in steps for h in d.hits.values()),
        "preempted": sum(len(d.preempted) for d in steps),
        "chunked": sum(
            1 for d in steps for sid, n in d.scheduled.items() if n > 1 and sid not in d.hits
        ),
    }


def _kv_decision(d: V1Decision) -> Decision:
    return Decision(
        list(d.scheduled.items()), sorted(d.preempted), sorted(d.finished), d.hits, d.used_blocks
    )


def run_pair(case: Case, folder: str | None = None, index_duplicates: bool = True) -> PairResult:
    """Both schedulers on the case, compared after every step; the first divergence
    (both decisions and the request states) ends the run."""
    res = PairResult()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        vl = VllmDriver(case, folder or tmp)
        eng = engine_for(case, index_duplicates=index_duplicates)
        got: list[V1Decision] = []
        assert eng.v1 is not None
        eng.v1.on_step = got.append
        eng._begin(case.trace, None)
        seqs = eng.st.seqs
        by_id: dict[str, Any] = {}
        added = 0
        while True:
            if not eng.step():
                break
            while added < eng.st.next_arrival:  # joined kvbench's queue in this step
                r = case.trace.requests[added]
                seq = seqs[added]
                by_id[seq.sid] = seq
                vl.add(seq.sid, list(r.prompt_ids(added)), r.output_len)
                added += 1
            if not got:
                continue  # an idle jump of the clock: no step on either side
            mine = _kv_decision(got.pop())
            theirs = vl.step(lambda rid, p: by_id[rid].token(p))
            res.steps += 1
            res.preemptions += len(theirs.preempted)
            res.vllm_hits += sum(theirs.hits.values())
            res.kv_hits += sum(mine.hits.values())
            if mine != theirs:
                res.divergence = _explain(res.steps - 1, mine, theirs, eng, vl)
                break
        vl.drain_stats()
        if res.divergence is None and vl.s.has_unfinished_requests():
            res.divergence = f"kvbench finished after {res.steps} steps, vLLM has requests left"
        st1 = eng.v1.stats
        res.kv_stats = {k: getattr(st1, k) for k in STAT_KEYS}
        res.vllm_stats = dict(vl.stats)
    res.seconds = time.perf_counter() - t0
    return res


def _explain(step: int, mine: Decision, theirs: Decision, eng: Engine, vl: VllmDriver) -> str:
    lines = [f"first divergent step {step}:", f"  kvbench: {mine}", f"  vLLM:    {theirs}"]
    lines.append("  kvbench requests (id state computed generated):")
    for s in eng.st.running:
        lines.append(f"    {s.sid} running {s.computed} {s.generated}")
    for _, s in sorted(eng.st.waiting)[:10]:
        lines.append(f"    {s.sid} waiting {s.computed} {s.generated}")
    lines.append("  vLLM requests (id status computed tokens outputs):")
    for r in list(vl.s.running) + list(vl.s.waiting)[:10]:
        lines.append(
            f"    {r.request_id} {r.status.name} {r.num_computed_tokens} {r.num_tokens} "
            f"{len(r.output_token_ids)}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------- traces
TRACES_DIR = os.environ.get("KVBENCH_TRACES", "/work/shared/data/traces")


def sharegpt_like(
    n: int, seed: int, *, systems: int = 0, system_len: int = 0, spread_s: float = 0.0
) -> Trace:
    """n chat requests with ShareGPT-like lengths (lognormal prompts of ~160 tokens,
    4-1,500; outputs of ~90, 1-300); with `systems` > 0 each prompt opens with one of
    that many shared system prompts of `system_len` tokens; arrivals uniform over
    `spread_s` seconds (0: all at once)."""
    import random

    from kvbench.workloads.trace import TraceRequest

    rnd = random.Random(seed)
    heads = [tuple(rnd.randrange(50_000) for _ in range(system_len)) for _ in range(systems)]
    reqs = []
    t = 0.0
    for i in range(n):
        plen = min(1500, max(4, round(rnd.lognormvariate(4.7, 0.9))))
        out = min(300, max(1, round(rnd.lognormvariate(4.0, 1.0))))
        own = tuple(rnd.randrange(50_000) for _ in range(plen))
        prompt = (rnd.choice(heads) + own) if heads else own
        if spread_s:
            t += rnd.expovariate(n / spread_s)
        reqs.append(TraceRequest(f"s{i}", round(t, 6), len(prompt), out, prompt=prompt))
    return Trace(tuple(reqs))


def multi_turn(chats: int, turns: int, seed: int, gap_s: float = 0.6) -> Trace:
    """`chats` conversations of `turns` turns: turn k's prompt is turn k - 1's prompt,
    its answer (given output ids, so answered blocks are shareable) and a new user
    message; turn k arrives `gap_s` x k seconds after its chat's start."""
    import random

    from kvbench.workloads.trace import TraceRequest

    rnd = random.Random(seed)
    reqs = []
    for c in range(chats):
        start = rnd.uniform(0, 1.0)
        history: tuple[int, ...] = tuple(rnd.randrange(50_000) for _ in range(rnd.randint(20, 120)))
        for k in range(turns):
            out = rnd.randint(8, 90)
            answer = tuple(rnd.randrange(50_000) for _ in range(out))
            reqs.append(
                TraceRequest(
                    f"c{c}t{k}",
                    round(start + gap_s * k, 6),
                    len(history),
                    out,
                    prompt=history,
                    output_tokens=answer,
                )
            )
            history = (
                history + answer + tuple(rnd.randrange(50_000) for _ in range(rnd.randint(5, 60)))
            )
    reqs.sort(key=lambda r: r.arrival)
    return Trace(tuple(reqs))


def _sliced(trace: Trace, first: int, count: int, max_output: int) -> Trace:
    """`count` requests from `first`, arrivals from 0, outputs capped (steps bounded);
    a Mooncake request keeps its hash ids (expanded to token ids by `prompt_ids`)."""
    from dataclasses import replace

    part = trace.requests[first : first + count]
    t0 = part[0].arrival
    return Trace(
        tuple(
            replace(r, arrival=round(r.arrival - t0, 6), output_len=min(r.output_len, max_output))
            for r in part
        )
    )


def mooncake_slice(
    first: int, count: int, max_output: int = 48, max_prompt: int = 16_384
) -> Trace | None:
    """A slice of the Mooncake conversation trace: `count` requests from `first` among
    those with prompts of at most `max_prompt` tokens (the trace's longest, 126k tokens,
    would make a run of minutes); None when the file is absent."""
    from kvbench.workloads.trace import Trace as _Trace
    from kvbench.workloads.trace_import import read_mooncake

    path = os.path.join(TRACES_DIR, "mooncake_conversation_trace.jsonl")
    if not os.path.exists(path):
        return None
    trace = read_mooncake(path)
    kept = tuple(r for r in trace.requests if r.prompt_len <= max_prompt)
    return _sliced(_Trace(kept), first, count, max_output)


def azure_slice(first: int, count: int, max_output: int = 64) -> Trace | None:
    """A slice of the Azure conversation trace (None when the file is absent)."""
    from kvbench.workloads.trace_import import read_azure

    path = os.path.join(TRACES_DIR, "AzureLLMInferenceTrace_conv.csv")
    if not os.path.exists(path):
        return None
    return _sliced(read_azure(path), first, count, max_output)
