// An independent float64 reference for the tests (docs/architecture.md, "Tests and CI"), written
// from the formulas of docs/ops.md and docs/numerics.md, not from the library's code: it must not
// include anything from embrope/detail/. Also the test helpers: owning host buffers of any dtype,
// random fill, poisoning, independent float16/bfloat16 codecs and the tolerance rules.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "embrope/tensor.hpp"

namespace ref {

using embrope::DType;

// ------------------------------------------------------------ binary formats ------------

// A binary floating-point format: `digits` significand bits (with the implicit one) and
// normal exponents [emin, emax].
struct Format {
  int digits;
  int emin;
  int emax;
};
constexpr Format kFloat32{24, -126, 127};
constexpr Format kFloat16{11, -14, 15};
constexpr Format kBFloat16{8, -126, 127};
constexpr Format kFloat8E4M3{4, -6, 8};  // normal exponents of OCP E4M3 (bias 7) and E5M2
constexpr Format kFloat8E5M2{3, -14, 15};

inline Format format_of(DType dtype) {
  return dtype == DType::float16         ? kFloat16
         : dtype == DType::bfloat16      ? kBFloat16
         : dtype == DType::float8_e4m3fn ? kFloat8E4M3
         : dtype == DType::float8_e5m2   ? kFloat8E5M2
                                         : kFloat32;
}

// floor(log2(a)) for finite a > 0.
inline int exponent_of(double a) {
  int e = 0;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  return e - 1;
}

// The largest finite value of a format.
inline double max_finite(Format f) {
  return std::ldexp(std::ldexp(1.0, f.digits) - 1.0, f.emax - (f.digits - 1));
}

// One unit in the last place of format f at value v (the spacing of the format's values in
// the binade of v; the subnormal spacing below the smallest normal). NaN for inf and NaN.
inline double ulp(Format f, double v) {
  if (!std::isfinite(v)) return std::numeric_limits<double>::quiet_NaN();
  const double a = std::fabs(v);
  const int e = a == 0.0 ? f.emin : std::max(exponent_of(a), f.emin);
  return std::ldexp(1.0, e - (f.digits - 1));
}
inline double ulp(DType dtype, double v) {
  return ulp(format_of(dtype), v);
}

// x rounded to the nearest value of format f, ties to even, overflow to infinity. Scaling
// by a power of two is exact in float64, and std::nearbyint rounds ties to even in the
// default rounding mode, so this is exact for any float64 x.
inline double round_to(Format f, double x) {
  if (!std::isfinite(x) || x == 0.0) return x;
  const double a = std::fabs(x);
  const int e = std::max(exponent_of(a), f.emin);
  const double spacing = std::ldexp(1.0, e - (f.digits - 1));
  double r = std::nearbyint(a / spacing) * spacing;
  if (r > max_finite(f)) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, x);
}
inline double round_to(DType dtype, double x) {
  return round_to(format_of(dtype), x);
}

// Decoders from the bit fields.
inline double decode_f16(std::uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), -24);
  } else if (exp == 31) {
    v = mant != 0 ? std::numeric_limits<double>::quiet_NaN()
                  : std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(static_cast<double>(1024 + mant), exp - 25);
  }
  return (h & 0x8000) != 0 ? -v : v;
}

inline double decode_bf16(std::uint16_t h) {
  const int exp = (h >> 7) & 0xff;
  const int mant = h & 0x7f;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), -133);
  } else if (exp == 255) {
    v = mant != 0 ? std::numeric_limits<double>::quiet_NaN()
                  : std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(static_cast<double>(128 + mant), exp - 134);
  }
  return (h & 0x8000) != 0 ? -v : v;
}

// Bits of a value exactly representable in the 16-bit format f (or inf or NaN):
// mantissa_bits = digits - 1, exponent bias = emax.
inline std::uint16_t bits_of_exact(Format f, double v) {
  const int mbits = f.digits - 1;
  const int bias = f.emax;
  const std::uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const std::uint16_t exp_all = static_cast<std::uint16_t>(((2 * bias + 1) << mbits) & 0x7fff);
  if (std::isnan(v)) return static_cast<std::uint16_t>(sign | exp_all | (1u << (mbits - 1)));
  if (std::isinf(v)) return static_cast<std::uint16_t>(sign | exp_all);
  const double a = std::fabs(v);
  if (a == 0.0) return sign;
  const int e = exponent_of(a);
  if (e < f.emin) {  // subnormal: the integer multiple of the subnormal spacing
    return static_cast<std::uint16_t>(sign |
                                      static_cast<std::uint16_t>(std::ldexp(a, -(f.emin - mbits))));
  }
  const auto mant = static_cast<std::uint32_t>(std::ldexp(a, mbits - e) - std::ldexp(1.0, mbits));
  return static_cast<std::uint16_t>(sign | ((e + bias) << mbits) | mant);
}

// Encoders, round to nearest even from any float64.
inline std::uint16_t encode_f16(double x) {
  return bits_of_exact(kFloat16, round_to(kFloat16, x));
}
inline std::uint16_t encode_bf16(double x) {
  return bits_of_exact(kBFloat16, round_to(kBFloat16, x));
}

// ------------------------------------------------------------ 8-bit floats ----
// OCP OFP8 (rev. 1.0): E4M3 (bias 7, no infinities, S.1111.111 is NaN, largest 448) and E5M2
// (bias 15, IEEE-like, largest 57344), decoded from the bit fields.
inline bool fp8_is_nan(DType dtype, std::uint8_t c) {
  return dtype == DType::float8_e4m3fn ? (c & 0x7f) == 0x7f : (c & 0x7f) > 0x7c;
}
inline double decode_fp8(DType dtype, std::uint8_t c) {
  const bool e4m3 = dtype == DType::float8_e4m3fn;
  const int mbits = e4m3 ? 3 : 2;
  const int bias = e4m3 ? 7 : 15;
  const int exp = (c & 0x7f) >> mbits;
  const int mant = c & ((1 << mbits) - 1);
  double v;
  if (fp8_is_nan(dtype, c)) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (!e4m3 && exp == 31) {
    v = std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), 1 - bias - mbits);
  } else {
    v = std::ldexp(static_cast<double>((1 << mbits) + mant), exp - bias - mbits);
  }
  return (c & 0x80) != 0 ? -v : v;
}
inline double fp8_max(DType dtype) {
  return dtype == DType::float8_e4m3fn ? 448.0 : 57344.0;
}
// x rounded to the nearest finite 8-bit value by search over all codes, ties to the even
// code (even mantissa), magnitudes past the largest finite value (infinity too) saturated to
// it, NaN to the NaN code 0x7f of x's sign (both formats; PyTorch's conversion stores it).
inline std::uint8_t encode_fp8(DType dtype, double x) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<std::uint8_t>(sign | 0x7f);  // as torch stores NaN
  const double a = std::min(std::fabs(x), fp8_max(dtype));
  int best = 0;
  double best_error = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 0x80; ++c) {
    const double v = decode_fp8(dtype, static_cast<std::uint8_t>(c));
    if (!std::isfinite(v)) continue;
    const double error = std::fabs(v - a);
    if (error < best_error || (error == best_error && c % 2 == 0)) {
      best = c;
      best_error = error;
    }
  }
  return static_cast<std::uint8_t>(sign | best);
}

// A NaN in both float16 and bfloat16, written to outputs before a call: an element the call
// fails to write is caught as a NaN (and by its bit pattern).
constexpr std::uint16_t kPoison16 = 0x7fbb;

// ------------------------------------------------------------------ buffers -------------

// An owning host buffer of n elements of one dtype; elements are read and written as
// float64 through the independent codecs above (value dtypes) or as int64 (index dtypes).
class Buffer {
 public:
  Buffer() = default;
  Buffer(DType dtype, std::int64_t n)
      : dtype_(dtype),
        n_(n),
        bytes_(static_cast<std::size_t>(n) * static_cast<std::size_t>(embrope::dtype_size(dtype))) {
  }

  DType dtype() const { return dtype_; }
  std::int64_t size() const { return n_; }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  // Address of element i (i may equal size() for an empty view at the end).
  void* at(std::int64_t i) { return bytes_.data() + i * embrope::dtype_size(dtype_); }

  // The raw bit pattern of element i.
  std::uint64_t bits(std::int64_t i) const {
    const int s = embrope::dtype_size(dtype_);
    std::uint64_t u = 0;
    if (s == 1) {
      u = bytes_[static_cast<std::size_t>(i)];
    } else if (s == 2) {
      std::uint16_t v;
      std::memcpy(&v, bytes_.data() + i * s, 2);
      u = v;
    } else if (s == 4) {
      std::uint32_t v;
      std::memcpy(&v, bytes_.data() + i * s, 4);
      u = v;
    } else {
      std::memcpy(&u, bytes_.data() + i * s, 8);
    }
    return u;
  }
  void set_bits(std::int64_t i, std::uint64_t u) {
    const int s = embrope::dtype_size(dtype_);
    if (s == 1) {
      bytes_[static_cast<std::size_t>(i)] = static_cast<unsigned char>(u);
    } else if (s == 2) {
      const auto v = static_cast<std::uint16_t>(u);
      std::memcpy(bytes_.data() + i * s, &v, 2);
    } else if (s == 4) {
      const auto v = static_cast<std::uint32_t>(u);
      std::memcpy(bytes_.data() + i * s, &v, 4);
    } else {
      std::memcpy(bytes_.data() + i * s, &u, 8);
    }
  }

  // Element i as float64 (index dtypes: the integer value).
  double get(std::int64_t i) const {
    switch (dtype_) {
      case DType::float32: {
        float f;
        const auto u = static_cast<std::uint32_t>(bits(i));
        std::memcpy(&f, &u, 4);
        return f;
      }
      case DType::float16:
        return decode_f16(static_cast<std::uint16_t>(bits(i)));
      case DType::bfloat16:
        return decode_bf16(static_cast<std::uint16_t>(bits(i)));
      case DType::float8_e4m3fn:
      case DType::float8_e5m2:
        return decode_fp8(dtype_, static_cast<std::uint8_t>(bits(i)));
      case DType::int32:
      case DType::int64:
        return static_cast<double>(get_index(i));
      case DType::uint8:
        return static_cast<double>(static_cast<std::uint8_t>(bits(i)));
      case DType::int8:
        return static_cast<double>(static_cast<std::int8_t>(static_cast<std::uint8_t>(bits(i))));
    }
    return 0.0;
  }
  // Stores v rounded to nearest even in the buffer's value dtype.
  void set(std::int64_t i, double v) {
    switch (dtype_) {
      case DType::float32: {
        const float f = static_cast<float>(v);
        std::uint32_t u;
        std::memcpy(&u, &f, 4);
        set_bits(i, u);
        break;
      }
      case DType::float16:
        set_bits(i, encode_f16(v));
        break;
      case DType::bfloat16:
        set_bits(i, encode_bf16(v));
        break;
      case DType::float8_e4m3fn:
      case DType::float8_e5m2:
        set_bits(i, encode_fp8(dtype_, v));
        break;
      case DType::int32:
      case DType::int64:
        set_index(i, static_cast<std::int64_t>(v));
        break;
      case DType::uint8:
      case DType::int8:  // the integer's two's-complement byte
        set_bits(i, static_cast<std::uint8_t>(static_cast<std::int64_t>(v)));
        break;
    }
  }
  std::int64_t get_index(std::int64_t i) const {
    if (dtype_ == DType::int32)
      return static_cast<std::int32_t>(static_cast<std::uint32_t>(bits(i)));
    return static_cast<std::int64_t>(bits(i));
  }
  void set_index(std::int64_t i, std::int64_t v) {
    if (dtype_ == DType::int32) {
      set_bits(i, static_cast<std::uint32_t>(static_cast<std::int32_t>(v)));
    } else {
      set_bits(i, static_cast<std::uint64_t>(v));
    }
  }

  // All bit patterns, to check later which elements a call changed.
  std::vector<std::uint64_t> snapshot() const {
    std::vector<std::uint64_t> s(static_cast<std::size_t>(n_));
    for (std::int64_t i = 0; i < n_; ++i) s[static_cast<std::size_t>(i)] = bits(i);
    return s;
  }

 private:
  DType dtype_ = DType::float32;
  std::int64_t n_ = 0;
  std::vector<unsigned char> bytes_;
};

// A view into a Buffer: element offset, shape and strides (in elements).
inline embrope::Tensor view(Buffer& b, std::int64_t offset, std::vector<std::int64_t> shape,
                            std::vector<std::int64_t> strides = {}) {
  return embrope::Tensor(b.at(offset), b.dtype(), static_cast<int>(shape.size()), shape.data(),
                         strides.empty() ? nullptr : strides.data());
}

// Row-major contiguous strides of a shape.
inline std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> s(shape.size());
  std::int64_t acc = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    s[d] = acc;
    acc *= shape[d];
  }
  return s;
}

// ------------------------------------------------------- random data, poison ------------

// A deterministic seed from the parameters of a case (splitmix64 over the parts), so that
// every case draws fresh inputs and a failure reproduces.
inline std::uint64_t seed_of(std::initializer_list<std::int64_t> parts) {
  std::uint64_t h = 0x9e3779b97f4a7c15ull;
  for (std::int64_t p : parts) {
    h ^= static_cast<std::uint64_t>(p) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    std::uint64_t z = h + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    h = z ^ (z >> 31);
  }
  return h;
}

// Values uniform in [-1, 1], rounded to the buffer's dtype, never zero.
inline void fill_random(Buffer& b, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  for (std::int64_t i = 0; i < b.size(); ++i) {
    double v = 0.0;
    while (v == 0.0) v = round_to(b.dtype(), dist(rng));
    b.set(i, v);
  }
}

// Random integers in [lo, hi] into an index buffer.
inline void fill_random_indices(Buffer& b, std::uint64_t seed, std::int64_t lo, std::int64_t hi) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> dist(lo, hi);
  for (std::int64_t i = 0; i < b.size(); ++i) b.set_index(i, dist(rng));
}

// Writes NaN (float32), the kPoison16 NaN pattern (float16, bfloat16) or 0x7f (float8) everywhere.
inline void poison(Buffer& b) {
  for (std::int64_t i = 0; i < b.size(); ++i) {
    if (b.dtype() == DType::float32) {
      b.set_bits(i, 0x7fc00badu);
    } else if (embrope::dtype_size(b.dtype()) == 1) {
      b.set_bits(i, 0x7f);  // NaN in both float8 formats
    } else {
      b.set_bits(i, kPoison16);
    }
  }
}

// ------------------------------------------------------------------ RoPE ----------------

// inv_freq_i = base^(-2i/R) (docs/ops.md, "apply_rope").
inline double rope_inv_freq(std::int64_t i, std::int64_t rotary_dim, double base) {
  return std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim));
}

// The two elements of rotation pair i: neox (i, i + R/2), interleaved (2i, 2i + 1).
inline void rope_pair(bool interleaved, std::int64_t rotary_dim, std::int64_t i, std::int64_t* a,
                      std::int64_t* b) {
  if (interleaved) {
    *a = 2 * i;
    *b = 2 * i + 1;
  } else {
    *a = i;
    *b = i + rotary_dim / 2;
  }
}

// cos and sin of p * inv_freq_i for i < R/2, in float64.
inline void rope_cos_sin(std::int64_t position, std::int64_t rotary_dim, double base,
                         std::vector<double>& cos_v, std::vector<double>& sin_v) {
  cos_v.resize(static_cast<std::size_t>(rotary_dim / 2));
  sin_v.resize(static_cast<std::size_t>(rotary_dim / 2));
  for (std::int64_t i = 0; i < rotary_dim / 2; ++i) {
    const double angle = static_cast<double>(position) * rope_inv_freq(i, rotary_dim, base);
    cos_v[static_cast<std::size_t>(i)] = std::cos(angle);
    sin_v[static_cast<std::size_t>(i)] = std::sin(angle);
  }
}

// Rotates head vector x by the given per-frequency cos and sin: (a, b) ->
// (a cos - b sin, a sin + b cos), with -sin for the inverse; elements >= R pass through.
// magnitude (optional) receives |a cos| + |b sin| (resp. |a sin| + |b cos|) per element, the
// size of the terms the float32 arithmetic rounds (the pass-through elements get |x|).
inline std::vector<double> rope_rotate(const std::vector<double>& x, std::int64_t rotary_dim,
                                       bool interleaved, bool inverse,
                                       const std::vector<double>& cos_v,
                                       const std::vector<double>& sin_v,
                                       std::vector<double>* magnitude = nullptr) {
  std::vector<double> y = x;
  if (magnitude != nullptr) {
    magnitude->resize(x.size());
    for (std::size_t d = 0; d < x.size(); ++d) (*magnitude)[d] = std::fabs(x[d]);
  }
  for (std::int64_t i = 0; i < rotary_dim / 2; ++i) {
    std::int64_t ia = 0, ib = 0;
    rope_pair(interleaved, rotary_dim, i, &ia, &ib);
    const auto ua = static_cast<std::size_t>(ia);
    const auto ub = static_cast<std::size_t>(ib);
    const double c = cos_v[static_cast<std::size_t>(i)];
    const double s =
        inverse ? -sin_v[static_cast<std::size_t>(i)] : sin_v[static_cast<std::size_t>(i)];
    const double a = x[ua];
    const double b = x[ub];
    y[ua] = a * c - b * s;
    y[ub] = a * s + b * c;
    if (magnitude != nullptr) {
      (*magnitude)[ua] = std::fabs(a * c) + std::fabs(b * s);
      (*magnitude)[ub] = std::fabs(a * s) + std::fabs(b * c);
    }
  }
  return y;
}

// RoPE of one head vector at a position with the default frequencies.
inline std::vector<double> rope(const std::vector<double>& x, std::int64_t position,
                                std::int64_t rotary_dim, double base, bool interleaved,
                                bool inverse = false, std::vector<double>* magnitude = nullptr) {
  std::vector<double> c, s;
  rope_cos_sin(position, rotary_dim, base, c, s);
  return rope_rotate(x, rotary_dim, interleaved, inverse, c, s, magnitude);
}

// ---------------------------------------------------- sinusoidal positions --------------

// w_i = base^(-2i/D) (docs/ops.md, "embed").
inline double sinusoid_freq(std::int64_t i, std::int64_t dim, double base) {
  return std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(dim));
}

// P(p): interleaved P[2i] = sin(p w_i), P[2i+1] = cos(p w_i); split P[i] = sin(p w_i),
// P[D/2 + i] = cos(p w_i).
inline std::vector<double> sinusoid(std::int64_t position, std::int64_t dim, double base,
                                    bool split) {
  std::vector<double> p(static_cast<std::size_t>(dim));
  for (std::int64_t i = 0; i < dim / 2; ++i) {
    const double angle = static_cast<double>(position) * sinusoid_freq(i, dim, base);
    const auto si = static_cast<std::size_t>(split ? i : 2 * i);
    const auto ci = static_cast<std::size_t>(split ? dim / 2 + i : 2 * i + 1);
    p[si] = std::sin(angle);
    p[ci] = std::cos(angle);
  }
  return p;
}

// ------------------------------------------------------------- embeddings ---------------

enum class Positions { none, learned, sinusoidal };

// Everything one output row of embed depends on besides its id, position and type id.
struct EmbedSpec {
  const Buffer* table = nullptr;  // [V, D] with row stride table_stride
  std::int64_t vocab = 0, dim = 0, table_stride = 0;
  double scale = 1.0;
  std::int64_t vocab_start = 0;
  bool vocab_shard = false;
  Positions positions = Positions::none;
  const Buffer* position_table = nullptr;  // learned: [max_positions, D]
  std::int64_t max_positions = 0, position_stride = 0;
  double base = 10000.0;
  bool split = false;
  const Buffer* type_table = nullptr;  // [num_types, D], or null
  std::int64_t num_types = 0, type_stride = 0;
};

// The float64 reference of one row (docs/ops.md, "embed"):
//   out = scale * table[id - vocab_start] (zero for a shard miss) + P(pos) + type_table[type].
// Returns false when the row is bad (an id outside a non-shard table, a position outside the
// learned table or negative, a type id outside its table): its expected output is zeros.
// magnitude receives the sum of the absolute values of the terms, per element.
inline bool embed_row(const EmbedSpec& s, std::int64_t id, std::int64_t position, std::int64_t type,
                      std::vector<double>& out, std::vector<double>& magnitude) {
  const auto dim = static_cast<std::size_t>(s.dim);
  out.assign(dim, 0.0);
  magnitude.assign(dim, 0.0);
  // Compared before subtracting: id - vocab_start would overflow for ids near INT64_MIN.
  const bool hit = id >= s.vocab_start && id < s.vocab_start + s.vocab;
  const std::int64_t row = hit ? id - s.vocab_start : 0;
  bool bad = !hit && !s.vocab_shard;
  if (s.positions == Positions::learned && (position < 0 || position >= s.max_positions)) {
    bad = true;
  }
  // Sinusoidal positions lie in [0, 2^32) (docs/ops.md).
  if (s.positions == Positions::sinusoidal &&
      (position < 0 || position >= (std::int64_t{1} << 32))) {
    bad = true;
  }
  if (s.type_table != nullptr && (type < 0 || type >= s.num_types)) bad = true;
  if (bad) return false;
  for (std::size_t d = 0; d < dim; ++d) {
    if (hit) {
      const double t = s.scale * s.table->get(row * s.table_stride + static_cast<std::int64_t>(d));
      out[d] += t;
      magnitude[d] += std::fabs(t);
    }
  }
  if (s.positions == Positions::learned) {
    for (std::size_t d = 0; d < dim; ++d) {
      const double p =
          s.position_table->get(position * s.position_stride + static_cast<std::int64_t>(d));
      out[d] += p;
      magnitude[d] += std::fabs(p);
    }
  } else if (s.positions == Positions::sinusoidal) {
    const std::vector<double> p = sinusoid(position, s.dim, s.base, s.split);
    for (std::size_t d = 0; d < dim; ++d) {
      out[d] += p[d];
      magnitude[d] += std::fabs(p[d]);
    }
  }
  if (s.type_table != nullptr) {
    for (std::size_t d = 0; d < dim; ++d) {
      const double t = s.type_table->get(type * s.type_stride + static_cast<std::int64_t>(d));
      out[d] += t;
      magnitude[d] += std::fabs(t);
    }
  }
  return true;
}

// ------------------------------------------------------------- tolerances ---------------

// The relative tolerance of float32 outputs against the float64 reference, relative to the
// norm of the vector (head row, embedding row) the element belongs to (docs/numerics.md).
constexpr double kFloat32RelTol = 2e-6;

inline double norm(const std::vector<double>& v) {
  double s = 0.0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// How far an output element of `dtype` may be from its float64 reference value `want`:
// - float32: kFloat32RelTol * norm (the reference row's norm);
// - float16, bfloat16: one ulp of the output dtype at `want`, plus four float32 ulps of the
//   terms the float32 arithmetic added (`magnitude`): when the terms cancel to a result
//   far below them (a tiny rotated element), the float32 arithmetic before the one rounding
//   is itself off by a float32 ulp of the terms, which can exceed a float16 subnormal ulp.
inline double tolerance(DType dtype, double want, double row_norm, double magnitude) {
  if (dtype == DType::float32) return kFloat32RelTol * row_norm;
  return ulp(dtype, want) + std::ldexp(magnitude, -21);
}

// Collects the elements that miss their reference: count and a description of the first few.
struct Mismatches {
  std::int64_t checked = 0;
  std::int64_t count = 0;
  std::string first;

  void fail(const std::string& what) {
    if (count < 5) first += what + "\n";
    ++count;
  }
  // Checks got against want within tol; NaN never passes. loc() describes the element and
  // is called only on failure.
  template <typename Loc>
  void expect_close(const Loc& loc, double got, double want, double tol) {
    ++checked;
    if (!(std::fabs(got - want) <= tol)) {
      std::ostringstream os;
      os.precision(17);
      os << loc() << ": got " << got << ", expected " << want << " (tolerance " << tol << ", error "
         << std::fabs(got - want) << ")";
      fail(os.str());
    }
  }
  template <typename Loc>
  void expect_bits(const Loc& loc, std::uint64_t got, std::uint64_t want) {
    ++checked;
    if (got != want) {
      std::ostringstream os;
      os << loc() << ": bits 0x" << std::hex << got << ", expected 0x" << want;
      fail(os.str());
    }
  }
  std::string summary() const {
    std::ostringstream os;
    os << count << " of " << checked << " elements wrong\n" << first;
    return os.str();
  }
};

// Whether `text` mentions `word` as a whole: not as part of a longer identifier (so that
// "k" matches "k has dtype float16" but not "kernel"). Case-sensitive.
inline bool mentions(const std::string& text, const std::string& word) {
  auto ident = [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_';
  };
  for (std::size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    const std::size_t end = at + word.size();
    const bool left = at == 0 || !ident(text[at - 1]) || !ident(word.front());
    const bool right = end == text.size() || !ident(text[end]) || !ident(word.back());
    if (left && right) return true;
  }
  return false;
}

// A compact description of an element, for messages: "q[b=1,s=2,h=0,d=5]".
inline std::string where(const char* name, std::initializer_list<std::int64_t> coords) {
  std::ostringstream os;
  os << name << "[";
  bool first = true;
  for (std::int64_t c : coords) {
    if (!first) os << ",";
    os << c;
    first = false;
  }
  os << "]";
  return os.str();
}

// Checks token t's rows of a RoPE output against the float64 rotation of the input's: `heads`
// rows of d elements from element (t * heads) * d of in and out, each rotated by the token's
// float64 cos_v and sin_v (R/2 each; rope_rotate), within tolerance() of dtype.
inline void expect_rotated_token(Mismatches& m, const char* name, const Buffer& in,
                                 const Buffer& out, std::int64_t t, std::int64_t heads,
                                 std::int64_t d, std::int64_t rotary_dim, bool interleaved,
                                 bool inverse, const std::vector<double>& cos_v,
                                 const std::vector<double>& sin_v, DType dtype) {
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::int64_t row = (t * heads + h) * d;
    std::vector<double> x(static_cast<std::size_t>(d)), magnitude;
    for (std::int64_t e = 0; e < d; ++e) x[static_cast<std::size_t>(e)] = in.get(row + e);
    const std::vector<double> y =
        rope_rotate(x, rotary_dim, interleaved, inverse, cos_v, sin_v, &magnitude);
    const double n = norm(y);
    for (std::int64_t e = 0; e < d; ++e) {
      const auto ue = static_cast<std::size_t>(e);
      m.expect_close(
          [&] {
            return where(name, {t, h, e});
          },
          out.get(row + e), y[ue], tolerance(dtype, y[ue], n, magnitude[ue]));
    }
  }
}

}  // namespace ref
