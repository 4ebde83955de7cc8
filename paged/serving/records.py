"""What happened to one sequence in a serving run (`SeqRecord`): the engine stamps it,
the latency and SLO summaries read it. Its own module so that the time model, the
engine and the latency summaries all import it from below, none from another."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class SeqRecord:
    """What happened to one sequence (a request, or a child `id#k` of an n-sample one).

    Steps are engine iterations; times are modeled seconds from the trace's t = 0
    (`kvbench.paged.serving.latency`): `arrival_s` the trace's arrival (with a concurrency
    cap, the later time the request joined the engine), `first_token_s` the end of
    the step that sampled its first token, `finish_s` the end of the step that generated
    its last (-1.0 until stamped; 0.0 throughout without a time model).
    """

    id: str
    request: str | int
    arrival_s: float
    prompt_len: int
    output_len: int
    generated: int = 0
    admit_step: int = -1
    first_token_step: int = -1
    finish_step: int = -1
    preemptions: int = 0
    swaps: int = 0
    recomputes: int = 0
    cached_tokens: int = 0
    first_token_s: float = -1.0
    finish_s: float = -1.0

    def key(self) -> tuple[str | int, ...]:
        """The scheduling decisions, for comparing two runs."""
        return (
            self.id,
            self.generated,
            self.admit_step,
            self.first_token_step,
            self.finish_step,
            self.preemptions,
            self.swaps,
            self.recomputes,
            self.cached_tokens,
        )

    def times(self) -> tuple[str, float, float, float]:
        """(id, arrival_s, first_token_s, finish_s), for comparing two runs' latencies."""
        return (self.id, self.arrival_s, self.first_token_s, self.finish_s)

    def as_dict(self) -> dict[str, Any]:
        """The fields plus this sequence's ttft_s, tpot_s (NaN for one output token),
        e2e_s and normalized_latency_s (per output token): a row of `--out` records."""
        out = asdict(self)
        e2e = self.finish_s - self.arrival_s
        decode = self.finish_s - self.first_token_s
        out.update(
            ttft_s=self.first_token_s - self.arrival_s,
            tpot_s=decode / (self.output_len - 1) if self.output_len > 1 else math.nan,
            e2e_s=e2e,
            normalized_latency_s=e2e / self.output_len,
        )
        return out
