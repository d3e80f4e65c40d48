// embrope-bench: every op against the memory ceiling of its own access pattern measured in
// the same case (on the CPU: a copy of the same bytes, streaming past 16 MiB, for ops that read one
// place and write another, an in-place read-modify-write pass over them for in-place ops; on the
// GPU a device-to-device copy; read + write counted, timed after every call of the op) and against
// an unfused baseline inside embrope.
//
//   embrope-bench [--device=auto|cpu|gpu] [--full] [Google Benchmark flags]
//
// Without --full it runs the main cases (the README's table: every op and dtype at the
// sizes that tell, in about a minute on two cores); --full runs the whole sweep of shapes and
// token counts. Unless told otherwise, every case runs 3 repetitions and reports medians.
//
// Counters per case: GB/s (bytes the op must move / median time), ceiling_seconds (the
// ceiling pass's time per iteration), in_place (1 where that pass is in place),
// pct_of_ceiling (the op's bandwidth over the ceiling's: the ceiling's time over the op's),
// x_vs_unfused (the unfused baseline's time over the fused op's: q then k in two calls;
// lookup, then positions, then an add pass; RoPE, then a copy into the KV cache; the lookup
// with positions, then a LayerNorm pass).
// On the GPU, decode RoPE is also timed without the default check (/deferred) and as CUDA
// graph replays (/graph_replay).
#include <benchmark/benchmark.h>
#include <embrope/embrope.hpp>
#include <omp.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "embrope/detail/numeric_types.hpp"

#ifdef EMBROPE_BENCH_CUDA
#include <cuda_runtime.h>

#include "add_rows.hpp"
#endif

namespace {

using embrope::Device;
using embrope::DType;
using embrope::Tensor;

bool g_gpu = false;
bool g_full = false;

// Memory on the benchmark's device, filled with values in [-1, 1].
class Memory {
 public:
  explicit Memory(std::size_t bytes) : bytes_(bytes) {
#ifdef EMBROPE_BENCH_CUDA
    if (g_gpu) {
      if (cudaMalloc(&data_, bytes) != cudaSuccess) throw std::bad_alloc();
      return;
    }
#endif
    data_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (data_ == nullptr) throw std::bad_alloc();
  }
  ~Memory() {
#ifdef EMBROPE_BENCH_CUDA
    if (g_gpu) {
      cudaFree(data_);
      return;
    }
#endif
    std::free(data_);
  }
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  void* data() const {
    return data_;
  }

  // Fills with a host-made pattern: random values of dtype, or indices in [0, modulo). On
  // the CPU directly in place, on the GPU through a host copy.
  void fill_values(DType dtype) {
    const std::size_t n = bytes_ / embrope::dtype_size(dtype);
    std::vector<unsigned char> staging(g_gpu ? bytes_ : 0);
    unsigned char* host = g_gpu ? staging.data() : static_cast<unsigned char*>(data_);
#pragma omp parallel for
    for (std::size_t i = 0; i < n; ++i) {
      // A hash of the index to [-1, 1): cheap enough to fill gigabytes, and the same
      // values on every run.
      std::uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull;
      x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
      const float v = static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f;
      if (dtype == DType::float32) {
        std::memcpy(&host[4 * i], &v, 4);
      } else {
        const std::uint16_t b = dtype == DType::float16 ? embrope::detail::float_to_half(v)
                                                        : embrope::detail::float_to_bfloat16(v);
        std::memcpy(&host[2 * i], &b, 2);
      }
    }
    if (g_gpu) upload(host);
  }
  void fill_float32(float value) {
    const std::vector<float> host(bytes_ / 4, value);
    upload(host.data());
  }
  void fill_indices(std::int64_t count, std::int64_t modulo, bool sequential) {
    std::vector<std::int64_t> host(static_cast<std::size_t>(count));
    std::mt19937_64 rng(42);
    for (std::int64_t i = 0; i < count; ++i) {
      host[i] = sequential ? i % modulo : static_cast<std::int64_t>(rng() % modulo);
    }
    upload(host.data());
  }
  void fill_int64(const std::vector<std::int64_t>& host) {
    upload(host.data());
  }
  void fill_bytes(unsigned char value) {
    const std::vector<unsigned char> host(bytes_, value);
    upload(host.data());
  }

 private:
  void upload(const void* host) {
#ifdef EMBROPE_BENCH_CUDA
    if (g_gpu) {
      cudaMemcpy(data_, host, bytes_, cudaMemcpyHostToDevice);
      return;
    }
#endif
    std::memcpy(data_, host, bytes_);
  }
  void* data_ = nullptr;
  std::size_t bytes_;
};

Device device() {
  return g_gpu ? Device::cuda(0) : Device::cpu();
}

// Buffers shared by the cases, made once per process: allocating and filling gigabytes per
// case would take longer than timing them. `key` names what a buffer holds (its contents do
// not matter to timing, only that they are ordinary values; in-place ops keep rewriting them).
Memory& shared(const std::string& key, std::size_t bytes,
               const std::function<void(Memory&)>& fill) {
  static std::map<std::string, std::unique_ptr<Memory>> buffers;
  const std::string full_key = key + "/" + std::to_string(bytes);
  auto it = buffers.find(full_key);
  if (it == buffers.end()) {
    it = buffers.emplace(full_key, std::make_unique<Memory>(bytes)).first;
    fill(*it->second);
  }
  return *it->second;
}

Memory& shared_values(const std::string& key, std::size_t bytes, DType dtype) {
  return shared(key + "/" + embrope::dtype_name(dtype), bytes,
                [dtype](Memory& m) { m.fill_values(dtype); });
}

Memory& shared_indices(const std::string& key, std::int64_t count, std::int64_t modulo,
                       bool sequential) {
  return shared(key + "/" + std::to_string(modulo) + (sequential ? "/seq" : "/rand"),
                static_cast<std::size_t>(count) * 8,
                [=](Memory& m) { m.fill_indices(count, modulo, sequential); });
}

// One cos/sin table per rotary dim (building 65536 rows costs more than many RoPE calls).
const embrope::RopeCache& shared_cache(std::int64_t rotary_dim) {
  static std::map<std::int64_t, std::unique_ptr<embrope::RopeCache>> caches;
  auto& cache = caches[rotary_dim];
  if (!cache) {
    cache = std::make_unique<embrope::RopeCache>(embrope::RopeConfig{rotary_dim, 500000.0, 65536},
                                                 device());
  }
  return *cache;
}

// A copy of n bytes (a multiple of 64, both ends 64-byte aligned) with streaming stores, the
// widest the CPU has: lines written without being read for ownership first. On the 2-core
// EPYC VM of docs/performance.md glibc's memcpy of 134-537 MiB ran at 21-31 GB/s and this
// copy at 35-42 GB/s (1.2-1.9x), so held to memcpy the lookups, which stream their output
// (src/cpu/simd.hpp's kStreamingOutputBytes), measured up to 145% of "the ceiling"
// (benchmarks/results/cpu-2026-12-07-streaming-copy-ceiling/).
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) void stream_copy_avx512(char* d, const char* s, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 64) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), _mm512_load_si512(s + i));
  }
  _mm_sfence();
}
__attribute__((target("avx2"))) void stream_copy_avx2(char* d, const char* s, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 32) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm256_load_si256(reinterpret_cast<const __m256i*>(s + i)));
  }
  _mm_sfence();
}
#endif
void stream_copy(char* d, const char* s, std::size_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx512f")) return stream_copy_avx512(d, s, n);
  if (__builtin_cpu_supports("avx2")) return stream_copy_avx2(d, s, n);
#endif
  std::memcpy(d, s, n);
}

// Past this many bytes written a copy streams them (the CPU kernels' kStreamingOutputBytes:
// an output this large will not stay in cache); below, memcpy, whose ordinary stores keep the
// lines in cache as the ops' do.
constexpr std::size_t kStreamingCopyBytes = std::size_t{1} << 24;

// The ceiling: a copy of bytes/2 (read + write = bytes moved), a device-to-device copy on
// the GPU (on `stream`); on the CPU split over the cores like the ops it bounds, with
// streaming stores past kStreamingCopyBytes, and, like the ops, on one thread below 32768
// four-byte elements (where waking a team would cost more than the copy).
std::function<void()> copy_body(std::int64_t bytes, void* stream) {
  (void)stream;  // used by the CUDA build
  const std::size_t half = static_cast<std::size_t>(bytes / 2);
  Memory& src = shared_values("copy_src", half, DType::float32);
  Memory& dst = shared("copy_dst", half, [](Memory&) {});
#ifdef EMBROPE_BENCH_CUDA
  if (g_gpu) {
    const auto s = static_cast<cudaStream_t>(stream);
    return [&src, &dst, half, s] {
      cudaMemcpyAsync(dst.data(), src.data(), half, cudaMemcpyDeviceToDevice, s);
    };
  }
#endif
  const bool threaded = half / 4 >= (1 << 15);
  const bool streaming = half >= kStreamingCopyBytes;
  return [&src, &dst, half, threaded, streaming] {
#pragma omp parallel if (threaded)
    {
      const std::size_t threads = static_cast<std::size_t>(omp_get_num_threads());
      // Whole 64-byte lines per thread (the buffers start on one), the tail on the last.
      const std::size_t chunk = ((half + threads - 1) / threads + 63) / 64 * 64;
      const std::size_t begin =
          std::min(half, chunk * static_cast<std::size_t>(omp_get_thread_num()));
      const std::size_t end = std::min(half, begin + chunk);
      char* d = static_cast<char*>(dst.data());
      const char* s = static_cast<const char*>(src.data());
      const std::size_t lines = streaming ? (end - begin) / 64 * 64 : 0;
      if (lines > 0) stream_copy(d + begin, s + begin, lines);
      std::memcpy(d + begin + lines, s + begin + lines, end - begin - lines);
    }
  };
}

// Seconds that one call of body takes: CUDA events on `stream` on the GPU, wall time on the
// CPU.
double seconds_of(const std::function<void()>& body, void* stream) {
  (void)stream;  // used by the CUDA build
#ifdef EMBROPE_BENCH_CUDA
  if (g_gpu) {
    const auto s = static_cast<cudaStream_t>(stream);
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaEventRecord(start, s);
    body();
    cudaEventRecord(stop, s);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return ms / 1e3;
  }
#endif
  const auto start = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The access pattern of an op's bytes, and so of its ceiling. An in-place pass over memory
// the cores' caches hold outruns memcpy of the same bytes (no write-allocate of a second
// buffer): on the 2-core machine of docs/performance.md, 1.96x at 128 MiB, 1.2x at 1-2 GiB.
enum class Pattern { copy, in_place };

// An in-place op that touches the first touched_bytes of every row_bytes (a partial rotation:
// the rotary part of each head row, Pythia's 64 of 256 bytes); zero: every byte.
struct Rows {
  std::int64_t row_bytes = 0, touched_bytes = 0;
};

// The strided pass of rows [begin, end) (ceiling_body), compiled for the widest vectors the
// machine has: the lines a thread keeps in flight are bounded by the instructions between
// them, and on the 2-core AVX-512 VM of docs/performance.md 16-byte accesses took 1.8x as long
// as 64-byte ones over GPT-J's pattern (128 of 512 bytes, 268 MB); a dense pass, which the
// hardware prefetchers run ahead of, differs by a few percent.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void strided_pass(std::uint64_t* w, std::size_t begin, std::size_t end, std::size_t row_words,
                  std::size_t touched_words) {
  for (std::size_t r = begin; r < end; ++r) {
    std::uint64_t* row = w + r * row_words;
    for (std::size_t i = 0; i < touched_words; ++i) row[i] ^= 0x8000000080000000ull;
  }
}

// The ceiling of an in-place op: a read-modify-write pass over bytes/2 (read + write = bytes
// moved), each 8-byte word's float sign bits flipped (a pass the compiler vectorises and
// cannot drop), split over the cores like copy_body. With rows (a partial rotation), the same
// pass over the touched part of each row of a buffer of such rows: a strided pass, the op's own
// pattern (the lines between are not the op's, but the memory system fetches around the
// touched ones, and the hardware prefetchers follow a stride less far ahead). On the GPU, the
// device copy.
std::function<void()> ceiling_body(std::int64_t bytes, Pattern pattern, void* stream,
                                   Rows rows = {}) {
  if (pattern == Pattern::copy || g_gpu) return copy_body(bytes, stream);
  if (rows.touched_bytes > 0 && rows.touched_bytes < rows.row_bytes) {
    const std::size_t row_words = static_cast<std::size_t>(rows.row_bytes / 8);
    const std::size_t touched_words = static_cast<std::size_t>(rows.touched_bytes / 8);
    const std::size_t count = static_cast<std::size_t>(bytes / 2 / rows.touched_bytes);
    Memory& buffer = shared_values("in_place_strided_pass", count * row_words * 8, DType::float32);
    const bool threaded = count * touched_words * 2 >= (1 << 15);
    return [&buffer, count, row_words, touched_words, threaded] {
      auto* w = static_cast<std::uint64_t*>(buffer.data());
#pragma omp parallel if (threaded)
      {
        const auto threads = static_cast<std::size_t>(omp_get_num_threads());
        const std::size_t chunk = (count + threads - 1) / threads;
        const std::size_t begin =
            std::min(count, chunk * static_cast<std::size_t>(omp_get_thread_num()));
        strided_pass(w, begin, std::min(count, begin + chunk), row_words, touched_words);
      }
    };
  }
  const std::size_t words = static_cast<std::size_t>(bytes / 2 / 8);
  Memory& buffer = shared_values("in_place_pass", words * 8, DType::float32);
  const bool threaded = words * 2 >= (1 << 15);
  return [&buffer, words, threaded] {
    auto* w = static_cast<std::uint64_t*>(buffer.data());
#pragma omp parallel for schedule(static) if (threaded)
    for (std::size_t i = 0; i < words; ++i) w[i] ^= 0x8000000080000000ull;
  };
}

// Times body() (manual time: CUDA events on `stream` on the GPU, wall time on the CPU), and
// after each call the ceiling pass over the same bytes (`pattern`), into the counter
// ceiling_seconds (per iteration). Op and ceiling alternate call by call: a machine whose
// memory bandwidth drifts within seconds (a shared VM) moves both, and pct_of_ceiling
// compares them at the same moments.
void run_timed(benchmark::State& state, const std::function<void()>& body, std::int64_t bytes_moved,
               Pattern pattern, void* stream = nullptr, Rows rows = {}) {
  const std::function<void()> ceiling = ceiling_body(bytes_moved, pattern, stream, rows);
  body();  // warm up
  ceiling();
  double ceiling_seconds = 0;
  for (auto _ : state) {
    state.SetIterationTime(seconds_of(body, stream));
    ceiling_seconds += seconds_of(ceiling, stream);
  }
  const benchmark::IterationCount iterations = state.iterations();
  state.counters["ceiling_seconds"] =
      iterations > 0 ? ceiling_seconds / static_cast<double>(iterations) : 0;
  state.counters["in_place"] = pattern == Pattern::in_place && !g_gpu ? 1 : 0;
  if (pattern == Pattern::in_place && !g_gpu && rows.touched_bytes > 0 &&
      rows.touched_bytes < rows.row_bytes) {
    state.counters["row_bytes"] = static_cast<double>(rows.row_bytes);
    state.counters["touched_bytes"] = static_cast<double>(rows.touched_bytes);
  }
  state.counters["bytes"] = static_cast<double>(bytes_moved);
  state.counters["GBps"] = benchmark::Counter(static_cast<double>(bytes_moved) / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

struct RopeShape {
  const char* model;
  std::int64_t hq, hk, head_dim, rotary_dim;
  embrope::RopeLayout layout;
};

// How a RoPE call is issued: with the default bad-position policy (the call checks and so
// synchronises), with a DeferredStatus (kernels only, on a stream of its own), or as a
// replay of a CUDA graph that captured the deferred call (launch cost of decode steps).
enum class Launch { checked, deferred, graph };

void rope_case(benchmark::State& state, RopeShape s, DType dtype, std::int64_t tokens, bool fused,
               Launch launch) {
  const int es = embrope::dtype_size(dtype);
  Memory& q = shared_values("rope_q", tokens * s.hq * s.head_dim * es, dtype);
  Memory& k = shared_values("rope_k", tokens * s.hk * s.head_dim * es, dtype);
  Memory& pos = shared_indices("positions", tokens, 65536, true);
  const embrope::RopeCache& cache = shared_cache(s.rotary_dim);
  const Tensor tq(q.data(), dtype, {tokens, s.hq, s.head_dim}, device());
  const Tensor tk(k.data(), dtype, {tokens, s.hk, s.head_dim}, device());
  const Tensor tp(pos.data(), DType::int64, {tokens}, device());
  embrope::RopeOptions options;
  options.layout = s.layout;
  const std::int64_t bytes = 2 * tokens * (s.hq + s.hk) * s.rotary_dim * es;
  auto call = [&] {
    if (fused) {
      embrope::apply_rope(tq, tk, tp, cache, options);
    } else {
      embrope::apply_rope(tq, std::nullopt, tp, cache, options);
      embrope::apply_rope(tk, std::nullopt, tp, cache, options);
    }
  };
  if (launch == Launch::checked) {
    // A partial rotation's ceiling: the in-place pass over the rotary part of each head row.
    run_timed(state, call, bytes, Pattern::in_place, nullptr,
              Rows{s.head_dim * es, s.rotary_dim * es});
    return;
  }
#ifdef EMBROPE_BENCH_CUDA
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  embrope::DeferredStatus status(device());
  options.deferred = &status;
  options.stream = embrope::Stream{stream};
  cudaGraphExec_t exec = nullptr;
  std::function<void()> body = call;
  if (launch == Launch::graph) {
    cudaGraph_t graph = nullptr;
    bool captured = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    if (captured) {
      call();
      captured = cudaStreamEndCapture(stream, &graph) == cudaSuccess &&
                 cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (!captured) {
      state.SkipWithError("apply_rope could not be captured into a CUDA graph");
      cudaStreamDestroy(stream);
      return;
    }
    body = [&] { cudaGraphLaunch(exec, stream); };
  }
  run_timed(state, body, bytes, Pattern::in_place, stream);
  cudaStreamSynchronize(stream);
  if (!status.ok(embrope::Stream{stream})) state.SkipWithError("a position was reported bad");
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
#else
  state.SkipWithError("deferred and graph launches need the CUDA build");
#endif
}

// Axial RoPE of one image: q and k of every patch rotated by its (index, row, column) or
// (row, column) coordinates, with the axes' cache (RopeCache::axial).
struct AxialShape {
  const char* model;
  std::int64_t heads, head_dim;
  std::vector<std::int64_t> axes_dim;
  embrope::RopeLayout layout;
};

void axial_rope_case(benchmark::State& state, const AxialShape& s, DType dtype,
                     std::int64_t tokens) {
  const int es = embrope::dtype_size(dtype);
  const auto axes = static_cast<std::int64_t>(s.axes_dim.size());
  Memory& q = shared_values("rope_q", tokens * s.heads * s.head_dim * es, dtype);
  Memory& k = shared_values("rope_k", tokens * s.heads * s.head_dim * es, dtype);
  // A square grid of patches, row-major: axis a's coordinates are 0 (a leading index axis),
  // the row, or the column of each patch.
  const auto side = static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(tokens))));
  Memory& pos = shared(std::string("axial_positions/") + s.model + "/" + std::to_string(tokens),
                       static_cast<std::size_t>(axes * tokens) * 8, [&](Memory& m) {
                         std::vector<std::int64_t> host(static_cast<std::size_t>(axes * tokens));
                         for (std::int64_t a = 0; a < axes; ++a) {
                           for (std::int64_t t = 0; t < tokens; ++t) {
                             const std::int64_t axis_from_end = axes - 1 - a;
                             host[static_cast<std::size_t>(a * tokens + t)] =
                                 axis_from_end == 0   ? t % side
                                 : axis_from_end == 1 ? t / side
                                                      : 0;
                           }
                         }
                         m.fill_int64(host);
                       });
  static std::map<std::string, std::unique_ptr<embrope::RopeCache>> caches;
  auto& cache = caches[s.model];
  if (!cache) {
    std::vector<embrope::RopeConfig> configs;
    for (std::int64_t dim : s.axes_dim) configs.push_back({dim, 10000.0, 512});
    cache = std::make_unique<embrope::RopeCache>(embrope::RopeCache::axial(configs, device()));
  }
  const Tensor tq(q.data(), dtype, {tokens, s.heads, s.head_dim}, device());
  const Tensor tk(k.data(), dtype, {tokens, s.heads, s.head_dim}, device());
  const Tensor tp(pos.data(), DType::int64, {axes, tokens}, device());
  embrope::RopeOptions options;
  options.layout = s.layout;
  const std::int64_t bytes = 2 * tokens * 2 * s.heads * cache->rotary_dim() * es;
  run_timed(
      state, [&] { embrope::apply_rope(tq, tk, tp, *cache, options); }, bytes, Pattern::in_place);
}

// RoPE + KV-cache append (a prefill into consecutive slots of a paged NHD cache, 16 slots a
// page). Unfused: apply_rope of q and k in place, then the copy of k and v into the cache,
// which with consecutive slots is one contiguous copy each (memcpy split over the cores, or
// a device copy): the fastest cache write there is, so the ratio is a lower bound.
void append_kv_case(benchmark::State& state, RopeShape s, DType dtype, DType cache_dtype,
                    std::int64_t tokens, bool fused) {
  const int es = embrope::dtype_size(dtype), cs = embrope::dtype_size(cache_dtype);
  const std::int64_t page = 16, pages = (tokens + page - 1) / page;
  const std::int64_t kv_row = s.hk * s.head_dim;
  Memory& q = shared_values("kv_q", tokens * s.hq * s.head_dim * es, dtype);
  Memory& k = shared_values("kv_k", tokens * kv_row * es, dtype);
  Memory& v = shared_values("kv_v", tokens * kv_row * es, dtype);
  Memory& k_cache = shared("kv_k_cache/" + std::string(embrope::dtype_name(cache_dtype)),
                           pages * page * kv_row * cs, [](Memory&) {});
  Memory& v_cache = shared("kv_v_cache/" + std::string(embrope::dtype_name(cache_dtype)),
                           pages * page * kv_row * cs, [](Memory&) {});
  Memory& pos = shared_indices("positions", tokens, 65536, true);
  Memory& slots = shared_indices("kv_slots", tokens, pages * page, true);
  const embrope::RopeCache& cache = shared_cache(s.rotary_dim);
  const Tensor tq(q.data(), dtype, {tokens, s.hq, s.head_dim}, device());
  const Tensor tk(k.data(), dtype, {tokens, s.hk, s.head_dim}, device());
  const Tensor tv(v.data(), dtype, {tokens, s.hk, s.head_dim}, device());
  const Tensor tp(pos.data(), DType::int64, {tokens}, device());
  embrope::KvCache kv;
  kv.k = Tensor(k_cache.data(), cache_dtype, {pages, page, s.hk, s.head_dim}, device());
  kv.v = Tensor(v_cache.data(), cache_dtype, {pages, page, s.hk, s.head_dim}, device());
  const embrope::KvSlots kv_slots =
      embrope::KvSlots::paged(Tensor(slots.data(), DType::int64, {tokens}, device()));
  embrope::RopeOptions options;
  options.layout = s.layout;
  auto copy = [&](void* dst, const void* src) {
#ifdef EMBROPE_BENCH_CUDA
    if (g_gpu) {
      cudaMemcpyAsync(dst, src, static_cast<std::size_t>(tokens * kv_row * es),
                      cudaMemcpyDeviceToDevice);
      return;
    }
#endif
#pragma omp parallel for schedule(static)
    for (std::int64_t t = 0; t < tokens; ++t) {
      const std::size_t row = static_cast<std::size_t>(kv_row * es);
      std::memcpy(static_cast<char*>(dst) + t * row, static_cast<const char*>(src) + t * row, row);
    }
  };
  // What the fused op must move: q read and written, k and v read, their cache rows written.
  const std::int64_t bytes =
      2 * tokens * s.hq * s.head_dim * es + 2 * tokens * kv_row * es + 2 * tokens * kv_row * cs;
  run_timed(
      state,
      [&] {
        if (fused) {
          embrope::apply_rope_append_kv(tq, tk, tv, tp, cache, kv, kv_slots, options);
        } else {
          embrope::apply_rope(tq, tk, tp, cache, options);
          copy(k_cache.data(), k.data());
          copy(v_cache.data(), v.data());
        }
      },
      bytes, Pattern::copy);
}

// The unfused chain's quantize pass: value * scale rounded once to float8_e4m3fn (embrope's
// branch-free conversion, which the compiler vectorizes), threaded like the op.
template <typename T>
void quantize_e4m3(const T* src, std::uint8_t* dst, std::int64_t n, float scale) {
#pragma omp parallel for simd schedule(static) if (n >= (1 << 15))
  for (std::int64_t i = 0; i < n; ++i) {
    dst[i] = embrope::detail::float_to_float8_e4m3(embrope::detail::to_float(src[i]) * scale);
  }
}

// RoPE with float8 outputs (FlashInfer's rope_quantize_fp8): q and k rotated out of place into
// float8_e4m3fn, with a scale each. Unfused: apply_rope out of place into q's dtype, then a
// quantize pass over both outputs (value * scale, rounded once by embrope's own conversion,
// threaded like the op); on the CPU only (the GPU has no such pass here: the row is skipped).
void rope_fp8_case(benchmark::State& state, RopeShape s, DType dtype, std::int64_t tokens,
                   bool fused) {
  const int es = embrope::dtype_size(dtype);
  const std::int64_t q_elements = tokens * s.hq * s.head_dim;
  const std::int64_t k_elements = tokens * s.hk * s.head_dim;
  if (!fused && g_gpu) {
    state.SkipWithError("the unfused quantize pass is CPU-only");
    return;
  }
  Memory& q = shared_values("rope_q", q_elements * es, dtype);
  Memory& k = shared_values("rope_k", k_elements * es, dtype);
  Memory& q8 = shared("fp8_q", q_elements, [](Memory&) {});
  Memory& k8 = shared("fp8_k", k_elements, [](Memory&) {});
  Memory& pos = shared_indices("positions", tokens, 65536, true);
  const embrope::RopeCache& cache = shared_cache(s.rotary_dim);
  const Tensor tq(q.data(), dtype, {tokens, s.hq, s.head_dim}, device());
  const Tensor tk(k.data(), dtype, {tokens, s.hk, s.head_dim}, device());
  const Tensor tp(pos.data(), DType::int64, {tokens}, device());
  constexpr float kQScale = 0.5f, kKScale = 2.0f;
  embrope::RopeOptions options;
  options.layout = s.layout;
  std::function<void()> body;
  if (fused) {
    options.q_out = Tensor(q8.data(), DType::float8_e4m3fn, {tokens, s.hq, s.head_dim}, device());
    options.k_out = Tensor(k8.data(), DType::float8_e4m3fn, {tokens, s.hk, s.head_dim}, device());
    options.q_out_scale = kQScale;
    options.k_out_scale = kKScale;
    body = [&, options] { embrope::apply_rope(tq, tk, tp, cache, options); };
  } else {
    Memory& q_tmp = shared("fp8_q_tmp", q_elements * es, [](Memory&) {});
    Memory& k_tmp = shared("fp8_k_tmp", k_elements * es, [](Memory&) {});
    options.q_out = Tensor(q_tmp.data(), dtype, {tokens, s.hq, s.head_dim}, device());
    options.k_out = Tensor(k_tmp.data(), dtype, {tokens, s.hk, s.head_dim}, device());
    const auto quantize = [dtype](const void* src, void* dst, std::int64_t n, float scale) {
      auto* out = static_cast<std::uint8_t*>(dst);
      if (dtype == DType::float32) {
        quantize_e4m3(static_cast<const float*>(src), out, n, scale);
      } else if (dtype == DType::float16) {
        quantize_e4m3(static_cast<const embrope::detail::Half*>(src), out, n, scale);
      } else {
        quantize_e4m3(static_cast<const embrope::detail::BFloat16*>(src), out, n, scale);
      }
    };
    body = [&, options, quantize] {
      embrope::apply_rope(tq, tk, tp, cache, options);
      quantize(options.q_out->data(), q8.data(), q_elements, kQScale);
      quantize(options.k_out->data(), k8.data(), k_elements, kKScale);
    };
  }
  // What the fused op must move: q and k read, their float8 outputs written.
  run_timed(state, body, (q_elements + k_elements) * (es + 1), Pattern::copy);
}

void embed_case(benchmark::State& state, DType dtype, std::int64_t dim, std::int64_t tokens,
                embrope::PositionEncoding positions, bool fused) {
  const std::int64_t vocab = g_full ? 128256 : 32000;
  const std::int64_t max_pos = 32768;
  const int es = embrope::dtype_size(dtype);
  Memory& table = shared_values("table", vocab * dim * es, dtype);
  const bool learned = positions == embrope::PositionEncoding::learned;
  Memory* ptable = learned ? &shared_values("position_table", max_pos * dim * es, dtype) : nullptr;
  Memory& ids = shared_indices("ids", tokens, vocab, false);
  Memory& pids = shared_indices("position_ids", tokens, max_pos, true);
  Memory& out = shared("out", tokens * dim * es, [](Memory&) {});
  Memory& tmp = shared("tmp", tokens * dim * es, [](Memory&) {});
  const Tensor tt(table.data(), dtype, {vocab, dim}, device());
  const Tensor ti(ids.data(), DType::int64, {tokens}, device());
  const Tensor tpi(pids.data(), DType::int64, {tokens}, device());
  const Tensor to(out.data(), dtype, {tokens, dim}, device());
  embrope::EmbedOptions options;
  options.positions = positions;
  options.position_ids = tpi;
  if (positions == embrope::PositionEncoding::learned) {
    options.position_table = Tensor(ptable->data(), dtype, {max_pos, dim}, device());
  }
  if (positions == embrope::PositionEncoding::none) options.position_ids.reset();
  const std::int64_t reads = positions == embrope::PositionEncoding::learned ? 2 : 1;
  const std::int64_t bytes = (reads + 1) * tokens * dim * es;
  std::function<void()> body = [&] { embrope::embed(tt, ti, to, options); };
  if (!fused) {
    // Unfused baseline (learned positions only): a lookup of the token rows, a lookup of the
    // position rows (a plain lookup in the position table: no token row read), then a
    // separate add pass.
    const Tensor position_table = *options.position_table;
    body = [&, position_table] {
      embrope::embed(tt, ti, to);
      embrope::embed(position_table, tpi, Tensor(tmp.data(), dtype, {tokens, dim}, device()));
#ifdef EMBROPE_BENCH_CUDA
      if (g_gpu) {
        bench_add_rows(out.data(), tmp.data(), tokens * dim, es, dtype == DType::bfloat16, nullptr);
        return;
      }
#endif
      {
        auto* o = static_cast<float*>(out.data());
        const auto* t = static_cast<const float*>(tmp.data());
#pragma omp parallel for
        for (std::int64_t i = 0; i < tokens * dim; ++i) o[i] += t[i];
      }
    };
  }
  run_timed(state, body, bytes, Pattern::copy);
}

// A case; run_timed times its ceiling, the copy of the same bytes, inside it.
template <typename Fn>
void register_case(const std::string& name, Fn op) {
  benchmark::RegisterBenchmark(name.c_str(), op)->UseManualTime()->Unit(benchmark::kMicrosecond);
}

DType parse_dtype(const char* s) {
  return std::strcmp(s, "bf16") == 0  ? DType::bfloat16
         : std::strcmp(s, "f16") == 0 ? DType::float16
                                      : DType::float32;
}

void register_all() {
  const RopeShape shapes[] = {
      {"llama3-8b", 32, 8, 128, 128, embrope::RopeLayout::neox},
      {"llama3-70b", 64, 8, 128, 128, embrope::RopeLayout::neox},
      {"qwen2.5-7b", 28, 4, 128, 128, embrope::RopeLayout::neox},
      {"pythia", 32, 32, 128, 32, embrope::RopeLayout::neox},
      {"gpt-j", 16, 16, 256, 64, embrope::RopeLayout::interleaved},
      {"hd80", 32, 32, 80, 80, embrope::RopeLayout::neox},
      {"hd256", 16, 16, 256, 256, embrope::RopeLayout::neox},
  };
  // The main cases: Llama-3-8B at every dtype from decode to 16K tokens, partial rotary
  // (Pythia, GPT-J) at 16K; --full: every shape at every token count, and Llama-3-8B at 64K
  // tokens (q and k of 336-671 MB: past a 480 MiB last-level cache; the 16K cases fit in one).
  std::vector<std::int64_t> token_counts = {1, 8, 64, 1024, 16384};
  for (const char* dt : {"bf16", "f16", "f32"}) {
    const DType dtype = parse_dtype(dt);
    for (const RopeShape& s : shapes) {
      const bool main_shape = std::strcmp(s.model, "llama3-8b") == 0;
      const bool partial_shape =
          std::strcmp(s.model, "pythia") == 0 || std::strcmp(s.model, "gpt-j") == 0;
      std::vector<std::int64_t> counts = token_counts;
      if (main_shape || g_gpu) counts.push_back(65536);
      if (!g_full) {
        if (main_shape) {
          counts = {1, 256, 4096, 16384};
        } else if (partial_shape) {
          counts = {16384};
        } else {
          continue;
        }
      }
      for (std::int64_t t : counts) {
        // The unfused baseline first, so that the fused row can report its speedup.
        for (bool fused : {false, true}) {
          if (!fused && !(main_shape && (g_full || t == 16384))) continue;
          const std::string name = std::string("rope/") + s.model + "/" + dt +
                                   "/T=" + std::to_string(t) + (fused ? "" : "/unfused_q_then_k");
          register_case(name, [s, dtype, t, fused](benchmark::State& st) {
            rope_case(st, s, dtype, t, fused, Launch::checked);
          });
        }
        // Decode on the GPU: kernels only (deferred status), and CUDA-graph replays.
        if (g_gpu && main_shape && t <= 64) {
          for (Launch launch : {Launch::deferred, Launch::graph}) {
            const std::string name = std::string("rope/") + s.model + "/" + dt +
                                     "/T=" + std::to_string(t) +
                                     (launch == Launch::graph ? "/graph_replay" : "/deferred");
            register_case(name, [s, dtype, t, launch](benchmark::State& st) {
              rope_case(st, s, dtype, t, true, launch);
            });
          }
        }
      }
    }
  }
  // Axial RoPE: a Flux.1 image of 4096 latent patches (24 heads of 128, axes [16, 56, 56]) and
  // Qwen2-VL's vision tower on 1024 patches (16 heads of 80, axes [40, 40]); --full: f16, f32.
  {
    const AxialShape axial_shapes[] = {
        {"flux", 24, 128, {16, 56, 56}, embrope::RopeLayout::interleaved},
        {"qwen2-vl-vision", 16, 80, {40, 40}, embrope::RopeLayout::neox},
    };
    for (const char* dt : {"bf16", "f16", "f32"}) {
      const DType dtype = parse_dtype(dt);
      if (!g_full && dtype != DType::bfloat16) continue;
      for (const AxialShape& s : axial_shapes) {
        const std::int64_t t = std::strcmp(s.model, "flux") == 0 ? 4096 : 1024;
        register_case(std::string("axial_rope/") + s.model + "/" + dt + "/T=" + std::to_string(t),
                      [s, dtype, t](benchmark::State& st) { axial_rope_case(st, s, dtype, t); });
      }
    }
  }
  // RoPE + KV-cache append, Llama-3-8B: the fused op against apply_rope + a cache copy at
  // the activations' dtype, and into a float8 cache.
  {
    const RopeShape s = shapes[0];
    for (const char* dt : {"bf16", "f16", "f32"}) {
      const DType dtype = parse_dtype(dt);
      if (!g_full && dtype != DType::bfloat16) continue;
      const std::vector<std::int64_t> counts =
          g_full ? std::vector<std::int64_t>{1, 64, 1024, 4096, 16384}
                 : std::vector<std::int64_t>{1, 4096};
      for (std::int64_t t : counts) {
        for (DType cache_dtype : {dtype, DType::float8_e4m3fn}) {
          const bool fp8 = cache_dtype == DType::float8_e4m3fn;
          if (!g_full && fp8 && t != 4096) continue;
          for (bool fused : {false, true}) {
            if (!fused && (fp8 || (!g_full && t != 4096))) continue;
            const std::string name = std::string("rope_append_kv/") + s.model + "/" + dt +
                                     (fp8 ? "->fp8e4m3" : "") + "/T=" + std::to_string(t) +
                                     (fused ? "" : "/unfused_rope_then_copy");
            register_case(name, [=](benchmark::State& st) {
              append_kv_case(st, s, dtype, cache_dtype, t, fused);
            });
          }
        }
      }
    }
  }
  // RoPE with float8 outputs, Llama-3-8B bf16 -> e4m3: decode to prefill, against apply_rope
  // out of place followed by a quantize pass.
  for (std::int64_t t : {1, 64, 2048}) {
    for (bool fused : {false, true}) {
      const std::string name = std::string("rope_fp8/") + shapes[0].model +
                               "/bf16->fp8e4m3/T=" + std::to_string(t) +
                               (fused ? "" : "/unfused_rope_then_quantize");
      register_case(name, [=](benchmark::State& st) {
        rope_fp8_case(st, shapes[0], DType::bfloat16, t, fused);
      });
    }
  }
  for (const char* dt : {"bf16", "f16", "f32"}) {
    const DType dtype = parse_dtype(dt);
    for (std::int64_t dim : {4096, 8192}) {
      if (!g_full && dim != 4096) continue;
      for (auto positions : {embrope::PositionEncoding::none, embrope::PositionEncoding::learned,
                             embrope::PositionEncoding::sinusoidal}) {
        const bool sinusoidal = positions == embrope::PositionEncoding::sinusoidal;
        // --full: 64K rows of D 4096 too (0.5-2 GB out: past the last-level cache).
        std::vector<std::int64_t> counts = {1, 64, 1024, 16384, 65536};
        if (!g_full)
          counts =
              sinusoidal ? std::vector<std::int64_t>{16384} : std::vector<std::int64_t>{64, 16384};
        for (std::int64_t t : counts) {
          const char* pname = positions == embrope::PositionEncoding::none      ? "lookup"
                              : positions == embrope::PositionEncoding::learned ? "learned"
                                                                                : "sinusoidal";
          for (bool fused : {false, true}) {
            if (!fused && positions != embrope::PositionEncoding::learned) continue;
            if (!fused && !g_full && t != 16384) continue;
            // the CPU baseline's add pass is plain float32 code; the GPU's a vector kernel
            if (!fused && !g_gpu && dtype != DType::float32) continue;
            const std::string name = std::string("embed/") + pname + "/" + dt +
                                     "/D=" + std::to_string(dim) + "/T=" + std::to_string(t) +
                                     (fused ? "" : "/unfused_lookup_then_add");
            register_case(name, [=](benchmark::State& st) {
              embed_case(st, dtype, dim, t, positions, fused);
            });
          }
        }
      }
    }
  }
}

// embed from a quantized table of D 4096 (QuantizedTable): the quantized
// rows (and their scales) read, a bfloat16 row written, against a copy of the same bytes. The
// data bytes are all 0x11 (finite, normal values in every format), the scales and zero points
// hashed values.
void embed_quantized_case(benchmark::State& state, embrope::QuantFormat format, std::int64_t dim,
                          std::int64_t tokens) {
  const std::int64_t vocab = g_full ? 128256 : 32000;
  std::int64_t columns = dim, groups = 1;  // data columns (bytes), scales per row
  DType data_dtype = DType::uint8;
  bool zero_points = false;
  switch (format) {
    case embrope::QuantFormat::int8:
      data_dtype = DType::int8;
      break;
    case embrope::QuantFormat::int4:
      columns = dim / 2, groups = dim / 32, zero_points = true;
      break;
    case embrope::QuantFormat::float8_e4m3fn:
      data_dtype = DType::float8_e4m3fn;
      break;
    case embrope::QuantFormat::gguf_q8_0:
      columns = dim / 32 * 34, groups = 0;
      break;
    case embrope::QuantFormat::gguf_q4_k:
      columns = dim / 256 * 144, groups = 0;
      break;
    default:  // gguf_q6_k
      columns = dim / 256 * 210, groups = 0;
      break;
  }
  Memory& data = shared(std::string("quant_data/") + std::to_string(columns), vocab * columns,
                        [](Memory& m) { m.fill_bytes(0x11); });
  embrope::QuantizedTable table;
  table.format = format;
  table.dim = dim;
  table.data = Tensor(data.data(), data_dtype, {vocab, columns}, device());
  std::int64_t scale_bytes = 0;
  if (groups > 0) {
    Memory& scales = shared_values("quant_scales", vocab * groups * 4, DType::float32);
    table.scales = Tensor(scales.data(), DType::float32, {vocab, groups}, device());
    scale_bytes = groups * 4;
    if (zero_points) {
      Memory& zp =
          shared("quant_zero_points", vocab * groups, [](Memory& m) { m.fill_bytes(0x02); });
      table.zero_points = Tensor(zp.data(), DType::int8, {vocab, groups}, device());
      scale_bytes += groups;
    }
  }
  Memory& ids = shared_indices("ids", tokens, vocab, false);
  Memory& out = shared("out", tokens * dim * 2, [](Memory&) {});
  const Tensor ti(ids.data(), DType::int64, {tokens}, device());
  const Tensor to(out.data(), DType::bfloat16, {tokens, dim}, device());
  const std::int64_t bytes = tokens * (columns + scale_bytes) + tokens * dim * 2;
  run_timed(
      state, [&, table] { embrope::embed(table, ti, to); }, bytes, Pattern::copy);
}

void register_embed_quantized() {
  const std::pair<const char*, embrope::QuantFormat> formats[] = {
      {"int8", embrope::QuantFormat::int8},
      {"int4", embrope::QuantFormat::int4},
      {"fp8e4m3", embrope::QuantFormat::float8_e4m3fn},
      {"q8_0", embrope::QuantFormat::gguf_q8_0},
      {"q4_k", embrope::QuantFormat::gguf_q4_k},
      {"q6_k", embrope::QuantFormat::gguf_q6_k}};
  for (const auto& [name, format] : formats) {
    for (std::int64_t t : {std::int64_t{64}, std::int64_t{16384}}) {
      if (!g_full && t != 16384) continue;
      const embrope::QuantFormat f = format;
      register_case(std::string("embed_quantized/") + name + "->bf16/D=4096/T=" + std::to_string(t),
                    [=](benchmark::State& st) { embed_quantized_case(st, f, 4096, t); });
    }
  }
}

// embed + LayerNorm of [T, D] tokens with learned positions (BERT's embedding, without the
// pre-norm output): token and position rows read, the normalised row written. Unfused
// baseline inside embrope: the lookup with positions into a scratch [T, D], then a second
// embed over the scratch as a table (ids 0 .. T-1) with the norm, a LayerNorm pass.
void embed_norm_case(benchmark::State& state, DType dtype, std::int64_t dim, std::int64_t tokens,
                     bool fused) {
  const std::int64_t vocab = 32000, max_pos = 32768;
  const int es = embrope::dtype_size(dtype);
  Memory& table = shared_values("table", vocab * dim * es, dtype);
  Memory& ptable = shared_values("position_table", max_pos * dim * es, dtype);
  Memory& gamma = shared_values("norm_weight", dim * 4, DType::float32);
  Memory& beta = shared_values("norm_bias", dim * 4, DType::float32);
  Memory& ids = shared_indices("ids", tokens, vocab, false);
  Memory& pids = shared_indices("position_ids", tokens, max_pos, true);
  Memory& rows = shared_indices("rows", tokens, tokens, true);
  Memory& out = shared("out", tokens * dim * es, [](Memory&) {});
  Memory& tmp = shared("tmp", tokens * dim * es, [](Memory&) {});
  const Tensor tt(table.data(), dtype, {vocab, dim}, device());
  const Tensor ti(ids.data(), DType::int64, {tokens}, device());
  const Tensor to(out.data(), dtype, {tokens, dim}, device());
  embrope::EmbedOptions lookup;
  lookup.positions = embrope::PositionEncoding::learned;
  lookup.position_table = Tensor(ptable.data(), dtype, {max_pos, dim}, device());
  lookup.position_ids = Tensor(pids.data(), DType::int64, {tokens}, device());
  embrope::EmbedOptions norm;
  norm.norm = embrope::Normalization::layer_norm;
  norm.norm_eps = 1e-12f;
  norm.norm_weight = Tensor(gamma.data(), DType::float32, {dim}, device());
  norm.norm_bias = Tensor(beta.data(), DType::float32, {dim}, device());
  embrope::EmbedOptions both = lookup;
  both.norm = norm.norm;
  both.norm_eps = norm.norm_eps;
  both.norm_weight = norm.norm_weight;
  both.norm_bias = norm.norm_bias;
  const Tensor scratch(tmp.data(), dtype, {tokens, dim}, device());
  const Tensor row_ids(rows.data(), DType::int64, {tokens}, device());
  const std::int64_t bytes = 3 * tokens * dim * es;
  std::function<void()> body = [&] { embrope::embed(tt, ti, to, both); };
  if (!fused) {
    body = [&] {
      embrope::embed(tt, ti, scratch, lookup);
      embrope::embed(scratch, row_ids, to, norm);
    };
  }
  run_timed(state, body, bytes, Pattern::copy);
}

void register_embed_norm() {
  for (const char* dt : {"bf16", "f32"}) {
    for (std::int64_t t : {1024, 16384}) {
      if (!g_full && t != 16384) continue;
      for (bool fused : {false, true}) {
        const DType dtype = parse_dtype(dt);
        const std::int64_t dim = 4096;
        const std::string name = std::string("embed_layer_norm/learned/") + dt +
                                 "/D=" + std::to_string(dim) + "/T=" + std::to_string(t) +
                                 (fused ? "" : "/unfused_lookup_then_norm");
        register_case(name,
                      [=](benchmark::State& st) { embed_norm_case(st, dtype, dim, t, fused); });
      }
    }
  }
}

// qk-norm + RoPE of Qwen3-8B's q and k ([T, 32, 128] and [T, 8, 128]), out of place: q and k
// read, the normalised and rotated rows written. Unfused baseline inside embrope: each head
// row normalised by embed with rms_norm (q and k viewed as tables of head rows, ids 0 .. rows
// - 1, their own weights), then apply_rope of the normalised rows in place.
void qk_norm_rope_case(benchmark::State& state, DType dtype, std::int64_t tokens, bool fused) {
  const std::int64_t hq = 32, hk = 8, dim = 128;
  const int es = embrope::dtype_size(dtype);
  Memory& q = shared_values("rope_q", tokens * hq * dim * es, dtype);
  Memory& k = shared_values("rope_k", tokens * hk * dim * es, dtype);
  Memory& q_out = shared("qk_q_out", tokens * hq * dim * es, [](Memory&) {});
  Memory& k_out = shared("qk_k_out", tokens * hk * dim * es, [](Memory&) {});
  Memory& wq = shared_values("q_norm_weight", dim * 4, DType::float32);
  Memory& wk = shared_values("k_norm_weight", dim * 4, DType::float32);
  Memory& pos = shared_indices("positions", tokens, 65536, true);
  Memory& rows = shared_indices("head_rows", tokens * hq, tokens * hq, true);
  const embrope::RopeCache& cache = shared_cache(dim);
  const Tensor tq(q.data(), dtype, {tokens, hq, dim}, device());
  const Tensor tk(k.data(), dtype, {tokens, hk, dim}, device());
  const Tensor tq_out(q_out.data(), dtype, {tokens, hq, dim}, device());
  const Tensor tk_out(k_out.data(), dtype, {tokens, hk, dim}, device());
  const Tensor tp(pos.data(), DType::int64, {tokens}, device());
  embrope::QkNorm norm;
  norm.q_weight = Tensor(wq.data(), DType::float32, {dim}, device());
  norm.k_weight = Tensor(wk.data(), DType::float32, {dim}, device());
  embrope::RopeOptions options;
  options.q_out = tq_out;
  options.k_out = tk_out;
  // The unfused pair's pieces: q and k as [rows, D] tables.
  const Tensor q_rows(q.data(), dtype, {tokens * hq, dim}, device());
  const Tensor k_rows(k.data(), dtype, {tokens * hk, dim}, device());
  const Tensor q_out_rows(q_out.data(), dtype, {tokens * hq, dim}, device());
  const Tensor k_out_rows(k_out.data(), dtype, {tokens * hk, dim}, device());
  const Tensor q_ids(rows.data(), DType::int64, {tokens * hq}, device());
  const Tensor k_ids(rows.data(), DType::int64, {tokens * hk}, device());
  embrope::EmbedOptions q_norm, k_norm;
  q_norm.norm = k_norm.norm = embrope::Normalization::rms_norm;
  q_norm.norm_eps = k_norm.norm_eps = 1e-6f;
  q_norm.norm_weight = norm.q_weight;
  k_norm.norm_weight = norm.k_weight;
  const std::int64_t bytes = 2 * tokens * (hq + hk) * dim * es;
  std::function<void()> body = [&] {
    embrope::apply_qk_norm_rope(tq, tk, tp, cache, norm, options);
  };
  if (!fused) {
    body = [&] {
      embrope::embed(q_rows, q_ids, q_out_rows, q_norm);
      embrope::embed(k_rows, k_ids, k_out_rows, k_norm);
      embrope::apply_rope(tq_out, tk_out, tp, cache);
    };
  }
  run_timed(state, body, bytes, Pattern::copy);
}

// Qwen3-8B's qk-norm + RoPE + KV-cache append (q [T, 32, 128], k and v [T, 8, 128], a paged
// NHD cache, pages of 16, slots in order): the memory and views both of its cases share.
struct Qwen3AppendKv {
  static constexpr std::int64_t hq = 32, hk = 8, dim = 128, page = 16;
  std::int64_t tokens, pages, kv_row, es;
  Memory *q, *k, *v, *k_tmp, *k_cache, *v_cache, *slots;
  const embrope::RopeCache* cache;
  Tensor tq, tk, tv, tp;
  embrope::KvCache kv;
  embrope::KvSlots kv_slots;
  embrope::QkNorm norm;

  Qwen3AppendKv(DType dtype, std::int64_t t, DType cache_dtype)
      : tokens(t), pages((t + page - 1) / page), kv_row(hk * dim), es(embrope::dtype_size(dtype)) {
    const std::int64_t cache_bytes = pages * page * kv_row * embrope::dtype_size(cache_dtype);
    const std::string cache_name = embrope::dtype_name(cache_dtype);
    q = &shared_values("kv_q", tokens * hq * dim * es, dtype);
    k = &shared_values("kv_k", tokens * kv_row * es, dtype);
    v = &shared_values("kv_v", tokens * kv_row * es, dtype);
    k_tmp = &shared("qk_k_out", tokens * kv_row * es, [](Memory&) {});
    k_cache = &shared("kv_k_cache/" + cache_name, cache_bytes, [](Memory&) {});
    v_cache = &shared("kv_v_cache/" + cache_name, cache_bytes, [](Memory&) {});
    // Weights of 1: q is normalised in place call after call, and weights w would scale its
    // elements by w again each time, down into subnormals (whose arithmetic is slow).
    Memory& ones = shared("qk_norm_unit_weight", dim * 4, [](Memory& m) { m.fill_float32(1.0f); });
    Memory& pos = shared_indices("positions", tokens, 65536, true);
    slots = &shared_indices("kv_slots", tokens, pages * page, true);
    cache = &shared_cache(dim);
    tq = Tensor(q->data(), dtype, {tokens, hq, dim}, device());
    tk = Tensor(k->data(), dtype, {tokens, hk, dim}, device());
    tv = Tensor(v->data(), dtype, {tokens, hk, dim}, device());
    tp = Tensor(pos.data(), DType::int64, {tokens}, device());
    kv.k = Tensor(k_cache->data(), cache_dtype, {pages, page, hk, dim}, device());
    kv.v = Tensor(v_cache->data(), cache_dtype, {pages, page, hk, dim}, device());
    kv_slots = embrope::KvSlots::paged(Tensor(slots->data(), DType::int64, {tokens}, device()));
    norm.q_weight = norm.k_weight = Tensor(ones.data(), DType::float32, {dim}, device());
  }
  const std::int64_t* slot_of() const { return static_cast<const std::int64_t*>(slots->data()); }
};

// In the activations' dtype: q in place, k and v only read. Unfused: apply_qk_norm_rope (q in
// place, k into a scratch k_out), then the cache write vLLM's reshape_and_cache_flash does, a
// copy of each token's k and v rows to its slot (CPU only: the GPU run times the fused op).
void qk_norm_append_kv_case(benchmark::State& state, DType dtype, std::int64_t tokens, bool fused) {
  const Qwen3AppendKv a(dtype, tokens, dtype);
  embrope::RopeOptions unfused;
  unfused.k_out = Tensor(a.k_tmp->data(), dtype, {tokens, a.hk, a.dim}, device());
  auto scatter = [&] {
    const std::size_t row = static_cast<std::size_t>(a.kv_row * a.es);
    const std::int64_t* slot_of = a.slot_of();
#pragma omp parallel for schedule(static) if (tokens >= 64)
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::memcpy(static_cast<char*>(a.k_cache->data()) + slot_of[t] * row,
                  static_cast<const char*>(a.k_tmp->data()) + t * row, row);
      std::memcpy(static_cast<char*>(a.v_cache->data()) + slot_of[t] * row,
                  static_cast<const char*>(a.v->data()) + t * row, row);
    }
  };
  // What the fused op must move: q read and written, k and v read, their cache rows written.
  const std::int64_t bytes = 2 * tokens * a.hq * a.dim * a.es + 4 * tokens * a.kv_row * a.es;
  run_timed(
      state,
      [&] {
        if (fused) {
          embrope::apply_qk_norm_rope_append_kv(a.tq, a.tk, a.tv, a.tp, *a.cache, a.kv, a.kv_slots,
                                                a.norm);
        } else {
          embrope::apply_qk_norm_rope(a.tq, a.tk, a.tp, *a.cache, a.norm, unfused);
          scatter();
        }
      },
      bytes, Pattern::copy);
}

// For a float8 attention kernel (bfloat16 activations): q normalised and rotated into a
// float8_e4m3fn q_out (scale 0.5) and a float8_e4m3fn cache (scales 1). Unfused:
// apply_qk_norm_rope into q's dtype (q and k out of place), then a quantize pass over q and a
// converting copy of each token's k and v rows to its slot (CPU only).
void qk_norm_append_kv_fp8_case(benchmark::State& state, std::int64_t tokens, bool fused) {
  using embrope::detail::BFloat16;
  const Qwen3AppendKv a(DType::bfloat16, tokens, DType::float8_e4m3fn);
  const std::int64_t q_elements = tokens * a.hq * a.dim;
  Memory& q8 = shared("fp8_q", q_elements, [](Memory&) {});
  constexpr float kQScale = 0.5f;
  embrope::RopeOptions options;
  std::function<void()> body;
  if (fused) {
    options.q_out = Tensor(q8.data(), DType::float8_e4m3fn, {tokens, a.hq, a.dim}, device());
    options.q_out_scale = kQScale;
    body = [&, options] {
      embrope::apply_qk_norm_rope_append_kv(a.tq, a.tk, a.tv, a.tp, *a.cache, a.kv, a.kv_slots,
                                            a.norm, options);
    };
  } else {
    if (g_gpu) {
      state.SkipWithError("the unfused quantize pass is CPU-only");
      return;
    }
    Memory& q_tmp = shared("fp8_q_tmp", q_elements * a.es, [](Memory&) {});
    options.q_out = Tensor(q_tmp.data(), DType::bfloat16, {tokens, a.hq, a.dim}, device());
    options.k_out = Tensor(a.k_tmp->data(), DType::bfloat16, {tokens, a.hk, a.dim}, device());
    body = [&, options] {
      embrope::apply_qk_norm_rope(a.tq, a.tk, a.tp, *a.cache, a.norm, options);
      quantize_e4m3(static_cast<const BFloat16*>(q_tmp.data()),
                    static_cast<std::uint8_t*>(q8.data()), q_elements, kQScale);
      const std::int64_t* slot_of = a.slot_of();
      const std::int64_t kv_row = a.kv_row;
#pragma omp parallel for schedule(static) if (tokens >= 64)
      for (std::int64_t t = 0; t < tokens; ++t) {
        auto* kc = static_cast<std::uint8_t*>(a.k_cache->data()) + slot_of[t] * kv_row;
        auto* vc = static_cast<std::uint8_t*>(a.v_cache->data()) + slot_of[t] * kv_row;
        const auto* kr = static_cast<const BFloat16*>(a.k_tmp->data()) + t * kv_row;
        const auto* vr = static_cast<const BFloat16*>(a.v->data()) + t * kv_row;
#pragma omp simd
        for (std::int64_t e = 0; e < kv_row; ++e) {
          kc[e] = embrope::detail::float_to_float8_e4m3(embrope::detail::to_float(kr[e]));
          vc[e] = embrope::detail::float_to_float8_e4m3(embrope::detail::to_float(vr[e]));
        }
      }
    };
  }
  // What the fused op must move: q, k and v read; q_out and the cache rows written in float8.
  run_timed(state, body, q_elements * (a.es + 1) + 2 * tokens * a.kv_row * (a.es + 1),
            Pattern::copy);
}

// DeepSeek-V3 MLA into float8 (FlashInfer's mla_rope_quantize_fp8): q [T, 128, 128 | 64]
// and kv_a [T, 512 | 64] bfloat16, the rope slices rotated (interleaved) and every part
// stored as float8_e4m3fn. Fused: one apply_rope with q_nope / k_nope. Unfused: apply_rope's
// float8 outputs of the rope slices, then a quantize pass over q_nope and kv_c (strided rows).
void mla_fp8_case(benchmark::State& state, std::int64_t tokens, bool fused) {
  const std::int64_t h = 128, nope = 128, rope = 64, rank = 512;
  const std::int64_t qd = nope + rope, kd = rank + rope;
  if (!fused && g_gpu) {
    state.SkipWithError("the unfused quantize pass is CPU-only");
    return;
  }
  Memory& q = shared_values("mla_q", tokens * h * qd * 2, DType::bfloat16);
  Memory& kv = shared_values("mla_kv", tokens * kd * 2, DType::bfloat16);
  Memory& q_pe8 = shared("mla_q_pe8", tokens * h * rope, [](Memory&) {});
  Memory& k_pe8 = shared("mla_k_pe8", tokens * rope, [](Memory&) {});
  Memory& q_nope8 = shared("mla_q_nope8", tokens * h * nope, [](Memory&) {});
  Memory& kv_c8 = shared("mla_kv_c8", tokens * rank, [](Memory&) {});
  Memory& pos = shared_indices("positions", tokens, 65536, true);
  const embrope::RopeCache& cache = shared_cache(rope);
  auto* q_base = static_cast<embrope::detail::BFloat16*>(q.data());
  auto* kv_base = static_cast<embrope::detail::BFloat16*>(kv.data());
  const std::int64_t q_strides[3] = {h * qd, qd, 1}, k_strides[3] = {kd, kd, 1};
  const std::int64_t q_pe_shape[3] = {tokens, h, rope}, k_pe_shape[3] = {tokens, 1, rope};
  const std::int64_t q_nope_shape[3] = {tokens, h, nope}, kv_c_shape[3] = {tokens, 1, rank};
  const Tensor q_pe(q_base + nope, DType::bfloat16, 3, q_pe_shape, q_strides, device());
  const Tensor k_pe(kv_base + rank, DType::bfloat16, 3, k_pe_shape, k_strides, device());
  const Tensor tp(pos.data(), DType::int64, {tokens}, device());
  embrope::RopeOptions options;
  options.layout = embrope::RopeLayout::interleaved;
  options.q_out = Tensor(q_pe8.data(), DType::float8_e4m3fn, {tokens, h, rope}, device());
  options.k_out = Tensor(k_pe8.data(), DType::float8_e4m3fn, {tokens, 1, rope}, device());
  options.q_out_scale = 0.5f;
  options.k_out_scale = 2.0f;
  if (fused) {
    options.q_nope = Tensor(q_base, DType::bfloat16, 3, q_nope_shape, q_strides, device());
    options.q_nope_out = Tensor(q_nope8.data(), DType::float8_e4m3fn, {tokens, h, nope}, device());
    options.k_nope = Tensor(kv_base, DType::bfloat16, 3, kv_c_shape, k_strides, device());
    options.k_nope_out = Tensor(kv_c8.data(), DType::float8_e4m3fn, {tokens, 1, rank}, device());
  }
  const auto quantize_rows = [&](const embrope::detail::BFloat16* src, std::int64_t rows,
                                 std::int64_t row_stride, std::int64_t dim, void* dst,
                                 float scale) {
    auto* out = static_cast<std::uint8_t*>(dst);
#pragma omp parallel for schedule(static) if (rows * dim >= (1 << 15))
    for (std::int64_t r = 0; r < rows; ++r) {
#pragma omp simd
      for (std::int64_t j = 0; j < dim; ++j) {
        out[r * dim + j] = embrope::detail::float_to_float8_e4m3(
            embrope::detail::to_float(src[r * row_stride + j]) * scale);
      }
    }
  };
  run_timed(
      state,
      [&] {
        embrope::apply_rope(q_pe, k_pe, tp, cache, options);
        if (!fused) {
          quantize_rows(q_base, tokens * h, qd, nope, q_nope8.data(), 0.5f);
          quantize_rows(kv_base, tokens, kd, rank, kv_c8.data(), 2.0f);
        }
      },
      tokens * (h * qd + kd) * 3, Pattern::copy);  // bfloat16 read, float8 written
}

// DeepSeek-V3 MLA's rotation and latent cache write (vLLM's rotary_emb + concat_and_cache_mla):
// q [T, 128, 128 | 64] and kv_a [T, 512 | 64] bfloat16, the rope slices rotated in place
// (interleaved), kv_c and the rotated k_pe written to the bfloat16 cache [blocks, 16, 576] at
// slots in order. Fused: one apply_rope_append_kv through views. Unfused: apply_rope of the
// slices (k_pe in place), then the copy of each token's kv_a row into its cache row.
void mla_append_case(benchmark::State& state, std::int64_t tokens, bool fused) {
  const std::int64_t h = 128, nope = 128, rope = 64, rank = 512, page = 16;
  const std::int64_t qd = nope + rope, kd = rank + rope, pages = (tokens + page - 1) / page;
  if (!fused && g_gpu) {
    state.SkipWithError("the unfused cache copy is CPU-only");
    return;
  }
  Memory& q = shared_values("mla_q", tokens * h * qd * 2, DType::bfloat16);
  Memory& kv = shared_values("mla_kv", tokens * kd * 2, DType::bfloat16);
  Memory& cache_mem = shared("mla_cache", pages * page * kd * 2, [](Memory&) {});
  Memory& pos = shared_indices("positions", tokens, 65536, true);
  Memory& slots = shared_indices("kv_slots", tokens, pages * page, true);
  const embrope::RopeCache& cache = shared_cache(rope);
  auto* q_base = static_cast<embrope::detail::BFloat16*>(q.data());
  auto* kv_base = static_cast<embrope::detail::BFloat16*>(kv.data());
  auto* c_base = static_cast<embrope::detail::BFloat16*>(cache_mem.data());
  const auto view = [](void* p, std::vector<std::int64_t> shape,
                       std::vector<std::int64_t> strides) {
    return Tensor(p, DType::bfloat16, static_cast<int>(shape.size()), shape.data(), strides.data(),
                  device());
  };
  const Tensor q_pe = view(q_base + nope, {tokens, h, rope}, {h * qd, qd, 1});
  const Tensor k_pe = view(kv_base + rank, {tokens, 1, rope}, {kd, rope, 1});
  const Tensor kv_c = view(kv_base, {tokens, 1, rank}, {kd, rank, 1});
  const Tensor tp(pos.data(), DType::int64, {tokens}, device());
  embrope::KvCache kv_cache;
  kv_cache.k = view(c_base + rank, {pages, page, 1, rope}, {page * kd, kd, rope, 1});
  kv_cache.v = view(c_base, {pages, page, 1, rank}, {page * kd, kd, rank, 1});
  const embrope::KvSlots kv_slots =
      embrope::KvSlots::paged(Tensor(slots.data(), DType::int64, {tokens}, device()));
  embrope::RopeOptions options;
  options.layout = embrope::RopeLayout::interleaved;
  const std::int64_t* slot_of = static_cast<const std::int64_t*>(slots.data());
  run_timed(
      state,
      [&] {
        if (fused) {
          embrope::apply_rope_append_kv(q_pe, k_pe, kv_c, tp, cache, kv_cache, kv_slots, options);
          return;
        }
        embrope::apply_rope(q_pe, k_pe, tp, cache, options);
#pragma omp parallel for schedule(static) if (tokens >= 64)
        for (std::int64_t t = 0; t < tokens; ++t) {
          std::memcpy(c_base + slot_of[t] * kd, kv_base + t * kd, static_cast<std::size_t>(kd * 2));
        }
      },
      tokens * (2 * h * rope + 2 * kd) * 2,  // q's rope slices read and written, kv_a to the cache
      Pattern::copy);
}

void register_qk_norm_rope() {
  for (const char* dt : {"bf16", "f32"}) {
    if (!g_full && std::strcmp(dt, "bf16") != 0) continue;
    const DType dtype = parse_dtype(dt);
    const std::int64_t t = 16384;
    for (bool fused : {false, true}) {
      const std::string name = std::string("qk_norm_rope/qwen3-8b/") + dt +
                               "/T=" + std::to_string(t) + (fused ? "" : "/unfused_norm_then_rope");
      register_case(name, [=](benchmark::State& st) { qk_norm_rope_case(st, dtype, t, fused); });
    }
  }
  // DeepSeek-V3 MLA into float8, decode to prefill (one apply_rope against two passes).
  for (std::int64_t t : {1, 64, 2048}) {
    for (bool fused : {false, true}) {
      const std::string name = std::string("mla_rope_fp8/deepseek-v3/bf16->fp8e4m3/T=") +
                               std::to_string(t) + (fused ? "" : "/unfused_rope_fp8_then_quantize");
      register_case(name, [=](benchmark::State& st) { mla_fp8_case(st, t, fused); });
    }
  }
  // DeepSeek-V3 MLA rotation + latent cache write, decode to prefill.
  for (std::int64_t t : {1, 64, 2048}) {
    for (bool fused : {false, true}) {
      const std::string name = std::string("mla_rope_append_kv/deepseek-v3/bf16/T=") +
                               std::to_string(t) + (fused ? "" : "/unfused_rope_then_copy");
      register_case(name, [=](benchmark::State& st) { mla_append_case(st, t, fused); });
    }
  }
  // qk-norm + RoPE + KV-cache append, decode to prefill (the fused op against the pair).
  for (std::int64_t t : {1, 64, 2048}) {
    for (bool fused : {false, true}) {
      if (!fused && g_gpu) continue;
      const std::string name = std::string("qk_norm_rope_append_kv/qwen3-8b/bf16/T=") +
                               std::to_string(t) + (fused ? "" : "/unfused_qk_norm_rope_then_copy");
      register_case(name, [=](benchmark::State& st) {
        qk_norm_append_kv_case(st, DType::bfloat16, t, fused);
      });
    }
  }
  // The same into a float8 q and a float8 cache (a float8 attention kernel's inputs).
  for (std::int64_t t : {1, 64, 2048}) {
    for (bool fused : {false, true}) {
      if (!fused && g_gpu) continue;
      const std::string name = std::string("qk_norm_rope_append_kv_fp8/qwen3-8b/bf16->fp8e4m3/T=") +
                               std::to_string(t) +
                               (fused ? "" : "/unfused_qk_norm_rope_then_quantize_copy");
      register_case(name, [=](benchmark::State& st) { qk_norm_append_kv_fp8_case(st, t, fused); });
    }
  }
}

// ---------------------------------------------------------------- backward passes ----

// The vocabulary of the backward cases (as the forward embed cases).
std::int64_t backward_vocab() {
  return g_full ? 128256 : 32000;
}

// The number of distinct values Memory::fill_indices(count, modulo, false) writes (the same
// generator and seed).
std::int64_t distinct_ids(std::int64_t count, std::int64_t modulo) {
  std::mt19937_64 rng(42);
  std::vector<bool> seen(static_cast<std::size_t>(modulo));
  std::int64_t distinct = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    const auto v = static_cast<std::size_t>(rng() % modulo);
    distinct += seen[v] ? 0 : 1;
    seen[v] = true;
  }
  return distinct;
}

// The ids of a backward case: random over the vocabulary, one id on every row (one run), or
// drawn from Zipf's law over the vocabulary (p(rank r) proportional to 1 / r, as word
// frequencies in text; the ranks scattered over the ids), where the most frequent ids hold
// many rows each (16K tokens of --full's 128,256-row vocabulary: about 35% of the rows in
// about 40 ids of more than 32 rows, the largest about 1,400).
enum class BackwardIds { random, one_id, zipf };

// Zipf's ids (made once per count and vocabulary) and how many distinct ones they hold.
const std::pair<std::vector<std::int64_t>, std::int64_t>& zipf_ids(std::int64_t count,
                                                                   std::int64_t vocab) {
  static std::map<std::pair<std::int64_t, std::int64_t>,
                  std::pair<std::vector<std::int64_t>, std::int64_t>>
      made;
  auto& entry = made[{count, vocab}];
  if (!entry.first.empty()) return entry;
  std::vector<double> cdf(static_cast<std::size_t>(vocab));
  double sum = 0;
  for (std::int64_t r = 0; r < vocab; ++r) cdf[static_cast<std::size_t>(r)] = sum += 1.0 / (r + 1);
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> uniform(0.0, sum);
  std::vector<bool> seen(static_cast<std::size_t>(vocab));
  entry.first.resize(static_cast<std::size_t>(count));
  for (auto& id : entry.first) {
    const auto rank = static_cast<std::int64_t>(
        std::lower_bound(cdf.begin(), cdf.end(), uniform(rng)) - cdf.begin());
    id = std::min(rank, vocab - 1) * 7919 % vocab;  // 7919: a prime, coprime to the vocab
    entry.second += seen[static_cast<std::size_t>(id)] ? 0 : 1;
    seen[static_cast<std::size_t>(id)] = true;
  }
  return entry;
}

// embed_backward of grad_out [T, D] into a float32 grad_table [V, D]. Bytes moved: grad_out
// read once, and every distinct id's gradient row read and written once.
void embed_backward_case(benchmark::State& state, DType dtype, std::int64_t dim,
                         std::int64_t tokens, embrope::BackwardMode mode, BackwardIds kind) {
  const std::int64_t vocab = backward_vocab();
  const int es = embrope::dtype_size(dtype);
  Memory& grad_out = shared_values("grad_out", tokens * dim * es, dtype);
  Memory& grad = shared_values("grad_table", vocab * dim * 4, DType::float32);
  std::int64_t distinct = 0;
  Memory* ids_memory = nullptr;
  if (kind == BackwardIds::zipf) {
    const auto& made = zipf_ids(tokens, vocab);
    distinct = made.second;
    ids_memory = &shared("ids/zipf/" + std::to_string(vocab), static_cast<std::size_t>(tokens) * 8,
                         [&](Memory& m) { m.fill_int64(made.first); });
  } else {
    const bool one_id = kind == BackwardIds::one_id;
    ids_memory = &shared_indices("ids", tokens, one_id ? 1 : vocab, false);
    distinct = distinct_ids(tokens, one_id ? 1 : vocab);
  }
  const Tensor tg(grad_out.data(), dtype, {tokens, dim}, device());
  const Tensor ti(ids_memory->data(), DType::int64, {tokens}, device());
  const Tensor tt(grad.data(), DType::float32, {vocab, dim}, device());
  embrope::EmbedBackwardOptions options;
  options.mode = mode;
  // A caller workspace, as a training loop would keep one (no allocation in the timed loop).
  const std::size_t workspace_bytes = embrope::embed_backward_workspace_size(tg, ti, tt, options);
  std::unique_ptr<Memory> workspace;
  if (workspace_bytes > 0) {
    workspace = std::make_unique<Memory>(workspace_bytes);
    options.workspace = workspace->data();
    options.workspace_bytes = workspace_bytes;
  }
  const std::int64_t bytes = tokens * dim * es + 2 * distinct * dim * 4;
  run_timed(
      state, [&] { embrope::embed_backward(tg, ti, tt, options); }, bytes, Pattern::copy);
}

// The same bytes as the forward rope case: read and write the rotated part of dq and dk.
void rope_backward_case(benchmark::State& state, DType dtype, std::int64_t tokens) {
  const std::int64_t hq = 32, hk = 8, dim = 128;
  const int es = embrope::dtype_size(dtype);
  Memory& dq = shared_values("rope_q", tokens * hq * dim * es, dtype);
  Memory& dk = shared_values("rope_k", tokens * hk * dim * es, dtype);
  Memory& pos = shared_indices("positions", tokens, 65536, true);
  const embrope::RopeCache& cache = shared_cache(dim);
  const Tensor tq(dq.data(), dtype, {tokens, hq, dim}, device());
  const Tensor tk(dk.data(), dtype, {tokens, hk, dim}, device());
  const Tensor tp(pos.data(), DType::int64, {tokens}, device());
  const std::int64_t bytes = 2 * tokens * (hq + hk) * dim * es;
  run_timed(
      state, [&] { embrope::apply_rope_backward(tq, tk, tp, cache); }, bytes, Pattern::in_place);
}

void register_backward() {
  const std::vector<std::int64_t> token_counts =
      g_full ? std::vector<std::int64_t>{1024, 16384} : std::vector<std::int64_t>{16384};
  for (const char* dt : {"bf16", "f32"}) {
    const DType dtype = parse_dtype(dt);
    if (!g_full && dtype != DType::bfloat16) continue;  // the main cases: bfloat16 training
    for (std::int64_t t : token_counts) {
      // Random ids over the vocabulary, one id on every row (one long run), Zipf's ids.
      for (BackwardIds kind : {BackwardIds::random, BackwardIds::one_id, BackwardIds::zipf}) {
        if (kind != BackwardIds::random && !g_full) continue;
        for (auto mode : {embrope::BackwardMode::deterministic, embrope::BackwardMode::atomic}) {
          // The CPU path is deterministic in either mode: time it once.
          if (!g_gpu && mode == embrope::BackwardMode::atomic) continue;
          const std::int64_t dim = 4096;
          const std::string name =
              std::string("embed_backward/") +
              (mode == embrope::BackwardMode::atomic ? "atomic" : "deterministic") + "/" + dt +
              "/D=4096/T=" + std::to_string(t) +
              (kind == BackwardIds::one_id ? "/one_id"
               : kind == BackwardIds::zipf ? "/zipf"
                                           : "");
          register_case(name, [=](benchmark::State& st) {
            embed_backward_case(st, dtype, dim, t, mode, kind);
          });
        }
      }
      register_case(std::string("rope_backward/llama3-8b/") + dt + "/T=" + std::to_string(t),
                    [=](benchmark::State& st) { rope_backward_case(st, dtype, t); });
    }
  }
}

// Adds pct_of_ceiling to every row from the ceiling pass timed inside the same case
// (run_timed), and x_vs_unfused to a fused row from its baseline's row (on the terminal and in
// the JSON file alike). For the median aggregate, the medians of the op's and the ceiling's
// times.
template <typename Base>
class PctReporter : public Base {
 public:
  using Run = benchmark::BenchmarkReporter::Run;
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> with_ratios = runs;
    for (Run& run : with_ratios) {
      const double seconds = run.GetAdjustedRealTime() / 1e6;  // unit: microseconds
      const bool is_time = run.run_type == Run::RT_Iteration || run.aggregate_name == "median";
      const auto ceiling_seconds = run.counters.find("ceiling_seconds");
      if ((is_time || run.aggregate_name == "mean") && ceiling_seconds != run.counters.end() &&
          ceiling_seconds->second.value > 0 && seconds > 0) {
        run.counters["pct_of_ceiling"] = 100.0 * ceiling_seconds->second.value / seconds;
      }
      const std::string& name = run.run_name.function_name;
      const std::size_t unfused = name.find("/unfused");
      // A baseline that did not run (skipped with an error: no time) gives no ratio.
      if (unfused != std::string::npos) {
        if (is_time && seconds > 0) unfused_seconds_[name.substr(0, unfused)] = seconds;
      } else if (is_time && seconds > 0 && unfused_seconds_.count(name) != 0) {
        run.counters["x_vs_unfused"] = unfused_seconds_[name] / seconds;
      }
    }
    Base::ReportRuns(with_ratios);
  }

 private:
  std::map<std::string, double> unfused_seconds_;  // baseline median time by fused name
};

// The terminal's view while the cases run: one line per case as it finishes (the table
// itself is printed by benchmarks/report.py from the JSON, or by Google Benchmark's console
// reporter with --benchmark_format=console).
class ProgressReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type == Run::RT_Aggregate && run.aggregate_name != "median") continue;
      if (run.error_occurred) {
        std::fprintf(stderr, "  %-58s error: %s\n", run.run_name.function_name.c_str(),
                     run.error_message.c_str());
        continue;
      }
      std::fprintf(stderr, "  %-58s %12.2f us\n", run.run_name.function_name.c_str(),
                   run.GetAdjustedRealTime());
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string device_flag = "auto";
  bool console = false;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--device=", 9) == 0) {
      device_flag = argv[i] + 9;
    } else if (std::strcmp(argv[i], "--full") == 0) {
      g_full = true;
    } else {
      console = console || std::strcmp(argv[i], "--benchmark_format=console") == 0;
      rest.push_back(argv[i]);
    }
  }
  const int gpus = embrope::cuda_device_count();
  if (device_flag == "gpu" && gpus == 0) {
    std::fprintf(stderr, "embrope-bench: --device=gpu but no usable CUDA device\n");
    return 2;
  }
#ifdef EMBROPE_BENCH_CUDA
  g_gpu = device_flag != "cpu" && gpus > 0;
#endif
  std::fprintf(stderr, "embrope-bench %s on %s (%d CPU threads, CPU kernels: %s), %s cases\n",
               EMBROPE_VERSION_STRING, g_gpu ? "GPU 0" : "CPU", omp_get_max_threads(),
               embrope::cpu_isa(), g_full ? "all" : "the main");
  // Medians of 3 repetitions of at least 70 ms of op time each unless the command line says
  // otherwise (flags given later win): with the copy timed after every call, the main cases
  // then take under a minute on two cores, so that a fresh clone builds and runs them within
  // two minutes.
  bool has_out = false, has_repetitions = false;
  for (char* a : rest) {
    has_out = has_out || std::strncmp(a, "--benchmark_out=", 16) == 0;
    has_repetitions = has_repetitions || std::strncmp(a, "--benchmark_repetitions", 23) == 0;
  }
  std::string repetitions = "--benchmark_repetitions=3";
  std::string aggregates = "--benchmark_report_aggregates_only=true";
  std::string min_time = "--benchmark_min_time=0.07";
  if (!has_repetitions) {
    rest.insert(rest.begin() + 1, {repetitions.data(), aggregates.data(), min_time.data()});
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::AddCustomContext("embrope_version", EMBROPE_VERSION_STRING);
  benchmark::AddCustomContext("device", g_gpu ? "gpu" : "cpu");
  benchmark::AddCustomContext("cpu_isa", embrope::cpu_isa());
  benchmark::AddCustomContext("cases", g_full ? "full" : "main");
  benchmark::AddCustomContext("omp_threads", std::to_string(omp_get_max_threads()));
  if (const char* commit = std::getenv("EMBROPE_BENCH_COMMIT")) {
    benchmark::AddCustomContext("commit", commit);
  }
  register_all();
  register_embed_norm();
  register_embed_quantized();
  register_qk_norm_rope();
  register_backward();
  PctReporter<ProgressReporter> progress;
  PctReporter<benchmark::ConsoleReporter> table;
  PctReporter<benchmark::JSONReporter> file;
  benchmark::BenchmarkReporter* display =
      console ? static_cast<benchmark::BenchmarkReporter*>(&table) : &progress;
  if (has_out) {
    benchmark::RunSpecifiedBenchmarks(display, &file);
  } else {
    benchmark::RunSpecifiedBenchmarks(display);
  }
  benchmark::Shutdown();
  return 0;
}
