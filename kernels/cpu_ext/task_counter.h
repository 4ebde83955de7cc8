// kvbench's CPU kernels: a decode's tasks handed out by a shared counter (used by the
// 16/32-bit decode in paged_attn.cpp and the fp8 decode in paged_attn_fp8.cpp).
//
// for_each_task<State>(n, f) runs f(task, state) for task = 0 .. n - 1 on the intra-op
// threads, each thread taking the next task from a shared counter as it finishes one
// (tasks start in index order), with one default-constructed State per thread (its
// scratch buffers, sized by f on first use). A static split (at::parallel_for's own: n /
// threads tasks each) leaves one core idle at the end whenever the other thread was
// preempted or slowed by a neighbour on a shared host; here the thread that runs takes the
// remaining tasks: paired against the static split in one process at load average 7.7-8.2
// on the 2-core host, 0.81-0.97 of its time (8 x 4096 and 32 x 1024, docs/cpu-kernel.md).
// A task's result depends on its index only, so outputs are the static split's, bit for
// bit. Nested inside another parallel region the single thread runs them all, in order.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

template <typename State = std::vector<float>, typename F>
void for_each_task(int64_t n, F&& f) {
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(n, at::get_num_threads());
  at::parallel_for(0, std::max<int64_t>(1, threads), 1, [&](int64_t, int64_t) {
    State state;
    for (int64_t task; (task = next.fetch_add(1, std::memory_order_relaxed)) < n;) f(task, state);
  });
}
