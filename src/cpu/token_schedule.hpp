// How the CPU's RoPE kernels (apply_rope and its backward, apply_rope_append_kv,
// apply_qk_norm_rope) deal a call's tokens to the OpenMP threads.
#pragma once

// One contiguous block of tokens per thread (a static schedule): each thread then reads and
// writes its part of q, k and the caches front to back, one stream per tensor, which the
// hardware prefetchers follow. Chunks of 16 tokens dealt out dynamically made each thread's
// streams jump every 16 tokens: a bfloat16 Llama-3-8B RoPE of 16K tokens in place took 5.2-5.3 ms
// against 3.3 ms (57-60% of an in-place pass over its bytes against 93-94%), RoPE + KV append
// 1.36x, qk-norm + RoPE + KV append 1.14x (2 cores, AVX-512;
// benchmarks/results/cpu-2026-11-28-token-schedule/). What it gives up: a thread whose core is
// busy with other work holds the call back, where dynamic chunks let the other thread take more.
// (Macros are expanded in OpenMP directives.)
#define EMBROPE_TOKEN_SCHEDULE schedule(static)
