"""Serving set-ups: a model on a number of devices with a KV memory, as papers state them.

A set-up fixes everything the modeled serving sweeps need besides the trace: the model
preset (KV geometry, weights, parameters), the device profile, the tensor-parallel rank
count, the KV memory of the whole set-up and the longest sequence a request may reach.

The vLLM paper's set-ups (Kwon et al., SOSP 2023, Table 1, as commonly quoted) and seed
001's, with the arithmetic that checks them (KV slots = KV memory / bytes per token):

    set-up                 KV memory      bytes/token   slots     quoted
    opt-13b-1xa100-40gb    12 GiB         800 KiB       15,728    15.7K
    opt-66b-4xa100-40gb    21 GiB         2.25 MiB       9,557    9.7K (needs 21.3 GiB)
    opt-175b-8xa100-80gb   264 GiB        4.5 MiB       60,074    60.1K
    llama-2-70b-a100-80gb  42 GB (seed:   320 KiB      134,400    8,400 blocks of 16
                           42,000 MiB)                            ([PA-deep-dive])
    llama-2-70b-h100       the same on an H100-80GB
    llama-3-70b-8xh100-tp8 400 GiB        320 KiB    1,310,720    (Mooncake's model; see
                                                                  its `source`)

The paper's KV figures are binary gigabytes: 12 and 264 GiB give its slot counts; its
21 GB for OPT-66B gives 9,557 slots, 1.5% under the quoted 9.7K. [PA-deep-dive] serves
Llama-2-70B on one 80 GB GPU with "~35 GB" of weights: that is what its budget and its
throughput tables assume, though fp16 weights of a 70B model are ~140 GB (35 GB is a
4-bit model); the set-up takes the seed's 35 GB so its tables can be regenerated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry, canonical_dtype, parse_bytes
from kvbench.workloads.presets import ModelPreset, get_preset
from kvbench.workloads.profiles import DeviceProfile, get_profile


@dataclass(frozen=True)
class ServingSetup:
    """A model served on `tp` devices of one profile with a KV memory (module docstring).

    Attributes:
        name: key used on the command line and in case parameters.
        model: model preset name.
        profile: device profile name (one device; `tp` of them).
        tp: tensor-parallel ranks.
        kv_budget: KV memory of the whole set-up ("12GiB"; "42GB" is read as 42,000 MiB,
            [PA-deep-dive]'s convention).
        max_seq_len: longest request (the contiguous max reservation).
        source: where the figures come from.
        weight_bytes: overrides the preset's fp16 weight bytes (0: the preset's).
        quoted_slots: the slot count the source quotes (0: none), shown beside ours.
        kv_dtype: the KV cache dtype ("" : the preset's, float16); "fp8_e4m3" / "fp8_e5m2"
            halve the bytes per token, so the same KV memory holds twice the slots and a
            decode step reads half the KV bytes (`with_kv_dtype`).
    """

    name: str
    model: str
    profile: str
    tp: int
    kv_budget: str
    max_seq_len: int
    source: str
    weight_bytes: int = 0
    quoted_slots: int = 0
    kv_dtype: str = ""
    #: whose scheduling decisions replays of this set-up make by default
    #: (`SchedulerConfig.policy`): the paper's set-ups the 2023 paper's vLLM, a modern
    #: one vLLM v1's scheduler
    scheduler: str = "vllm-2023"

    @property
    def preset(self) -> ModelPreset:
        return get_preset(self.model)

    @property
    def geometry(self) -> KVGeometry:
        """The KV geometry served: the preset's, in `kv_dtype` where one is set."""
        g = self.preset.geometry
        return g.with_dtype(self.kv_dtype) if self.kv_dtype else g

    @property
    def device(self) -> DeviceProfile:
        return get_profile(self.profile)

    def total_weight_bytes(self) -> int:
        """Weight bytes of the whole model (over all ranks)."""
        return self.weight_bytes or self.preset.weight_bytes

    def kv_bytes(self) -> int:
        return parse_bytes(self.kv_budget, decimal_gb_as_mib=True)

    def kv_slots(self) -> int:
        """Tokens of KV the set-up holds."""
        return self.kv_bytes() // self.geometry.bytes_per_token

    def check_fits(self) -> None:
        """Raise ConfigError when weights plus KV over the ranks exceed one device."""
        mem = self.device.memory_bytes
        per_rank = (self.total_weight_bytes() + self.kv_bytes()) / self.tp
        if mem and per_rank > mem:
            raise ConfigError(
                f"set-up {self.name!r}: {per_rank / 1e9:.1f} GB of weights and KV per device "
                f"exceed the {self.profile}'s {mem / 1e9:.0f} GB"
            )


SETUPS: dict[str, ServingSetup] = {
    s.name: s
    for s in (
        ServingSetup(
            "opt-13b-1xa100-40gb",
            "opt-13b",
            "a100-40gb",
            1,
            "12GiB",
            2048,
            "vLLM paper Table 1: OPT-13B on 1 x A100-40GB, 12 GB of KV, 15.7K slots",
            quoted_slots=15_700,
        ),
        ServingSetup(
            "opt-66b-4xa100-40gb",
            "opt-66b",
            "a100-40gb",
            4,
            "21GiB",
            2048,
            "vLLM paper Table 1: OPT-66B on 4 x A100-40GB, 21 GB of KV, 9.7K slots",
            quoted_slots=9_700,
        ),
        ServingSetup(
            "opt-175b-8xa100-80gb",
            "opt-175b",
            "a100-80gb",
            8,
            "264GiB",
            2048,
            "vLLM paper Table 1: OPT-175B on 8 x A100-80GB, 264 GB of KV, 60.1K slots",
            quoted_slots=60_100,
        ),
        ServingSetup(
            "llama-2-70b-a100-80gb",
            "llama-2-70b",
            "a100-80gb",
            1,
            "42GB",
            4096,
            "[PA-deep-dive]: Llama-2-70B on A100-80GB, ~35 GB weights, 42 GB KV pool (8,400 "
            "blocks of 16); 4,096-token context",
            weight_bytes=35 * 10**9,
            quoted_slots=134_400,
        ),
        ServingSetup(
            "llama-2-70b-h100",
            "llama-2-70b",
            "h100",
            1,
            "42GB",
            4096,
            "[PA-deep-dive]'s Llama-2-70B set-up on an H100-80GB",
            weight_bytes=35 * 10**9,
            quoted_slots=134_400,
        ),
        ServingSetup(
            "llama-3-70b-8xh100-tp8",
            "llama-3-70b",
            "h100",
            8,
            "400GiB",
            131_072,
            "Mooncake paper (FAST'25) model on 8 x H100-80GB, tensor parallel 8: 90% of "
            "640 GB (vLLM's default memory use) less 141 GB of fp16 weights and ~4 GB of "
            "activations per GPU leaves ~50 GB of KV per GPU, taken as 400 GiB (1.31M "
            "slots); 128K-token context (Llama 3.1), which the trace's longest request "
            "(126,527 tokens) needs",
            scheduler="vllm-v1",
        ),
    )
}


def get_setup(name: str) -> ServingSetup:
    """The set-up called `name`, or ConfigError listing the known ones."""
    try:
        return SETUPS[str(name).lower()]
    except KeyError:
        raise ConfigError(f"unknown serving set-up {name!r}; known: {', '.join(SETUPS)}") from None


#: How a modeled sweep prices its GPUs: the shipped fitted efficiency, or the datasheet.
CALIBRATIONS = ("fitted", "datasheet")


def with_calibration(setup: ServingSetup, calibration: str) -> ServingSetup:
    """`setup` on its profile as shipped ('fitted': the fitted or transferred efficiency
    of `kvbench.workloads.fitted_gpu`) or at the datasheet ('datasheet': 100%, no
    kernel floor)."""
    if calibration not in CALIBRATIONS:
        raise ConfigError(f"unknown calibration {calibration!r}; known: {CALIBRATIONS}")
    if calibration == "fitted":
        return setup
    return replace(setup, profile=setup.device.datasheet().name)


def with_kv_dtype(setup: ServingSetup, dtype: str) -> ServingSetup:
    """`setup` with its KV cache stored in `dtype` (a KV dtype name or alias: "float16",
    "fp8_e4m3", ...); ConfigError naming an unknown dtype. Weights are unchanged."""
    name = canonical_dtype(dtype)
    return replace(setup, kv_dtype=name)
