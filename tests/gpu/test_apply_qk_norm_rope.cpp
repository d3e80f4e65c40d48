// apply_qk_norm_rope and its backward on the GPU against the CPU: the same bits (both sum in
// the order of docs/numerics.md and round the same way), weight gradients included.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <embrope/embrope.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_support.hpp"

using namespace gpu_test;

namespace {

struct QkCase {
  DType dtype;
  std::int64_t tokens, hq, hk, dim, rotary;
  embrope::RopeLayout layout;
  bool unit_offset;
  bool mrope;  // interleaved mrope over 3 streams
  bool axial;  // four axes of rotary / 4 features each (FLUX.2's layout)
};

// The first byte where two buffers differ, or -1.
std::int64_t first_difference(const std::vector<unsigned char>& a,
                              const std::vector<unsigned char>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<std::int64_t>(i);
  }
  return a.size() == b.size() ? -1 : static_cast<std::int64_t>(a.size());
}

Tensor host_view(Buffer& b, DType dtype, std::vector<std::int64_t> shape) {
  return Tensor(b.host.data(), dtype, static_cast<int>(shape.size()), shape.data(), nullptr);
}
Tensor device_view(Buffer& b, DType dtype, std::vector<std::int64_t> shape) {
  return Tensor(b.device, dtype, static_cast<int>(shape.size()), shape.data(), nullptr,
                Device::cuda(0));
}

}  // namespace

TEST_CASE("GPU apply_qk_norm_rope and its backward equal the CPU bit for bit",
          "[gpu][qk_norm_rope]") {
  using embrope::RopeLayout;
  const QkCase cases[] = {
      {DType::bfloat16, 77, 8, 2, 128, 128, RopeLayout::neox, false, false, false},
      {DType::float32, 70, 4, 1, 64, 32, RopeLayout::interleaved, false, false, false},
      {DType::float16, 33, 3, 3, 80, 80, RopeLayout::neox, true, false, false},
      {DType::bfloat16, 20, 2, 1, 256, 256, RopeLayout::interleaved, true, false, false},
      {DType::float32, 9, 2, 1, 17, 16, RopeLayout::neox, false, false, false},
      {DType::bfloat16, 40, 4, 2, 96, 64, RopeLayout::neox, false, true, false},
      {DType::float32, 5, 1, 1, 300, 300, RopeLayout::neox, false, false, false},
      {DType::bfloat16, 37, 4, 2, 128, 128, RopeLayout::interleaved, false, false, true},
      {DType::float16, 11, 2, 2, 80, 64, RopeLayout::neox, false, false, true},
      // The neox fast path (D 64, 128 or 256 rotated whole, a float32 table) beside case 1:
      // enough tokens for a block per token (its rounds of 4 rows), and D 256 with mrope
      // (rounds of 5 rows, the second with an empty slot).
      {DType::float16, 600, 3, 1, 64, 64, RopeLayout::neox, true, false, false},
      {DType::float32, 19, 6, 3, 256, 256, RopeLayout::neox, false, true, false},
      // Rows in two rounds per block (Qwen3's 24 rows in blocks of 8, a token's rows split in
      // two at 270 tokens: rounds of 8 and 4), the round's node buffers alternating.
      {DType::bfloat16, 270, 16, 8, 64, 64, RopeLayout::neox, false, false, false},
  };
  for (const QkCase& c : cases) {
    INFO("dtype " << embrope::dtype_name(c.dtype) << " D " << c.dim << " R " << c.rotary
                  << " interleaved " << (c.layout == RopeLayout::interleaved) << " unit "
                  << c.unit_offset << " mrope " << c.mrope << " axial " << c.axial);
    const int es = embrope::dtype_size(c.dtype);
    const std::int64_t nq = c.tokens * c.hq * c.dim, nk = c.tokens * c.hk * c.dim;
    const std::int64_t streams = c.mrope ? 3 : c.axial ? 4 : 1;
    Buffer q(nq * es), k(nk * es), dq(nq * es), dk(nk * es), pos(streams * c.tokens * 8),
        wq(c.dim * es), wk(c.dim * es), gq(c.dim * 4), gk(c.dim * 4);
    fill_random(q, c.dtype, nq, 201);
    fill_random(k, c.dtype, nk, 202);
    fill_random(dq, c.dtype, nq, 203);
    fill_random(dk, c.dtype, nk, 204);
    fill_random(wq, c.dtype, c.dim, 205);
    fill_random(wk, c.dtype, c.dim, 206);
    for (std::int64_t t = 0; t < streams * c.tokens; ++t) {
      // Token 3 is out of range in every stream: zero-filled and reported on both backends.
      const std::int64_t p = t % c.tokens == 3 ? 5000 : (t * 37) % 4096;
      std::memcpy(pos.host.data() + 8 * t, &p, 8);
    }
    for (Buffer* b : {&q, &k, &dq, &dk, &pos, &wq, &wk}) b->upload();
    gq.poison_both(0x7f);
    gk.poison_both(0x7f);
    const embrope::RopeConfig config{c.rotary, 10000.0, 4096};
    embrope::RopeCache cpu_cache(config);
    embrope::RopeCache gpu_cache(config, Device::cuda(0));
    embrope::RopeOptions o;
    o.layout = c.layout;
    if (c.mrope) {
      o.mrope_section = {c.rotary / 2 - 2 * (c.rotary / 8), c.rotary / 8, c.rotary / 8};
      o.mrope_interleaved = true;
    }
    if (c.axial) o.axes_dim = {c.rotary / 4, c.rotary / 4, c.rotary / 4, c.rotary / 4};
    const std::vector<std::int64_t> qs{c.tokens, c.hq, c.dim}, ks{c.tokens, c.hk, c.dim};
    const std::vector<std::int64_t> ps = streams > 1 ? std::vector<std::int64_t>{streams, c.tokens}
                                                     : std::vector<std::int64_t>{c.tokens};
    auto norm_on = [&](bool gpu) {
      embrope::QkNorm n;
      n.q_weight = gpu ? device_view(wq, c.dtype, {c.dim}) : host_view(wq, c.dtype, {c.dim});
      n.k_weight = gpu ? device_view(wk, c.dtype, {c.dim}) : host_view(wk, c.dtype, {c.dim});
      n.eps = 1e-6f;
      n.unit_offset = c.unit_offset;
      return n;
    };

    // Backward first (it reads the saved q and k, which the forward then overwrites).
    for (bool gpu : {false, true}) {
      auto v = gpu ? device_view : host_view;
      embrope::QkNormGradients g;
      g.q_weight = v(gq, DType::float32, {c.dim});
      g.k_weight = v(gk, DType::float32, {c.dim});
      Buffer* workspace = nullptr;
      if (gpu) {
        // The caller's workspace, of the size the query gives.
        const std::size_t bytes = embrope::apply_qk_norm_rope_backward_workspace_size(
            v(dq, c.dtype, qs), v(dk, c.dtype, ks), g);
        REQUIRE(bytes > 0);
        workspace = new Buffer(bytes);
        g.workspace = workspace->device;
        g.workspace_bytes = bytes;
      }
      try {
        embrope::apply_qk_norm_rope_backward(
            v(dq, c.dtype, qs), v(dk, c.dtype, ks), v(q, c.dtype, qs), v(k, c.dtype, ks),
            v(pos, DType::int64, ps), gpu ? gpu_cache : cpu_cache, norm_on(gpu), g, o);
        FAIL("the bad position was not reported");
      } catch (const embrope::Error& e) {
        CHECK(e.code() == embrope::ErrorCode::index_out_of_range);
        CHECK(std::string(e.what()).find("apply_qk_norm_rope_backward") != std::string::npos);
      }
      delete workspace;
    }
    CHECK(first_difference(dq.download(), dq.host) == -1);
    CHECK(first_difference(dk.download(), dk.host) == -1);
    CHECK(first_difference(gq.download(), gq.host) == -1);
    CHECK(first_difference(gk.download(), gk.host) == -1);

    for (bool gpu : {false, true}) {
      auto v = gpu ? device_view : host_view;
      try {
        embrope::apply_qk_norm_rope(v(q, c.dtype, qs), v(k, c.dtype, ks), v(pos, DType::int64, ps),
                                    gpu ? gpu_cache : cpu_cache, norm_on(gpu), o);
        FAIL("the bad position was not reported");
      } catch (const embrope::Error& e) {
        CHECK(e.code() == embrope::ErrorCode::index_out_of_range);
        CHECK(std::string(e.what()).find("apply_qk_norm_rope") != std::string::npos);
      }
    }
    CHECK(first_difference(q.download(), q.host) == -1);
    CHECK(first_difference(k.download(), k.host) == -1);
  }
}

TEST_CASE("GPU apply_qk_norm_rope out of place, with caller cos/sin tables, equals the CPU",
          "[gpu][qk_norm_rope]") {
  // q_out and k_out (the inputs left as they were) and a caller's table: float32 (the neox
  // fast path through the table overload) and bfloat16 (a 16-bit table: the general path).
  const std::int64_t tokens = 40, hq = 4, hk = 2, dim = 128, positions = 64;
  const DType dtype = DType::bfloat16;
  const std::int64_t nq = tokens * hq * dim, nk = tokens * hk * dim;
  for (DType table : {DType::float32, DType::bfloat16}) {
    INFO("table " << embrope::dtype_name(table));
    const int ts = embrope::dtype_size(table);
    Buffer q(nq * 2), k(nk * 2), q_out(nq * 2), k_out(nk * 2), pos(tokens * 8), wq(dim * 4),
        wk(dim * 4), cos(positions * dim / 2 * ts), sin(positions * dim / 2 * ts);
    fill_random(q, dtype, nq, 401);
    fill_random(k, dtype, nk, 402);
    fill_random(wq, DType::float32, dim, 403);
    fill_random(wk, DType::float32, dim, 404);
    fill_random(cos, table, positions * dim / 2, 405);
    fill_random(sin, table, positions * dim / 2, 406);
    for (std::int64_t t = 0; t < tokens; ++t) {
      const std::int64_t p = (t * 29) % positions;
      std::memcpy(pos.host.data() + 8 * t, &p, 8);
    }
    for (Buffer* b : {&q, &k, &pos, &wq, &wk, &cos, &sin}) b->upload();
    const std::vector<unsigned char> q_in = q.host, k_in = k.host;
    q_out.poison_both(0x7f);
    k_out.poison_both(0x7f);
    for (bool gpu : {false, true}) {
      auto v = gpu ? device_view : host_view;
      embrope::QkNorm n;
      n.q_weight = v(wq, DType::float32, {dim});
      n.k_weight = v(wk, DType::float32, {dim});
      embrope::RopeOptions o;
      o.q_out = v(q_out, dtype, {tokens, hq, dim});
      o.k_out = v(k_out, dtype, {tokens, hk, dim});
      embrope::apply_qk_norm_rope(v(q, dtype, {tokens, hq, dim}), v(k, dtype, {tokens, hk, dim}),
                                  v(pos, DType::int64, {tokens}),
                                  v(cos, table, {positions, dim / 2}),
                                  v(sin, table, {positions, dim / 2}), n, o);
    }
    cuda_check(cudaDeviceSynchronize());
    CHECK(first_difference(q_out.download(), q_out.host) == -1);
    CHECK(first_difference(k_out.download(), k_out.host) == -1);
    CHECK(first_difference(q.download(), q_in) == -1);
    CHECK(first_difference(k.download(), k_in) == -1);
    CHECK(first_difference(q.host, q_in) == -1);
  }
}

TEST_CASE(
    "GPU apply_qk_norm_rope_backward: weight gradients of no rows are zero, and the "
    "call allocates its own workspace",
    "[gpu][qk_norm_rope]") {
  const std::int64_t dim = 64;
  Buffer q(8), dq(8), pos(8), w(dim * 4), g(dim * 4);
  g.poison_both(0x7f);
  embrope::RopeCache cache({dim, 10000.0, 64}, Device::cuda(0));
  embrope::QkNorm n;
  n.q_weight = device_view(w, DType::float32, {dim});
  embrope::QkNormGradients grads;
  grads.q_weight = device_view(g, DType::float32, {dim});
  embrope::apply_qk_norm_rope_backward(device_view(dq, DType::float32, {0, 2, dim}), std::nullopt,
                                       device_view(q, DType::float32, {0, 2, dim}), std::nullopt,
                                       device_view(pos, DType::int64, {0}), cache, n, grads);
  cuda_check(cudaDeviceSynchronize());
  const std::vector<unsigned char> got = g.download();
  for (std::int64_t j = 0; j < dim; ++j) {
    float v;
    std::memcpy(&v, got.data() + 4 * j, 4);
    CHECK(v == 0.0f);
  }
}

TEST_CASE(
    "GPU apply_qk_norm_rope of q alone and its backward, with and without weights, equal the CPU",
    "[gpu][qk_norm_rope]") {
  // k absent (the fast path's rows are q's alone; the general path's too), and weights absent
  // (every factor 1) or only q's: D 128 neox (the fast path; 300 tokens, a block per token, and
  // 7, split over blocks) and D 96 interleaved (the general path). The backward first, from
  // the same q (its fast path's chunks of q rows alone: 1,500 rows, the last chunk 28 of them;
  // 84 rows), with q's weight gradient where q has a weight.
  struct Case {
    std::int64_t tokens, heads, dim;
    embrope::RopeLayout layout;
    bool weight;
  };
  const Case cases[] = {{300, 5, 128, embrope::RopeLayout::neox, true},
                        {7, 12, 128, embrope::RopeLayout::neox, false},
                        {9, 3, 96, embrope::RopeLayout::interleaved, true}};
  const DType dtype = DType::bfloat16;
  for (const Case& c : cases) {
    INFO("T " << c.tokens << " heads " << c.heads << " D " << c.dim << " weight " << c.weight);
    const std::int64_t n = c.tokens * c.heads * c.dim;
    Buffer q(n * 2), dq(n * 2), pos(c.tokens * 8), w(c.dim * 4), gw(c.dim * 4);
    fill_random(q, dtype, n, 301);
    fill_random(dq, dtype, n, 303);
    fill_random(w, DType::float32, c.dim, 302);
    gw.poison_both(0x7f);
    for (std::int64_t t = 0; t < c.tokens; ++t) {
      const std::int64_t p = (t * 53) % 512;
      std::memcpy(pos.host.data() + 8 * t, &p, 8);
    }
    for (Buffer* b : {&q, &dq, &pos, &w}) b->upload();
    const embrope::RopeConfig config{c.dim, 10000.0, 512};
    embrope::RopeCache cpu_cache(config);
    embrope::RopeCache gpu_cache(config, Device::cuda(0));
    embrope::RopeOptions o;
    o.layout = c.layout;
    const std::vector<std::int64_t> shape{c.tokens, c.heads, c.dim};
    for (bool gpu : {false, true}) {
      auto v = gpu ? device_view : host_view;
      embrope::QkNorm norm;
      if (c.weight) norm.q_weight = v(w, DType::float32, {c.dim});
      norm.eps = 1e-6f;
      embrope::QkNormGradients grads;
      if (c.weight) grads.q_weight = v(gw, DType::float32, {c.dim});
      embrope::apply_qk_norm_rope_backward(v(dq, dtype, shape), std::nullopt, v(q, dtype, shape),
                                           std::nullopt, v(pos, DType::int64, {c.tokens}),
                                           gpu ? gpu_cache : cpu_cache, norm, grads, o);
    }
    cuda_check(cudaDeviceSynchronize());
    CHECK(first_difference(dq.download(), dq.host) == -1);
    CHECK(first_difference(gw.download(), gw.host) == -1);
    for (bool gpu : {false, true}) {
      auto v = gpu ? device_view : host_view;
      embrope::QkNorm norm;
      if (c.weight) norm.q_weight = v(w, DType::float32, {c.dim});
      norm.eps = 1e-6f;
      embrope::apply_qk_norm_rope(v(q, dtype, {c.tokens, c.heads, c.dim}), std::nullopt,
                                  v(pos, DType::int64, {c.tokens}), gpu ? gpu_cache : cpu_cache,
                                  norm, o);
    }
    cuda_check(cudaDeviceSynchronize());
    CHECK(first_difference(q.download(), q.host) == -1);
  }
}
