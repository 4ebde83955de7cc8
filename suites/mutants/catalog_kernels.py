"""Mutants of the kernels (kernels/: the torch versions, the Triton kernels, the C++ CPU
kernel) and of the workload math (workloads/: capacity, geometry, fp8, trace import)."""

from __future__ import annotations

from kvbench.suites.mutants.model import Mutant

C = "suites/conformance/"
W = "suites/tests/workloads/"
SW = C + "test_kernels_sliding_window.py"
SWP = C + "test_kernels_sliding_window_prefill.py"
CPU = C + "test_kernels_cpu_paged.py"
OPS = C + "test_kernels_ops.py"
FP8 = C + "test_kernels_fp8.py"

KERNELS: list[Mutant] = [
    # ---- kernels/torch_ops.py (the gather + SDPA path) and kernels/validation.py
    Mutant(
        "kernels.torch_ops.window_first_block_late",
        "kernels/torch_ops.py",
        "    first = rule.first_kept_many(lens - 1) // block_size",
        "    first = rule.first_kept_many(lens) // block_size",
        "windowed decode starts its gather one token late: a window starting on a block's last slot loses that block",
        (SW + "::test_sliding_window_decode_matches_the_oracle",),
        k="gather",
    ),
    Mutant(
        "kernels.torch_ops.window_keep_strict",
        "kernels/torch_ops.py",
        "    keep = (pos.unsqueeze(0) >= lo.unsqueeze(1)) & (pos.unsqueeze(0) < lens.unsqueeze(1))",
        "    keep = (pos.unsqueeze(0) > lo.unsqueeze(1)) & (pos.unsqueeze(0) < lens.unsqueeze(1))",
        "windowed decode masks the window's first token (window start off by one)",
        (SW + "::test_sliding_window_decode_matches_the_oracle",),
        k="gather",
    ),
    Mutant(
        "kernels.torch_ops.prefill_window_wider",
        "kernels/torch_ops.py",
        "            mask &= kpos >= rule.first_kept_many(qpos)",
        "            mask &= kpos >= rule.first_kept_many(qpos) - 1",
        "windowed prefill lets each query see window + 1 keys",
        (SWP + "::test_sliding_window_prefill_matches_the_oracle",),
        k="gather",
    ),
    Mutant(
        "kernels.torch_ops.fp8_scale_inverted",
        "kernels/torch_ops.py",
        "    return (x.to(torch.float32) * scale.view(1, -1, 1, 1)).to(dtype)",
        "    return (x.to(torch.float32) / scale.view(1, -1, 1, 1)).to(dtype)",
        "the torch path dequantizes fp8 by dividing by the scale",
        # ops' "torch" fp8 prefill runs the C++ kernel where it builds: the gather path is
        # called directly (test_fp8_prefill_torch_... let this mutant survive)
        (C + "test_kernels_fp8_gather.py",),
    ),
    Mutant(
        "kernels.torch_ops.write_kv_skips_slot_zero",
        "kernels/torch_ops.py",
        "    keep = slot_mapping >= 0",
        "    keep = slot_mapping > 0",
        "write_kv treats slot 0 like the padding slot -1 and skips it",
        (OPS + "::test_write_kv",),
        k="torch",
    ),
    Mutant(
        "kernels.torch_ops.copy_blocks_reversed",
        "kernels/torch_ops.py",
        "    src, dst = pairs[:, 0], pairs[:, 1]",
        "    dst, src = pairs[:, 0], pairs[:, 1]",
        "copy-on-write copies the new block onto the shared one",
        (OPS + "::test_copy_blocks",),
        k="torch",
    ),
    Mutant(
        "kernels.torch_ops.decode_reads_one_past_the_end",
        "kernels/torch_ops.py",
        "        mask = (pos.unsqueeze(0) < seq_lens.unsqueeze(1)).view(batch, 1, 1, length)",
        "        mask = (pos.unsqueeze(0) <= seq_lens.unsqueeze(1)).view(batch, 1, 1, length)",
        "decode attends to the slot after a sequence's last token",
        (CPU + "::test_decode_matches_oracle",),
        k="gather",
    ),
    Mutant(
        "kernels.validation.scale_not_sqrt",
        "kernels/validation.py",
        "        return 1.0 / math.sqrt(head_dim)",
        "        return 1.0 / head_dim",
        "the kernels' default softmax scale is 1/d, not 1/sqrt(d)",
        (CPU + "::test_decode_matches_oracle",),
        k="gather",
    ),
    # ---- kernels/triton_kernels.py (run by the interpreter on a CPU)
    Mutant(
        "kernels.triton.decode_window_begins_early",
        "kernels/triton_kernels.py",
        "tl.maximum(start, seq_len - window)",
        "tl.maximum(start, seq_len - window - 1)",
        "Triton windowed decode reads one key before the window",
        (
            SW + "::test_sliding_window_skips_released_blocks[triton]",
            SW + "::test_sliding_window_triton_split_partitions",
        ),
    ),
    Mutant(
        "kernels.triton.decode_scale_natural_log",
        "kernels/triton_kernels.py",
        '            s = s * qk_scale\n            s = tl.where(tok_ok[None, :], s, float("-inf"))',
        '            s = s * (qk_scale / 1.4426950408889634)\n            s = tl.where(tok_ok[None, :], s, float("-inf"))',
        "Triton decode uses the softmax scale without the log2(e) factor its exp2 needs",
        (SW + "::test_sliding_window_skips_released_blocks[triton]",),
    ),
    Mutant(
        "kernels.triton.reduce_natural_exp",
        "kernels/triton_kernels.py",
        "        w = tl.where(ok, l_p * tl.exp2(m_p - m_all), 0.0)",
        "        w = tl.where(ok, l_p * tl.exp(m_p - m_all), 0.0)",
        "the split-KV merge weighs partitions with e^x where the maxima are in the log2 domain",
        (SW + "::test_sliding_window_triton_split_partitions",),
    ),
    Mutant(
        "kernels.triton.prefill_window_wider",
        "kernels/triton_kernels.py",
        "                visible = visible & (kt[None, :] > q_pos[:, None] - window)",
        "                visible = visible & (kt[None, :] >= q_pos[:, None] - window)",
        "Triton windowed prefill lets each query see window + 1 keys",
        (SWP + "::test_sliding_window_prefill_skips_released_blocks[triton]",),
    ),
    Mutant(
        "kernels.triton.prefill_fp8_v_scale_inverted",
        "kernels/triton_kernels.py",
        "            v_scale = tl.load(v_scale_ptr + kv_head) * (1 << (15 - FP8_BIAS))\n"
        "            qk_scale = scale_log2 * k_scale\n        kv_begin = 0",
        "            v_scale = (1.0 / tl.load(v_scale_ptr + kv_head)) * (1 << (15 - FP8_BIAS))\n"
        "            qk_scale = scale_log2 * k_scale\n        kv_begin = 0",
        "Triton fp8 prefill dequantizes V with the inverse scale",
        (C + "test_kernels_fp8_triton.py::test_fp8_triton_sliding_window_prefill",),
    ),
    # ---- kernels/cpu_ext/paged_attn.cpp (each one rebuilds the extension in the copy)
    Mutant(
        "kernels.cpp.decode_window_narrower",
        "kernels/cpu_ext/paged_attn.cpp",
        "    const int64_t lo = first_key(len - 1, window);",
        "    const int64_t lo = first_key(len - 1, window) + (window > 0 && len > window);",
        "the C++ windowed decode skips the window's first token",
        (
            SW + "::test_sliding_window_skips_released_blocks[cpp]",
            SW + "::test_sliding_window_decode_matches_the_oracle",
        ),
        k="cpp",
    ),
    Mutant(
        "kernels.cpp.merge_weight_flipped",
        "kernels/cpu_ext/paged_attn.cpp",
        "        const float w = std::exp(mp - M);",
        "        const float w = std::exp(M - mp);",
        "the C++ split-KV merge weighs each partition by e^(M - m_p) instead of e^(m_p - M)",
        (CPU + "::test_decode_task_splits_agree",),
    ),
]

WORKLOADS: list[Mutant] = [
    Mutant(
        "workloads.capacity.blocks_floor",
        "workloads/capacity.py",
        "    return -(-tokens // block_size)",
        "    return tokens // block_size",
        "blocks for n tokens rounds down: a partial last block is not counted",
        (W + "test_capacity.py", W + "test_spec_capacity.py"),
    ),
    Mutant(
        "workloads.capacity.watermark_floor",
        "workloads/capacity.py",
        "    return math.ceil(round(float(watermark) * num_blocks, 9))",
        "    return int(round(float(watermark) * num_blocks, 9))",
        "the watermark keeps floor(w * blocks) free, not the least integer above",
        (W + "test_capacity.py", C + "test_paged_cache.py"),
    ),
    Mutant(
        "workloads.geometry.v_forgotten",
        "workloads/geometry.py",
        "        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes",
        "        return self.num_kv_heads * self.head_dim * self.dtype_bytes",
        "bytes per token count K only (V forgotten): every capacity doubles",
        (W + "test_capacity.py",),
    ),
    Mutant(
        "workloads.kv_rules.window_start_early",
        "workloads/kv_rules.py",
        "        return max(0, query_position - self.window + 1)",
        "        return max(0, query_position - self.window)",
        "the release rule keeps one token more than the window reads",
        (W + "test_kv_rules.py", W + "test_spec_capacity.py", C + "test_paged_sliding_window.py"),
    ),
    Mutant(
        "workloads.kv_rules.growth_floor",
        "workloads/kv_rules.py",
        "        return max(0, -(-(seq_len + n) // block_size) - table_len)",
        "        return max(0, (seq_len + n) // block_size - table_len)",
        "growth plans floor(new length / block) blocks: an append into a new partial block takes none",
        (W + "test_kv_rules.py", C + "test_paged_cache.py"),
    ),
    Mutant(
        "workloads.trace_import.azure_fields_swapped",
        "workloads/trace_import.py",
        "    return (index, scaled, lengths[0], lengths[1]), arrival, origin",
        "    return (index, scaled, lengths[1], lengths[0]), arrival, origin",
        "Azure import swaps ContextTokens and GeneratedTokens",
        (W + "test_trace_import.py",),
    ),
    Mutant(
        "workloads.trace_import.mooncake_ids_floor",
        "workloads/trace_import.py",
        "    need = -(-prompt_len // MOONCAKE_BLOCK_TOKENS)",
        "    need = prompt_len // MOONCAKE_BLOCK_TOKENS",
        "Mooncake import expects floor(input_length / 512) hash ids, not the ceiling",
        (W + "test_trace_import.py",),
    ),
    Mutant(
        "workloads.trace_import.mooncake_speed_multiplies",
        "workloads/trace_import.py",
        "    scaled = seconds / speed\n",
        "    scaled = seconds * speed\n",
        "Mooncake import slows the trace down by --speed instead of speeding it up",
        (W + "test_trace_import.py",),
    ),
    Mutant(
        "workloads.fp8.dynamic_scale_inverted",
        "workloads/fp8.py",
        "    scale = torch.where(amax > 0, (amax / fmt.max).clamp(min=MIN_SCALE), torch.ones_like(amax))",
        "    scale = torch.where(amax > 0, (fmt.max / amax).clamp(min=MIN_SCALE), torch.ones_like(amax))",
        "the dynamic fp8 scale is max / amax (inverted)",
        (C + "test_fp8_semantics.py",),
    ),
    Mutant(
        "workloads.fp8.dequantize_divides",
        "workloads/fp8.py",
        "    return (q.to(wide) * s).to(dtype)",
        "    return (q.to(wide) / s).to(dtype)",
        "fp8 dequantize divides by the scale",
        (C + "test_fp8_semantics.py", C + "test_caches_fp8.py"),
    ),
]
