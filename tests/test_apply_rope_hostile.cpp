// Hostile inputs to apply_rope, embrope_apply_rope and embrope_apply_rope_cos_sin (docs/ops.md,
// docs/errors.md): one table of cases run on both surfaces and with both table kinds (RopeCache and
// caller cos/sin): null data, bad dtypes and devices, bad sizes and strides, overlapping views, bad
// rotary dims, positions at the int32/int64 limits, empty caches, NaN and infinity in values. Then
// the multimodal sections (mrope_section) through the C API. The harness is in hostile.hpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "embrope/embrope.h"
#include "embrope/embrope.hpp"
#include "hostile.hpp"

namespace {

using namespace hostile;

constexpr const char* kGroup = "apply_rope";
constexpr const char* kMropeGroup = "apply_rope mrope";

struct RopeFixture {
  static constexpr std::int64_t T = 4, Hq = 2, Hk = 1, D = 8, R = 8, P = 16;
  Arena arena;
  Region q, k, q_out, k_out, positions, cos, sin;
  embrope::RopeCache cache{embrope::RopeConfig{R, 10000.0, P}};
  embrope_rope_cache_t* c_cache = nullptr;

  explicit RopeFixture(DType value = DType::float32, DType index = DType::int64) {
    q = arena.region(value, T * Hq * D);
    k = arena.region(value, T * Hk * D);
    q_out = arena.region(value, T * Hq * D);
    k_out = arena.region(value, T * Hk * D);
    positions = arena.region(index, T);
    cos = arena.region(value, P * R / 2);
    sin = arena.region(value, P * R / 2);
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> u(-2.0, 2.0), w(0.1, 0.9);
    for (std::int64_t i = 0; i < T * Hq * D; ++i) q.set(i, u(rng)), q_out.set(i, u(rng));
    for (std::int64_t i = 0; i < T * Hk * D; ++i) k.set(i, u(rng)), k_out.set(i, u(rng));
    for (std::int64_t i = 0; i < P * R / 2; ++i) cos.set(i, w(rng)), sin.set(i, w(rng));
    for (std::int64_t t = 0; t < T; ++t) positions.set_index(t, (5 * t + 3) % P);
    embrope_rope_config_t config;
    embrope_rope_config_init(&config);
    config.rotary_dim = R;
    config.max_positions = P;
    REQUIRE(embrope_rope_cache_create(&config, DLDevice{kDLCPU, 0}, nullptr, &c_cache) ==
            EMBROPE_OK);
  }
  ~RopeFixture() { embrope_rope_cache_destroy(c_cache); }
  RopeFixture(const RopeFixture&) = delete;
  RopeFixture& operator=(const RopeFixture&) = delete;
};

enum class Table { cache, cos_sin };
constexpr int kCache = 1, kCosSin = 2, kTables = kCache | kCosSin;

struct RopeArgs {
  Tensor q;
  std::optional<Tensor> k;
  Tensor positions, cos, sin;
  const embrope::RopeCache* cache = nullptr;  // C++ surface with Table::cache
  bool null_cache = false;                    // C: a NULL cache handle
  embrope::RopeOptions o;
  DLPatch patch;
  std::function<void(embrope_rope_options_t&)> copt;
  bool null_options = false;
  std::string null_tensor;
};

RopeArgs rope_args(RopeFixture& f, bool with_outputs = false) {
  using F = RopeFixture;
  RopeArgs a;
  const DType vd = f.q.dtype;
  a.q = Tensor(f.q.data, vd, {F::T, F::Hq, F::D});
  a.k = Tensor(f.k.data, vd, {F::T, F::Hk, F::D});
  a.positions = Tensor(f.positions.data, f.positions.dtype, {F::T});
  a.cos = Tensor(f.cos.data, vd, {F::P, F::R / 2});
  a.sin = Tensor(f.sin.data, vd, {F::P, F::R / 2});
  a.cache = &f.cache;
  if (with_outputs) {
    a.o.q_out = Tensor(f.q_out.data, vd, {F::T, F::Hq, F::D});
    a.o.k_out = Tensor(f.k_out.data, vd, {F::T, F::Hk, F::D});
  }
  return a;
}

Outcome call_rope(Surface s, Table table, const RopeArgs& a, RopeFixture& f) {
  if (s == Surface::cpp) {
    return run_cpp([&] {
      if (table == Table::cache) {
        embrope::apply_rope(a.q, a.k, a.positions, *a.cache, a.o);
      } else {
        embrope::apply_rope(a.q, a.k, a.positions, a.cos, a.sin, a.o);
      }
    });
  }
  auto view = [&](const std::string& name, const Tensor& t) {
    auto v = std::make_unique<DLView>(t);
    if (a.patch) a.patch(name, *v);
    if (a.null_tensor == name) v->null = true;
    return v;
  };
  auto q = view("q", a.q), positions = view("positions", a.positions);
  auto cos = view("cos", a.cos), sin = view("sin", a.sin);
  std::unique_ptr<DLView> k, q_out, k_out;
  if (a.k) k = view("k", *a.k);
  if (a.o.q_out) q_out = view("q_out", *a.o.q_out);
  if (a.o.k_out) k_out = view("k_out", *a.o.k_out);
  embrope_rope_options_t o;
  embrope_rope_options_init(&o);
  o.layout = a.o.layout == embrope::RopeLayout::neox ? EMBROPE_ROPE_NEOX : EMBROPE_ROPE_INTERLEAVED;
  o.inverse = a.o.inverse ? 1 : 0;
  o.rotary_dim = a.o.rotary_dim;
  o.q_out = q_out ? const_cast<DLTensor*>(q_out->get()) : nullptr;
  o.k_out = k_out ? const_cast<DLTensor*>(k_out->get()) : nullptr;
  if (a.copt) a.copt(o);
  const embrope_rope_options_t* op = a.null_options ? nullptr : &o;
  const DLTensor* kt = k ? k->get() : nullptr;
  if (table == Table::cache) {
    return from_status(embrope_apply_rope(q->get(), kt, positions->get(),
                                          a.null_cache ? nullptr : f.c_cache, op, nullptr));
  }
  return from_status(embrope_apply_rope_cos_sin(q->get(), kt, positions->get(), cos->get(),
                                                sin->get(), op, nullptr));
}

struct RopeCase {
  std::string name;
  Expect expect;
  std::function<RopeArgs(RopeFixture&)> make;
  int surfaces = kBoth;
  int tables = kTables;
  std::function<void(const RopeFixture&)> after;
  DType value = DType::float32, index = DType::int64;
};

void run_rope_cases(const std::vector<RopeCase>& cases) {
  for (const RopeCase& c : cases) {
    for (Surface s : {Surface::cpp, Surface::c}) {
      if ((c.surfaces & (s == Surface::cpp ? kCpp : kC)) == 0) continue;
      for (Table table : {Table::cache, Table::cos_sin}) {
        if ((c.tables & (table == Table::cache ? kCache : kCosSin)) == 0) continue;
        const std::string op = s == Surface::cpp       ? "apply_rope"
                               : table == Table::cache ? "embrope_apply_rope"
                                                       : "embrope_apply_rope_cos_sin";
        DYNAMIC_SECTION(op << (table == Table::cache ? " (cache): " : " (cos/sin): ") << c.name) {
          RopeFixture f(c.value, c.index);
          f.arena.seal();
          Outcome got;
          std::optional<RopeArgs> args;
          got = run_cpp([&] { args = c.make(f); });
          if (args) got = call_rope(s, table, *args, f);
          check_outcome(got, c.expect, got.message.rfind("Tensor: ", 0) == 0 ? "Tensor" : op,
                        f.arena);
          if (c.after && (got.ok || got.code == ErrorCode::index_out_of_range)) c.after(f);
          count(kGroup, s);
        }
      }
    }
  }
}

std::vector<RopeCase> rope_cases() {
  using F = RopeFixture;
  std::vector<RopeCase> cases;
  auto add = [&](std::string name, Expect e, std::function<RopeArgs(F&)> make, int surfaces = kBoth,
                 int tables = kTables) {
    cases.push_back({std::move(name), std::move(e), std::move(make), surfaces, tables, nullptr});
  };
  auto shape_of = [](const Tensor& t) {
    return std::vector<std::int64_t>(t.shape(), t.shape() + t.ndim());
  };
  auto strides_of = [](const Tensor& t) {
    return std::vector<std::int64_t>(t.strides(), t.strides() + t.ndim());
  };
  auto rebuilt = [](void* data, DType dtype, std::vector<std::int64_t> shape,
                    std::vector<std::int64_t> strides, Device device) {
    return Tensor(data, dtype, static_cast<int>(shape.size()), shape.data(),
                  strides.empty() ? nullptr : strides.data(), device);
  };

  struct Named {
    const char* name;
    std::function<Tensor&(RopeArgs&)> get;
    bool value;
    int tables;  // which table kinds have this argument
  };
  const std::vector<Named> tensors = {
      {"q", [](RopeArgs& a) -> Tensor& { return a.q; }, true, kTables},
      {"k", [](RopeArgs& a) -> Tensor& { return *a.k; }, true, kTables},
      {"positions", [](RopeArgs& a) -> Tensor& { return a.positions; }, false, kTables},
      {"q_out", [](RopeArgs& a) -> Tensor& { return *a.o.q_out; }, true, kTables},
      {"k_out", [](RopeArgs& a) -> Tensor& { return *a.o.k_out; }, true, kTables},
      {"cos", [](RopeArgs& a) -> Tensor& { return a.cos; }, true, kCosSin},
      {"sin", [](RopeArgs& a) -> Tensor& { return a.sin; }, true, kCosSin},
  };
  for (const Named& n : tensors) {
    const std::string name = n.name;
    auto get = n.get;
    const int tables = n.tables;
    auto mutated = [=](std::function<void(Tensor&)> m) {
      return [=](F& f) {
        RopeArgs a = rope_args(f, true);
        m(get(a));
        return a;
      };
    };
    add(name + " has null data", invalid({name, "null"}), mutated([=](Tensor& t) {
          t = rebuilt(nullptr, t.dtype(), shape_of(t), strides_of(t), t.device());
        }),
        kBoth, tables);
    const std::vector<DType> wrong =
        n.value ? std::vector<DType>{DType::int32, DType::int64, DType::float16}
                : std::vector<DType>{DType::float32, DType::bfloat16};
    for (DType d : wrong) {
      // float16 q/k/cos mismatch the float32 rest; sin mismatching cos is named as sin.
      add(name + " has dtype " + embrope::dtype_name(d), invalid({"dtype"}),
          mutated(
              [=](Tensor& t) { t = rebuilt(t.data(), d, shape_of(t), strides_of(t), t.device()); }),
          kBoth, tables);
    }
    add(name + " has an unknown dtype", invalid({"dtype"}), mutated([=](Tensor& t) {
          t = rebuilt(t.data(), static_cast<DType>(200), shape_of(t), strides_of(t), t.device());
        }),
        kCpp, tables);
    add(name + " is on cuda:0", on_cuda({}), mutated([=](Tensor& t) {
          t = rebuilt(t.data(), t.dtype(), shape_of(t), strides_of(t), Device::cuda(0));
        }),
        kBoth, tables);
    add(name + " is on cuda:7", on_cuda({}), mutated([=](Tensor& t) {
          t = rebuilt(t.data(), t.dtype(), shape_of(t), strides_of(t), Device::cuda(7));
        }),
        kBoth, tables);
    add(name + " has a data pointer that is not a multiple of its element size",
        invalid({name, "data pointer", "element size"}), mutated([=](Tensor& t) {
          // Rejected before any access, so the view may reach one byte past its region.
          void* odd = static_cast<unsigned char*>(t.data()) + 1;
          t = rebuilt(odd, t.dtype(), shape_of(t), strides_of(t), t.device());
        }),
        kBoth, tables);
    add(name + " has a negative size", invalid({name, "negative", "size"}), mutated([=](Tensor& t) {
          auto shape = shape_of(t);
          shape[0] = -1;
          t = rebuilt(t.data(), t.dtype(), shape, strides_of(t), t.device());
        }),
        kBoth, tables);
    add(name + " has a negative stride", invalid({name, "negative", "stride"}),
        mutated([=](Tensor& t) {
          auto strides = strides_of(t);
          strides[0] = -strides[0];
          t = rebuilt(t.data(), t.dtype(), shape_of(t), strides, t.device());
        }),
        kBoth, tables);
    add(name + " has a shape product past 2^63", invalid({name, "2^60"}), mutated([=](Tensor& t) {
          auto shape = shape_of(t);
          shape[0] = kI64Max;
          if (shape.size() > 1) shape[1] = 3;
          t = rebuilt(t.data(), t.dtype(), shape, {}, t.device());
        }),
        kBoth, tables);
    if (n.value) {
      add(name + " has a non-unit last stride", invalid({name, "stride", "last"}),
          mutated([=](Tensor& t) {
            // Rejected before any access, so the view may reach past its region.
            auto strides = strides_of(t);
            strides.back() = 2;
            t = rebuilt(t.data(), t.dtype(), shape_of(t), strides, t.device());
          }),
          kBoth, tables);
    }
    add(name + " has rank 5", invalid({name, "dimensions"}), mutated([=](Tensor& t) {
          t = rebuilt(t.data(), t.dtype(), {1, 1, 1, 1, 1}, {}, t.device());
        }),
        kBoth, tables);
    add(name + " has rank 0", invalid({name, "dimensions"}),
        mutated([=](Tensor& t) { t = rebuilt(t.data(), t.dtype(), {}, {}, t.device()); }), kBoth,
        tables);
    for (const DLDataType d :
         {DLDataType{kDLFloat, 32, 2}, DLDataType{kDLFloat, 64, 1}, DLDataType{kDLUInt, 64, 1},
          DLDataType{kDLInt, 16, 1}, DLDataType{kDLBfloat, 16, 4}, DLDataType{kDLFloat, 0, 1}}) {
      add(
          name + " has DLPack dtype code " + std::to_string(d.code) + " bits " +
              std::to_string(d.bits) + " lanes " + std::to_string(d.lanes),
          invalid({name, "DLPack", "dtype"}),
          [=](F& f) {
            RopeArgs a = rope_args(f, true);
            a.patch = patch_of(name, [=](DLView& v) { v.t.dtype = d; });
            return a;
          },
          kC, tables);
    }
    for (std::int32_t ndim : {-3, 9}) {
      add(
          name + " has ndim " + std::to_string(ndim), invalid({name, "ndim"}),
          [=](F& f) {
            RopeArgs a = rope_args(f, true);
            a.patch = patch_of(name, [=](DLView& v) { v.t.ndim = ndim; });
            return a;
          },
          kC, tables);
    }
    add(
        name + " has a null shape", invalid({name, "null", "shape"}),
        [=](F& f) {
          RopeArgs a = rope_args(f, true);
          a.patch = patch_of(name, [](DLView& v) { v.t.shape = nullptr; });
          return a;
        },
        kC, tables);
    add(
        name + " has an odd byte_offset", invalid({name, "byte_offset"}),
        [=](F& f) {
          RopeArgs a = rope_args(f, true);
          a.patch = patch_of(name, [](DLView& v) { v.t.byte_offset = 3; });
          return a;
        },
        kC, tables);
    add(
        name + " has DLPack device kDLCUDAHost", invalid({name, "device"}),
        [=](F& f) {
          RopeArgs a = rope_args(f, true);
          a.patch = patch_of(name, [](DLView& v) { v.t.device.device_type = kDLCUDAHost; });
          return a;
        },
        kC, tables);
  }
  // NULL DLTensor* arguments: required ones are errors; k, q_out, k_out are optional.
  for (const char* name : {"q", "positions", "cos", "sin"}) {
    const std::string nm = name;
    const bool table_arg = nm == "cos" || nm == "sin";
    add(
        nm + " is a NULL DLTensor*", invalid({nm, "null"}),
        [=](F& f) {
          RopeArgs a = rope_args(f);
          a.null_tensor = nm;
          return a;
        },
        kC, table_arg ? kCosSin : kTables);
  }
  add(
      "k is a NULL DLTensor* (q only)", ok(),
      [](F& f) {
        RopeArgs a = rope_args(f);
        a.null_tensor = "k";
        return a;
      },
      kC);
  add("k_out without k", invalid({"k_out", "k"}), [](F& f) {
    RopeArgs a = rope_args(f, true);
    a.k.reset();
    return a;
  });
  add(
      "a NULL cache handle", invalid({"cache", "null"}),
      [](F& f) {
        RopeArgs a = rope_args(f);
        a.null_cache = true;
        return a;
      },
      kC, kCache);
  add(
      "a moved-from RopeCache", invalid({"cache", "moved"}),
      [](F& f) {
        RopeArgs a = rope_args(f);
        static thread_local std::optional<embrope::RopeCache> moved_from;
        moved_from.emplace(embrope::RopeConfig{F::R, 10000.0, F::P});
        embrope::RopeCache taken(std::move(*moved_from));
        a.cache = &*moved_from;
        return a;
      },
      kCpp, kCache);
  add(
      "NULL options are the defaults (in place)", ok(),
      [](F& f) {
        RopeArgs a = rope_args(f);
        a.null_options = true;
        return a;
      },
      kC);
  for (int v : {2, -1, 77}) {
    add(
        "C layout enum " + std::to_string(v), invalid({"layout"}),
        [=](F& f) {
          RopeArgs a = rope_args(f);
          a.copt = [=](embrope_rope_options_t& o) { std::memcpy(&o.layout, &v, sizeof v); };
          return a;
        },
        kC);
  }

  // Shapes that do not fit together.
  add("positions of the wrong length", invalid({"positions", "token"}), [](F& f) {
    RopeArgs a = rope_args(f);
    a.positions = Tensor(f.positions.data, f.positions.dtype, {F::T - 1});
    return a;
  });
  add("positions of rank 2 for q of rank 3", invalid({"positions", "dimensions"}), [](F& f) {
    RopeArgs a = rope_args(f);
    a.positions = Tensor(f.positions.data, f.positions.dtype, {1, F::T});
    return a;
  });
  add("k with another head_dim", invalid({"k", "head_dim"}), [](F& f) {
    RopeArgs a = rope_args(f);
    a.k = Tensor(f.k.data, f.q.dtype, {F::T, 2, F::D / 2});
    return a;
  });
  add("k with another token count", invalid({"k", "token"}), [](F& f) {
    RopeArgs a = rope_args(f);
    a.k = Tensor(f.k.data, f.q.dtype, {F::T / 2, 2, F::D});
    return a;
  });
  add("k of rank 4 with q of rank 3", invalid({"k", "dimensions"}), [](F& f) {
    RopeArgs a = rope_args(f);
    a.k = Tensor(f.k.data, f.q.dtype, {1, F::T, F::Hk, F::D});
    return a;
  });
  add("q_out of another shape", invalid({"q_out", "shape"}), [](F& f) {
    RopeArgs a = rope_args(f, true);
    a.o.q_out = Tensor(f.q_out.data, f.q.dtype, {F::T, 1, F::D});
    return a;
  });
  add("k_out of another dtype", invalid({"k_out", "dtype"}), [](F& f) {
    RopeArgs a = rope_args(f, true);
    a.o.k_out = Tensor(f.k_out.data, DType::bfloat16, {F::T, F::Hk, F::D});
    return a;
  });

  // Rotary dims: odd, zero, negative, larger than the head, not the table's.
  for (std::int64_t r :
       {std::int64_t{7}, std::int64_t{-8}, std::int64_t{6}, std::int64_t{16}, kI64Max, kI64Min}) {
    add("options.rotary_dim " + std::to_string(r), invalid({"rotary_dim", std::to_string(r)}),
        [=](F& f) {
          RopeArgs a = rope_args(f);
          a.o.rotary_dim = r;
          return a;
        });
  }
  add("rotary_dim larger than head_dim", invalid({"rotary_dim", "exceeds", "head_dim"}), [](F& f) {
    RopeArgs a = rope_args(f);
    a.q = Tensor(f.q.data, f.q.dtype, {F::T, F::Hq, F::D - 2});
    a.k = Tensor(f.k.data, f.q.dtype, {F::T, F::Hk, F::D - 2});
    return a;
  });
  add("head_dim of zero", invalid({"rotary_dim", "exceeds", "head_dim"}), [](F& f) {
    RopeArgs a = rope_args(f);
    a.q = Tensor(f.q.data, f.q.dtype, {F::T, F::Hq, 0});
    a.k.reset();
    return a;
  });
  add(
      "cos with zero columns (rotary_dim 0)", invalid({"cos", "rotary_dim"}),
      [](F& f) {
        RopeArgs a = rope_args(f);
        a.cos = Tensor(f.cos.data, f.q.dtype, {F::P, 0});
        a.sin = Tensor(f.sin.data, f.q.dtype, {F::P, 0});
        return a;
      },
      kBoth, kCosSin);
  add(
      "empty cos/sin tables with INT64_MAX columns", invalid({"cos", "2^60"}),
      [](F& f) {
        RopeArgs a = rope_args(f);
        a.cos = Tensor(f.cos.data, f.q.dtype, {0, kI64Max});
        a.sin = Tensor(f.sin.data, f.q.dtype, {0, kI64Max});
        return a;
      },
      kBoth, kCosSin);
  add("an empty q with a size past 2^60", invalid({"q", "2^60"}), [](F& f) {
    RopeArgs a = rope_args(f);
    a.q = Tensor(f.q.data, f.q.dtype, {0, kI64Max, F::D});
    a.k.reset();
    return a;
  });
  add(
      "sin shaped unlike cos", invalid({"sin", "cos", "shape"}),
      [](F& f) {
        RopeArgs a = rope_args(f);
        a.sin = Tensor(f.sin.data, f.q.dtype, {F::P / 2, F::R / 2});
        return a;
      },
      kBoth, kCosSin);
  add(
      "a cos/sin table of zero positions", bad_index({"positions[0]", "cos/sin"}),
      [](F& f) {
        RopeArgs a = rope_args(f);
        a.cos = Tensor(f.cos.data, f.q.dtype, {0, F::R / 2});
        a.sin = Tensor(f.sin.data, f.q.dtype, {0, F::R / 2});
        return a;
      },
      kBoth, kCosSin);

  // Zero tokens and zero heads.
  add("zero tokens", ok(), [](F& f) {
    RopeArgs a = rope_args(f);
    a.q = Tensor(f.q.data, f.q.dtype, {0, F::Hq, F::D});
    a.k = Tensor(f.k.data, f.q.dtype, {0, F::Hk, F::D});
    a.positions = Tensor(f.positions.data, f.positions.dtype, {0});
    return a;
  });
  add("zero heads", ok(), [](F& f) {
    RopeArgs a = rope_args(f);
    a.q = Tensor(f.q.data, f.q.dtype, {F::T, 0, F::D});
    a.k = Tensor(f.k.data, f.q.dtype, {F::T, 0, F::D});
    return a;
  });

  // Positions at the limits, both index dtypes.
  for (DType index : {DType::int32, DType::int64}) {
    const bool i32 = index == DType::int32;
    const std::vector<std::int64_t> bad =
        i32 ? std::vector<std::int64_t>{-1, F::P, kI32Min, kI32Max}
            : std::vector<std::int64_t>{
                  -1,      F::P,   kI32Min, kI32Max, std::int64_t{1} << 31, std::int64_t{1} << 32,
                  kI64Min, kI64Max};
    for (std::int64_t p : bad) {
      RopeCase c{
          std::string("positions[2] = ") + embrope::dtype_name(index) + " " + std::to_string(p),
          bad_index({"positions[2]", std::to_string(p)}),
          [=](F& f) {
            f.positions.set_index(2, p);
            f.arena.seal();
            return rope_args(f, true);
          },
          kBoth,
          kTables,
          nullptr,
          DType::float32,
          index};
      cases.push_back(c);
    }
  }
  {
    // Bad rows are zero-filled in every output; the others are written.
    RopeCase c{"a bad position zero-fills its token's rows in q_out and k_out",
               bad_index({"positions[1]", "-5"}),
               [](F& f) {
                 f.positions.set_index(1, -5);
                 f.arena.seal();
                 return rope_args(f, true);
               },
               kBoth,
               kTables,
               nullptr};
    c.after = [](const RopeFixture& f) {
      for (std::int64_t j = 0; j < F::Hq * F::D; ++j) CHECK(f.q_out.get(F::Hq * F::D + j) == 0.0);
      for (std::int64_t j = 0; j < F::Hk * F::D; ++j) CHECK(f.k_out.get(F::Hk * F::D + j) == 0.0);
    };
    cases.push_back(c);
  }

  // Overlaps.
  add("q_out is exactly q (in place)", ok(), [](F& f) {
    RopeArgs a = rope_args(f);
    a.o.q_out = a.q;
    return a;
  });
  add("q_out is q shifted by half a head", invalid({"q_out", "overlaps", "q", "same view"}),
      [](F& f) {
        RopeArgs a = rope_args(f);
        a.q = Tensor(f.q.data, f.q.dtype, {F::T, 1, F::D}, {F::Hq * F::D, F::D, 1});
        a.o.q_out = Tensor(f.q.at(F::D / 2), f.q.dtype, {F::T, 1, F::D}, {F::Hq * F::D, F::D, 1});
        a.k.reset();
        return a;
      });
  add("q_out writes head 1 of q while q reads head 0 (no shared byte)", ok(), [](F& f) {
    RopeArgs a = rope_args(f);
    a.q = Tensor(f.q.data, f.q.dtype, {F::T, 1, F::D}, {F::Hq * F::D, F::D, 1});
    a.o.q_out = Tensor(f.q.at(F::D), f.q.dtype, {F::T, 1, F::D}, {F::Hq * F::D, F::D, 1});
    a.k.reset();
    return a;
  });
  add("q_out's tokens land on q's other tokens", invalid({"q_out", "overlaps", "q"}), [](F& f) {
    // q: even tokens of the buffer; q_out: tokens 1, 2 (token 2 is q's token 1).
    RopeArgs a = rope_args(f);
    a.q = Tensor(f.q.data, f.q.dtype, {F::T / 2, F::Hq, F::D}, {2 * F::Hq * F::D, F::D, 1});
    a.o.q_out =
        Tensor(f.q.at(F::Hq * F::D), f.q.dtype, {F::T / 2, F::Hq, F::D}, {F::Hq * F::D, F::D, 1});
    a.positions = Tensor(f.positions.data, f.positions.dtype, {F::T / 2});
    a.k.reset();
    return a;
  });
  add("in place q overlaps k", invalid({"q", "overlaps", "k"}), [](F& f) {
    RopeArgs a = rope_args(f);
    a.k = Tensor(f.q.at(F::D), f.q.dtype, {F::T, F::Hk, F::D}, {F::Hq * F::D, F::D, 1});
    a.q = Tensor(f.q.data, f.q.dtype, {F::T, F::Hq, F::D});
    return a;
  });
  add("q and k side by side in one fused buffer (no shared byte)", ok(), [](F& f) {
    // Each token row of q holds head 0 of q and head 0 of k: [q | k] with row stride 2D.
    RopeArgs a = rope_args(f);
    a.q = Tensor(f.q.data, f.q.dtype, {F::T, 1, F::D}, {2 * F::D, F::D, 1});
    a.k = Tensor(f.q.at(F::D), f.q.dtype, {F::T, 1, F::D}, {2 * F::D, F::D, 1});
    return a;
  });
  add("k_out overlaps q_out", invalid({"k_out", "overlaps", "q_out"}), [](F& f) {
    RopeArgs a = rope_args(f, true);
    a.o.k_out = Tensor(f.q_out.at(F::D), f.q.dtype, {F::T, F::Hk, F::D}, {F::Hq * F::D, F::D, 1});
    return a;
  });
  add("k_out is exactly head 0 of q_out", invalid({"k_out", "overlaps", "q_out"}), [](F& f) {
    RopeArgs a = rope_args(f, true);
    a.o.k_out = Tensor(f.q_out.data, f.q.dtype, {F::T, F::Hk, F::D}, {F::Hq * F::D, F::D, 1});
    return a;
  });
  add("q_out overlaps k (an input)", invalid({"q_out", "overlaps", "k"}), [](F& f) {
    RopeArgs a = rope_args(f, true);
    a.o.q_out = Tensor(f.k.data, f.q.dtype, {F::T, 1, F::D});
    a.q = Tensor(f.q.data, f.q.dtype, {F::T, 1, F::D}, {F::Hq * F::D, F::D, 1});
    return a;
  });
  add("q_out overlaps the positions", invalid({"q_out", "overlaps", "positions"}), [](F& f) {
    RopeArgs a = rope_args(f, true);
    a.positions = Tensor(f.q_out.at(0), DType::int64, {F::T});
    return a;
  });
  add(
      "q_out overlaps cos", invalid({"q_out", "overlaps", "cos"}),
      [](F& f) {
        RopeArgs a = rope_args(f, true);
        a.o.q_out = Tensor(f.cos.data, f.q.dtype, {F::T, F::Hq, F::D});
        return a;
      },
      kBoth, kCosSin);
  add(
      "k_out overlaps sin", invalid({"k_out", "overlaps", "sin"}),
      [](F& f) {
        RopeArgs a = rope_args(f, true);
        a.o.k_out = Tensor(f.sin.at(4), f.q.dtype, {F::T, F::Hk, F::D});
        return a;
      },
      kBoth, kCosSin);
  add(
      "q_out is the cache's own table", invalid({"q_out", "overlaps", "cache"}),
      [](F& f) {
        RopeArgs a = rope_args(f, true);
        a.o.q_out = Tensor(const_cast<float*>(f.cache.data()), DType::float32, {F::T, F::Hq, F::D});
        a.k.reset();
        a.o.k_out.reset();
        return a;
      },
      kCpp, kCache);
  add("in place q with a zero head stride overlaps itself", invalid({"q", "overlaps", "itself"}),
      [](F& f) {
        RopeArgs a = rope_args(f);
        a.q = Tensor(f.q.data, f.q.dtype, {F::T, F::Hq, F::D}, {F::Hq * F::D, 0, 1});
        return a;
      });
  add("k_out with overlapping token rows overlaps itself", invalid({"k_out", "overlaps", "itself"}),
      [](F& f) {
        RopeArgs a = rope_args(f, true);
        a.o.k_out = Tensor(f.k_out.data, f.q.dtype, {F::T, F::Hk, F::D}, {3, F::D, 1});
        return a;
      });
  add("an input with a zero stride is fine (k broadcast over tokens)", ok(), [](F& f) {
    RopeArgs a = rope_args(f, true);
    a.k = Tensor(f.k.data, f.q.dtype, {F::T, F::Hk, F::D}, {0, F::D, 1});
    return a;
  });

  // NaN and infinity: per IEEE into the rotated pair only; other pairs and rows stay finite.
  for (DType value : {DType::float32, DType::float16, DType::bfloat16}) {
    RopeCase c;
    c.name = std::string("NaN and infinity in q, ") + embrope::dtype_name(value);
    c.expect = ok();
    c.value = value;
    c.make = [](F& f) {
      f.positions.set_index(0, 3);  // sin and cos both nonzero
      f.q.set(0, kNaN);             // pair (0, 4) of token 0, head 0 (neox)
      f.q.set(F::D + 1, kInf);      // pair (1, 5) of token 0, head 1
      f.arena.seal();
      return rope_args(f, true);
    };
    c.after = [](const RopeFixture& f) {
      for (std::int64_t i = 0; i < F::T * F::Hq * F::D; ++i) {
        const bool hit = i == 0 || i == 4 || i == F::D + 1 || i == F::D + 5;
        INFO("q_out[" << i << "] = " << f.q_out.get(i));
        CHECK(std::isfinite(f.q_out.get(i)) == !hit);
      }
      CHECK(std::isnan(f.q_out.get(0)));
      CHECK(std::isnan(f.q_out.get(4)));
      for (std::int64_t i = 0; i < F::T * F::Hk * F::D; ++i) CHECK(std::isfinite(f.k_out.get(i)));
    };
    cases.push_back(c);
    c.name = std::string("NaN in the cos table, ") + embrope::dtype_name(value);
    c.tables = kCosSin;
    c.make = [](F& f) {
      f.cos.set(3 * F::R / 2 + 2, kNaN);  // position 3, pair 2
      f.positions.set_index(0, 3);
      f.arena.seal();
      return rope_args(f, true);
    };
    c.after = [](const RopeFixture& f) {
      // Token 0 (position 3): pair (2, 6) of every head of q and k is NaN, the rest finite.
      for (std::int64_t i = 0; i < F::T * F::Hq * F::D; ++i) {
        const bool hit = i < F::Hq * F::D && (i % F::D == 2 || i % F::D == 6);
        INFO("q_out[" << i << "]");
        CHECK(std::isnan(f.q_out.get(i)) == hit);
      }
      for (std::int64_t i = 0; i < F::T * F::Hk * F::D; ++i) {
        const bool hit = i < F::Hk * F::D && (i % F::D == 2 || i % F::D == 6);
        CHECK(std::isnan(f.k_out.get(i)) == hit);
      }
    };
    cases.push_back(c);
  }
  return cases;
}

// mrope options through the C API.
std::vector<ArenaCase> mrope_cases() {
  std::vector<ArenaCase> cases;
  struct Mrope {
    std::string name;
    std::int64_t s0, s1, s2;
    bool three_streams;
    Expect expect;
  };
  const std::vector<Mrope> mrope = {
      {"valid", 2, 3, 3, true, ok()},
      {"sections not summing to R/2", 2, 3, 4, true, invalid({"mrope_section", "rotary_dim / 2"})},
      {"a negative section", -1, 4, 5, true, invalid({"mrope_section", "non-negative"})},
      {"INT64_MIN sections", kI64Min, kI64Max, 8, true, invalid({"mrope_section"})},
      {"positions without the stream dimension", 2, 3, 3, false, invalid({"positions"})},
  };
  for (const Mrope& k : mrope) {
    cases.push_back({"embrope_apply_rope mrope " + k.name, "embrope_apply_rope", k.expect,
                     Surface::c, [k](Arena& arena) {
                       const std::int64_t t = 2, h = 1, d = 16;
                       Region q = arena.region(DType::float32, t * h * d);
                       Region pos = arena.region(DType::int64, 3 * t);
                       for (std::int64_t i = 0; i < t * h * d; ++i) q.set(i, 1.0);
                       for (std::int64_t i = 0; i < 3 * t; ++i) pos.set_index(i, i % 4);
                       embrope_rope_config_t c;
                       embrope_rope_config_init(&c);
                       c.rotary_dim = d;
                       c.max_positions = 8;
                       embrope_rope_cache_t* handle = nullptr;
                       REQUIRE(embrope_rope_cache_create(&c, DLDevice{kDLCPU, 0}, nullptr,
                                                         &handle) == EMBROPE_OK);
                       arena.seal();
                       DLView qv(view_of(q, {t, h, d}));
                       DLView pv(k.three_streams ? view_of(pos, {3, t}) : view_of(pos, {t}));
                       embrope_rope_options_t o;
                       embrope_rope_options_init(&o);
                       o.mrope_section[0] = k.s0;
                       o.mrope_section[1] = k.s1;
                       o.mrope_section[2] = k.s2;
                       const Outcome out = from_status(
                           embrope_apply_rope(qv.get(), nullptr, pv.get(), handle, &o, nullptr));
                       embrope_rope_cache_destroy(handle);
                       return out;
                     }});
  }
  return cases;
}

}  // namespace

std::vector<hostile::CaseName> apply_rope_hostile_case_names() {
  std::vector<hostile::CaseName> names;
  for (const RopeCase& r : rope_cases()) {
    names.push_back({kGroup, r.name, r.surfaces, r.tables == kTables ? 2 : 1});
  }
  for (hostile::CaseName& n : names_of(kMropeGroup, mrope_cases())) names.push_back(n);
  return names;
}

TEST_CASE("hostile inputs: apply_rope with a cache and with cos/sin, C++ and C",
          "[hostile][apply_rope]") {
  run_rope_cases(rope_cases());
  // The init function takes NULL without crashing.
  embrope_rope_options_init(nullptr);
}

TEST_CASE("hostile inputs: apply_rope mrope sections, C", "[hostile][apply_rope][mrope]") {
  run_arena_cases(kMropeGroup, mrope_cases());
}
