// An allocation that fails inside a call, wherever it is: the call throws std::bad_alloc (the C
// API's EMBROPE_ERROR_OUT_OF_MEMORY), never ends the process, and the next call gives the same
// bits as before. This executable replaces the global operator new so that the n-th allocation
// of a call fails, for every n the call reaches, on any thread (the CPU kernels' OpenMP teams
// included: an exception cannot leave an OpenMP region, the runtime terminates instead). Its own
// executable, because the replacement is global; left out of sanitizer builds, whose runtimes
// replace operator new themselves.
#include <catch2/catch.hpp>
#include <omp.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "embrope/embrope.hpp"

namespace {

std::atomic<long> fail_at{0};  // the allocation that fails, counted from 1; 0: none
std::atomic<long> allocations{0};

void count_or_fail() {
  if (fail_at.load() == 0) return;
  if (allocations.fetch_add(1) + 1 == fail_at.load()) throw std::bad_alloc();
}

void* allocate(std::size_t bytes) {
  count_or_fail();
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}

void* allocate_aligned(std::size_t bytes, std::align_val_t alignment) {
  count_or_fail();
  const auto a = static_cast<std::size_t>(alignment);
  // aligned_alloc wants a size that is a multiple of the alignment.
  if (void* p = std::aligned_alloc(a, (bytes + a - 1) / a * a + (bytes == 0 ? a : 0))) return p;
  throw std::bad_alloc();
}

}  // namespace

void* operator new(std::size_t bytes) {
  return allocate(bytes);
}
void* operator new[](std::size_t bytes) {
  return allocate(bytes);
}
void* operator new(std::size_t bytes, std::align_val_t a) {
  return allocate_aligned(bytes, a);
}
void* operator new[](std::size_t bytes, std::align_val_t a) {
  return allocate_aligned(bytes, a);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}

namespace {

using embrope::DType;
using embrope::Tensor;

// Past every CPU kernel's threading threshold (2^15 elements), so that each call opens its
// OpenMP team.
constexpr std::int64_t V = 64, D = 256, N = 256;           // embed: N rows of D
constexpr std::int64_t T = 256, Hq = 4, Hk = 2, HD = 64;   // RoPE: T tokens
constexpr std::int64_t P = 512, Pages = 8, PageSize = 64;  // positions, paged cache

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<std::int64_t> random_ids(std::size_t n, std::int64_t bound, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int64_t> v(n);
  for (auto& x : v) x = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(bound));
  return v;
}

struct Buffers {
  std::vector<float> table = random_floats(V * D, 1), norm_weight = random_floats(D, 2),
                     norm_bias = random_floats(D, 3), grad_out = random_floats(N * D, 4),
                     q = random_floats(T * Hq * HD, 5), k = random_floats(T * Hk * HD, 6),
                     v = random_floats(T * Hk * HD, 7), head_weight = random_floats(HD, 8);
  std::vector<std::int64_t> ids = random_ids(N, V, 9), positions = random_ids(T, P, 10),
                            positions3 = random_ids(3 * T, P, 11), slots = random_ids(T, T, 12);
  std::vector<float> out, out2, cache;
  embrope::RopeCache rope{embrope::RopeConfig{HD, 10000.0, P}};
  Buffers() {
    for (std::int64_t t = 0; t < T; ++t) slots[t] = t;  // distinct slots, in order
  }
};

// One call of an op, writing its results into b.out (and b.out2, b.cache).
struct Op {
  const char* name;
  std::function<void(Buffers&)> run;
};

std::vector<Op> ops() {
  const auto embed_with = [](Buffers& b, const embrope::EmbedOptions& o) {
    b.out.assign(N * D, 0.0f);
    embrope::embed(Tensor(b.table.data(), DType::float32, {V, D}),
                   Tensor(b.ids.data(), DType::int64, {N}),
                   Tensor(b.out.data(), DType::float32, {N, D}), o);
  };
  const auto rope_options = [](Buffers& b) {
    b.out.assign(T * Hq * HD, 0.0f);
    b.out2.assign(T * Hk * HD, 0.0f);
    embrope::RopeOptions o;
    o.q_out = Tensor(b.out.data(), DType::float32, {T, Hq, HD});
    o.k_out = Tensor(b.out2.data(), DType::float32, {T, Hk, HD});
    return o;
  };
  const auto q_of = [](Buffers& b) { return Tensor(b.q.data(), DType::float32, {T, Hq, HD}); };
  const auto k_of = [](Buffers& b) { return Tensor(b.k.data(), DType::float32, {T, Hk, HD}); };
  const auto positions_of = [](Buffers& b) {
    return Tensor(b.positions.data(), DType::int64, {T});
  };
  const auto head_norm = [](Buffers& b) {
    embrope::QkNorm norm;
    norm.q_weight = Tensor(b.head_weight.data(), DType::float32, {HD});
    norm.k_weight = Tensor(b.head_weight.data(), DType::float32, {HD});
    return norm;
  };
  return {
      {"embed with a LayerNorm",
       [=](Buffers& b) {
         embrope::EmbedOptions o;
         o.norm = embrope::Normalization::layer_norm;
         o.norm_weight = Tensor(b.norm_weight.data(), DType::float32, {D});
         o.norm_bias = Tensor(b.norm_bias.data(), DType::float32, {D});
         embed_with(b, o);
       }},
      {"embed with sinusoidal positions",
       [=](Buffers& b) {
         embrope::EmbedOptions o;
         o.positions = embrope::PositionEncoding::sinusoidal;
         embed_with(b, o);
       }},
      {"embed_backward through an RMSNorm",
       [=](Buffers& b) {
         b.out.assign(V * D, 0.0f);
         b.out2.assign(D, 0.0f);
         embrope::EmbedBackwardOptions o;
         o.norm = embrope::Normalization::rms_norm;
         o.pre_norm = Tensor(b.grad_out.data(), DType::float32, {N, D});
         o.norm_weight = Tensor(b.norm_weight.data(), DType::float32, {D});
         o.grad_norm_weight = Tensor(b.out2.data(), DType::float32, {D});
         embrope::embed_backward(Tensor(b.grad_out.data(), DType::float32, {N, D}),
                                 Tensor(b.ids.data(), DType::int64, {N}),
                                 Tensor(b.out.data(), DType::float32, {V, D}), o);
       }},
      {"apply_rope",
       [=](Buffers& b) {
         embrope::apply_rope(q_of(b), k_of(b), positions_of(b), b.rope, rope_options(b));
       }},
      {"apply_rope with mrope sections",
       [=](Buffers& b) {
         embrope::RopeOptions o = rope_options(b);
         o.mrope_section = {8, 12, 12};
         embrope::apply_rope(q_of(b), k_of(b), Tensor(b.positions3.data(), DType::int64, {3, T}),
                             b.rope, o);
       }},
      {"apply_qk_norm_rope",
       [=](Buffers& b) {
         embrope::apply_qk_norm_rope(q_of(b), k_of(b), positions_of(b), b.rope, head_norm(b),
                                     rope_options(b));
       }},
      {"apply_qk_norm_rope_backward",
       [=](Buffers& b) {
         // dq and dk: the inputs' values, read before out and out2 are written.
         embrope::RopeOptions o = rope_options(b);
         b.cache.assign(2 * HD, 0.0f);
         embrope::QkNormGradients grads;
         grads.q_weight = Tensor(b.cache.data(), DType::float32, {HD});
         grads.k_weight = Tensor(b.cache.data() + HD, DType::float32, {HD});
         embrope::apply_qk_norm_rope_backward(q_of(b), k_of(b), q_of(b), k_of(b), positions_of(b),
                                              b.rope, head_norm(b), grads, o);
       }},
      {"apply_rope_append_kv, paged cache",
       [=](Buffers& b) {
         b.cache.assign(2 * Pages * PageSize * Hk * HD, 0.0f);
         embrope::KvCache cache = embrope::KvCache::combined(
             Tensor(b.cache.data(), DType::float32, {Pages, 2, PageSize, Hk, HD}));
         embrope::apply_rope_append_kv(
             q_of(b), k_of(b), Tensor(b.v.data(), DType::float32, {T, Hk, HD}), positions_of(b),
             b.rope, cache, embrope::KvSlots::paged(Tensor(b.slots.data(), DType::int64, {T})),
             rope_options(b));
       }},
      {"apply_qk_norm_rope_append_kv, paged cache",
       [=](Buffers& b) {
         b.cache.assign(2 * Pages * PageSize * Hk * HD, 0.0f);
         embrope::KvCache cache = embrope::KvCache::combined(
             Tensor(b.cache.data(), DType::float32, {Pages, 2, PageSize, Hk, HD}));
         embrope::apply_qk_norm_rope_append_kv(
             q_of(b), k_of(b), Tensor(b.v.data(), DType::float32, {T, Hk, HD}), positions_of(b),
             b.rope, cache, embrope::KvSlots::paged(Tensor(b.slots.data(), DType::int64, {T})),
             head_norm(b), rope_options(b));
       }},
  };
}

std::vector<float> results(const Buffers& b) {
  std::vector<float> all(b.out);
  all.insert(all.end(), b.out2.begin(), b.out2.end());
  all.insert(all.end(), b.cache.begin(), b.cache.end());
  return all;
}

}  // namespace

TEST_CASE("an allocation that fails anywhere in a call is std::bad_alloc, on any thread",
          "[allocation]") {
  // More threads than this machine may have cores: the team's other threads are then sure to
  // run part of each call.
  omp_set_num_threads(3);
  Buffers b;
  for (const Op& op : ops()) {
    CAPTURE(op.name);
    op.run(b);
    const std::vector<float> expected = results(b);
    long failed = 0;
    for (long n = 1;; ++n) {
      CAPTURE(n);
      allocations = 0;
      fail_at = n;
      bool threw = false;
      try {
        op.run(b);
      } catch (const std::bad_alloc&) {
        threw = true;
      }
      fail_at = 0;
      if (!threw) {
        // A failure the call absorbed (std::stable_sort's buffer: it merges in place without
        // one) must leave the same results.
        CHECK(results(b) == expected);
        // Fewer than n allocations: the sweep has passed them all.
        if (allocations.load() < n) break;
        continue;
      }
      ++failed;
      REQUIRE(n < 1000);
    }
    // The sweep reached the call's allocations.
    CHECK(failed >= 1);
    op.run(b);
    CHECK(results(b) == expected);
  }
}
