// Hostile inputs to every public entry point, C++ and C (DESIGN.md sections 2 and 5): null
// pointers and tensors, bad dtypes and devices, bad sizes and strides, overlapping views,
// shape products past 64 bits, bad rotary dims, ids and positions at the int32/int64 limits,
// empty caches, bad ranks, NaN and infinity in values.
//
// Every case runs against tensors that live inside guarded regions: each region sits between
// bands of sentinel bytes, which must be intact after the call (and AddressSanitizer, in CI,
// catches any access past a region's allocation). A call rejected as an invalid argument must
// not have written anything at all. Each case asserts the error code and that the message
// starts with the op's (or C function's) name and names the argument and the rule.
//
// The cases are tables: one table per entry point, run once per surface (C++ and C) and, for
// RoPE, once per table kind (RopeCache and caller cos/sin). The total count is printed.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "embrope/embrope.h"
#include "embrope/embrope.hpp"
#include "reference.hpp"
#include "test_support.hpp"

namespace {

using embrope::Device;
using embrope::DType;
using embrope::ErrorCode;
using embrope::Tensor;

constexpr std::int64_t kI64Min = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kI32Min = std::numeric_limits<std::int32_t>::min();
constexpr std::int64_t kI32Max = std::numeric_limits<std::int32_t>::max();
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// ------------------------------------------------------------ guarded memory --------------

constexpr unsigned char kSentinel = 0xa5;
constexpr std::size_t kGuard = 256;

// Typed access to a region of n elements of one dtype (values through the reference codecs).
struct Region {
  unsigned char* data = nullptr;
  DType dtype = DType::float32;
  std::int64_t n = 0;

  void* at(std::int64_t i) const { return data + i * embrope::dtype_size(dtype); }
  void set(std::int64_t i, double v) const {
    switch (dtype) {
      case DType::float32: {
        const float f = static_cast<float>(v);
        std::memcpy(at(i), &f, 4);
        break;
      }
      case DType::float16:
      case DType::bfloat16: {
        const std::uint16_t h = dtype == DType::float16 ? ref::encode_f16(v) : ref::encode_bf16(v);
        std::memcpy(at(i), &h, 2);
        break;
      }
      case DType::int32: {
        const auto x = static_cast<std::int32_t>(v);
        std::memcpy(at(i), &x, 4);
        break;
      }
      case DType::int64: {
        const auto x = static_cast<std::int64_t>(v);
        std::memcpy(at(i), &x, 8);
        break;
      }
    }
  }
  void set_index(std::int64_t i, std::int64_t v) const {
    if (dtype == DType::int32) {
      const auto x = static_cast<std::int32_t>(v);
      std::memcpy(at(i), &x, 4);
    } else {
      std::memcpy(at(i), &v, 8);
    }
  }
  double get(std::int64_t i) const {
    switch (dtype) {
      case DType::float32: {
        float f;
        std::memcpy(&f, at(i), 4);
        return f;
      }
      case DType::float16:
      case DType::bfloat16: {
        std::uint16_t h;
        std::memcpy(&h, at(i), 2);
        return dtype == DType::float16 ? ref::decode_f16(h) : ref::decode_bf16(h);
      }
      default:
        return 0.0;
    }
  }
};

// Regions, each in its own heap block between two sentinel bands.
class Arena {
 public:
  Region region(DType dtype, std::int64_t n) {
    const std::size_t bytes = static_cast<std::size_t>(n) * embrope::dtype_size(dtype);
    Block b;
    b.size = kGuard + bytes + kGuard;
    b.mem = std::make_unique<unsigned char[]>(b.size);
    std::memset(b.mem.get(), kSentinel, b.size);
    blocks_.push_back(std::move(b));
    return Region{blocks_.back().mem.get() + kGuard, dtype, n};
  }
  // Remembers every byte; unchanged() compares with this.
  void seal() {
    sealed_.clear();
    for (const Block& b : blocks_) sealed_.emplace_back(b.mem.get(), b.mem.get() + b.size);
  }
  bool guards_intact() const {
    for (const Block& b : blocks_) {
      for (std::size_t i = 0; i < kGuard; ++i) {
        if (b.mem[i] != kSentinel || b.mem[b.size - 1 - i] != kSentinel) return false;
      }
    }
    return true;
  }
  bool unchanged() const {
    if (sealed_.size() != blocks_.size()) return false;
    for (std::size_t k = 0; k < blocks_.size(); ++k) {
      if (std::memcmp(sealed_[k].data(), blocks_[k].mem.get(), blocks_[k].size) != 0) return false;
    }
    return true;
  }

 private:
  struct Block {
    std::unique_ptr<unsigned char[]> mem;
    std::size_t size = 0;
  };
  std::vector<Block> blocks_;
  std::vector<std::vector<unsigned char>> sealed_;
};

// ------------------------------------------------------------------ C views ----------------

// A DLTensor that owns its shape and strides.
struct DLView {
  std::vector<std::int64_t> shape, strides;
  DLTensor t{};
  bool null = false;  // passed as a NULL DLTensor*

  explicit DLView(const Tensor& x) {
    shape.assign(x.shape(), x.shape() + x.ndim());
    strides.assign(x.strides(), x.strides() + x.ndim());
    t.data = x.data();
    t.device = x.device().kind == embrope::DeviceKind::cpu
                   ? DLDevice{kDLCPU, 0}
                   : DLDevice{kDLCUDA, static_cast<std::int32_t>(x.device().index)};
    t.dtype = dl_dtype(x.dtype());
    sync();
  }
  void sync() {
    t.ndim = static_cast<std::int32_t>(shape.size());
    t.shape = shape.data();
    t.strides = strides.data();
  }
  const DLTensor* get() const { return null ? nullptr : &t; }
};

// Hostility that only the C surface can express, applied to a named DLTensor argument.
using DLPatch = std::function<void(const std::string& name, DLView& view)>;

DLPatch patch_of(const std::string& target, std::function<void(DLView&)> f) {
  return [target, f](const std::string& name, DLView& v) {
    if (name == target) f(v);
  };
}

// ------------------------------------------------------------------ outcomes ----------------

enum class Surface { cpp, c };
constexpr int kCpp = 1, kC = 2, kBoth = kCpp | kC;

struct Outcome {
  bool ok = true;
  ErrorCode code = ErrorCode::ok;
  std::string message;
  bool c_status_known = true;  // C: the status is one of embrope_status_t
};

template <typename F>
Outcome run_cpp(F&& f) {
  Outcome o;
  try {
    f();
  } catch (const embrope::Error& e) {
    o.ok = false;
    o.code = e.code();
    o.message = e.what();
  }
  return o;
}

Outcome from_status(embrope_status_t status) {
  Outcome o;
  const int s = static_cast<int>(status);
  o.c_status_known = s >= EMBROPE_OK && s <= EMBROPE_ERROR_INTERNAL;
  o.ok = status == EMBROPE_OK;
  o.code = static_cast<ErrorCode>(s);
  o.message = embrope_last_error();
  return o;
}

// What a case expects: success, or one of `codes` with a message naming every part.
struct Expect {
  std::vector<ErrorCode> codes;  // empty: success
  std::vector<std::string> parts;
};
Expect ok() {
  return {};
}
Expect invalid(std::vector<std::string> parts) {
  return {{ErrorCode::invalid_argument}, std::move(parts)};
}
Expect bad_index(std::vector<std::string> parts) {
  return {{ErrorCode::index_out_of_range}, std::move(parts)};
}
// A tensor on a CUDA device: without a usable GPU the call cannot run at all
// (not_implemented); with one, mixing it with CPU tensors is an invalid argument.
Expect on_cuda(std::vector<std::string> parts) {
  return {{ErrorCode::invalid_argument, ErrorCode::not_implemented}, std::move(parts)};
}

int g_cases_cpp = 0;
int g_cases_c = 0;

// The checks shared by every case: code, message, guards, nothing written on rejection.
void check_outcome(const Outcome& got, const Expect& want, const std::string& op,
                   const Arena& arena) {
  INFO("message: " << got.message);
  CHECK(got.c_status_known);
  CHECK(arena.guards_intact());
  if (want.codes.empty()) {
    CHECK(got.ok);
    CHECK(got.message.empty());
    return;
  }
  REQUIRE_FALSE(got.ok);
  bool code_ok = false;
  for (ErrorCode c : want.codes) code_ok = code_ok || got.code == c;
  CHECK(code_ok);
  // The message starts with the op's name: "embed: ..." or "embrope_embed: ...".
  CHECK(got.message.rfind(op + ": ", 0) == 0);
  for (const std::string& part : want.parts) {
    INFO("expected the message to mention \"" << part << "\"");
    CHECK(ref::mentions(got.message, part));
  }
  // Validation happens before any kernel runs: a rejected call writes nothing.
  if (got.code == ErrorCode::invalid_argument || got.code == ErrorCode::not_implemented) {
    CHECK(arena.unchanged());
  }
}

void count(Surface s) {
  (s == Surface::cpp ? g_cases_cpp : g_cases_c) += 1;
}

// --------------------------------------------------------------------- embed ----------------

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
        count(s);
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
        {"code", DLDataType{kDLUInt, 8, 1}},          {"code", DLDataType{200, 32, 1}},
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
  for (double base : {0.0, -1.0, kNaN, kInf}) {
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

// ---------------------------------------------------------------------- RoPE ----------------

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
          count(s);
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
          DLDataType{kDLInt, 8, 1}, DLDataType{kDLBfloat, 16, 4}, DLDataType{kDLFloat, 0, 1}}) {
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

// ---------------------------------------------------------------- cache and C misc ----------

struct MiscCase {
  std::string name;
  std::string op;
  Expect expect;
  std::function<Outcome()> run;
  Surface surface;
};

std::vector<MiscCase> misc_cases() {
  std::vector<MiscCase> cases;
  const std::int64_t huge_positions = std::int64_t{1} << 46;  // 2^49 bytes: never allocatable
  struct Config {
    std::string name;
    std::int64_t rotary_dim;
    double base;
    std::int64_t max_positions;
    Expect expect;
  };
  const std::vector<Config> configs = {
      {"rotary_dim 0", 0, 10000.0, 16, invalid({"rotary_dim", "even"})},
      {"rotary_dim 7 (odd)", 7, 10000.0, 16, invalid({"rotary_dim", "7", "even"})},
      {"rotary_dim -2", -2, 10000.0, 16, invalid({"rotary_dim", "-2"})},
      {"rotary_dim INT64_MIN", kI64Min, 10000.0, 16, invalid({"rotary_dim"})},
      {"base 0", 8, 0.0, 16, invalid({"base", "positive"})},
      {"base -1", 8, -1.0, 16, invalid({"base", "positive"})},
      {"base NaN", 8, kNaN, 16, invalid({"base", "finite"})},
      {"base infinity", 8, kInf, 16, invalid({"base", "finite"})},
      {"max_positions 0", 8, 10000.0, 0, invalid({"max_positions", "positive"})},
      {"max_positions -1", 8, 10000.0, -1, invalid({"max_positions", "positive"})},
      {"max_positions INT64_MIN", 8, 10000.0, kI64Min, invalid({"max_positions"})},
      {"max_positions * rotary_dim overflows", 1 << 20, 10000.0, kI64Max / 4,
       invalid({"max_positions", "overflows"})},
      {"a table too large to allocate", 2, 10000.0, huge_positions,
       Expect{{ErrorCode::out_of_memory}, {"allocate"}}},
  };
  for (const Config& c : configs) {
    cases.push_back({"RopeCache " + c.name, "RopeCache", c.expect,
                     [c] {
                       return run_cpp([&] {
                         embrope::RopeCache cache({c.rotary_dim, c.base, c.max_positions});
                       });
                     },
                     Surface::cpp});
    cases.push_back({"embrope_rope_cache_create " + c.name, "embrope_rope_cache_create", c.expect,
                     [c] {
                       embrope_rope_config_t config;
                       embrope_rope_config_init(&config);
                       config.rotary_dim = c.rotary_dim;
                       config.base = c.base;
                       config.max_positions = c.max_positions;
                       embrope_rope_cache_t* cache = reinterpret_cast<embrope_rope_cache_t*>(1);
                       const Outcome o = from_status(embrope_rope_cache_create(
                           &config, DLDevice{kDLCPU, 0}, nullptr, &cache));
                       CHECK(cache == nullptr);  // no handle on failure
                       return o;
                     },
                     Surface::c});
  }
  const auto cpu_cache = [] {
    return std::make_shared<embrope::RopeCache>(embrope::RopeConfig{8, 10000.0, 4});
  };
  cases.push_back(
      {"RopeCache on an unknown device kind", "RopeCache", invalid({}),
       [] {
         return run_cpp([] {
           embrope::RopeCache c({8, 10000.0, 4}, Device{static_cast<embrope::DeviceKind>(3), 0});
         });
       },
       Surface::cpp});
  for (auto [pos, i] : {std::pair<std::int64_t, std::int64_t>{-1, 0},
                        {4, 0},
                        {0, -1},
                        {0, 4},
                        {kI64Min, 0},
                        {0, kI64Max}}) {
    cases.push_back({"RopeCache::cos(" + std::to_string(pos) + ", " + std::to_string(i) + ")",
                     "RopeCache", invalid({"outside"}),
                     [=] { return run_cpp([&] { (void)cpu_cache()->cos(pos, i); }); },
                     Surface::cpp});
    cases.push_back({"RopeCache::sin(" + std::to_string(pos) + ", " + std::to_string(i) + ")",
                     "RopeCache", invalid({"outside"}),
                     [=] { return run_cpp([&] { (void)cpu_cache()->sin(pos, i); }); },
                     Surface::cpp});
  }
  for (std::int64_t i : {std::int64_t{-1}, std::int64_t{4}, kI64Max}) {
    cases.push_back({"RopeCache::inv_freq(" + std::to_string(i) + ")", "RopeCache",
                     invalid({"frequency", "outside"}),
                     [=] { return run_cpp([&] { (void)cpu_cache()->inv_freq(i); }); },
                     Surface::cpp});
  }
  cases.push_back({"RopeCache::copy_to_host with null buffers", "RopeCache",
                   invalid({"copy_to_host"}),
                   [=] { return run_cpp([&] { cpu_cache()->copy_to_host(nullptr, nullptr); }); },
                   Surface::cpp});
  cases.push_back({"RopeCache::cos of a moved-from cache", "RopeCache", invalid({"moved"}),
                   [=] {
                     return run_cpp([&] {
                       auto c = cpu_cache();
                       embrope::RopeCache taken(std::move(*c));
                       (void)c->cos(0, 0);
                     });
                   },
                   Surface::cpp});
  cases.push_back({"Tensor of rank 9", "Tensor", invalid({"ndim", "9"}),
                   [] {
                     return run_cpp([] {
                       const std::int64_t shape[9] = {};
                       Tensor t(nullptr, DType::float32, 9, shape, nullptr);
                     });
                   },
                   Surface::cpp});
  cases.push_back(
      {"Tensor of rank -1", "Tensor", invalid({"ndim", "-1"}),
       [] { return run_cpp([] { Tensor t(nullptr, DType::float32, -1, nullptr, nullptr); }); },
       Surface::cpp});
  cases.push_back(
      {"Tensor with a null shape", "Tensor", invalid({"shape", "null"}),
       [] { return run_cpp([] { Tensor t(nullptr, DType::float32, 2, nullptr, nullptr); }); },
       Surface::cpp});
  cases.push_back({"Tensor with fewer strides than dimensions", "Tensor", invalid({"strides"}),
                   [] { return run_cpp([] {
                          Tensor t(nullptr, DType::float32, {2, 3}, {1});
                        }); },
                   Surface::cpp});

  // The C cache functions.
  auto make_c_cache = [] {
    embrope_rope_config_t config;
    embrope_rope_config_init(&config);
    config.rotary_dim = 8;
    config.max_positions = 4;
    embrope_rope_cache_t* cache = nullptr;
    REQUIRE(embrope_rope_cache_create(&config, DLDevice{kDLCPU, 0}, nullptr, &cache) == EMBROPE_OK);
    return std::shared_ptr<embrope_rope_cache_t>(cache, embrope_rope_cache_destroy);
  };
  cases.push_back({"embrope_rope_cache_create with a NULL out-param", "embrope_rope_cache_create",
                   invalid({"cache", "null"}),
                   [] {
                     embrope_rope_config_t config;
                     embrope_rope_config_init(&config);
                     config.rotary_dim = 8;
                     config.max_positions = 4;
                     return from_status(
                         embrope_rope_cache_create(&config, DLDevice{kDLCPU, 0}, nullptr, nullptr));
                   },
                   Surface::c});
  cases.push_back({"embrope_rope_cache_create with a NULL config", "embrope_rope_cache_create",
                   invalid({"config", "null"}),
                   [] {
                     embrope_rope_cache_t* cache = nullptr;
                     return from_status(
                         embrope_rope_cache_create(nullptr, DLDevice{kDLCPU, 0}, nullptr, &cache));
                   },
                   Surface::c});
  // Device types as a C caller may store them: -5 is no enumerator of DLDeviceType.
  for (int dev : {static_cast<int>(kDLCUDAHost), static_cast<int>(kDLOpenCL),
                  static_cast<int>(kDLVulkan), -5}) {
    cases.push_back({"embrope_rope_cache_create on DLPack device " + std::to_string(dev),
                     "embrope_rope_cache_create", invalid({"device"}),
                     [=] {
                       embrope_rope_config_t config;
                       embrope_rope_config_init(&config);
                       config.rotary_dim = 8;
                       config.max_positions = 4;
                       embrope_rope_cache_t* cache = nullptr;
                       DLDevice device{kDLCPU, 0};
                       std::memcpy(&device.device_type, &dev, sizeof dev);
                       return from_status(
                           embrope_rope_cache_create(&config, device, nullptr, &cache));
                     },
                     Surface::c});
  }
  if (embrope_cuda_device_count() == 0) {
    cases.push_back({"embrope_rope_cache_create on CUDA without a GPU", "embrope_rope_cache_create",
                     Expect{{ErrorCode::not_implemented}, {"CUDA"}},
                     [] {
                       embrope_rope_config_t config;
                       embrope_rope_config_init(&config);
                       config.rotary_dim = 8;
                       config.max_positions = 4;
                       embrope_rope_cache_t* cache = nullptr;
                       return from_status(embrope_rope_cache_create(&config, DLDevice{kDLCUDA, 0},
                                                                    nullptr, &cache));
                     },
                     Surface::c});
  }
  cases.push_back({"embrope_rope_cache_info with a NULL cache", "embrope_rope_cache_info",
                   invalid({"cache", "null"}),
                   [] {
                     embrope_rope_config_t config;
                     DLDevice device;
                     return from_status(embrope_rope_cache_info(nullptr, &config, &device));
                   },
                   Surface::c});
  cases.push_back({"embrope_rope_cache_info with NULL out-params is fine",
                   "embrope_rope_cache_info", ok(),
                   [=] {
                     auto cache = make_c_cache();
                     return from_status(embrope_rope_cache_info(cache.get(), nullptr, nullptr));
                   },
                   Surface::c});
  cases.push_back({"embrope_rope_cache_copy_to_host with a NULL cache",
                   "embrope_rope_cache_copy_to_host", invalid({"cache", "null"}),
                   [] {
                     float cos[16], sin[16];
                     return from_status(embrope_rope_cache_copy_to_host(nullptr, cos, sin));
                   },
                   Surface::c});
  cases.push_back({"embrope_rope_cache_copy_to_host with a NULL cos",
                   "embrope_rope_cache_copy_to_host", invalid({"cos", "null"}),
                   [=] {
                     auto cache = make_c_cache();
                     float sin[16];
                     return from_status(embrope_rope_cache_copy_to_host(cache.get(), nullptr, sin));
                   },
                   Surface::c});
  cases.push_back({"embrope_rope_cache_copy_to_host with a NULL sin",
                   "embrope_rope_cache_copy_to_host", invalid({"sin", "null"}),
                   [=] {
                     auto cache = make_c_cache();
                     float cos[16];
                     return from_status(embrope_rope_cache_copy_to_host(cache.get(), cos, nullptr));
                   },
                   Surface::c});
  cases.push_back({"embrope_rope_cache_destroy(NULL) does nothing", "embrope_rope_cache_destroy",
                   ok(), [] { return from_status(embrope_rope_cache_destroy(nullptr)); },
                   Surface::c});
  return cases;
}

// ------------------------------------------- packed_positions, backward passes, configs ----

// A case of the newer entry points: it builds its own guarded tensors in `arena` (sealed before
// the call by the case) and returns what the call did.
struct NewCase {
  std::string name;
  std::string op;
  Expect expect;
  Surface surface;
  std::function<Outcome(Arena&)> run;
};

Tensor view_of(const Region& r, std::vector<std::int64_t> shape,
               std::vector<std::int64_t> strides = {}) {
  return Tensor(r.data, r.dtype, static_cast<int>(shape.size()), shape.data(),
                strides.empty() ? nullptr : strides.data());
}

std::vector<NewCase> new_op_cases() {
  std::vector<NewCase> cases;
  // ---- packed_positions: cu_seqlens [B + 1], positions [T], start_offsets [B].
  struct Packed {
    std::string name;
    std::vector<std::int64_t> cu;
    std::vector<std::int64_t> starts;  // empty: absent
    std::int64_t tokens;
    DType cu_dtype, pos_dtype;
    int layout;  // 0 plain, 1 cu 2-D, 2 positions alias cu_seqlens, 3 positions zero stride
    Expect expect;
  };
  const DType i64 = DType::int64, i32 = DType::int32, f32 = DType::float32;
  const std::vector<Packed> packed = {
      {"valid", {0, 2, 2, 5}, {0, 7, 1}, 5, i64, i32, 0, ok()},
      {"cu_seqlens float32", {0, 2, 5}, {}, 5, f32, i64, 0, invalid({"cu_seqlens", "int32"})},
      {"positions float32", {0, 2, 5}, {}, 5, i64, f32, 0, invalid({"positions", "int32"})},
      {"cu_seqlens 2-D", {0, 2, 5, 5}, {}, 5, i64, i64, 1, invalid({"cu_seqlens"})},
      {"cu_seqlens empty", {}, {}, 0, i64, i64, 0, invalid({"cu_seqlens", "B + 1"})},
      {"start_offsets of the wrong length",
       {0, 2, 5},
       {0, 0, 0},
       5,
       i64,
       i64,
       0,
       invalid({"start_offsets"})},
      {"positions aliasing cu_seqlens",
       {0, 1, 2, 3},
       {},
       3,
       i64,
       i64,
       2,
       invalid({"positions", "cu_seqlens"})},
      {"positions with stride 0", {0, 4}, {}, 4, i64, i64, 3, invalid({"positions"})},
      {"cu_seqlens decreasing", {0, 4, 2, 6}, {}, 6, i64, i64, 0, bad_index({"cu_seqlens[2]"})},
      {"cu_seqlens INT64_MIN", {0, kI64Min, 6}, {}, 6, i64, i64, 0, bad_index({"cu_seqlens[1]"})},
      {"cu_seqlens ends at INT64_MAX",
       {0, 3, kI64Max},
       {},
       6,
       i64,
       i64,
       0,
       bad_index({"cu_seqlens[2]"})},
      {"cu_seqlens INT32_MIN (int32)",
       {0, kI32Min, 6},
       {},
       6,
       i32,
       i64,
       0,
       bad_index({"cu_seqlens[1]"})},
      {"cu_seqlens first entry 1", {1, 3, 6}, {}, 6, i64, i64, 0, bad_index({"cu_seqlens[0]"})},
      {"start_offsets INT64_MAX",
       {0, 3, 6},
       {kI64Max, 0},
       6,
       i64,
       i64,
       0,
       bad_index({"start_offsets[0]"})},
      {"start_offsets INT64_MIN",
       {0, 3, 6},
       {0, kI64Min},
       6,
       i64,
       i64,
       0,
       bad_index({"start_offsets[1]"})},
      {"start_offsets past INT32_MAX for int32 positions",
       {0, 3, 6},
       {0, kI32Max - 1},
       6,
       i64,
       i32,
       0,
       bad_index({"start_offsets[1]"})},
  };
  for (const Packed& k : packed) {
    for (const Surface surface : {Surface::cpp, Surface::c}) {
      const bool cpp = surface == Surface::cpp;
      cases.push_back({(cpp ? "packed_positions " : "embrope_packed_positions ") + k.name,
                       cpp ? "packed_positions" : "embrope_packed_positions", k.expect, surface,
                       [k, cpp](Arena& arena) {
                         const auto n_cu = static_cast<std::int64_t>(k.cu.size());
                         Region cu = arena.region(k.cu_dtype, std::max<std::int64_t>(n_cu, 1));
                         for (std::int64_t i = 0; i < n_cu; ++i) {
                           if (k.cu_dtype == DType::float32) {
                             cu.set(i, static_cast<double>(k.cu[static_cast<std::size_t>(i)]));
                           } else {
                             cu.set_index(i, k.cu[static_cast<std::size_t>(i)]);
                           }
                         }
                         Region pos =
                             arena.region(k.pos_dtype, std::max<std::int64_t>(k.tokens, 1));
                         Region start =
                             arena.region(DType::int64, std::max<std::size_t>(k.starts.size(), 1));
                         for (std::size_t i = 0; i < k.starts.size(); ++i) {
                           start.set_index(static_cast<std::int64_t>(i), k.starts[i]);
                         }
                         Tensor cu_t = k.layout == 1 ? view_of(cu, {2, 2}) : view_of(cu, {n_cu});
                         Tensor pos_t = view_of(pos, {k.tokens});
                         if (k.layout == 2) pos_t = view_of(cu, {k.tokens});
                         if (k.layout == 3) pos_t = view_of(pos, {k.tokens}, {0});
                         std::optional<Tensor> start_t;
                         if (!k.starts.empty()) {
                           start_t = view_of(start, {static_cast<std::int64_t>(k.starts.size())});
                         }
                         arena.seal();
                         if (cpp) {
                           return run_cpp([&] {
                             embrope::PackedPositionsOptions o;
                             o.start_offsets = start_t;
                             embrope::packed_positions(cu_t, pos_t, o);
                           });
                         }
                         DLView cv(cu_t), pv(pos_t);
                         std::optional<DLView> sv;
                         if (start_t) sv.emplace(*start_t);
                         return from_status(embrope_packed_positions(
                             cv.get(), sv ? sv->get() : nullptr, pv.get(), nullptr, nullptr));
                       }});
    }
  }
  cases.push_back({"embrope_packed_positions NULL cu_seqlens", "embrope_packed_positions",
                   invalid({"cu_seqlens", "null"}), Surface::c, [](Arena& arena) {
                     Region pos = arena.region(DType::int64, 4);
                     arena.seal();
                     DLView pv(view_of(pos, {4}));
                     return from_status(
                         embrope_packed_positions(nullptr, nullptr, pv.get(), nullptr, nullptr));
                   }});

  // ---- embed_backward: grad_out [N, D], ids [N], grad_table [V, D].
  struct Backward {
    std::string name;
    int variant;
    Expect expect;
  };
  const std::vector<Backward> backward = {
      {"valid", 0, ok()},
      {"grad_out int32", 1, invalid({"grad_out"})},
      {"grad_table of another D", 2, invalid({"grad_table"})},
      {"ids of another length", 3, invalid({"grad_out"})},
      {"grad_table aliasing grad_out", 4, invalid({"grad_table", "grad_out"})},
      {"grad_table with row stride 0", 5, invalid({"grad_table"})},
      {"an id of INT64_MIN", 6, bad_index({"ids[1]"})},
      {"an id equal to V", 7, bad_index({"ids[2]"})},
      {"scale NaN", 8, invalid({"scale", "finite"})},
      {"no gradient at all", 9, invalid({"no gradient"})},
      {"grad_position_table aliasing grad_table", 10,
       invalid({"grad_table", "grad_position_table"})},
  };
  for (const Backward& k : backward) {
    for (const Surface surface : {Surface::cpp, Surface::c}) {
      const bool cpp = surface == Surface::cpp;
      cases.push_back({(cpp ? "embed_backward " : "embrope_embed_backward ") + k.name,
                       cpp ? "embed_backward" : "embrope_embed_backward", k.expect, surface,
                       [k, cpp](Arena& arena) {
                         const std::int64_t n = 4, d = 8, v = 6, p = 8;
                         Region grad_out =
                             arena.region(k.variant == 1 ? DType::int32 : DType::float32, n * d);
                         Region ids = arena.region(DType::int64, n);
                         Region grad = arena.region(DType::float32, v * (d + 4));
                         for (std::int64_t i = 0; i < n * d; ++i)
                           grad_out.set(i, 0.25 * (i % 7) - 0.5);
                         for (std::int64_t i = 0; i < n; ++i) ids.set_index(i, i % v);
                         if (k.variant == 6) ids.set_index(1, kI64Min);
                         if (k.variant == 7) ids.set_index(2, v);
                         Tensor go = view_of(grad_out, {n, d});
                         Tensor id = view_of(ids, {k.variant == 3 ? n - 1 : n});
                         std::optional<Tensor> gt = view_of(grad, {v, k.variant == 2 ? d + 1 : d});
                         if (k.variant == 4) gt = view_of(grad_out, {n, d});
                         if (k.variant == 5) gt = view_of(grad, {v, d}, {0, 1});
                         if (k.variant == 9) gt.reset();
                         embrope::EmbedBackwardOptions o;
                         if (k.variant == 8) o.scale = std::nanf("");
                         if (k.variant == 10) {
                           o.grad_position_table = view_of(grad, {p / 2, d});
                         }
                         arena.seal();
                         if (cpp) return run_cpp([&] { embrope::embed_backward(go, id, gt, o); });
                         DLView gov(go), idv(id);
                         std::optional<DLView> gtv, gpv;
                         if (gt) gtv.emplace(*gt);
                         embrope_embed_backward_options_t co;
                         embrope_embed_backward_options_init(&co);
                         co.scale = o.scale;
                         if (o.grad_position_table) {
                           gpv.emplace(*o.grad_position_table);
                           co.grad_position_table = gpv->get();
                         }
                         return from_status(embrope_embed_backward(
                             gov.get(), idv.get(), gtv ? gtv->get() : nullptr, &co, nullptr));
                       }});
    }
  }
  cases.push_back(
      {"embrope_embed_backward mode 7", "embrope_embed_backward", invalid({"mode", "7"}),
       Surface::c, [](Arena& arena) {
         Region go = arena.region(DType::float32, 8), ids = arena.region(DType::int64, 1),
                gt = arena.region(DType::float32, 16);
         ids.set_index(0, 0);
         arena.seal();
         DLView gov(view_of(go, {1, 8})), idv(view_of(ids, {1})), gtv(view_of(gt, {2, 8}));
         embrope_embed_backward_options_t co;
         embrope_embed_backward_options_init(&co);
         const int seven = 7;
         std::memcpy(&co.mode, &seven, sizeof seven);
         return from_status(embrope_embed_backward(gov.get(), idv.get(), gtv.get(), &co, nullptr));
       }});

  // ---- apply_rope_backward: the forward's checks under the backward's name.
  for (const Surface surface : {Surface::cpp, Surface::c}) {
    const bool cpp = surface == Surface::cpp;
    for (int variant = 0; variant < 3; ++variant) {
      const char* what[] = {"valid", "a position of INT64_MIN", "dq of dtype int64"};
      cases.push_back(
          {std::string(cpp ? "apply_rope_backward " : "embrope_apply_rope_backward ") +
               what[variant],
           cpp ? "apply_rope_backward" : "embrope_apply_rope_backward",
           variant == 0   ? ok()
           : variant == 1 ? bad_index({"positions[1]"})
                          : invalid({"dq"}),
           surface, [variant, cpp](Arena& arena) {
             const std::int64_t t = 3, h = 2, d = 16;
             Region dq = arena.region(variant == 2 ? DType::int64 : DType::float32, t * h * d);
             Region pos = arena.region(DType::int64, t);
             if (variant != 2) {
               for (std::int64_t i = 0; i < t * h * d; ++i) dq.set(i, 0.5);
             }
             for (std::int64_t i = 0; i < t; ++i) pos.set_index(i, i);
             if (variant == 1) pos.set_index(1, kI64Min);
             const embrope::RopeCache cache(embrope::RopeConfig{d, 10000.0, 8});
             arena.seal();
             const Tensor q = view_of(dq, {t, h, d}), p = view_of(pos, {t});
             if (cpp) {
               return run_cpp([&] { embrope::apply_rope_backward(q, std::nullopt, p, cache); });
             }
             embrope_rope_config_t c;
             embrope_rope_config_init(&c);
             c.rotary_dim = d;
             c.max_positions = 8;
             embrope_rope_cache_t* handle = nullptr;
             REQUIRE(embrope_rope_cache_create(&c, DLDevice{kDLCPU, 0}, nullptr, &handle) ==
                     EMBROPE_OK);
             DLView qv(q), pv(p);
             const Outcome o = from_status(embrope_apply_rope_backward(qv.get(), nullptr, pv.get(),
                                                                       handle, nullptr, nullptr));
             embrope_rope_cache_destroy(handle);
             return o;
           }});
    }
  }

  // ---- mrope options and scaling configurations through the C API.
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
  struct Scaling {
    std::string name;
    std::function<void(embrope_rope_config_t&)> edit;
    Expect expect;
  };
  static const double factors[4] = {1.0, 1.0, 1.0, 1.0};
  const std::vector<Scaling> scaling = {
      {"scaling 99",
       [](embrope_rope_config_t& c) {
         const int v = 99;
         std::memcpy(&c.scaling, &v, sizeof v);
       },
       invalid({"scaling", "99"})},
      {"linear factor NaN",
       [](embrope_rope_config_t& c) {
         c.scaling = EMBROPE_ROPE_SCALING_LINEAR;
         c.factor = kNaN;
       },
       invalid({"factor", "finite"})},
      {"yarn factor infinity",
       [](embrope_rope_config_t& c) {
         c.scaling = EMBROPE_ROPE_SCALING_YARN;
         c.factor = kInf;
         c.original_max_positions = 4;
       },
       invalid({"factor", "finite"})},
      {"yarn beta_fast NaN",
       [](embrope_rope_config_t& c) {
         c.scaling = EMBROPE_ROPE_SCALING_YARN;
         c.factor = 2.0;
         c.original_max_positions = 4;
         c.beta_fast = kNaN;
       },
       invalid({"beta_fast"})},
      {"llama3 original INT64_MIN",
       [](embrope_rope_config_t& c) {
         c.scaling = EMBROPE_ROPE_SCALING_LLAMA3;
         c.factor = 8.0;
         c.original_max_positions = kI64Min;
       },
       invalid({"original_max_positions"})},
      {"longrope num_factors -1",
       [](embrope_rope_config_t& c) {
         c.scaling = EMBROPE_ROPE_SCALING_LONGROPE;
         c.original_max_positions = 4;
         c.num_factors = -1;
       },
       invalid({"num_factors", "-1"})},
      {"longrope arrays NULL with num_factors 4",
       [](embrope_rope_config_t& c) {
         c.scaling = EMBROPE_ROPE_SCALING_LONGROPE;
         c.original_max_positions = 4;
         c.num_factors = 4;
       },
       invalid({"num_factors", "null"})},
      {"longrope with 4 of 8 factors",
       [](embrope_rope_config_t& c) {
         c.scaling = EMBROPE_ROPE_SCALING_LONGROPE;
         c.original_max_positions = 4;
         c.short_factor = factors;
         c.long_factor = factors;
         c.num_factors = 4;
       },
       invalid({"short_factor", "rotary_dim / 2"})},
      {"dynamic sequence_length INT64_MIN",
       [](embrope_rope_config_t& c) {
         c.scaling = EMBROPE_ROPE_SCALING_DYNAMIC;
         c.factor = 2.0;
         c.original_max_positions = 4;
         c.sequence_length = kI64Min;
       },
       invalid({"sequence_length"})},
  };
  for (const Scaling& k : scaling) {
    cases.push_back({"embrope_rope_cache_create " + k.name, "embrope_rope_cache_create", k.expect,
                     Surface::c, [k](Arena& arena) {
                       arena.seal();
                       embrope_rope_config_t c;
                       embrope_rope_config_init(&c);
                       c.rotary_dim = 16;
                       c.max_positions = 8;
                       k.edit(c);
                       embrope_rope_cache_t* handle = nullptr;
                       const Outcome o = from_status(
                           embrope_rope_cache_create(&c, DLDevice{kDLCPU, 0}, nullptr, &handle));
                       CHECK(handle == nullptr);
                       return o;
                     }});
  }
  cases.push_back({"embrope_rope_frequencies capacity 0", "embrope_rope_frequencies",
                   invalid({"capacity"}), Surface::c, [](Arena& arena) {
                     arena.seal();
                     embrope_rope_config_t c;
                     embrope_rope_config_init(&c);
                     c.rotary_dim = 16;
                     c.max_positions = 8;
                     double f[8];
                     return from_status(embrope_rope_frequencies(&c, f, 0, nullptr));
                   }});

  // ---- deferred statuses.
  cases.push_back(
      {"embrope_deferred_status_create NULL out", "embrope_deferred_status_create",
       invalid({"status", "null"}), Surface::c, [](Arena& arena) {
         arena.seal();
         return from_status(embrope_deferred_status_create(DLDevice{kDLCPU, 0}, nullptr));
       }});
  cases.push_back({"embrope_deferred_status_check NULL", "embrope_deferred_status_check",
                   invalid({"status", "null"}), Surface::c, [](Arena& arena) {
                     arena.seal();
                     return from_status(embrope_deferred_status_check(nullptr, nullptr));
                   }});
  cases.push_back({"embrope_deferred_status_create device type 99",
                   "embrope_deferred_status_create", invalid({"device"}), Surface::c,
                   [](Arena& arena) {
                     arena.seal();
                     embrope_deferred_status_t* s = nullptr;
                     const int type = 99;
                     DLDevice dev{};
                     std::memcpy(&dev.device_type, &type, sizeof type);
                     const Outcome o = from_status(embrope_deferred_status_create(dev, &s));
                     CHECK(s == nullptr);
                     return o;
                   }});

  // ---- AdaptiveRopeCache lengths.
  for (const std::int64_t length : {std::int64_t{0}, std::int64_t{-1}, kI64Min}) {
    cases.push_back({"AdaptiveRopeCache::get " + std::to_string(length), "AdaptiveRopeCache",
                     invalid({"sequence_length", "positive"}), Surface::cpp,
                     [length](Arena& arena) {
                       arena.seal();
                       embrope::AdaptiveRopeCache adaptive(embrope::RopeConfig{16, 10000.0, 8});
                       return run_cpp([&] { adaptive.get(length); });
                     }});
  }

  // ---- HF config.json text.
  struct Json {
    std::string name;
    std::string text;
    std::string op;
    std::vector<std::string> parts;
  };
  const std::string head =
      R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2, )"
      R"("max_position_embeddings": 128)";
  std::string deep = std::string(5000, '[') + std::string(5000, ']');
  const std::vector<Json> json = {
      {"empty text", "", "model_config_from_hf_json", {"JSON"}},
      {"truncated", head, "model_config_from_hf_json", {"JSON"}},
      {"5000 nested arrays", deep, "model_config_from_hf_json", {"not an object"}},
      {"hidden_size 1e300",
       R"({"model_type": "llama", "hidden_size": 1e300, "num_attention_heads": 2, "max_position_embeddings": 8})",
       "model_config_from_hf_json",
       {"hidden_size", "integer"}},
      {"num_attention_heads 0",
       R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 0, "max_position_embeddings": 8})",
       "model_config_from_hf_json",
       {"positive"}},
      {"head_dim -4",
       head + R"(, "head_dim": -4})",
       "model_config_from_hf_json",
       {"head_dim", "positive"}},
      {"partial_rotary_factor 1e300",
       head + R"(, "partial_rotary_factor": 1e300})",
       "model_config_from_hf_json",
       {"partial_rotary_factor", "(0, 1]"}},
      {"rope_scaling a string",
       head + R"(, "rope_scaling": "yes"})",
       "model_config_from_hf_json",
       {"rope_scaling", "object"}},
      {"mrope_section of two",
       head + R"(, "rope_scaling": {"type": "mrope", "mrope_section": [8, 8]}})",
       "model_config_from_hf_json",
       {"mrope_section", "3"}},
      {"short_factor a string",
       head + R"(, "rope_scaling": {"type": "longrope", "short_factor": "x", "long_factor": [1]}})",
       "model_config_from_hf_json",
       {"short_factor", "array"}},
      {"factor a string",
       head + R"(, "rope_scaling": {"rope_type": "linear", "factor": "8"}})",
       "model_config_from_hf_json",
       {"factor", "number"}},
      {"max_position_embeddings -1",
       R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2, "max_position_embeddings": -1})",
       "RopeCache",
       {"max_positions", "positive"}},
  };
  for (const Json& k : json) {
    cases.push_back({"model_config_from_hf_json " + k.name, k.op, invalid(k.parts), Surface::cpp,
                     [k](Arena& arena) {
                       arena.seal();
                       return run_cpp([&] { embrope::model_config_from_hf_json(k.text); });
                     }});
  }
  return cases;
}

void run_new_op_cases(const std::vector<NewCase>& cases) {
  for (const NewCase& c : cases) {
    DYNAMIC_SECTION(c.name) {
      Arena arena;
      const Outcome got = c.run(arena);
      check_outcome(got, c.expect, c.op, arena);
      count(c.surface);
    }
  }
}

}  // namespace

TEST_CASE("hostile inputs: packed_positions, backward passes, mrope, scaling, statuses, configs",
          "[hostile][new_ops]") {
  run_new_op_cases(new_op_cases());
}

namespace {}  // namespace

TEST_CASE("hostile inputs: embed, C++ and C", "[hostile][embed]") {
  run_embed_cases(embed_cases());
}

TEST_CASE("hostile inputs: apply_rope with a cache and with cos/sin, C++ and C",
          "[hostile][rope]") {
  run_rope_cases(rope_cases());
}

TEST_CASE("hostile inputs: RopeCache, Tensor and the C cache functions", "[hostile][rope_cache]") {
  for (const MiscCase& c : misc_cases()) {
    DYNAMIC_SECTION(c.name) {
      Arena none;
      none.seal();
      const Outcome got = c.run();
      check_outcome(got, c.expect, c.op, none);
      count(c.surface);
    }
  }
  // The init functions take NULL without crashing.
  embrope_rope_config_init(nullptr);
  embrope_rope_options_init(nullptr);
  embrope_embed_options_init(nullptr);
}

TEST_CASE("hostile inputs: every case has its own name; the number of cases", "[hostile][count]") {
  // Cases are told apart by name (Catch2 sections): a repeated name would silently skip one.
  int cpp = 0, c = 0;
  std::set<std::string> names;
  auto tally = [&](const std::string& name, int surfaces, int variants) {
    INFO("case: " << name);
    CHECK(names.insert(name).second);
    if (surfaces & kCpp) cpp += variants;
    if (surfaces & kC) c += variants;
  };
  for (const EmbedCase& e : embed_cases()) tally("embed " + e.name, e.surfaces, 1);
  for (const RopeCase& r : rope_cases()) {
    tally("rope " + r.name, r.surfaces, r.tables == kTables ? 2 : 1);
  }
  for (const MiscCase& m : misc_cases())
    tally("misc " + m.name, m.surface == Surface::cpp ? kCpp : kC, 1);
  for (const NewCase& n : new_op_cases())
    tally("new " + n.name, n.surface == Surface::cpp ? kCpp : kC, 1);
  // The figure the README quotes (each case on each surface and table kind is one call).
  std::printf("hostile inputs: %d C++ calls, %d C calls, %d in all\n", cpp, c, cpp + c);
  // When the other test cases ran in this process, they ran exactly these.
  if (g_cases_cpp + g_cases_c > 0) {
    CHECK(g_cases_cpp == cpp);
    CHECK(g_cases_c == c);
  }
}
