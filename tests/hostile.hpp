// The harness shared by the hostile-input tests (tests/test_*_hostile.cpp, one file per op):
// guarded memory, DLPack views, the outcome of a call on the C++ or the C surface, the checks
// every case makes, and the count of cases.
//
// Every case runs against tensors that live inside guarded regions: each region sits between
// bands of sentinel bytes, which must be intact after the call (and AddressSanitizer, in CI,
// catches any access past a region's allocation). A call rejected as an invalid argument must
// not have written anything at all. Each case asserts the error code and that the message
// starts with the op's (or C function's) name and names the argument and the rule.
//
// Each test case of hostile inputs runs a table of cases under a group name; the file that
// holds it lists the table through its <op>_hostile_case_names() (declared below), and
// tests/test_hostile_count.cpp checks that names are unique within a group, prints the total
// count, and compares each group that ran earlier in the same process with its list.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "embrope/embrope.h"
#include "embrope/embrope.hpp"
#include "reference.hpp"
#include "test_support.hpp"

namespace hostile {

using embrope::Device;
using embrope::DType;
using embrope::ErrorCode;
using embrope::Tensor;

inline constexpr std::int64_t kI64Min = std::numeric_limits<std::int64_t>::min();
inline constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
inline constexpr std::int64_t kI32Min = std::numeric_limits<std::int32_t>::min();
inline constexpr std::int64_t kI32Max = std::numeric_limits<std::int32_t>::max();
inline const double kNaN = std::numeric_limits<double>::quiet_NaN();
inline const double kInf = std::numeric_limits<double>::infinity();

// ------------------------------------------------------------ guarded memory --------------

inline constexpr unsigned char kSentinel = 0xa5;
inline constexpr std::size_t kGuard = 256;

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
      case DType::float8_e4m3fn:
      case DType::float8_e5m2: {
        const std::uint8_t c = ref::encode_fp8(dtype, v);
        std::memcpy(at(i), &c, 1);
        break;
      }
      case DType::uint8:
      case DType::int8: {  // the integer's two's-complement byte
        const auto c = static_cast<std::uint8_t>(static_cast<std::int64_t>(v));
        std::memcpy(at(i), &c, 1);
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

inline DLPatch patch_of(const std::string& target, std::function<void(DLView&)> f) {
  return [target, f](const std::string& name, DLView& v) {
    if (name == target) f(v);
  };
}

// ------------------------------------------------------------------ outcomes ----------------

enum class Surface { cpp, c };
inline constexpr int kCpp = 1, kC = 2, kBoth = kCpp | kC;

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

inline Outcome from_status(embrope_status_t status) {
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
inline Expect ok() {
  return {};
}
inline Expect invalid(std::vector<std::string> parts) {
  return {{ErrorCode::invalid_argument}, std::move(parts)};
}
inline Expect bad_index(std::vector<std::string> parts) {
  return {{ErrorCode::index_out_of_range}, std::move(parts)};
}
// A tensor on a CUDA device: without a usable GPU the call cannot run at all
// (not_implemented); with one, mixing it with CPU tensors is an invalid argument.
inline Expect on_cuda(std::vector<std::string> parts) {
  return {{ErrorCode::invalid_argument, ErrorCode::not_implemented}, std::move(parts)};
}

// The checks shared by every case: code, message, guards, nothing written on rejection.
inline void check_outcome(const Outcome& got, const Expect& want, const std::string& op,
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

// A view of a whole region (row-major, or with the given element strides).
inline Tensor view_of(const Region& r, std::vector<std::int64_t> shape,
                      std::vector<std::int64_t> strides = {}) {
  return Tensor(r.data, r.dtype, static_cast<int>(shape.size()), shape.data(),
                strides.empty() ? nullptr : strides.data());
}

// ------------------------------------------------------------------ counting ----------------

// One case as the count sees it: the group (the test case that runs it), its name (a Catch2
// section: names must differ within a group, or one would silently be skipped), the surfaces
// it runs on, and the calls it makes on each (RoPE: one per table kind).
struct CaseName {
  std::string group;
  std::string name;
  int surfaces = kBoth;
  int calls = 1;
};

struct Calls {
  int cpp = 0, c = 0;
};

// The calls each group has made in this process.
inline std::map<std::string, Calls>& calls_made() {
  static std::map<std::string, Calls> made;
  return made;
}

inline void count(const std::string& group, Surface s) {
  Calls& k = calls_made()[group];
  (s == Surface::cpp ? k.cpp : k.c) += 1;
}

// ---------------------------------------------------------------- case kinds ----------------

// A case of one call that needs no guarded tensors: run() makes the call.
struct CallCase {
  std::string name;
  std::string op;
  Expect expect;
  std::function<Outcome()> run;
  Surface surface;
};

inline void run_call_cases(const std::string& group, const std::vector<CallCase>& cases) {
  for (const CallCase& c : cases) {
    DYNAMIC_SECTION(c.name) {
      Arena none;
      none.seal();
      const Outcome got = c.run();
      check_outcome(got, c.expect, c.op, none);
      count(group, c.surface);
    }
  }
}

// A case that builds its own guarded tensors in `arena` (sealed before the call by the case)
// and returns what the call did.
struct ArenaCase {
  std::string name;
  std::string op;
  Expect expect;
  Surface surface;
  std::function<Outcome(Arena&)> run;
};

inline void run_arena_cases(const std::string& group, const std::vector<ArenaCase>& cases) {
  for (const ArenaCase& c : cases) {
    DYNAMIC_SECTION(c.name) {
      Arena arena;
      const Outcome got = c.run(arena);
      check_outcome(got, c.expect, c.op, arena);
      count(group, c.surface);
    }
  }
}

template <typename Case>
std::vector<CaseName> names_of(const std::string& group, const std::vector<Case>& cases) {
  std::vector<CaseName> names;
  for (const Case& c : cases) {
    names.push_back({group, c.name, c.surface == Surface::cpp ? kCpp : kC, 1});
  }
  return names;
}

}  // namespace hostile

// The cases of each file, for the count (tests/test_hostile_count.cpp).
std::vector<hostile::CaseName> embed_hostile_case_names();
std::vector<hostile::CaseName> embed_backward_hostile_case_names();
std::vector<hostile::CaseName> apply_rope_hostile_case_names();
std::vector<hostile::CaseName> apply_rope_backward_hostile_case_names();
std::vector<hostile::CaseName> packed_positions_hostile_case_names();
std::vector<hostile::CaseName> rope_cache_hostile_case_names();
std::vector<hostile::CaseName> model_config_hostile_case_names();
std::vector<hostile::CaseName> deferred_status_hostile_case_names();
std::vector<hostile::CaseName> tensor_hostile_case_names();
