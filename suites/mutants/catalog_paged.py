"""Mutants of the cache (paged/) and of the references it is judged against (reference/)."""

from __future__ import annotations

from kvbench.suites.mutants.model import CANARY, Mutant

C = "suites/conformance/"
POOL = C + "test_paged_block_pool.py"
CACHE = C + "test_paged_cache.py"
HITRATE = C + "test_paged_hitrate.py"
ORACLE = C + "test_oracle.py"
CONTIG = C + "test_contiguous.py"
#: the layer-group state machines alone (issue 36's classes: group orders and failures;
#: the views right after prefix hits)
GROUPS_MACHINE = (
    C + "test_paged_hybrid_atomic.py::test_group_orders_and_injected_failures_paged_vs_reference"
)
HITS_MACHINE = C + "test_paged_hybrid_atomic.py::test_views_after_prefix_hits_paged_vs_reference"
#: the fp8 layer-group machine with group orders and injected failures
FP8_GROUPS_MACHINE = (
    C + "test_paged_hybrid_fp8.py::test_fp8_group_orders_and_injected_failures_paged_vs_reference"
)

PAGED: list[Mutant] = [
    Mutant(
        CANARY,
        "paged/block_pool.py",
        "        self.ref[block] = 1\n        self.num_used += 1\n        return block",
        "        self.ref[block] = 1\n        self.num_used += 2\n        return block",
        "canary: allocate counts a block twice (every pool test checks the counters)",
        (POOL,),
    ),
    Mutant(
        "paged.block_pool.free_stack_fifo",
        "paged/block_pool.py",
        "                    fill[block] = 0\n                    free.append(block)",
        "                    fill[block] = 0\n                    free.insert(0, block)",
        "released blocks go to the bottom of the free stack: reuse order is no longer last-freed-first",
        (POOL,),
    ),
    Mutant(
        "paged.block_pool.release_head_first",
        "paged/block_pool.py",
        "            for block in reversed(blocks):",
        "            for block in blocks:",
        "release walks the table head first: a request's shared head is evicted before its tail",
        (POOL, CACHE + "::test_eviction_takes_the_least_recently_freed_deepest_blocks_first"),
    ),
    Mutant(
        "paged.block_pool.evict_mru",
        "paged/block_pool.py",
        "            block, _ = self._evictable.popitem(last=False)",
        "            block, _ = self._evictable.popitem(last=True)",
        "single allocations evict the most recently freed cached block (eviction order flipped)",
        (POOL, CACHE),
    ),
    Mutant(
        "paged.block_pool.bulk_evict_mru",
        "paged/block_pool.py",
        "            victims = list(islice(queue, k))",
        "            victims = list(islice(reversed(queue), k))",
        "bulk allocations evict from the recently-freed end of the LRU queue",
        (POOL, CACHE, HITRATE),
    ),
    Mutant(
        "paged.block_pool.shared_ref_not_decremented",
        "paged/block_pool.py",
        "                    ref[block] = count - 1\n                    continue",
        "                    ref[block] = count\n                    continue",
        "releasing a shared block does not drop its reference count (the block leaks)",
        (POOL, CACHE),
    ),
    Mutant(
        "paged.block_pool.revive_forgets_fill",
        "paged/block_pool.py",
        "                used += 1\n                live += fill[block]\n            ref[block] = count + 1",
        "                used += 1\n            ref[block] = count + 1",
        "a prefix hit that revives an evictable block does not count its written slots",
        (POOL, CACHE),
    ),
    Mutant(
        "paged.block_pool.allocate_many_overcommits",
        "paged/block_pool.py",
        "        if n > self.num_free:\n            raise CapacityError(",
        "        if n > self.num_free + 1:\n            raise CapacityError(",
        "allocate_many lets one block more than is free through (not all-or-nothing)",
        (POOL,),
    ),
    Mutant(
        "paged.block_pool.fill_span_last_block",
        "paged/block_pool.py",
        "        fill[blocks[last - 1]] = end - (last - 1) * bs",
        "        fill[blocks[last - 1]] = end - (last - 1) * bs - 1",
        "the last block of an append records one written slot too few",
        (CACHE,),
    ),
    Mutant(
        "paged.prefix_cache.key_ignores_salt",
        "paged/prefix_cache.py",
        "    return sha256(head + token_bytes(tokens) + tail).digest()",
        "    return sha256(head + token_bytes(tokens)).digest()",
        "a block's key leaves out the extra keys (salt, adapter): the hash no longer isolates",
        (POOL, CACHE),
    ),
    Mutant(
        "paged.prefix_cache.chain_keys_ignore_salt",
        "paged/prefix_cache.py",
        "        key = sha256(_PARENT32 + key + chunk + tail).digest()",
        "        key = sha256(_PARENT32 + key + chunk).digest()",
        "the bulk key chain (prompt heads, replays) leaves out the salt: keys differ from block_key",
        (CACHE, HITRATE, C + "test_paged_block_chain.py"),
    ),
    Mutant(
        "paged.prefix_cache.hit_not_verified_for_extra",
        "paged/prefix_cache.py",
        "                if entry.parent != parent or entry.extra != extra:\n                    block = None",
        "                if entry.parent != parent:\n                    block = None",
        "a hit is verified on parent and tokens but not on the salt: a weak hash shares across salts",
        (POOL, CACHE),
    ),
    Mutant(
        "paged.prefix_cache.match_ignores_parent",
        "paged/prefix_cache.py",
        "            blocks.append(block)\n            parent = key\n        return keys, blocks",
        "            blocks.append(block)\n        return keys, blocks",
        "match keys every block as a root block: the chain is not followed past the first block",
        (POOL, CACHE),
    ),
    Mutant(
        "paged.prefix_cache.insert_overwrites_key",
        "paged/prefix_cache.py",
        "        if key in by_key:\n            if not self.index_duplicates:",
        "        if key in by_key and self.index_duplicates:\n            if not self.index_duplicates:",
        "a second block with the same prefix replaces the first in the index (bijection broken)",
        (POOL, CACHE),
    ),
    Mutant(
        "paged.prefix_cache.hit_tokens_counted_as_blocks",
        "paged/prefix_cache.py",
        "        self.hit_tokens += hit_tokens",
        "        self.hit_tokens += hit_blocks",
        "the hit-rate counter adds hit blocks where it should add hit tokens",
        (CACHE, HITRATE),
    ),
    Mutant(
        "paged.prefix_admission.last_token_not_recomputed",
        "paged/prefix_admission.py",
        "        max_blocks = (len(prompt) - 1) // self.block_size  # the last token is recomputed",
        "        max_blocks = len(prompt) // self.block_size",
        "a prompt that is a whole number of cached blocks is served entirely from the cache",
        (CACHE,),
    ),
    Mutant(
        "paged.prefix_admission.admission_cost_floor",
        "paged/prefix_admission.py",
        "        fresh = -(-prompt_len // self.block_size) - len(hits)",
        "        fresh = prompt_len // self.block_size - len(hits)",
        "the admission check counts whole blocks only (off by one for a partial last block)",
        (CACHE,),
    ),
    Mutant(
        "paged.cache.watermark_off_by_one",
        "paged/cache.py",
        "        if free - cost < self.watermark_blocks:",
        "        if free - cost < self.watermark_blocks - 1:",
        "admission may dip one block into the watermark",
        (CACHE,),
    ),
    Mutant(
        "paged.cache.cow_needs_three_owners",
        "paged/cache.py",
        "        cow = idx < len(req.blocks) and self.pool.ref[req.blocks[idx]] > 1",
        "        cow = idx < len(req.blocks) and self.pool.ref[req.blocks[idx]] > 2",
        "a block shared by two requests is written in place (no copy-on-write)",
        (CACHE,),
    ),
    Mutant(
        "paged.plain_append.plain_append_span",
        "paged/plain_append.py",
        "        last = -(-end // bs)  # blocks the request spans after the append",
        "        last = end // bs + 1  # blocks the request spans after the append",
        "the memory-only fast append takes a block too many when a block fills exactly",
        (CACHE, HITRATE),
    ),
    Mutant(
        "paged.plain_append.chained_parent_root",
        "paged/plain_append.py",
        "        parent = keys[-1] if i else None\n",
        "        parent = None\n",
        "the chain-keyed decode append indexes each filled block as if it began a prompt",
        (C + "test_v1_fast_paths.py",),
    ),
    Mutant(
        "paged.serving.v1_keys.common_blocks_overshoot",
        "paged/serving/engine/v1_keys.py",
        "            lo = mid\n",
        "            lo = mid + 1\n",
        "the shared-prefix memo takes one block too many from the last prompt that began alike",
        (C + "test_v1_fast_paths.py",),
    ),
    Mutant(
        "paged.block_identity.interned_without_parent",
        "paged/block_identity.py",
        "            memo = (parent, block)\n",
        "            memo = (0, block)\n",
        "identity keys intern a described block by its id alone, not its whole prefix",
        (C + "test_block_identity.py",),
    ),
    Mutant(
        "paged.block_identity.tail_after_root",
        "paged/block_identity.py",
        "            after = parent_field(keys[-1]) if full else None\n",
        "            after = None\n",
        "the blocks past a prompt's full blocks are keyed as if they began a sequence",
        (C + "test_block_identity.py",),
    ),
    Mutant(
        "paged.cache.fork_shares_floor",
        "paged/cache.py",
        "        shared = -(-parent.seq_len // self.block_size)",
        "        shared = parent.seq_len // self.block_size",
        "fork does not share the parent's partial last block",
        (CACHE, C + "test_paged_sliding_window.py"),
    ),
    Mutant(
        "paged.eviction.lfu_counts_no_uses",
        "paged/eviction.py",
        "        uses = self._uses.get(block, 0) + 1",
        "        uses = 1",
        "the LFU queue forgets use counts and degenerates to LRU",
        (HITRATE,),
    ),
    Mutant(
        "paged.hitrate.capacity_rounds_up",
        "paged/hitrate.py",
        "    blocks = capacity_tokens // block_size\n",
        "    blocks = -(-capacity_tokens // block_size)\n",
        "a replay's pool counts a partial block of capacity as a whole block",
        (HITRATE,),
    ),
    Mutant(
        "paged.hitrate.sweep_truncates_short",
        "paged/hitrate.py",
        "                    short = ids[: limits[k]]",
        "                    short = ids[: limits[k] - 1]",
        "a capacity sweep truncates an over-long prompt one token shorter than a single replay",
        (C + "test_paged_block_chain.py",),
    ),
    Mutant(
        "paged.layer_groups.window_start_late",
        "paged/layer_groups.py",
        "        return self.rules[group].first_kept(seq_len - 1)",
        "        return self.rules[group].first_kept(seq_len)",
        "a sliding-window group's view starts one token late (the window's first token is lost)",
        (C + "test_paged_hybrid.py", C + "test_paged_sliding_window.py"),
    ),
    Mutant(
        "paged.layer_groups.allocate_group_by_group",
        "paged/layer_groups.py",
        "                table.kept_from = self.rules[gi].first_kept(table.seq_len)\n"
        "            fresh = pool.allocate_many(take) if n else []\n",
        "                table.kept_from = self.rules[gi].first_kept(table.seq_len)\n"
        "                mine = sum(c + w for g, _, c, w in plans if g == gi)\n"
        "                fresh = ([] if gi == plans[0][0] else fresh) + pool.allocate_many(mine)\n"
        "            fresh = fresh if n else []\n",
        "issue 36 (1): each group allocates before the next releases: a full group listed first is refused what the capacity answer grants",
        (
            C
            + "test_paged_hybrid_atomic.py::test_capacity_answer_and_append_agree_in_every_group_order",
            C + "test_paged_hybrid_atomic.py::test_capacity_answer_equals_append_up_to_a_full_pool",
            GROUPS_MACHINE,
        ),
    ),
    Mutant(
        "paged.layer_groups.write_failure_not_rolled_back",
        "paged/layer_groups.py",
        "        except BaseException:\n            pool.release(fresh)\n",
        "        except BaseException:\n            raise\n            pool.release(fresh)\n",
        "issue 36 (2): a failed write leaves the groups before it appended (group lengths differ, blocks taken)",
        (GROUPS_MACHINE,),
    ),
    Mutant(
        "paged.layer_groups.release_not_undone",
        "paged/layer_groups.py",
        "            for table, j, b, fill in reversed(released):\n",
        "            for table, j, b, fill in reversed(released[:0]):\n",
        "issue 36 (2): a failed allocation leaves the windows' releases standing (the append half done)",
        (
            GROUPS_MACHINE,
            C + "test_paged_hybrid_atomic.py::"
            "test_failed_append_changes_nothing_and_check_compares_group_lengths",
        ),
    ),
    Mutant(
        "paged.layer_groups.gather_reads_released",
        "paged/layer_groups.py",
        "        start = self._readable_from(request_id, group, table)\n",
        "        start = self.window_start(group, table.seq_len)\n",
        "issue 36 (3): gather right after a prefix hit reads a released block (window mod block == 1)",
        (
            HITS_MACHINE,
            C + "test_paged_hybrid_atomic.py::"
            "test_gather_and_attend_refuse_the_same_positions_after_a_prefix_hit",
            C + "test_paged_hybrid_atomic.py::test_views_after_a_hit_at_every_position",
        ),
    ),
    Mutant(
        "paged.layer_groups.fp8_scales_committed_before_the_write",
        "paged/layer_groups.py",
        "        self._apply(tables, plans, kv, n, take, pending)\n"
        "        if self.quant is not None:\n            self.quant.commit(pending)\n",
        "        if self.quant is not None:\n            self.quant.commit(pending)\n"
        "        self._apply(tables, plans, kv, n, take, pending)\n",
        "an fp8 append that fails in its allocation or write still fixes the dynamic scales",
        (FP8_GROUPS_MACHINE,),
    ),
    Mutant(
        "paged.group_quant.attend_reads_layer_0_scales",
        "paged/group_quant.py",
        '        return {"k_scale": k[layer].to(device), "v_scale": v[layer].to(device)}',
        '        return {"k_scale": k[0].to(device), "v_scale": v[0].to(device)}',
        "fp8 decode attention dequantizes every layer of a group with layer 0's scales",
        (FP8_GROUPS_MACHINE,),
    ),
    Mutant(
        "reference.oracle.causal_sees_next",
        "reference/oracle.py",
        "    hidden = key_pos > query_pos\n",
        "    hidden = key_pos > query_pos + 1\n",
        "the oracle lets a query see the next token (causal mask off by one)",
        (ORACLE,),
    ),
    Mutant(
        "reference.oracle.window_one_wider",
        "reference/oracle.py",
        "        hidden = hidden | (key_pos <= query_pos - window)",
        "        hidden = hidden | (key_pos < query_pos - window)",
        "the oracle's window holds window + 1 keys",
        (
            ORACLE,
            C + "test_kernels_sliding_window.py::test_sliding_window_decode_matches_the_oracle",
        ),
        k="gather",
    ),
    Mutant(
        "reference.oracle.gqa_tiles_heads",
        "reference/oracle.py",
        "    k64 = k.to(torch.float64).repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, L, D]",
        "    k64 = k.to(torch.float64).repeat(1, group, 1).transpose(0, 1)  # [Hq, L, D]",
        "the oracle maps query heads to KV heads round-robin, not in consecutive groups",
        (ORACLE,),
    ),
    Mutant(
        "reference.oracle.scale_not_sqrt",
        "reference/oracle.py",
        "    return 1.0 / math.sqrt(head_dim)",
        "    return 1.0 / head_dim",
        "the oracle's default softmax scale is 1/d, not 1/sqrt(d)",
        (ORACLE,),
    ),
    Mutant(
        "reference.contiguous.next_pow2_doubles_exact",
        "reference/contiguous.py",
        "    return 1 << (max(n, 1) - 1).bit_length()",
        "    return 1 << max(n, 1).bit_length()",
        "pow2 reserves twice the prompt when it already is a power of two",
        (CONTIG,),
    ),
    Mutant(
        "reference.contiguous.first_fit_strict",
        "reference/contiguous.py",
        "            if length >= size:",
        "            if length > size:",
        "first fit refuses a gap of exactly the size needed",
        (CONTIG,),
    ),
    Mutant(
        "reference.contiguous.oracle_reserves_one_less",
        "reference/contiguous.py",
        "        return min(prompt_len + output_len, self.max_seq_len)",
        "        return min(prompt_len + output_len - 1, self.max_seq_len)",
        "the oracle policy reserves one token less than prompt + output",
        (CONTIG,),
    ),
    Mutant(
        "reference.layer_groups.window_slice_wider",
        "reference/oracle.py",
        "        first = max(first, position - window + 1)",
        "        first = max(first, position - window)",
        "the layer-group reference reads window + 1 tokens for a windowed group",
        (C + "test_paged_hybrid.py",),
    ),
]
