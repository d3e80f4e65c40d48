// embed_backward on the GPU against the CPU: deterministic (bitwise reproducible) and atomic
// modes, caller workspaces on another stream, bad ids, too small a workspace.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <embrope/embrope.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "../embed_backward_cases.hpp"
#include "gpu_support.hpp"

using namespace gpu_test;
using op_cases::BackwardCase;

namespace {

// The case the GPU runs start from: V 1000, D 64, every gradient table in one call (learned
// positions by explicit int32 ids over 512 rows, 3 token types), scale 1.5, padding_idx 3.
// The tests set the dtypes, D, the ids (one per row, ids_shape [N]) and the mode.
BackwardCase gpu_case() {
  BackwardCase c;
  c.vocab = 1000;
  c.dim = 64;
  c.scale = 1.5;
  c.padding = 3;
  c.learned = true;
  c.max_positions = 512;
  c.num_types = 3;
  return c;
}

// Runs embed_backward on the CPU and on the GPU (twice, the second time with a caller
// workspace on another stream) from the same initial gradients. Returns the GPU results of
// both runs and the CPU result for the token, position and type gradients, concatenated.
struct BackwardResults {
  std::vector<unsigned char> gpu_first, gpu_second, cpu;
  std::vector<double> magnitude;    // per element: |initial| + sum of |terms| (for tolerances)
  std::vector<std::int64_t> count;  // per element: the number of terms
};

BackwardResults run_backward_case(const BackwardCase& s) {
  INFO(describe(s));
  if (s.id_dtype != DType::int64 || s.ids_shape.size() != 1 ||
      s.ids_shape[0] != static_cast<std::int64_t>(s.ids.size()) || s.id_stride != 1 ||
      s.out_pad != 0 || s.grad_pad != 0 || s.vocab_start != 0 || s.shard || !s.token ||
      !s.learned || !s.explicit_positions || s.num_types <= 0 || s.zero_init ||
      !s.position_ids.empty() || !s.type_ids.empty() || !s.offsets.empty()) {
    FAIL("not a case the GPU runs: " << describe(s));
  }
  const embrope::BackwardMode mode = s.mode;
  const int es = embrope::dtype_size(s.dtype);
  const int gs = embrope::dtype_size(s.grad_dtype);
  const std::int64_t n = s.ids_shape[0], d = s.dim;
  const std::int64_t grad_rows = s.vocab + s.max_positions + s.num_types;
  Buffer grad_out(n * d * es), ids(n * 8), pids(n * 4), tids(n * 8), grads(grad_rows * d * gs);
  fill_random(grad_out, s.dtype, n * d, 71);
  fill_random(grads, s.grad_dtype, grad_rows * d, 72);
  std::mt19937_64 rng(73);
  std::vector<std::int64_t> pos(n), typ(n);
  for (std::int64_t r = 0; r < n; ++r) {
    std::memcpy(ids.host.data() + 8 * r, &s.ids[r], 8);
    const std::int32_t p = static_cast<std::int32_t>(rng() % s.max_positions);
    const std::int64_t t = static_cast<std::int64_t>(rng() % s.num_types);
    pos[r] = p;
    typ[r] = t;
    std::memcpy(pids.host.data() + 4 * r, &p, 4);
    std::memcpy(tids.host.data() + 8 * r, &t, 8);
  }
  for (Buffer* b : {&grad_out, &ids, &pids, &tids, &grads}) b->upload();
  const std::vector<unsigned char> initial = grads.host;
  const float scale = static_cast<float>(s.scale);
  const std::optional<std::int64_t> padding = s.padding;

  BackwardResults out;
  out.magnitude.assign(static_cast<std::size_t>(grad_rows * d), 0.0);
  out.count.assign(out.magnitude.size(), 0);
  for (std::int64_t i = 0; i < grad_rows * d; ++i) {
    out.magnitude[i] = std::fabs(load_value(initial.data(), s.grad_dtype, i));
  }
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t j = 0; j < d; ++j) {
      const double g = std::fabs(load_value(grad_out.host.data(), s.dtype, r * d + j));
      if (!(padding && s.ids[r] == *padding)) {
        out.magnitude[s.ids[r] * d + j] += scale * g;
        out.count[s.ids[r] * d + j] += 1;
      }
      out.magnitude[(s.vocab + pos[r]) * d + j] += g;
      out.count[(s.vocab + pos[r]) * d + j] += 1;
      out.magnitude[(s.vocab + s.max_positions + typ[r]) * d + j] += g;
      out.count[(s.vocab + s.max_positions + typ[r]) * d + j] += 1;
    }
  }

  auto call = [&](bool gpu, void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
    const Device dev = gpu ? Device::cuda(0) : Device::cpu();
    auto ptr = [&](Buffer& b) -> unsigned char* {
      return static_cast<unsigned char*>(gpu ? b.device : static_cast<void*>(b.host.data()));
    };
    embrope::EmbedBackwardOptions o;
    o.scale = scale;
    o.padding_idx = padding;
    o.mode = mode;
    o.grad_position_table =
        Tensor(ptr(grads) + s.vocab * d * gs, s.grad_dtype, {s.max_positions, d}, dev);
    o.position_ids = Tensor(ptr(pids), DType::int32, {n}, dev);
    o.grad_type_table = Tensor(ptr(grads) + (s.vocab + s.max_positions) * d * gs, s.grad_dtype,
                               {s.num_types, d}, dev);
    o.type_ids = Tensor(ptr(tids), DType::int64, {n}, dev);
    o.workspace = workspace;
    o.workspace_bytes = workspace_bytes;
    o.stream.handle = stream;
    const Tensor g(ptr(grad_out), s.dtype, {n, d}, dev);
    const Tensor i(ptr(ids), DType::int64, {n}, dev);
    const Tensor t(ptr(grads), s.grad_dtype, {s.vocab, d}, dev);
    if (workspace != nullptr) {
      REQUIRE(embrope::embed_backward_workspace_size(g, i, t, o) <= workspace_bytes);
    }
    embrope::embed_backward(g, i, t, o);
  };
  call(false, nullptr, 0, nullptr);
  out.cpu = grads.host;
  call(true, nullptr, 0, nullptr);
  cuda_check(cudaDeviceSynchronize());
  out.gpu_first = grads.download();

  // Again from the same initial values, with a caller workspace on a non-default stream.
  grads.host = initial;
  grads.upload();
  cudaStream_t stream;
  cuda_check(cudaStreamCreate(&stream));
  const std::size_t bytes = [&] {
    embrope::EmbedBackwardOptions o;
    o.mode = mode;
    o.grad_position_table = Tensor(static_cast<unsigned char*>(grads.device) + s.vocab * d * gs,
                                   s.grad_dtype, {s.max_positions, d}, Device::cuda(0));
    o.position_ids = Tensor(pids.device, DType::int32, {n}, Device::cuda(0));
    o.grad_type_table =
        Tensor(static_cast<unsigned char*>(grads.device) + (s.vocab + s.max_positions) * d * gs,
               s.grad_dtype, {s.num_types, d}, Device::cuda(0));
    o.type_ids = Tensor(tids.device, DType::int64, {n}, Device::cuda(0));
    return embrope::embed_backward_workspace_size(
        Tensor(grad_out.device, s.dtype, {n, d}, Device::cuda(0)),
        Tensor(ids.device, DType::int64, {n}, Device::cuda(0)),
        Tensor(grads.device, s.grad_dtype, {s.vocab, d}, Device::cuda(0)), o);
  }();
  void* workspace = nullptr;
  cuda_check(cudaMalloc(&workspace, bytes == 0 ? 1 : bytes));
  call(true, bytes == 0 ? nullptr : workspace, bytes, stream);
  cuda_check(cudaStreamSynchronize(stream));
  out.gpu_second = grads.download();
  cudaFree(workspace);
  cudaStreamDestroy(stream);
  return out;
}

// GPU against CPU: within (terms + 2) float32 unit roundoffs of the magnitudes (the bound of
// any summation order), plus one output ulp for float16/bfloat16 gradients; and, with
// `same_bits` (the deterministic mode, which sums in the CPU's order: docs/numerics.md), bit
// for bit.
void compare_gradients(const BackwardResults& r, DType grad_dtype, bool same_bits) {
  std::int64_t bit_differences = 0;
  Mismatches mm;
  for (std::size_t i = 0; i < r.magnitude.size(); ++i) {
    const float g = load_value(r.gpu_first.data(), grad_dtype, static_cast<std::int64_t>(i));
    const float c = load_value(r.cpu.data(), grad_dtype, static_cast<std::int64_t>(i));
    double tol = 2.0 * static_cast<double>(r.count[i] + 2) * std::ldexp(r.magnitude[i], -24);
    if (grad_dtype != DType::float32) {
      const int mantissa = grad_dtype == DType::float16 ? 10 : 7;
      const float m = std::fmax(std::fabs(g), std::fabs(c));
      tol += m == 0 ? 0 : std::ldexp(1.0, std::ilogb(m) - mantissa);
    }
    mm.check(std::fabs(static_cast<double>(g) - c) <= tol, [&] {
      return where(static_cast<std::int64_t>(i), r.count[i], g, c) + " (element, terms)";
    });
    bit_differences += g != c;
  }
  mm.require();
  if (same_bits) {
    CHECK(r.gpu_first == r.cpu);
  } else {
    WARN(bit_differences << " of " << r.magnitude.size()
                         << " gradient elements differ from the CPU");
  }
}

}  // namespace

TEST_CASE("GPU embed_backward deterministic: bitwise reproducible, equal to the CPU",
          "[gpu][embed_backward]") {
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (DType grad_dtype : {DType::float32, dtype}) {
      for (int pattern = 0; pattern < 3; ++pattern) {
        for (std::int64_t dim : {64, 100}) {
          INFO("dtype " << embrope::dtype_name(dtype) << " grad " << embrope::dtype_name(grad_dtype)
                        << " pattern " << pattern << " D " << dim);
          BackwardCase s = gpu_case();
          s.dtype = dtype;
          s.grad_dtype = grad_dtype;
          s.dim = dim;
          const std::int64_t rows = pattern == 2 ? s.vocab : 5000;
          s.ids_shape = {rows};
          s.mode = embrope::BackwardMode::deterministic;
          std::mt19937_64 rng(81);
          for (std::int64_t r = 0; r < rows; ++r) {
            s.ids.push_back(pattern == 0   ? static_cast<std::int64_t>(rng() % s.vocab)
                            : pattern == 1 ? 7  // one id on every row: one long run
                                           : (r * 7 + 1) % s.vocab);  // all distinct
          }
          const BackwardResults r = run_backward_case(s);
          REQUIRE(r.gpu_first == r.gpu_second);
          compare_gradients(r, grad_dtype, true);
        }
      }
    }
  }
}

TEST_CASE("GPU embed_backward atomic: float32 within the summation bound of the CPU",
          "[gpu][embed_backward]") {
  // A warp's step is 32 kVec16 elements (128 of float32, 256 of 16-bit values): D 64 and 100
  // are one partial step, 300 whole steps and a partial one.
  for (DType dtype : {DType::float32, DType::float16, DType::bfloat16}) {
    for (std::int64_t dim : {64, 100, 300}) {
      for (int pattern = 0; pattern < 2; ++pattern) {
        INFO("dtype " << embrope::dtype_name(dtype) << " D " << dim << " pattern " << pattern);
        BackwardCase s = gpu_case();
        s.dtype = dtype;
        s.dim = dim;
        const std::int64_t rows = 4096;
        s.ids_shape = {rows};
        s.mode = embrope::BackwardMode::atomic;
        std::mt19937_64 rng(91);
        for (std::int64_t r = 0; r < rows; ++r) {
          s.ids.push_back(pattern == 0 ? static_cast<std::int64_t>(rng() % s.vocab) : 11);
        }
        const BackwardResults r = run_backward_case(s);
        compare_gradients(r, DType::float32, false);
      }
    }
  }
}

TEST_CASE("GPU embed_backward: bad ids are reported, too small a workspace is rejected",
          "[gpu][embed_backward][errors]") {
  const std::int64_t vocab = 50, dim = 32, rows = 1000;
  Buffer grad_out(rows * dim * 4), ids(rows * 8), grad(vocab * dim * 4);
  fill_random(grad_out, DType::float32, rows * dim, 101);
  fill_random(grad, DType::float32, vocab * dim, 102);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t id = r == 611 ? -3 : (r == 900 ? vocab : r % vocab);
    std::memcpy(ids.host.data() + 8 * r, &id, 8);
  }
  for (Buffer* b : {&grad_out, &ids, &grad}) b->upload();
  const Device gpu = Device::cuda(0);
  const Tensor g(grad_out.device, DType::float32, {rows, dim}, gpu);
  const Tensor i(ids.device, DType::int64, {rows}, gpu);
  const Tensor t(grad.device, DType::float32, {vocab, dim}, gpu);
  for (auto mode : {embrope::BackwardMode::deterministic, embrope::BackwardMode::atomic}) {
    embrope::EmbedBackwardOptions o;
    o.mode = mode;
    REQUIRE_THROWS_WITH(embrope::embed_backward(g, i, t, o),
                        Catch::Contains("embed_backward") && Catch::Contains("ids[611] = -3"));
    embrope::DeferredStatus status(gpu);
    o.deferred = &status;
    embrope::embed_backward(g, i, t, o);
    REQUIRE_THROWS_WITH(status.check(), Catch::Contains("ids[611]"));
  }
  // The CPU oracle for the good rows: the same call as a shard that owns [0, vocab).
  grad.upload();
  embrope::EmbedBackwardOptions shard;
  shard.vocab_shard = true;
  embrope::embed_backward(g, i, t, shard);
  embrope::embed_backward(Tensor(grad_out.host.data(), DType::float32, {rows, dim}),
                          Tensor(ids.host.data(), DType::int64, {rows}),
                          Tensor(grad.host.data(), DType::float32, {vocab, dim}), shard);
  compare_rows(grad.download(), grad.host, DType::float32, vocab * dim, dim);

  embrope::EmbedBackwardOptions small;
  const std::size_t bytes = embrope::embed_backward_workspace_size(g, i, t, small);
  REQUIRE(bytes > 0);
  small.workspace = grad.device;  // any device pointer: the size is checked first
  small.workspace_bytes = bytes - 1;
  REQUIRE_THROWS_WITH(embrope::embed_backward(g, i, t, small), Catch::Contains("workspace_bytes"));
  embrope::EmbedBackwardOptions atomic;
  atomic.mode = embrope::BackwardMode::atomic;
  REQUIRE(embrope::embed_backward_workspace_size(g, i, t, atomic) == 0);
}

// ------------------------------------------------------------------- with a norm ----

namespace {

// embed_backward with a norm on the CPU and the GPU (deterministic mode, then with a caller
// workspace; atomic mode with float32 gradients), from the same inputs: token and position
// gradients (float32 or the model's dtype) and the norm's weight and bias gradients.
void check_norm_backward(DType dtype, DType pre_dtype, DType grad_dtype,
                         embrope::Normalization norm, std::int64_t d, bool grad_pre,
                         embrope::BackwardMode mode) {
  INFO("dtype " << embrope::dtype_name(dtype) << " pre " << embrope::dtype_name(pre_dtype)
                << " grads " << embrope::dtype_name(grad_dtype) << " norm "
                << static_cast<int>(norm) << " D " << d << " grad_pre " << grad_pre << " mode "
                << static_cast<int>(mode));
  const std::int64_t n = 300, vocab = 40, max_p = 64;  // 5 chunks of the weight gradients
  const int es = embrope::dtype_size(dtype), ps = embrope::dtype_size(pre_dtype);
  const int gs = embrope::dtype_size(grad_dtype);
  Buffer grad_out(n * d * es), pre(n * d * ps), gp(n * d * es), weight(d * 4), ids(n * 8),
      pids(n * 4), grads((vocab + max_p) * d * gs), norm_grads(2 * d * 4);
  fill_random(grad_out, dtype, n * d, 111);
  fill_random(pre, pre_dtype, n * d, 112);
  fill_random(gp, dtype, n * d, 113);
  fill_random(weight, DType::float32, d, 114);
  std::mt19937_64 rng(115);
  for (std::int64_t r = 0; r < n; ++r) {
    const std::int64_t id = static_cast<std::int64_t>(rng() % vocab);
    // Row 77 has a position outside the table: no gradient anywhere, reported.
    const std::int32_t p =
        r == 77 ? static_cast<std::int32_t>(max_p) : static_cast<std::int32_t>(rng() % max_p);
    std::memcpy(ids.host.data() + 8 * r, &id, 8);
    std::memcpy(pids.host.data() + 4 * r, &p, 4);
  }
  grads.poison_both(0);  // zero-initialised gradients
  for (Buffer* b : {&grad_out, &pre, &gp, &weight, &ids, &pids}) b->upload();

  auto call = [&](bool gpu, void* workspace, std::size_t bytes) {
    const Device dev = gpu ? Device::cuda(0) : Device::cpu();
    auto ptr = [&](Buffer& b) -> unsigned char* {
      return static_cast<unsigned char*>(gpu ? b.device : static_cast<void*>(b.host.data()));
    };
    embrope::EmbedBackwardOptions o;
    o.scale = 1.5f;
    o.mode = mode;
    o.norm = norm;
    o.norm_eps = 1e-5f;
    o.pre_norm = Tensor(ptr(pre), pre_dtype, {n, d}, dev);
    o.norm_weight = Tensor(ptr(weight), DType::float32, {d}, dev);
    if (grad_pre) o.grad_pre_norm = Tensor(ptr(gp), dtype, {n, d}, dev);
    o.grad_norm_weight = Tensor(ptr(norm_grads), DType::float32, {d}, dev);
    if (norm == embrope::Normalization::layer_norm) {
      o.grad_norm_bias = Tensor(ptr(norm_grads) + d * 4, DType::float32, {d}, dev);
    }
    o.grad_position_table = Tensor(ptr(grads) + vocab * d * gs, grad_dtype, {max_p, d}, dev);
    o.position_ids = Tensor(ptr(pids), DType::int32, {n}, dev);
    o.workspace = workspace;
    o.workspace_bytes = bytes;
    embrope::DeferredStatus status(dev);
    o.deferred = &status;
    const Tensor g(ptr(grad_out), dtype, {n, d}, dev);
    const Tensor i(ptr(ids), DType::int64, {n}, dev);
    const Tensor t(ptr(grads), grad_dtype, {vocab, d}, dev);
    if (workspace != nullptr) REQUIRE(embrope::embed_backward_workspace_size(g, i, t, o) <= bytes);
    embrope::embed_backward(g, i, t, o);
    REQUIRE_THROWS_WITH(status.check(), Catch::Contains("position_ids[77] = 64"));
    return embrope::embed_backward_workspace_size(g, i, t, o);
  };
  call(false, nullptr, 0);
  const std::size_t bytes = call(true, nullptr, 0);
  cuda_check(cudaDeviceSynchronize());
  const std::vector<unsigned char> gpu_grads = grads.download(), gpu_norm = norm_grads.download();
  const std::int64_t norm_floats = norm == embrope::Normalization::layer_norm ? 2 * d : d;
  // The norm's gradients are sums in the same fixed order on both: bit for bit, in every mode.
  CHECK(std::memcmp(gpu_norm.data(), norm_grads.host.data(), norm_floats * 4) == 0);
  if (mode == embrope::BackwardMode::deterministic) {
    CHECK(gpu_grads == grads.host);
    // Again into zeroed gradients, with a caller workspace of exactly the size asked for,
    // one byte past an aligned address (the call aligns its pieces within it).
    cuda_check(cudaMemset(grads.device, 0, grads.host.size()));
    void* workspace = nullptr;
    cuda_check(cudaMalloc(&workspace, bytes + 1));
    call(true, static_cast<unsigned char*>(workspace) + 1, bytes);
    cuda_check(cudaDeviceSynchronize());
    cudaFree(workspace);
    CHECK(grads.download() == grads.host);
  } else {
    compare_rows(gpu_grads, grads.host, grad_dtype, (vocab + max_p) * d, d);
  }
}

}  // namespace

TEST_CASE("GPU embed_backward with a norm equals the CPU bit for bit",
          "[gpu][embed_backward][norm]") {
  using embrope::Normalization;
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
    for (Normalization norm : {Normalization::layer_norm, Normalization::rms_norm}) {
      for (std::int64_t d : {64, 100, 768}) {
        const DType pre_dtype = d == 100 ? DType::float32 : dtype;
        const DType grad_dtype = d == 768 ? dtype : DType::float32;
        check_norm_backward(dtype, pre_dtype, grad_dtype, norm, d, d != 64,
                            embrope::BackwardMode::deterministic);
      }
    }
  }
  check_norm_backward(DType::bfloat16, DType::bfloat16, DType::float32,
                      embrope::Normalization::layer_norm, 128, true, embrope::BackwardMode::atomic);
}

// Hidden ([.]: about 5 GB on an H100; scripts/gpu-check.sh runs it): the norm's weight and bias
// gradients take a thread per column on a grid of at most 4 waves of blocks (grid_for), so
// columns past 4 x SMs x 8 blocks x 256 threads (1,081,344 on an H100) were never written. D
// one block past that. On the emulated device, SIMT_SM_COUNT=1 makes it D = 8,448.
TEST_CASE("GPU embed_backward with a norm: a row wider than the columns' grid",
          "[.][gpu_wide][embed_backward][norm]") {
  int device = 0, sms = 0, threads = 0;
  cuda_check(cudaGetDevice(&device));
  cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cuda_check(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  const std::int64_t d = 4 * static_cast<std::int64_t>(sms) * (threads / 256) * 256 + 256;
  check_norm_backward(DType::bfloat16, DType::bfloat16, DType::float32,
                      embrope::Normalization::layer_norm, d, false,
                      embrope::BackwardMode::deterministic);
}
