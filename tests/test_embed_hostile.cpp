// Hostile inputs to embed and embrope_embed (docs/ops.md, docs/errors.md), one table of cases
// run on both surfaces: null data, bad dtypes and devices, bad sizes and strides, overlapping
// views, shape products past 64 bits, ids and positions at the int32/int64 limits, bad
// options, NaN and infinity in values. The harness is in hostile.hpp.
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

constexpr const char* kGroup = "embed";

struct EmbedFixture {
  static constexpr std::int64_t V = 16, D = 8, B = 2, S = 3, P = 32, Y = 3;
  Arena arena;
  Region table, ids, out, pos_table, pos_ids, offsets, type_table, type_ids;

  explicit EmbedFixture(DType value = DType::float32, DType index = DType::int64) {
    table = arena.region(value, V * D);
    ids = arena.region(index, B * S);
    out = arena.region(value, B * S * D);
    pos_table = arena.region(value, P * D);
    pos_ids = arena.region(index, B * S);
    offsets = arena.region(index, B);
    type_table = arena.region(value, Y * D);
    type_ids = arena.region(index, B * S);
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> u(-2.0, 2.0);
    for (std::int64_t i = 0; i < V * D; ++i) table.set(i, u(rng));
    for (std::int64_t i = 0; i < P * D; ++i) pos_table.set(i, u(rng));
    for (std::int64_t i = 0; i < Y * D; ++i) type_table.set(i, u(rng));
    for (std::int64_t i = 0; i < B * S * D; ++i) out.set(i, u(rng));
    for (std::int64_t i = 0; i < B * S; ++i) {
      ids.set_index(i, (5 * i + 1) % V);
      pos_ids.set_index(i, (7 * i + 2) % P);
      type_ids.set_index(i, i % Y);
    }
    offsets.set_index(0, 0);
    offsets.set_index(1, 5);
  }
};

struct EmbedArgs {
  Tensor table, ids, out;
  embrope::EmbedOptions o;
  DLPatch patch;                                       // C only
  std::function<void(embrope_embed_options_t&)> copt;  // C only
  bool null_options = false;                           // C only
  std::string null_tensor;                             // C only
};

EmbedArgs embed_args(EmbedFixture& f) {
  EmbedArgs a;
  const DType vd = f.table.dtype, id = f.ids.dtype;
  a.table = Tensor(f.table.data, vd, {f.V, f.D});
  a.ids = Tensor(f.ids.data, id, {f.B, f.S});
  a.out = Tensor(f.out.data, vd, {f.B, f.S, f.D});
  return a;
}
// The same with every option in use: learned positions by id, token types.
EmbedArgs embed_args_full(EmbedFixture& f) {
  EmbedArgs a = embed_args(f);
  a.o.positions = embrope::PositionEncoding::learned;
  a.o.position_table = Tensor(f.pos_table.data, f.table.dtype, {f.P, f.D});
  a.o.position_ids = Tensor(f.pos_ids.data, f.ids.dtype, {f.B, f.S});
  a.o.type_table = Tensor(f.type_table.data, f.table.dtype, {f.Y, f.D});
  a.o.type_ids = Tensor(f.type_ids.data, f.ids.dtype, {f.B, f.S});
  return a;
}

Outcome call_embed(Surface s, const EmbedArgs& a) {
  if (s == Surface::cpp) return run_cpp([&] { embrope::embed(a.table, a.ids, a.out, a.o); });
  auto view = [&](const std::string& name, const Tensor& t) {
    auto v = std::make_unique<DLView>(t);
    if (a.patch) a.patch(name, *v);
    if (a.null_tensor == name) v->null = true;
    return v;
  };
  auto table = view("table", a.table), ids = view("ids", a.ids), out = view("out", a.out);
  std::vector<std::unique_ptr<DLView>> keep;
  auto optional = [&](const char* name, const std::optional<Tensor>& t) -> const DLTensor* {
    if (!t) return nullptr;
    keep.push_back(view(name, *t));
    return keep.back()->get();
  };
  embrope_embed_options_t o;
  embrope_embed_options_init(&o);
  o.scale = a.o.scale;
  o.vocab_start = a.o.vocab_start;
  o.vocab_shard = a.o.vocab_shard ? 1 : 0;
  o.positions = static_cast<embrope_position_encoding_t>(a.o.positions);
  o.position_table = optional("position_table", a.o.position_table);
  o.sinusoid_base = a.o.sinusoid_base;
  o.sinusoid_layout = static_cast<embrope_sinusoid_layout_t>(a.o.sinusoid_layout);
  o.position_ids = optional("position_ids", a.o.position_ids);
  o.position_offsets = optional("position_offsets", a.o.position_offsets);
  o.type_table = optional("type_table", a.o.type_table);
  o.type_ids = optional("type_ids", a.o.type_ids);
  if (a.copt) a.copt(o);
  return from_status(
      embrope_embed(table->get(), ids->get(), out->get(), a.null_options ? nullptr : &o, nullptr));
}

struct EmbedCase {
  std::string name;
  Expect expect;
  std::function<EmbedArgs(EmbedFixture&)> make;
  int surfaces = kBoth;
  // Extra checks of the outputs after a successful call.
  std::function<void(const EmbedFixture&)> after;
  DType value = DType::float32, index = DType::int64;
};

void run_embed_cases(const std::vector<EmbedCase>& cases) {
  for (const EmbedCase& c : cases) {
    for (Surface s : {Surface::cpp, Surface::c}) {
      if ((c.surfaces & (s == Surface::cpp ? kCpp : kC)) == 0) continue;
      const std::string op = s == Surface::cpp ? "embed" : "embrope_embed";
      DYNAMIC_SECTION(op << ": " << c.name) {
        EmbedFixture f(c.value, c.index);
        f.arena.seal();
        // Building the arguments may itself throw (a Tensor of rank 9): that is the outcome.
        Outcome got;
        std::optional<EmbedArgs> args;
        got = run_cpp([&] { args = c.make(f); });
        if (args) got = call_embed(s, *args);
        check_outcome(got, c.expect, got.message.rfind("Tensor: ", 0) == 0 ? "Tensor" : op,
                      f.arena);
        if (c.after && (got.ok || got.code == ErrorCode::index_out_of_range)) c.after(f);
        count(kGroup, s);
      }
    }
  }
}

// Element offsets of out rows: out [B, S, D] contiguous, row n at n * D.
void expect_row_zero(const EmbedFixture& f, std::int64_t row) {
  for (std::int64_t j = 0; j < f.D; ++j) CHECK(f.out.get(row * f.D + j) == 0.0);
}

std::vector<EmbedCase> embed_cases() {
  using F = EmbedFixture;
  std::vector<EmbedCase> cases;
  auto add = [&](std::string name, Expect e, std::function<EmbedArgs(F&)> make,
                 int surfaces = kBoth) {
    cases.push_back({std::move(name), std::move(e), std::move(make), surfaces, nullptr});
  };

  // Null data with a nonzero size, in every tensor argument.
  struct Named {
    const char* name;
    std::function<Tensor&(EmbedArgs&)> get;
    bool value;  // a value tensor (else an index tensor)
  };
  const std::vector<Named> tensors = {
      {"table", [](EmbedArgs& a) -> Tensor& { return a.table; }, true},
      {"ids", [](EmbedArgs& a) -> Tensor& { return a.ids; }, false},
      {"out", [](EmbedArgs& a) -> Tensor& { return a.out; }, true},
      {"position_table", [](EmbedArgs& a) -> Tensor& { return *a.o.position_table; }, true},
      {"position_ids", [](EmbedArgs& a) -> Tensor& { return *a.o.position_ids; }, false},
      {"type_table", [](EmbedArgs& a) -> Tensor& { return *a.o.type_table; }, true},
      {"type_ids", [](EmbedArgs& a) -> Tensor& { return *a.o.type_ids; }, false},
  };
  auto rebuilt = [](const Tensor& t, void* data, DType dtype, std::vector<std::int64_t> shape,
                    std::vector<std::int64_t> strides, Device device) {
    (void)t;
    return Tensor(data, dtype, static_cast<int>(shape.size()), shape.data(),
                  strides.empty() ? nullptr : strides.data(), device);
  };
  auto shape_of = [](const Tensor& t) {
    return std::vector<std::int64_t>(t.shape(), t.shape() + t.ndim());
  };
  auto strides_of = [](const Tensor& t) {
    return std::vector<std::int64_t>(t.strides(), t.strides() + t.ndim());
  };

  for (const Named& n : tensors) {
    const std::string name = n.name;
    auto get = n.get;
    add(name + " has null data", invalid({name, "null"}), [=](F& f) {
      EmbedArgs a = embed_args_full(f);
      Tensor& t = get(a);
      t = rebuilt(t, nullptr, t.dtype(), shape_of(t), strides_of(t), t.device());
      return a;
    });
    const std::vector<DType> wrong =
        n.value ? std::vector<DType>{DType::int32, DType::int64}
                : std::vector<DType>{DType::float32, DType::float16, DType::bfloat16};
    for (DType d : wrong) {
      add(name + " has dtype " + embrope::dtype_name(d), invalid({name, "dtype"}), [=](F& f) {
        EmbedArgs a = embed_args_full(f);
        Tensor& t = get(a);
        t = rebuilt(t, t.data(), d, shape_of(t), strides_of(t), t.device());
        return a;
      });
    }
    // A dtype value outside the enum (C++ only: DLPack has its own cases below).
    add(
        name + " has an unknown dtype", invalid({name, "dtype"}),
        [=](F& f) {
          EmbedArgs a = embed_args_full(f);
          Tensor& t = get(a);
          t = rebuilt(t, t.data(), static_cast<DType>(42), shape_of(t), strides_of(t), t.device());
          return a;
        },
        kCpp);
    add(name + " is on cuda:0", on_cuda({}), [=](F& f) {
      EmbedArgs a = embed_args_full(f);
      Tensor& t = get(a);
      t = rebuilt(t, t.data(), t.dtype(), shape_of(t), strides_of(t), Device::cuda(0));
      return a;
    });
    add(
        name + " is on an unknown device kind", invalid({}),
        [=](F& f) {
          EmbedArgs a = embed_args_full(f);
          Tensor& t = get(a);
          t = rebuilt(t, t.data(), t.dtype(), shape_of(t), strides_of(t),
                      Device{static_cast<embrope::DeviceKind>(9), 0});
          return a;
        },
        kCpp);
    for (int dim = 0; dim < 2; ++dim) {
      add(name + " has a negative size in dimension " + std::to_string(dim),
          invalid({name, "negative", "size"}), [=](F& f) {
            EmbedArgs a = embed_args_full(f);
            Tensor& t = get(a);
            auto shape = shape_of(t);
            shape[dim] = -shape[dim];
            t = rebuilt(t, t.data(), t.dtype(), shape, strides_of(t), t.device());
            return a;
          });
      add(name + " has a negative stride in dimension " + std::to_string(dim),
          invalid({name, "negative", "stride"}), [=](F& f) {
            EmbedArgs a = embed_args_full(f);
            Tensor& t = get(a);
            auto strides = strides_of(t);
            strides[dim] = -strides[dim];
            t = rebuilt(t, t.data(), t.dtype(), shape_of(t), strides, t.device());
            return a;
          });
    }
    add(name + " has INT64_MIN as a stride", invalid({name, "negative", "stride"}), [=](F& f) {
      EmbedArgs a = embed_args_full(f);
      Tensor& t = get(a);
      auto strides = strides_of(t);
      strides[0] = kI64Min;
      t = rebuilt(t, t.data(), t.dtype(), shape_of(t), strides, t.device());
      return a;
    });
    add(name + " has a shape whose product overflows int64", invalid({name, "2^60"}), [=](F& f) {
      EmbedArgs a = embed_args_full(f);
      Tensor& t = get(a);
      auto shape = shape_of(t);
      shape[0] = std::int64_t{1} << 40;
      shape[1] = std::int64_t{1} << 40;
      t = rebuilt(t, t.data(), t.dtype(), shape, {}, t.device());  // contiguous strides
      return a;
    });
    add(name + " has a stride that reaches past 2^60 elements", invalid({name, "2^60"}), [=](F& f) {
      EmbedArgs a = embed_args_full(f);
      Tensor& t = get(a);
      auto strides = strides_of(t);
      strides[0] = kI64Max / 2;
      t = rebuilt(t, t.data(), t.dtype(), shape_of(t), strides, t.device());
      return a;
    });
    add(name + " reaches past the end of the address space", invalid({name, "address"}), [=](F& f) {
      EmbedArgs a = embed_args_full(f);
      Tensor& t = get(a);
      void* top = reinterpret_cast<void*>(~std::uintptr_t{0} - 15);  // 16-byte aligned
      t = rebuilt(t, top, t.dtype(), shape_of(t), strides_of(t), t.device());
      return a;
    });
    add(name + " has a data pointer that is not a multiple of its element size",
        invalid({name, "data pointer", "element size"}), [=](F& f) {
          EmbedArgs a = embed_args_full(f);
          Tensor& t = get(a);
          // Rejected before any access, so the view may reach one byte past its region.
          void* odd = static_cast<unsigned char*>(t.data()) + 1;
          t = rebuilt(t, odd, t.dtype(), shape_of(t), strides_of(t), t.device());
          return a;
        });
    if (n.value) {
      add(name + " has a last stride of 2", invalid({name, "stride", "last"}), [=](F& f) {
        EmbedArgs a = embed_args_full(f);
        Tensor& t = get(a);
        auto shape = shape_of(t);
        auto strides = strides_of(t);
        shape.back() = 4;  // still inside its region with stride 2
        strides.back() = 2;
        t = rebuilt(t, t.data(), t.dtype(), shape, strides, t.device());
        return a;
      });
    }
    // DLPack spellings that embrope does not take (C only).
    const std::vector<std::pair<std::string, DLDataType>> dl_wrong = {
        {"lanes", DLDataType{kDLFloat, 32, 4}},       {"lanes", DLDataType{kDLInt, 64, 2}},
        {"lanes", DLDataType{kDLFloat, 32, 0}},       {"bits", DLDataType{kDLFloat, 64, 1}},
        {"bits", DLDataType{kDLFloat, 8, 1}},         {"bits", DLDataType{kDLInt, 16, 1}},
        {"bits", DLDataType{kDLInt, 7, 1}},           {"bits", DLDataType{kDLBfloat, 32, 1}},
        {"code", DLDataType{kDLUInt, 32, 1}},         {"code", DLDataType{kDLUInt, 64, 1}},
        {"code", DLDataType{kDLOpaqueHandle, 64, 1}}, {"code", DLDataType{kDLComplex, 64, 1}},
        {"code", DLDataType{kDLUInt, 16, 1}},         {"code", DLDataType{200, 32, 1}},
    };
    for (const auto& [what, dt] : dl_wrong) {
      const DLDataType d = dt;
      add(
          name + " has DLPack dtype code " + std::to_string(d.code) + " bits " +
              std::to_string(d.bits) + " lanes " + std::to_string(d.lanes),
          invalid({name, "DLPack", "dtype", what}),
          [=](F& f) {
            EmbedArgs a = embed_args_full(f);
            a.patch = patch_of(name, [=](DLView& v) { v.t.dtype = d; });
            return a;
          },
          kC);
    }
    for (std::int32_t ndim : {std::int32_t{-1}, std::int32_t{9}, std::int32_t{64},
                              static_cast<std::int32_t>(kI32Min)}) {
      add(
          name + " has ndim " + std::to_string(ndim), invalid({name, "ndim"}),
          [=](F& f) {
            EmbedArgs a = embed_args_full(f);
            a.patch = patch_of(name, [=](DLView& v) {
              v.shape.assign(ndim > 0 ? static_cast<std::size_t>(ndim) : 0, 1);
              v.strides.assign(v.shape.size(), 1);
              v.sync();
              v.t.ndim = ndim;
            });
            return a;
          },
          kC);
    }
    add(
        name + " has a null shape", invalid({name, "null", "shape"}),
        [=](F& f) {
          EmbedArgs a = embed_args_full(f);
          a.patch = patch_of(name, [](DLView& v) { v.t.shape = nullptr; });
          return a;
        },
        kC);
    add(
        name + " has a byte_offset that is not a multiple of its element size",
        invalid({name, "byte_offset"}),
        [=](F& f) {
          EmbedArgs a = embed_args_full(f);
          a.patch = patch_of(name, [](DLView& v) { v.t.byte_offset = 1; });
          return a;
        },
        kC);
    add(
        name + " has a byte_offset that wraps the address space",
        invalid({name, "byte_offset", "wraps"}),
        [=](F& f) {
          EmbedArgs a = embed_args_full(f);
          a.patch = patch_of(name, [](DLView& v) {
            v.t.byte_offset = ~std::uint64_t{0} - 7;  // a multiple of 8, 4 and 2
          });
          return a;
        },
        kC);
    for (DLDeviceType dev : {kDLCUDAHost, kDLCUDAManaged, kDLOpenCL, kDLROCM, kDLExtDev}) {
      add(
          name + " has DLPack device type " + std::to_string(dev), invalid({name, "device"}),
          [=](F& f) {
            EmbedArgs a = embed_args_full(f);
            a.patch = patch_of(name, [=](DLView& v) { v.t.device.device_type = dev; });
            return a;
          },
          kC);
    }
    add(
        name + " is a NULL DLTensor*", invalid({name, "null"}),
        [=](F& f) {
          EmbedArgs a = embed_args_full(f);
          a.null_tensor = name;
          // Optional tensors passed as NULL are simply absent; the call then fails for the
          // options that need them, or succeeds.
          return a;
        },
        kC);
  }
  // A NULL optional tensor is absence, not an error, except where the options need it: fix
  // the expectations of those cases.
  for (EmbedCase& c : cases) {
    if (c.name == "position_table is a NULL DLTensor*") {
      c.expect = invalid({"learned", "position_table"});
    } else if (c.name == "position_ids is a NULL DLTensor*") {
      c.expect = ok();  // implicit positions s instead
    } else if (c.name == "type_table is a NULL DLTensor*" ||
               c.name == "type_ids is a NULL DLTensor*") {
      c.expect = invalid({"type_table", "type_ids"});
    }
  }

  // Ranks.
  add("ids of rank 8 (out would need 9)", invalid({"ids", "dimensions"}), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.ids = Tensor(f.ids.data, f.ids.dtype, {1, 1, 1, 1, 1, 1, 1, 1});
    return a;
  });
  add(
      "out of rank 9", invalid({"ndim"}),
      [](F& f) {
        EmbedArgs a = embed_args(f);
        const std::int64_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
        a.out = Tensor(f.out.data, f.out.dtype, 9, shape, nullptr);
        return a;
      },
      kCpp);
  add("table of rank 1", invalid({"table", "dimensions"}), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.table = Tensor(f.table.data, f.table.dtype, {F::V * F::D});
    return a;
  });
  add("table of rank 0", invalid({"table", "dimensions"}), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.table = Tensor(f.table.data, f.table.dtype, 0, nullptr, nullptr);
    return a;
  });
  add("ids of rank 0 (one id) is fine", ok(), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.ids = Tensor(f.ids.data, f.ids.dtype, 0, nullptr, nullptr);
    a.out = Tensor(f.out.data, f.out.dtype, {F::D});
    return a;
  });
  add("out with the wrong D", invalid({"out", "D"}), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.out = Tensor(f.out.data, f.out.dtype, {F::B, F::S, F::D - 2});
    return a;
  });
  add("out with the wrong batch", invalid({"out", "ids"}), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.out = Tensor(f.out.data, f.out.dtype, {1, F::S, F::D});
    return a;
  });
  add("out of another dtype than table", invalid({"out", "dtype"}), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.out = Tensor(f.out.data, DType::float16, {F::B, F::S, F::D});
    return a;
  });
  add("position_ids shaped unlike ids", invalid({"position_ids", "shape"}), [](F& f) {
    EmbedArgs a = embed_args_full(f);
    a.o.position_ids = Tensor(f.pos_ids.data, f.pos_ids.dtype, {F::S, F::B});
    return a;
  });

  // Zero sizes: nothing to do, nothing touched.
  add("ids with zero tokens", ok(), [](F& f) {
    EmbedArgs a = embed_args_full(f);
    a.ids = Tensor(f.ids.data, f.ids.dtype, {F::B, 0});
    a.out = Tensor(f.out.data, f.out.dtype, {F::B, 0, F::D});
    a.o.position_ids = Tensor(f.pos_ids.data, f.pos_ids.dtype, {F::B, 0});
    a.o.type_ids = Tensor(f.type_ids.data, f.type_ids.dtype, {F::B, 0});
    return a;
  });
  add("null data with zero tokens is fine", ok(), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.ids = Tensor(nullptr, f.ids.dtype, {0});
    a.out = Tensor(nullptr, f.out.dtype, {0, F::D});
    return a;
  });
  add("a table with zero rows and a bad id", bad_index({"ids[0]", "vocabulary"}), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.table = Tensor(f.table.data, f.table.dtype, {0, F::D});
    return a;
  });
  add("D of zero", ok(), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.table = Tensor(f.table.data, f.table.dtype, {F::V, 0});
    a.out = Tensor(f.out.data, f.out.dtype, {F::B, F::S, 0});
    return a;
  });

  // Ids, positions and type ids at the limits: rows zero-filled, first one reported.
  for (DType index : {DType::int32, DType::int64}) {
    const bool i32 = index == DType::int32;
    const std::vector<std::int64_t> bad_ids =
        i32 ? std::vector<std::int64_t>{-1, F::V, kI32Min, kI32Max}
            : std::vector<std::int64_t>{-1,      F::V,   kI32Min, kI32Max, std::int64_t{1} << 32,
                                        kI64Min, kI64Max};
    for (std::int64_t bad : bad_ids) {
      const std::string tag = std::string(embrope::dtype_name(index)) + " " + std::to_string(bad);
      EmbedCase c{"ids[4] = " + tag,
                  bad_index({"ids[4]", std::to_string(bad)}),
                  [=](F& f) {
                    f.ids.set_index(4, bad);
                    f.arena.seal();
                    return embed_args(f);
                  },
                  kBoth,
                  nullptr,
                  DType::float32,
                  index};
      cases.push_back(c);
      c.name = "position_ids[1] = " + tag;
      c.expect = bad_index({"position_ids[1]", std::to_string(bad)});
      c.make = [=](F& f) {
        f.pos_ids.set_index(1, bad == F::V ? F::P : bad);
        f.arena.seal();
        return embed_args_full(f);
      };
      if (bad == F::V) c.expect = bad_index({"position_ids[1]", std::to_string(F::P)});
      cases.push_back(c);
      c.name = "type_ids[5] = " + tag;
      c.expect = bad_index({"type_ids[5]", std::to_string(bad == F::V ? F::Y : bad)});
      c.make = [=](F& f) {
        f.type_ids.set_index(5, bad == F::V ? F::Y : bad);
        f.arena.seal();
        return embed_args_full(f);
      };
      cases.push_back(c);
      c.name = "position_offsets[1] = " + tag + " (implicit positions)";
      c.expect = bad_index({"ids[3]"});  // row 3 is (b = 1, s = 0), the first of batch row 1
      c.make = [=](F& f) {
        f.offsets.set_index(1, bad == F::V ? F::P : bad);
        f.arena.seal();
        EmbedArgs a = embed_args(f);
        a.o.positions = embrope::PositionEncoding::learned;
        a.o.position_table = Tensor(f.pos_table.data, f.table.dtype, {F::P, F::D});
        a.o.position_offsets = Tensor(f.offsets.data, f.offsets.dtype, {F::B});
        return a;
      };
      c.after = nullptr;
      cases.push_back(c);
    }
  }
  cases.push_back({"the first of several bad ids is reported and every bad row is zero",
                   bad_index({"ids[1]", "-7"}),
                   [](F& f) {
                     f.ids.set_index(1, -7);
                     f.ids.set_index(4, F::V + 3);
                     f.arena.seal();
                     return embed_args(f);
                   },
                   kBoth,
                   [](const EmbedFixture& f) {
                     expect_row_zero(f, 1);
                     expect_row_zero(f, 4);
                   }});
  add("a shard with INT64_MIN and INT64_MAX ids gives zero rows", ok(), [](F& f) {
    f.ids.set_index(0, kI64Min);
    f.ids.set_index(2, kI64Max);
    f.arena.seal();
    EmbedArgs a = embed_args(f);
    a.o.vocab_shard = true;
    a.o.vocab_start = 100;
    return a;
  });
  cases.back().after = [](const EmbedFixture& f) {
    for (std::int64_t row = 0; row < F::B * F::S; ++row) expect_row_zero(f, row);
  };
  add("sinusoidal implicit positions with an offset of INT64_MAX",
      bad_index({"position_offsets", std::to_string(kI64Max)}), [](F& f) {
        f.offsets.set_index(1, kI64Max);
        f.arena.seal();
        EmbedArgs a = embed_args(f);
        a.o.positions = embrope::PositionEncoding::sinusoidal;
        a.o.position_offsets = Tensor(f.offsets.data, f.offsets.dtype, {F::B});
        return a;
      });

  // Options.
  for (double scale : {kNaN, kInf, -kInf}) {
    add("scale " + std::to_string(scale), invalid({"scale", "finite"}), [=](F& f) {
      EmbedArgs a = embed_args(f);
      a.o.scale = static_cast<float>(scale);
      return a;
    });
  }
  for (std::int64_t start : {std::int64_t{-1}, kI64Min}) {
    add("vocab_start " + std::to_string(start), invalid({"vocab_start", "negative"}), [=](F& f) {
      EmbedArgs a = embed_args(f);
      a.o.vocab_start = start;
      return a;
    });
  }
  add("vocab_start + V overflows int64", invalid({"vocab_start", "overflows"}), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.o.vocab_start = kI64Max - 3;
    return a;
  });
  for (double base : {0.0, -1.0, 0.5, kNaN, kInf}) {
    add("sinusoid_base " + std::to_string(base), invalid({"sinusoid_base"}), [=](F& f) {
      EmbedArgs a = embed_args(f);
      a.o.positions = embrope::PositionEncoding::sinusoidal;
      a.o.sinusoid_base = base;
      return a;
    });
  }
  add("sinusoidal positions with an odd D", invalid({"even", "D"}), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.o.positions = embrope::PositionEncoding::sinusoidal;
    a.table = Tensor(f.table.data, f.table.dtype, {F::V, 7});
    a.out = Tensor(f.out.data, f.out.dtype, {F::B, F::S, 7});
    return a;
  });
  add("learned positions without a table", invalid({"learned", "position_table"}), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.o.positions = embrope::PositionEncoding::learned;
    return a;
  });
  add("a position table with positions none", invalid({"position", "none"}), [](F& f) {
    EmbedArgs a = embed_args_full(f);
    a.o.positions = embrope::PositionEncoding::none;
    return a;
  });
  add("sinusoidal positions with a position table", invalid({"position_table", "sinusoidal"}),
      [](F& f) {
        EmbedArgs a = embed_args_full(f);
        a.o.positions = embrope::PositionEncoding::sinusoidal;
        return a;
      });
  add("position_ids and position_offsets together", invalid({"position_ids", "exclusive"}),
      [](F& f) {
        EmbedArgs a = embed_args_full(f);
        a.o.position_offsets = Tensor(f.offsets.data, f.offsets.dtype, {F::B});
        return a;
      });
  add("implicit positions for ids of rank 3", invalid({"implicit", "ids"}), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.o.positions = embrope::PositionEncoding::sinusoidal;
    a.ids = Tensor(f.ids.data, f.ids.dtype, {1, F::B, F::S});
    a.out = Tensor(f.out.data, f.out.dtype, {1, F::B, F::S, F::D});
    return a;
  });
  add("position_offsets of the wrong batch", invalid({"position_offsets", "batch"}), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.o.positions = embrope::PositionEncoding::sinusoidal;
    a.o.position_offsets = Tensor(f.offsets.data, f.offsets.dtype, {1});
    return a;
  });
  add("type_table without type_ids", invalid({"type_table", "type_ids"}), [](F& f) {
    EmbedArgs a = embed_args_full(f);
    a.o.type_ids.reset();
    return a;
  });
  add("position_table with another D", invalid({"position_table", "D"}), [](F& f) {
    EmbedArgs a = embed_args_full(f);
    a.o.position_table = Tensor(f.pos_table.data, f.table.dtype, {F::P, F::D / 2});
    return a;
  });
  add("type_table of another dtype", invalid({"type_table", "dtype"}), [](F& f) {
    EmbedArgs a = embed_args_full(f);
    a.o.type_table = Tensor(f.type_table.data, DType::bfloat16, {F::Y, F::D});
    return a;
  });
  for (int v : {3, -1, 1 << 30}) {
    add(
        "C positions enum " + std::to_string(v), invalid({"positions"}),
        [=](F& f) {
          EmbedArgs a = embed_args(f);
          a.copt = [=](embrope_embed_options_t& o) { std::memcpy(&o.positions, &v, sizeof v); };
          return a;
        },
        kC);
    add(
        "C sinusoid_layout enum " + std::to_string(v), invalid({"sinusoid_layout"}),
        [=](F& f) {
          EmbedArgs a = embed_args(f);
          a.copt = [=](embrope_embed_options_t& o) {
            std::memcpy(&o.sinusoid_layout, &v, sizeof v);
          };
          return a;
        },
        kC);
  }
  add(
      "NULL options are the defaults", ok(),
      [](F& f) {
        EmbedArgs a = embed_args(f);
        a.null_options = true;
        return a;
      },
      kC);
  add(
      "C options with a NULL position_table for learned positions",
      invalid({"learned", "position_table"}),
      [](F& f) {
        EmbedArgs a = embed_args(f);
        a.copt = [](embrope_embed_options_t& o) { o.positions = EMBROPE_POSITIONS_LEARNED; };
        return a;
      },
      kC);

  // Overlapping views: out must share no memory with any input, nor with itself.
  add("out overlaps table", invalid({"out", "overlaps", "table"}), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.out = Tensor(f.table.at(3), f.out.dtype, {F::B, F::S, F::D});
    return a;
  });
  add("out is exactly the table's view (embed has no in-place form)",
      invalid({"out", "overlaps", "table"}), [](F& f) {
        EmbedArgs a = embed_args(f);
        a.ids = Tensor(f.ids.data, f.ids.dtype, {2});
        a.table = Tensor(f.table.data, f.table.dtype, {2, F::D});
        a.out = Tensor(f.table.data, f.table.dtype, {2, F::D});
        return a;
      });
  add("out overlaps the ids", invalid({"out", "overlaps", "ids"}), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.ids = Tensor(f.out.at(2), f.ids.dtype, {F::B, F::S});
    return a;
  });
  add("out overlaps the position table", invalid({"out", "overlaps", "position_table"}), [](F& f) {
    EmbedArgs a = embed_args_full(f);
    a.out = Tensor(f.pos_table.at(F::D), f.out.dtype, {F::B, F::S, F::D});
    return a;
  });
  add("out overlaps the type ids", invalid({"out", "overlaps", "type_ids"}), [](F& f) {
    EmbedArgs a = embed_args_full(f);
    a.o.type_ids = Tensor(f.out.at(F::D * 5), f.type_ids.dtype, {F::B, F::S}, {1, 2});
    return a;
  });
  add("out overlaps the position offsets", invalid({"out", "overlaps", "position_offsets"}),
      [](F& f) {
        EmbedArgs a = embed_args(f);
        a.o.positions = embrope::PositionEncoding::sinusoidal;
        a.o.position_offsets = Tensor(f.out.at(F::B * F::S * F::D - 4), DType::int64, {F::B});
        return a;
      });
  add("out with a zero stride overlaps itself", invalid({"out", "overlaps", "itself"}), [](F& f) {
    EmbedArgs a = embed_args(f);
    a.out = Tensor(f.out.data, f.out.dtype, {F::B, F::S, F::D}, {F::S * F::D, 0, 1});
    return a;
  });
  add("out rows that overlap by half a row overlap itself", invalid({"out", "overlaps", "itself"}),
      [](F& f) {
        EmbedArgs a = embed_args(f);
        a.out = Tensor(f.out.data, f.out.dtype, {F::B, F::S, F::D}, {F::S * F::D, F::D / 2, 1});
        return a;
      });
  add("out rows interleaved with the table's rows without sharing a byte", ok(), [](F& f) {
    // table rows at even multiples of D, out rows at odd ones, all in the table's region.
    EmbedArgs a = embed_args(f);
    a.table = Tensor(f.table.data, f.table.dtype, {F::V / 2, F::D}, {2 * F::D, 1});
    a.out =
        Tensor(f.table.at(F::D), f.table.dtype, {F::B, F::S, F::D}, {F::S * 2 * F::D, 2 * F::D, 1});
    for (std::int64_t i = 0; i < F::B * F::S; ++i) f.ids.set_index(i, i % 2);  // rows 0, 1
    f.arena.seal();
    return a;
  });
  cases.back().after = [](const EmbedFixture& f) {
    // out row n (table row 2n + 1) now holds table row ids[n], which is row 0 or 2.
    for (std::int64_t n = 0; n < F::B * F::S; ++n) {
      for (std::int64_t j = 0; j < F::D; ++j) {
        CHECK(f.table.get((2 * n + 1) * F::D + j) == f.table.get((n % 2) * 2 * F::D + j));
      }
    }
  };

  // NaN and infinity propagate per IEEE in every value dtype; other rows are untouched.
  for (DType value : {DType::float32, DType::float16, DType::bfloat16}) {
    EmbedCase c;
    c.name = std::string("NaN and infinity in the tables, ") + embrope::dtype_name(value);
    c.expect = ok();
    c.value = value;
    c.make = [](F& f) {
      // ids row 0 -> token 1; pos_ids row 0 -> position 2; type_ids row 0 -> type 0.
      f.ids.set_index(0, 1);
      f.pos_ids.set_index(0, 2);
      f.type_ids.set_index(0, 0);
      f.table.set(1 * F::D + 0, kNaN);
      f.table.set(1 * F::D + 1, kInf);
      f.table.set(1 * F::D + 2, kInf);
      f.pos_table.set(2 * F::D + 2, -kInf);  // inf + -inf = NaN
      f.pos_table.set(2 * F::D + 3, -kInf);
      f.arena.seal();
      return embed_args_full(f);
    };
    c.after = [](const EmbedFixture& f) {
      CHECK(std::isnan(f.out.get(0)));
      CHECK(f.out.get(1) == kInf);
      CHECK(std::isnan(f.out.get(2)));
      CHECK(f.out.get(3) == -kInf);
      for (std::int64_t j = 4; j < F::B * F::S * F::D; ++j) CHECK(std::isfinite(f.out.get(j)));
    };
    cases.push_back(c);
  }
  return cases;
}

}  // namespace

std::vector<hostile::CaseName> embed_hostile_case_names() {
  std::vector<hostile::CaseName> names;
  for (const EmbedCase& e : embed_cases()) names.push_back({kGroup, e.name, e.surfaces, 1});
  return names;
}

TEST_CASE("hostile inputs: embed, C++ and C", "[hostile][embed]") {
  run_embed_cases(embed_cases());
  // The init function takes NULL without crashing.
  embrope_embed_options_init(nullptr);
}
