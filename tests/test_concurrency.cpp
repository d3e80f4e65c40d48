// Many threads calling every op at once (the thread-safety contract in embrope.hpp and
// embrope.h): shared inputs and a shared RopeCache, per-thread outputs, the C API with a
// per-thread last error, per-thread DeferredStatus. Every result must equal, bit for bit, the
// result of the same call made on one thread before the threads start. Run under
// ThreadSanitizer in CI (.ci/run), where any data race inside the library is reported.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "embrope/embrope.h"
#include "embrope/embrope.hpp"

namespace {

using embrope::DType;
using embrope::Tensor;

constexpr int kThreads = 8;
constexpr int kRounds = 20;

// Sizes past the CPU kernels' threading thresholds, so that each call also runs its own
// OpenMP team where OpenMP has threads.
constexpr std::int64_t V = 500, D = 256, B = 4, S = 33, P = 1024, Y = 2;
constexpr std::int64_t T = 64, Hq = 8, Hk = 2, HD = 64, R = 64;

std::vector<unsigned char> bytes_of(const void* p, std::size_t n) {
  const auto* c = static_cast<const unsigned char*>(p);
  return std::vector<unsigned char>(c, c + n);
}

template <typename T>
std::vector<T> random_values(std::size_t n, std::uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(u(rng));
  return v;
}

// The shared, read-only inputs of every call.
struct Inputs {
  std::vector<float> table = random_values<float>(V * D, 1, -1, 1);
  std::vector<float> pos_table = random_values<float>(P * D, 2, -1, 1);
  std::vector<float> type_table = random_values<float>(Y * D, 3, -1, 1);
  std::vector<std::int64_t> ids, pos_ids, type_ids, offsets{0, 7, 100, 900};
  std::vector<std::int32_t> ids32;
  std::vector<float> q = random_values<float>(T * Hq * HD, 4, -2, 2);
  std::vector<float> k = random_values<float>(T * Hk * HD, 5, -2, 2);
  std::vector<std::int64_t> positions;
  std::vector<float> cos = random_values<float>(P * R / 2, 6, -1, 1);
  std::vector<float> sin = random_values<float>(P * R / 2, 7, -1, 1);
  embrope::RopeCache cache{embrope::RopeConfig{R, 10000.0, P}};
  embrope::RopeCache yarn_cache{[] {
    embrope::RopeConfig c{R, 10000.0, P};
    c.scaling = embrope::RopeScaling::yarn;
    c.factor = 8.0;
    c.original_max_positions = 128;
    return c;
  }()};
  embrope::AdaptiveRopeCache adaptive{[] {
    embrope::RopeConfig c{R, 10000.0, P};
    c.scaling = embrope::RopeScaling::longrope;
    c.factor = 8.0;
    c.original_max_positions = 128;
    for (std::int64_t i = 0; i < R / 2; ++i) {
      c.short_factor.push_back(1.0 + 0.01 * static_cast<double>(i));
      c.long_factor.push_back(1.0 + 0.5 * static_cast<double>(i));
    }
    return c;
  }()};
  std::vector<std::int64_t> positions3;  // [3, T]: temporal, height, width
  std::vector<std::int64_t> cu_seqlens{0, 10, 10, 40, T}, starts{0, 5, 100, 1000};
  std::vector<float> grad_out = random_values<float>(B * S * D, 9, -1, 1);
  std::vector<float> norm_weight = random_values<float>(D, 10, 0.5, 1.5);
  std::vector<float> norm_bias = random_values<float>(D, 11, -0.5, 0.5);
  std::vector<std::int8_t> table_int8 = random_values<std::int8_t>(V * D, 12, -127, 127);
  std::vector<float> row_scales = random_values<float>(V, 13, 0.001, 0.01);
  std::vector<float> head_weight = random_values<float>(HD, 14, 0.5, 1.5);
  std::vector<float> v = random_values<float>(T * Hk * HD, 15, -2, 2);
  std::vector<std::int64_t> slots;  // a permutation of the cache's T slots

  Inputs() {
    std::mt19937_64 rng(8);
    for (std::int64_t n = 0; n < B * S; ++n) {
      ids.push_back(static_cast<std::int64_t>(rng() % V));
      ids32.push_back(static_cast<std::int32_t>(rng() % V));
      pos_ids.push_back(static_cast<std::int64_t>(rng() % P));
      type_ids.push_back(static_cast<std::int64_t>(rng() % Y));
    }
    for (std::int64_t t = 0; t < T; ++t) positions.push_back(static_cast<std::int64_t>(rng() % P));
    for (std::int64_t t = 0; t < T; ++t) slots.push_back((t * 5 + 3) % T);
    for (std::int64_t t = 0; t < 3 * T; ++t) {
      positions3.push_back(static_cast<std::int64_t>(rng() % P));
    }
  }
};

// One op as a function of the output buffers it writes (q and k in place are copied in
// first, so each thread rotates its own copy).
struct Op {
  std::string name;
  std::size_t out_bytes;
  std::function<void(float* out)> run;
};

std::vector<Op> ops(Inputs& in) {
  std::vector<Op> list;
  const Tensor table(in.table.data(), DType::float32, {V, D});
  const Tensor ids(in.ids.data(), DType::int64, {B, S});
  auto out_of = [](float* out) { return Tensor(out, DType::float32, {B, S, D}); };
  const std::size_t embed_bytes = B * S * D * sizeof(float);

  list.push_back(
      {"embed plain", embed_bytes, [=](float* out) { embrope::embed(table, ids, out_of(out)); }});
  list.push_back({"embed scale, learned positions by id, types", embed_bytes, [=, &in](float* out) {
                    embrope::EmbedOptions o;
                    o.scale = 1.75f;
                    o.positions = embrope::PositionEncoding::learned;
                    o.position_table = Tensor(in.pos_table.data(), DType::float32, {P, D});
                    o.position_ids = Tensor(in.pos_ids.data(), DType::int64, {B, S});
                    o.type_table = Tensor(in.type_table.data(), DType::float32, {Y, D});
                    o.type_ids = Tensor(in.type_ids.data(), DType::int64, {B, S});
                    embrope::embed(table, ids, out_of(out), o);
                  }});
  list.push_back(
      {"embed sinusoidal split with offsets, int32 ids", embed_bytes, [=, &in](float* out) {
         embrope::EmbedOptions o;
         o.positions = embrope::PositionEncoding::sinusoidal;
         o.sinusoid_layout = embrope::SinusoidLayout::split;
         o.position_offsets = Tensor(in.offsets.data(), DType::int64, {B});
         embrope::embed(table, Tensor(in.ids32.data(), DType::int32, {B, S}), out_of(out), o);
       }});
  list.push_back(
      {"embed vocab shard", embed_bytes, [=](float* out) {
         embrope::EmbedOptions o;
         o.vocab_start = V / 2;
         o.vocab_shard = true;
         embrope::embed(Tensor(table.data(), DType::float32, {V / 2, D}), ids, out_of(out), o);
       }});
  const std::size_t q_bytes = T * Hq * HD * sizeof(float), k_bytes = T * Hk * HD * sizeof(float);
  list.push_back(
      {"apply_rope q+k in place, shared cache", q_bytes + k_bytes, [&in, q_bytes](float* out) {
         float* q = out;
         float* k = out + q_bytes / sizeof(float);
         std::memcpy(q, in.q.data(), in.q.size() * sizeof(float));
         std::memcpy(k, in.k.data(), in.k.size() * sizeof(float));
         embrope::apply_rope(Tensor(q, DType::float32, {T, Hq, HD}),
                             Tensor(k, DType::float32, {T, Hk, HD}),
                             Tensor(in.positions.data(), DType::int64, {T}), in.cache);
       }});
  list.push_back({"apply_rope out of place, interleaved, inverse, shared cache", q_bytes + k_bytes,
                  [&in, q_bytes](float* out) {
                    embrope::RopeOptions o;
                    o.layout = embrope::RopeLayout::interleaved;
                    o.inverse = true;
                    o.q_out = Tensor(out, DType::float32, {T, Hq, HD});
                    o.k_out = Tensor(out + q_bytes / sizeof(float), DType::float32, {T, Hk, HD});
                    embrope::apply_rope(Tensor(in.q.data(), DType::float32, {T, Hq, HD}),
                                        Tensor(in.k.data(), DType::float32, {T, Hk, HD}),
                                        Tensor(in.positions.data(), DType::int64, {T}), in.cache,
                                        o);
                  }});
  list.push_back({"apply_rope with shared cos/sin", q_bytes, [&in](float* out) {
                    embrope::RopeOptions o;
                    o.q_out = Tensor(out, DType::float32, {T, Hq, HD});
                    embrope::apply_rope(Tensor(in.q.data(), DType::float32, {T, Hq, HD}),
                                        std::nullopt,
                                        Tensor(in.positions.data(), DType::int64, {T}),
                                        Tensor(in.cos.data(), DType::float32, {P, R / 2}),
                                        Tensor(in.sin.data(), DType::float32, {P, R / 2}), o);
                  }});
  list.push_back({"apply_rope mrope sections, shared cache", q_bytes, [&in](float* out) {
                    embrope::RopeOptions o;
                    o.mrope_section = {8, 12, 12};
                    o.q_out = Tensor(out, DType::float32, {T, Hq, HD});
                    embrope::apply_rope(
                        Tensor(in.q.data(), DType::float32, {T, Hq, HD}), std::nullopt,
                        Tensor(in.positions3.data(), DType::int64, {3, T}), in.cache, o);
                  }});
  list.push_back({"apply_rope with a shared yarn cache", q_bytes, [&in](float* out) {
                    embrope::RopeOptions o;
                    o.q_out = Tensor(out, DType::float32, {T, Hq, HD});
                    embrope::apply_rope(
                        Tensor(in.q.data(), DType::float32, {T, Hq, HD}), std::nullopt,
                        Tensor(in.positions.data(), DType::int64, {T}), in.yarn_cache, o);
                  }});
  list.push_back(
      {"apply_rope with a shared AdaptiveRopeCache (longrope, short and long)", 2 * q_bytes,
       [&in, q_bytes](float* out) {
         for (int half = 0; half < 2; ++half) {
           // Lengths on both sides of the switch: two tables, built on first use
           // by whichever thread comes first.
           const auto cache = in.adaptive.get(half == 0 ? 100 : P);
           embrope::RopeOptions o;
           o.q_out = Tensor(out + half * (q_bytes / sizeof(float)), DType::float32, {T, Hq, HD});
           embrope::apply_rope(Tensor(in.q.data(), DType::float32, {T, Hq, HD}), std::nullopt,
                               Tensor(in.positions.data(), DType::int64, {T}), *cache, o);
         }
       }});
  list.push_back({"apply_rope_backward in place", q_bytes, [&in](float* out) {
                    std::memcpy(out, in.q.data(), in.q.size() * sizeof(float));
                    embrope::apply_rope_backward(
                        Tensor(out, DType::float32, {T, Hq, HD}), std::nullopt,
                        Tensor(in.positions.data(), DType::int64, {T}), in.cache);
                  }});
  list.push_back({"packed_positions", T * sizeof(std::int64_t), [&in](float* out) {
                    embrope::PackedPositionsOptions o;
                    o.start_offsets = Tensor(in.starts.data(), DType::int64, {4});
                    embrope::packed_positions(Tensor(in.cu_seqlens.data(), DType::int64, {5}),
                                              Tensor(out, DType::int64, {T}), o);
                  }});
  list.push_back({"embed_backward into a table, positions and types",
                  (V + P + Y) * D * sizeof(float), [=, &in](float* out) {
                    std::memset(out, 0, (V + P + Y) * D * sizeof(float));
                    embrope::EmbedBackwardOptions o;
                    o.scale = 0.5f;
                    o.padding_idx = 3;
                    o.grad_position_table = Tensor(out + V * D, DType::float32, {P, D});
                    o.position_ids = Tensor(in.pos_ids.data(), DType::int64, {B, S});
                    o.grad_type_table = Tensor(out + (V + P) * D, DType::float32, {Y, D});
                    o.type_ids = Tensor(in.type_ids.data(), DType::int64, {B, S});
                    embrope::embed_backward(Tensor(in.grad_out.data(), DType::float32, {B, S, D}),
                                            ids, Tensor(out, DType::float32, {V, D}), o);
                  }});
  list.push_back({"embed + layer_norm with pre_norm_out", 2 * embed_bytes, [=, &in](float* out) {
                    embrope::EmbedOptions o;
                    o.norm = embrope::Normalization::layer_norm;
                    o.norm_weight = Tensor(in.norm_weight.data(), DType::float32, {D});
                    o.norm_bias = Tensor(in.norm_bias.data(), DType::float32, {D});
                    o.pre_norm_out = out_of(out + B * S * D);
                    embrope::embed(table, ids, out_of(out), o);
                  }});
  list.push_back({"embed of an int8 table with row scales", embed_bytes, [=, &in](float* out) {
                    embrope::QuantizedTable quantized;
                    quantized.format = embrope::QuantFormat::int8;
                    quantized.data = Tensor(in.table_int8.data(), DType::int8, {V, D});
                    quantized.dim = D;
                    quantized.scales = Tensor(in.row_scales.data(), DType::float32, {V});
                    embrope::embed(quantized, ids, out_of(out));
                  }});
  embrope::QkNorm qk_norm;
  qk_norm.q_weight = Tensor(in.head_weight.data(), DType::float32, {HD});
  qk_norm.k_weight = qk_norm.q_weight;
  list.push_back({"apply_qk_norm_rope q+k in place, shared cache", q_bytes + k_bytes,
                  [&in, q_bytes, qk_norm](float* out) {
                    float* q = out;
                    float* k = out + q_bytes / sizeof(float);
                    std::memcpy(q, in.q.data(), in.q.size() * sizeof(float));
                    std::memcpy(k, in.k.data(), in.k.size() * sizeof(float));
                    embrope::apply_qk_norm_rope(Tensor(q, DType::float32, {T, Hq, HD}),
                                                Tensor(k, DType::float32, {T, Hk, HD}),
                                                Tensor(in.positions.data(), DType::int64, {T}),
                                                in.cache, qk_norm);
                  }});
  list.push_back(
      {"apply_qk_norm_rope_backward with weight gradients",
       q_bytes + k_bytes + 2 * HD * sizeof(float), [&in, q_bytes, k_bytes, qk_norm](float* out) {
         float* dq = out;
         float* dk = out + q_bytes / sizeof(float);
         float* grads = dk + k_bytes / sizeof(float);
         // The outputs' gradients: any values (v's for dk, q's for dq).
         std::memcpy(dq, in.q.data(), q_bytes);
         std::memcpy(dk, in.v.data(), k_bytes);
         embrope::QkNormGradients g;
         g.q_weight = Tensor(grads, DType::float32, {HD});
         g.k_weight = Tensor(grads + HD, DType::float32, {HD});
         embrope::apply_qk_norm_rope_backward(
             Tensor(dq, DType::float32, {T, Hq, HD}), Tensor(dk, DType::float32, {T, Hk, HD}),
             Tensor(in.q.data(), DType::float32, {T, Hq, HD}),
             Tensor(in.k.data(), DType::float32, {T, Hk, HD}),
             Tensor(in.positions.data(), DType::int64, {T}), in.cache, qk_norm, g);
       }});
  // q rotated in place, then the paged K and V caches [T / 8 pages, 8, Hk, HD].
  auto append = [&in, q_bytes, k_bytes](float* out, const embrope::QkNorm* norm) {
    float* q = out;
    float* k_cache = out + q_bytes / sizeof(float);
    float* v_cache = k_cache + k_bytes / sizeof(float);
    std::memcpy(q, in.q.data(), in.q.size() * sizeof(float));
    embrope::KvCache kv;
    kv.k = Tensor(k_cache, DType::float32, {T / 8, 8, Hk, HD});
    kv.v = Tensor(v_cache, DType::float32, {T / 8, 8, Hk, HD});
    const Tensor qt(q, DType::float32, {T, Hq, HD});
    const Tensor kt(in.k.data(), DType::float32, {T, Hk, HD});
    const Tensor vt(in.v.data(), DType::float32, {T, Hk, HD});
    const Tensor pt(in.positions.data(), DType::int64, {T});
    const auto slots = embrope::KvSlots::paged(Tensor(in.slots.data(), DType::int64, {T}));
    if (norm) {
      embrope::apply_qk_norm_rope_append_kv(qt, kt, vt, pt, in.cache, kv, slots, *norm);
    } else {
      embrope::apply_rope_append_kv(qt, kt, vt, pt, in.cache, kv, slots);
    }
  };
  list.push_back({"apply_rope_append_kv into a paged cache", q_bytes + 2 * k_bytes,
                  [append](float* out) { append(out, nullptr); }});
  list.push_back({"apply_qk_norm_rope_append_kv into a paged cache", q_bytes + 2 * k_bytes,
                  [append, qk_norm](float* out) { append(out, &qk_norm); }});
  return list;
}

DLTensor dl(void* data, DLDataType dtype, std::int64_t* shape, int ndim) {
  DLTensor t{};
  t.data = data;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  return t;
}

}  // namespace

TEST_CASE("concurrent calls of every op equal the single-threaded results bit for bit",
          "[concurrency]") {
  Inputs in;
  const std::vector<Op> list = ops(in);

  // The single-threaded results.
  std::vector<std::vector<unsigned char>> expected;
  for (const Op& op : list) {
    std::vector<float> out(op.out_bytes / sizeof(float), -123.0f);
    op.run(out.data());
    expected.push_back(bytes_of(out.data(), op.out_bytes));
  }

  // A C cache shared by all threads, and the C calls' single-threaded results.
  embrope_rope_config_t config;
  embrope_rope_config_init(&config);
  config.rotary_dim = R;
  config.max_positions = P;
  embrope_rope_cache_t* c_cache = nullptr;
  REQUIRE(embrope_rope_cache_create(&config, DLDevice{kDLCPU, 0}, nullptr, &c_cache) == EMBROPE_OK);
  std::int64_t q_shape[3] = {T, Hq, HD}, pos_shape[1] = {T};
  std::int64_t table_shape[2] = {V, D}, ids_shape[2] = {B, S}, out_shape[3] = {B, S, D};
  const DLDataType f32{kDLFloat, 32, 1}, i64{kDLInt, 64, 1};
  auto c_rope = [&](float* q_out) {
    DLTensor q = dl(in.q.data(), f32, q_shape, 3), qo = dl(q_out, f32, q_shape, 3);
    DLTensor pos = dl(in.positions.data(), i64, pos_shape, 1);
    embrope_rope_options_t o;
    embrope_rope_options_init(&o);
    o.q_out = &qo;
    return embrope_apply_rope(&q, nullptr, &pos, c_cache, &o, nullptr);
  };
  auto c_embed = [&](float* out) {
    DLTensor t = dl(in.table.data(), f32, table_shape, 2), i = dl(in.ids.data(), i64, ids_shape, 2);
    DLTensor o = dl(out, f32, out_shape, 3);
    return embrope_embed(&t, &i, &o, nullptr, nullptr);
  };
  std::vector<float> c_rope_expected(T * Hq * HD), c_embed_expected(B * S * D);
  REQUIRE(c_rope(c_rope_expected.data()) == EMBROPE_OK);
  REQUIRE(c_embed(c_embed_expected.data()) == EMBROPE_OK);

  std::atomic<int> mismatches{0}, failures{0};
  std::atomic<bool> go{false};
  std::vector<std::string> first_problem(kThreads);
  auto note = [&](int thread, std::atomic<int>& counter, const std::string& what) {
    if (counter.fetch_add(1) == 0 || first_problem[thread].empty()) first_problem[thread] = what;
  };

  std::vector<std::thread> threads;
  for (int id = 0; id < kThreads; ++id) {
    threads.emplace_back([&, id] {
      while (!go.load()) std::this_thread::yield();
      std::vector<float> out;
      for (int round = 0; round < kRounds; ++round) {
        // Each thread starts at a different op, so that different ops overlap in time.
        for (std::size_t j = 0; j < list.size(); ++j) {
          const std::size_t i = (j + static_cast<std::size_t>(id)) % list.size();
          out.assign(list[i].out_bytes / sizeof(float), -7.0f);
          try {
            list[i].run(out.data());
          } catch (const std::exception& e) {
            note(id, failures, list[i].name + ": " + e.what());
            continue;
          }
          if (bytes_of(out.data(), list[i].out_bytes) != expected[i]) {
            note(id, mismatches, list[i].name + " differs");
          }
        }

        // The C API: a distinct error per thread, then its own message, then a success that
        // clears it, while other threads fail and succeed.
        {
          DLTensor q = dl(in.q.data(), f32, q_shape, 3);
          DLTensor pos = dl(in.positions.data(), i64, pos_shape, 1);
          embrope_rope_options_t o;
          embrope_rope_options_init(&o);
          o.rotary_dim = 1000 + id;  // not the cache's: a message naming this thread's value
          const embrope_status_t s = embrope_apply_rope(&q, nullptr, &pos, c_cache, &o, nullptr);
          const std::string message = embrope_last_error();
          if (s != EMBROPE_ERROR_INVALID_ARGUMENT ||
              message.find("rotary_dim " + std::to_string(1000 + id)) == std::string::npos ||
              message.rfind("embrope_apply_rope: ", 0) != 0) {
            note(id, failures, "C error message of another thread: " + message);
          }
        }
        out.assign(T * Hq * HD, -7.0f);
        if (c_rope(out.data()) != EMBROPE_OK || std::string(embrope_last_error()) != "" ||
            std::memcmp(out.data(), c_rope_expected.data(), out.size() * sizeof(float)) != 0) {
          note(id, mismatches, "C apply_rope");
        }
        out.assign(B * S * D, -7.0f);
        if (c_embed(out.data()) != EMBROPE_OK ||
            std::memcmp(out.data(), c_embed_expected.data(), out.size() * sizeof(float)) != 0) {
          note(id, mismatches, "C embed");
        }

        // A DeferredStatus per thread collects this thread's bad id only.
        {
          std::vector<std::int64_t> bad_ids = in.ids;
          bad_ids[static_cast<std::size_t>(id)] = -1 - id;
          embrope::DeferredStatus status;
          embrope::EmbedOptions o;
          o.deferred = &status;
          out.assign(B * S * D, -7.0f);
          embrope::embed(Tensor(in.table.data(), DType::float32, {V, D}),
                         Tensor(bad_ids.data(), DType::int64, {B, S}),
                         Tensor(out.data(), DType::float32, {B, S, D}), o);
          try {
            status.check();
            note(id, failures, "DeferredStatus recorded nothing");
          } catch (const embrope::Error& e) {
            const std::string want =
                "ids[" + std::to_string(id) + "] = " + std::to_string(-1 - id) + " ";
            if (std::string(e.what()).find(want) == std::string::npos) {
              note(id, failures, std::string("DeferredStatus of another thread: ") + e.what());
            }
          }
        }

        // Caches built concurrently with the same configuration are identical.
        {
          embrope::RopeCache mine({R, 10000.0, 64});
          for (std::int64_t p = 0; p < 64; ++p) {
            for (std::int64_t i = 0; i < R / 2; ++i) {
              if (mine.cos(p, i) != in.cache.cos(p, i) || mine.sin(p, i) != in.cache.sin(p, i)) {
                note(id, mismatches, "a concurrently built RopeCache differs");
                p = 64;
                break;
              }
            }
          }
        }
      }
    });
  }
  go.store(true);
  for (std::thread& t : threads) t.join();
  embrope_rope_cache_destroy(c_cache);

  for (int id = 0; id < kThreads; ++id) {
    INFO("thread " << id << ": " << first_problem[id]);
    CHECK(first_problem[id].empty());
  }
  CHECK(mismatches.load() == 0);
  CHECK(failures.load() == 0);
}
