"""Scenarios and the comparison with Hugging Face for the layer-group e2e check.

Shared by the conformance tests (`suites/conformance/test_e2e_kv_specs.py`) and the bench
rows (`e2e.kv_specs`): the same scenarios as the Llama check (a ragged batch with late
arrivals, shared prefixes served from the prefix cache, chunked prefill, parallel
sampling through fork, preemption by swap and by recompute), run by `SpecCacheRunner`
over a `LayerGroupsPagedCache` (or the reference cache), and compared with HF's own
forward over each whole sequence (`spec_models.hf_logits`): the same greedy tokens, and
per generated position ||logits - hf|| / ||hf|| within `LOGIT_TOL`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kvbench.paged.layer_groups import LayerGroupsPagedCache
from kvbench.reference.layer_groups import LayerGroupsReferenceCache
from kvbench.reference.oracle import relative_error
from kvbench.suites.e2e.llama_runner import GenerationRequest, SequenceResult
from kvbench.suites.e2e.spec_models import (
    TinySpecModel,
    encoder_inputs,
    hf_logits,
    model_kv_spec,
)
from kvbench.suites.e2e.spec_runner import SpecCacheRunner
from kvbench.workloads.kv_spec import ModelKVSpec
from kvbench.workloads.spec_capacity import request_peak_blocks

#: Per generated position, ||logits - hf|| / ||hf|| (the Llama check's tolerance; float32
#: end to end, about 7e-7 measured).
LOGIT_TOL = 1e-5

#: The tiny models, labelled by the spec they exercise (labels carry `sliding_window`,
#: `hybrid` or `cross_attention`, as the conformance test ids do).
SPEC_MODELS = {
    "sliding_window-mistral": TinySpecModel("mistral", window=7),
    "hybrid-gemma2": TinySpecModel("gemma2", num_layers=4, window=6, seed=1),
    "cross_attention-whisper": TinySpecModel("whisper", seed=2),
}

#: expect[seq_id] = (prompt, forced first token or None, encoder input or None).
Expect = dict[object, tuple[tuple[int, ...], int | None, torch.Tensor | None]]


@dataclass
class Comparison:
    """Differences from HF (empty when equal), the largest relative logit error over
    every generated position compared, and how many positions that was."""

    problems: list[str] = field(default_factory=list)
    max_error: float = 0.0
    positions: int = 0


_HF: dict[tuple[int, tuple[int, ...], int], torch.Tensor] = {}


def hf(model, tokens: Sequence[int], encoder_input: torch.Tensor | None) -> torch.Tensor:
    """`hf_logits`, memoized per model, tokens and encoder input (by identity)."""
    key = (id(model), tuple(tokens), id(encoder_input))
    if key not in _HF:
        _HF[key] = hf_logits(model, tokens, encoder_input)
    return _HF[key]


def compare(model, results: dict, expect: Expect) -> Comparison:
    """Each result against HF's forward over its prompt + generated tokens: the token
    after position i must be HF's argmax there (a fork branch's forced first token
    excepted) and its logits within LOGIT_TOL of HF's."""
    out = Comparison()
    for sid, (prompt, forced, enc) in expect.items():
        res: SequenceResult | None = results.get(sid)
        if res is None:
            out.problems.append(f"{sid!r}: no result")
            continue
        if res.prompt != tuple(prompt):
            out.problems.append(f"{sid!r}: prompt {res.prompt} != {tuple(prompt)}")
            continue
        seq = (*prompt, *res.tokens)
        want = hf(model, seq[:-1], enc)[len(prompt) - 1 :]
        greedy = tuple(int(t) for t in want.argmax(-1))
        expected = greedy if forced is None else (forced, *greedy[1:])
        if res.tokens != expected:
            i = next(j for j, (a, b) in enumerate(zip(res.tokens, expected, strict=True)) if a != b)
            top2 = torch.topk(want[i], 2).values
            out.problems.append(
                f"{sid!r}: tokens {res.tokens} != HF {expected} (first at step {i}; HF's "
                f"top-2 logit margin there {float(top2[0] - top2[1]):.3g})"
            )
        for i in range(len(res.tokens)):
            err = relative_error(res.logits[i], want[i])
            out.positions += 1
            out.max_error = max(out.max_error, err) if err == err else float("inf")
            if not err <= LOGIT_TOL:  # NaN fails too
                out.problems.append(f"{sid!r}: step {i} logits relative error {err:.3g}")
                break
    return out


# --------------------------------------------------------------------------- caches
def make_cache(
    model,
    block_size: int,
    num_blocks: int,
    *,
    reference: bool = False,
    prefix_caching: bool = True,
    spec: ModelKVSpec | None = None,
    paged_cls: type[LayerGroupsPagedCache] = LayerGroupsPagedCache,
):
    """A layer-group cache for `model` (its groups from its HF config unless `spec`):
    the reference, or a paged one of `num_blocks` pages with as many CPU blocks."""
    spec = spec or model_kv_spec(model)
    if reference:
        return LayerGroupsReferenceCache(spec)
    return paged_cls(
        spec,
        num_blocks,
        block_size,
        num_cpu_blocks=num_blocks,
        enable_prefix_caching=prefix_caching,
    )


def prompts(seed: int, lengths: Sequence[int], vocab: int) -> list[tuple[int, ...]]:
    """Random prompts (ids from 4 up: Whisper's special ids stay out of the way)."""
    gen = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(4, vocab, (n,), generator=gen).tolist()) for n in lengths]


def _encoders(model, count: int, seed: int) -> list[torch.Tensor | None]:
    if not model.config.is_encoder_decoder:
        return [None] * count
    return list(encoder_inputs(model, count, seed))


# --------------------------------------------------------------------------- scenarios
@dataclass
class Run:
    """One scenario's results, what HF must agree with, and the runner (its stats)."""

    results: dict
    expect: Expect
    runner: SpecCacheRunner
    min_hit: dict[str, int] = field(default_factory=dict)


def ragged(model, cache, new_tokens: int = 8, **runner_kw) -> Run:
    """Ragged prompts decoded together; two arrive after two steps (mixed batches). The
    longest reaches 48 tokens, several windows past a window of 6-7."""
    lengths = [3, 16, 17, 40, 1, 33]
    ps = prompts(11, lengths, model.config.vocab_size)
    encs = _encoders(model, len(ps), 11)
    reqs = [
        GenerationRequest(f"r{i}", p, new_tokens, encoder_input=e)
        for i, (p, e) in enumerate(zip(ps, encs, strict=True))
    ]
    runner = SpecCacheRunner(model, cache, **runner_kw)
    for r in reqs[:-2]:
        runner.submit(r)
    runner.step()
    runner.step()
    results = runner.run(reqs[-2:])
    return Run(results, {r.request_id: (r.prompt, None, r.encoder_input) for r in reqs}, runner)


def prefix(model, cache, block_size: int, new_tokens: int = 8, **runner_kw) -> Run:
    """Requests sharing a system prefix (and, for an encoder-decoder, one encoder input),
    as in the Llama check; `min_hit` is each request's least first-admission hit. An
    encoder-decoder adds `other-encoder`: the first request's prompt with another encoder
    input, which must not hit (its self-attention K/V differ from layer 1 on)."""
    bs = block_size
    system, u1, u2, u3 = prompts(5, [2 * bs + 3, 7, 4, 9], model.config.vocab_size)
    enc, other = _encoders(model, 2, 5)
    reqs = {
        "first": system + u1,
        "same-suffix": system + u2,
        "identical": system + u1,
        "aligned": system[: 2 * bs],
        "one-past": system[: 2 * bs + 1],
        "salted": system + u2,
    }
    min_hit = {"same-suffix": 2 * bs, "identical": 2 * bs, "aligned": bs, "one-past": 2 * bs}
    runner = SpecCacheRunner(model, cache, **runner_kw)
    runner.submit(GenerationRequest("first", reqs["first"], new_tokens, encoder_input=enc))
    runner.step()
    for name in ("same-suffix", "identical", "aligned", "one-past"):
        runner.submit(GenerationRequest(name, reqs[name], new_tokens, encoder_input=enc))
    runner.submit(
        GenerationRequest("salted", reqs["salted"], new_tokens, salt="tenant-b", encoder_input=enc)
    )
    encs: dict[str, torch.Tensor | None] = dict.fromkeys(reqs, enc)
    if model.config.is_encoder_decoder:
        reqs["other-encoder"] = reqs["first"]
        encs["other-encoder"] = other
        runner.submit(
            GenerationRequest("other-encoder", reqs["first"], new_tokens, encoder_input=other)
        )
    results = runner.run()
    reqs["after-free"] = system + u3  # everything freed: the prefix blocks stay cached
    encs["after-free"] = enc
    min_hit["after-free"] = 2 * bs
    results.update(
        runner.run(
            [GenerationRequest("after-free", reqs["after-free"], new_tokens, encoder_input=enc)]
        )
    )
    return Run(results, {k: (p, None, encs[k]) for k, p in reqs.items()}, runner, min_hit)


def fork(model, cache, block_size: int, new_tokens: int = 8, **runner_kw) -> Run:
    """Parallel sampling: each prompt forks into 3 branches forced down HF's top-3 first
    tokens (copy-on-write of the shared partial block in every self-attention group;
    cross-attention blocks shared, read-only)."""
    bs = block_size
    ps = prompts(23, [bs + 5, 2 * bs + 9], model.config.vocab_size)
    encs = _encoders(model, len(ps), 23)
    reqs: list[GenerationRequest] = []
    expect: Expect = {}
    for i, (p, e) in enumerate(zip(ps, encs, strict=True)):
        top = torch.topk(hf(model, p, e)[-1], 3).indices.tolist()
        reqs.append(
            GenerationRequest(f"p{i}", p, new_tokens, branch_tokens=tuple(top), encoder_input=e)
        )
        for j, token in enumerate(top):
            expect[(f"p{i}", j)] = (p, token, e)
    runner = SpecCacheRunner(model, cache, **runner_kw)
    return Run(runner.run(reqs), expect, runner)


def preemption_plan(model, block_size: int) -> tuple[list[int], int, int]:
    """(prompt lengths, new tokens, pool pages): the pool holds any one request at its
    peak (prefill in one step, every group) but not the batch, so decoding preempts."""
    lengths = [5, 9, 3]
    new = block_size + 8
    spec = model_kv_spec(model)
    need = [request_peak_blocks(spec, n + new, block_size, n) for n in lengths]
    return lengths, new, max(need) + 1


def preemption(model, cache, lengths: Sequence[int], new: int, **runner_kw) -> Run:
    ps = prompts(31, lengths, model.config.vocab_size)
    encs = _encoders(model, len(ps), 31)
    reqs = [
        GenerationRequest(f"q{i}", p, new, encoder_input=e)
        for i, (p, e) in enumerate(zip(ps, encs, strict=True))
    ]
    runner = SpecCacheRunner(model, cache, **runner_kw)
    return Run(
        runner.run(reqs), {r.request_id: (r.prompt, None, r.encoder_input) for r in reqs}, runner
    )


def spec_of(label: str) -> TinySpecModel:
    """The tiny model of a SPEC_MODELS label."""
    return SPEC_MODELS[label]
