// Every CPU path gives the portable path's bits: apply_rope and embed run under the
// instruction set named on the command line (EMBROPE_CPU_ISA = portable, avx2, avx512 or
// avx512_bf16), and each output byte is compared with the portable arithmetic of
// include/embrope/detail/ (the numerics contract, itself tested against float64 references),
// element by element. float16 and bfloat16 inputs take every one of their 65536 bit patterns (NaN,
// infinities, subnormals, signed zeros); float32 inputs random values and those specials.
//
//   embrope_cpu_isa_parity ISA
// exits 0 when every byte matches, 1 when one differs, 77 (skipped) when this CPU lacks ISA.
#include <embrope/embrope.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "embrope/detail/norm_math.hpp"
#include "embrope/detail/quant_math.hpp"
#include "embrope/detail/numeric_types.hpp"
#include "embrope/detail/rope_math.hpp"
#include "embrope/detail/sinusoid.hpp"

namespace {

using embrope::DType;
using embrope::Tensor;
using embrope::detail::BFloat16;
using embrope::detail::from_float;
using embrope::detail::Half;
using embrope::detail::to_float;

int failures = 0;

template <typename T>
constexpr DType dtype_of() {
  return std::is_same_v<T, float>  ? DType::float32
         : std::is_same_v<T, Half> ? DType::float16
                                   : DType::bfloat16;
}

template <typename T>
const char* name_of() {
  return embrope::dtype_name(dtype_of<T>());
}

// n values of T from a 64-byte boundary plus `offset` elements (a vector's storage need not be
// aligned: glibc puts large blocks 16 bytes past a page), so that outputs past 16 MiB are
// aligned for the streaming stores and take them, or, with an offset, are not and do not.
template <typename T>
struct AlignedValues {
  std::vector<T> storage;
  T* data;
  AlignedValues(std::size_t n, T fill, std::size_t offset = 0)
      : storage(n + offset + 64 / sizeof(T), fill) {
    const std::size_t misalignment = reinterpret_cast<std::uintptr_t>(storage.data()) % 64;
    data = storage.data() + (64 - misalignment) % 64 / sizeof(T) + offset;
  }
  std::vector<T> values(std::size_t n) const { return std::vector<T>(data, data + n); }
};

template <typename T>
std::uint32_t bits_of(T v) {
  std::uint32_t u = 0;
  std::memcpy(&u, &v, sizeof v);
  return u;
}

// Values of T: for 16-bit types, bit pattern (i * 40503) mod 2^16 (every pattern once per
// 65536 elements); for float32, random values with specials mixed in. `finite` gives random
// values in [-2, 2] instead.
template <typename T>
std::vector<T> make_values(std::size_t n, bool finite, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<T> v(n);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(),
                            -1e-40f,
                            std::numeric_limits<float>::max(),
                            65519.0f,
                            65520.0f,
                            1e-7f,
                            3.3895314e38f};
  for (std::size_t i = 0; i < n; ++i) {
    if (finite) {
      v[i] = from_float<T>(u(rng));
    } else if constexpr (std::is_same_v<T, float>) {
      v[i] = i % 7 == 0 ? specials[(i / 7) % std::size(specials)] : u(rng) * 1e3f;
    } else {
      const auto pattern = static_cast<std::uint16_t>((i * 40503u) & 0xffffu);
      std::memcpy(&v[i], &pattern, sizeof pattern);
    }
  }
  return v;
}

template <typename T>
void compare(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (bits_of(got[i]) != bits_of(want[i])) {
      std::printf("FAIL %s: element %zu is 0x%x, the portable arithmetic gives 0x%x\n",
                  what.c_str(), i, bits_of(got[i]), bits_of(want[i]));
      ++failures;
      return;
    }
  }
}

// apply_rope with a caller table of dtype C: q [T, H, D] rotated in place or out of place.
// `role` picks which element of each pair takes the exhaustive values (0: the first, 1: the
// second; the other is finite), so that no pair holds two NaNs (whose payload IEEE 754 leaves
// to the hardware). The default head dim and rotary dim are whole vectors of neither width;
// the sweep in all_cases_of gives rows (halves for neox) of less than one vector and of one
// to twenty whole vectors. tiny: every value scaled by 2^-120 first, so that some results are
// float32 subnormals (which bfloat16 keeps and VCVTNEPS2BF16 would flush): about 1% of a
// bfloat16 row's, in a third to three quarters of the rows, beside rows with none.
// nan_table: a float32 table whose entries hold, here and there, NaNs with payload bits in their
// low 16 (0x7fc0ffff, 0xffc08001), which an arithmetic NaN of 16-bit inputs never has:
// rounding such a NaN as a number changes its high half, so the rows holding one must take the
// stores' NaN paths. Cosines only (GPT-J's widened sines are negated, which flips a NaN's
// sign: a difference numerics.md allows); with role 2 every value of q is finite (one NaN per
// operation: IEEE 754 leaves the choice between two to the hardware).
template <typename T, typename C>
void rope_case(embrope::RopeLayout layout, bool inverse, bool in_place, int role,
               std::int64_t dim = 76, std::int64_t rotary = 68, std::int64_t tokens = 1800,
               bool tiny = false, bool nan_table = false) {
  const std::int64_t heads = 3, half = rotary / 2;
  const std::int64_t positions_count = 97;
  const std::size_t n = static_cast<std::size_t>(tokens * heads * dim);
  const bool neox = layout == embrope::RopeLayout::neox;
  std::vector<T> special = make_values<T>(n, false, 1);
  std::vector<T> finite = make_values<T>(n, true, 2);
  std::vector<T> q(n);
  for (std::size_t e = 0; e < n; ++e) {
    const std::int64_t i = static_cast<std::int64_t>(e) % dim;
    const int element_role = i >= rotary ? 0 : neox ? (i < half ? 0 : 1) : static_cast<int>(i % 2);
    q[e] = element_role == role ? special[e] : finite[e];
    if (tiny) q[e] = from_float<T>(to_float(q[e]) * 0x1p-120f);
  }
  std::vector<C> cos = make_values<C>(static_cast<std::size_t>(positions_count * half), true, 3);
  std::vector<C> sin = make_values<C>(static_cast<std::size_t>(positions_count * half), true, 4);
  if constexpr (std::is_same_v<C, float>) {
    for (std::size_t e = 0; nan_table && e < cos.size(); e += 1) {
      const std::uint32_t payload = e % 23 == 0 ? 0x7fc0ffffu : e % 29 == 1 ? 0xffc08001u : 0;
      if (payload != 0) std::memcpy(&cos[e], &payload, 4);
    }
  }
  std::vector<std::int64_t> positions(static_cast<std::size_t>(tokens));
  for (std::int64_t t = 0; t < tokens; ++t) positions[t] = (t * 31 + 5) % positions_count;

  std::vector<T> want = q;
  const float sin_sign = inverse ? -1.0f : 1.0f;
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t h = 0; h < heads; ++h) {
      T* x = want.data() + (t * heads + h) * dim;
      for (std::int64_t i = 0; i < half; ++i) {
        const std::int64_t ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
        float a = to_float(x[ia]), b = to_float(x[ib]);
        embrope::detail::rotate_pair(a, b, to_float(cos[positions[t] * half + i]),
                                     sin_sign * to_float(sin[positions[t] * half + i]));
        x[ia] = from_float<T>(a);
        x[ib] = from_float<T>(b);
      }
    }
  }
  std::vector<T> out(n, from_float<T>(7.0f));
  embrope::RopeOptions options;
  options.layout = layout;
  options.inverse = inverse;
  const Tensor tq(q.data(), dtype_of<T>(), {tokens, heads, dim});
  if (!in_place) options.q_out = Tensor(out.data(), dtype_of<T>(), {tokens, heads, dim});
  embrope::apply_rope(tq, std::nullopt, Tensor(positions.data(), DType::int64, {tokens}),
                      Tensor(cos.data(), dtype_of<C>(), {positions_count, half}),
                      Tensor(sin.data(), dtype_of<C>(), {positions_count, half}), options);
  compare(std::string("apply_rope ") + name_of<T>() + " table " + name_of<C>() +
              (neox ? " neox" : " interleaved") + (inverse ? " inverse" : "") +
              (in_place ? " in place" : " out of place") + (tiny ? " tiny" : "") +
              (nan_table ? " NaN table" : "") + " role " + std::to_string(role) + " D " +
              std::to_string(dim) + " R " + std::to_string(rotary),
          in_place ? q : out, want);
}

// apply_rope with float8 outputs: every byte is the portable arithmetic's, the rotation in
// float32 then value * scale rounded once (specials included: NaN, infinities, saturation),
// and q's non-rotary part held apart (q_nope, 37 elements a row) scaled and rounded alike.
template <typename T, typename O>
void rope_float8_case(embrope::RopeLayout layout, DType out_dtype) {
  const std::int64_t tokens = 700, heads = 3, dim = 76, rotary = 64, half = rotary / 2;
  const std::int64_t positions_count = 97;
  const std::size_t n = static_cast<std::size_t>(tokens * heads * dim);
  const bool neox = layout == embrope::RopeLayout::neox;
  std::vector<T> q = make_values<T>(n, false, 5);
  std::vector<float> cos =
      make_values<float>(static_cast<std::size_t>(positions_count * half), true, 6);
  std::vector<float> sin =
      make_values<float>(static_cast<std::size_t>(positions_count * half), true, 7);
  std::vector<std::int64_t> positions(static_cast<std::size_t>(tokens));
  for (std::int64_t t = 0; t < tokens; ++t) positions[t] = (t * 31 + 5) % positions_count;
  const float scales[heads] = {0.75f, 3.0f, 40.0f};
  std::vector<std::uint8_t> want(n);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const T* x = q.data() + (t * heads + h) * dim;
      std::uint8_t* y = want.data() + (t * heads + h) * dim;
      const float scale = 2.0f * scales[h];
      for (std::int64_t i = 0; i < half; ++i) {
        const std::int64_t ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
        float a = to_float(x[ia]), b = to_float(x[ib]);
        embrope::detail::rotate_pair(a, b, cos[positions[t] * half + i],
                                     sin[positions[t] * half + i]);
        y[ia] = from_float<O>(a * scale).bits;
        y[ib] = from_float<O>(b * scale).bits;
      }
      for (std::int64_t i = rotary; i < dim; ++i) y[i] = from_float<O>(to_float(x[i]) * scale).bits;
    }
  }
  const std::int64_t nope = 37;
  std::vector<T> q_nope = make_values<T>(static_cast<std::size_t>(tokens * heads * nope), false, 8);
  std::vector<std::uint8_t> nope_out(q_nope.size(), 0x55), want_nope(q_nope.size());
  for (std::size_t i = 0; i < q_nope.size(); ++i) {
    const float scale = 2.0f * scales[(i / nope) % heads];
    want_nope[i] = from_float<O>(to_float(q_nope[i]) * scale).bits;
  }
  std::vector<std::uint8_t> out(n, 0x55);
  std::vector<float> head_scales(scales, scales + heads);
  embrope::RopeOptions options;
  options.layout = layout;
  options.q_out = Tensor(out.data(), out_dtype, {tokens, heads, dim});
  options.q_out_scale = 2.0f;
  options.q_out_head_scales = Tensor(head_scales.data(), DType::float32, {heads});
  options.q_nope = Tensor(q_nope.data(), dtype_of<T>(), {tokens, heads, nope});
  options.q_nope_out = Tensor(nope_out.data(), out_dtype, {tokens, heads, nope});
  embrope::apply_rope(Tensor(q.data(), dtype_of<T>(), {tokens, heads, dim}), std::nullopt,
                      Tensor(positions.data(), DType::int64, {tokens}),
                      Tensor(cos.data(), DType::float32, {positions_count, half}),
                      Tensor(sin.data(), DType::float32, {positions_count, half}), options);
  const std::string what = std::string("apply_rope ") + name_of<T>() + " -> " +
                           embrope::dtype_name(out_dtype) + (neox ? " neox" : " interleaved");
  compare(what, out, want);
  compare(what + " q_nope_out", nope_out, want_nope);
}

// embed with a scale, learned or sinusoidal positions and types (each optional), shard misses
// included.
enum class Positions { none, learned, sinusoidal, sinusoidal_split };

template <typename T>
void embed_case(float scale, Positions positions_kind, bool types, std::int64_t rows = 2000,
                std::int64_t dim = 76) {
  const bool learned = positions_kind == Positions::learned;
  const bool sinusoidal =
      positions_kind == Positions::sinusoidal || positions_kind == Positions::sinusoidal_split;
  const bool split = positions_kind == Positions::sinusoidal_split;
  const std::int64_t vocab = 1000, max_positions = 50;
  std::vector<T> table = make_values<T>(static_cast<std::size_t>(vocab * dim), false, 5);
  std::vector<T> position_table =
      make_values<T>(static_cast<std::size_t>(max_positions * dim), true, 6);
  std::vector<T> type_table = make_values<T>(static_cast<std::size_t>(2 * dim), true, 7);
  std::vector<std::int64_t> ids(rows), position_ids(rows), type_ids(rows);
  for (std::int64_t n = 0; n < rows; ++n) {
    ids[n] = (n * 7 + 3) % (vocab + 40);  // ids past the shard: zero token rows
    position_ids[n] = sinusoidal ? n * 104729 : (n * 13) % max_positions;
    type_ids[n] = n % 2;
  }
  std::vector<T> want(static_cast<std::size_t>(rows * dim));
  // A plain lookup with scale 1 copies the row's bits (NaN payloads included).
  const bool copy = scale == 1.0f && positions_kind == Positions::none && !types;
  for (std::int64_t n = 0; n < rows; ++n) {
    for (std::int64_t j = 0; j < dim; ++j) {
      if (copy) {
        want[n * dim + j] = ids[n] < vocab ? table[ids[n] * dim + j] : from_float<T>(0.0f);
        continue;
      }
      float a = ids[n] < vocab ? scale * to_float(table[ids[n] * dim + j]) : 0.0f;
      if (learned) a += to_float(position_table[position_ids[n] * dim + j]);
      if (sinusoidal) {
        const std::int64_t i = split ? j % (dim / 2) : j / 2;
        float sin_v, cos_v;
        embrope::detail::sinusoid_sin_cos(
            position_ids[n], embrope::detail::sinusoid_freq(i, dim, 10000.0), &sin_v, &cos_v);
        a += (split ? j < dim / 2 : j % 2 == 0) ? sin_v : cos_v;
      }
      if (types) a += to_float(type_table[type_ids[n] * dim + j]);
      want[n * dim + j] = from_float<T>(a);
    }
  }
  std::vector<T> out(want.size());
  embrope::EmbedOptions options;
  options.scale = scale;
  options.vocab_shard = true;
  if (sinusoidal) {
    options.positions = embrope::PositionEncoding::sinusoidal;
    options.sinusoid_layout =
        split ? embrope::SinusoidLayout::split : embrope::SinusoidLayout::interleaved;
    options.position_ids = Tensor(position_ids.data(), DType::int64, {rows});
  }
  if (learned) {
    options.positions = embrope::PositionEncoding::learned;
    options.position_table = Tensor(position_table.data(), dtype_of<T>(), {max_positions, dim});
    options.position_ids = Tensor(position_ids.data(), DType::int64, {rows});
  }
  if (types) {
    options.type_table = Tensor(type_table.data(), dtype_of<T>(), {2, dim});
    options.type_ids = Tensor(type_ids.data(), DType::int64, {rows});
  }
  embrope::embed(Tensor(table.data(), dtype_of<T>(), {vocab, dim}),
                 Tensor(ids.data(), DType::int64, {rows}),
                 Tensor(out.data(), dtype_of<T>(), {rows, dim}), options);
  compare(std::string("embed ") + name_of<T>() + " D " + std::to_string(dim) + " rows " +
              std::to_string(rows) + " scale " + std::to_string(scale) +
              (learned ? " learned" : "") + (sinusoidal ? " sinusoidal" : "") +
              (split ? " split" : "") + (types ? " types" : ""),
          out, want);
}

// embed from a quantized table (nothing else added, so rows are decoded a part at a time; or
// with learned positions, a whole row into the sum): the vector bodies' decoding of every byte
// pattern (each int8, nibble pair and float8 code, NaN and subnormals included; GGUF blocks of
// varied bytes) against the element formulas of detail/quant_math.hpp. Groups that end
// mid-vector, odd int4 groups, rows past one part, zero points of each kind, streamed outputs.
struct QuantCase {
  embrope::QuantFormat format;
  std::int64_t dim, groups;  // groups: scales per row (0: one for the table)
  DType zero_point_dtype;    // DType::uint8: none
  std::int64_t rows = 700;
  bool learned = false;
};

template <typename T>
void embed_quantized_case(const QuantCase& c) {
  using embrope::QuantFormat;
  namespace d = embrope::detail;
  const std::int64_t vocab = 257, dim = c.dim, rows = c.rows, max_positions = 30;
  const bool gguf = c.format == QuantFormat::gguf_q8_0 || c.format == QuantFormat::gguf_q4_0 ||
                    c.format == QuantFormat::gguf_q4_k || c.format == QuantFormat::gguf_q6_k;
  d::GgufBlock block = d::GgufBlock::q8_0;
  if (c.format == QuantFormat::gguf_q4_0) block = d::GgufBlock::q4_0;
  if (c.format == QuantFormat::gguf_q4_k) block = d::GgufBlock::q4_k;
  if (c.format == QuantFormat::gguf_q6_k) block = d::GgufBlock::q6_k;
  const std::int64_t block_values = d::gguf_block_values(block);
  const std::int64_t columns = gguf ? dim / block_values * d::gguf_block_bytes(block)
                               : c.format == QuantFormat::int4 ? dim / 2
                                                               : dim;
  // Byte i of the table: (i * 167 + 13) mod 256, every pattern in every run of 256 bytes.
  std::vector<std::uint8_t> data(static_cast<std::size_t>(vocab * columns));
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::uint8_t>(i * 167 + 13);
  if (gguf) {  // finite float16 scales (d; and dmin for Q4_K) in [0.25, 2)
    const std::int64_t bytes = d::gguf_block_bytes(block);
    for (std::int64_t b = 0; b < vocab * columns / bytes; ++b) {
      std::uint8_t* p = data.data() + b * bytes + (block == d::GgufBlock::q6_k ? 208 : 0);
      for (int k = 0; k < (block == d::GgufBlock::q4_k ? 2 : 1); ++k) {
        const std::uint16_t h = static_cast<std::uint16_t>(0x3400 + (b * 97 + k * 31) % 0x0800);
        p[2 * k] = static_cast<std::uint8_t>(h & 0xff);
        p[2 * k + 1] = static_cast<std::uint8_t>(h >> 8);
      }
    }
  }
  const std::int64_t groups = c.groups == 0 ? 1 : c.groups, group = dim / groups;
  std::vector<float> scales =
      make_values<float>(static_cast<std::size_t>(vocab * groups), true, 21);
  if ((c.format == QuantFormat::float8_e4m3fn || c.format == QuantFormat::float8_e5m2) &&
      group >= 512) {
    // Rows 3, 10, 17 and 24 (ids 0-3) with a first scale of 0, infinity, -0 and -infinity:
    // factors for which a code and its negation need not give outputs of opposite signs
    // (infinity times zero is one NaN for either sign). (A NaN scale times a NaN code gives
    // one of the two NaNs, by operand order: not compared.)
    const float specials[] = {0.0f, std::numeric_limits<float>::infinity(), -0.0f,
                              -std::numeric_limits<float>::infinity()};
    for (int k = 0; k < 4; ++k)
      scales[static_cast<std::size_t>((3 + 7 * k) * groups)] = specials[k];
  }
  std::vector<std::int8_t> zero_i8(scales.size());
  std::vector<float> zero_f32(scales.size());
  for (std::size_t i = 0; i < scales.size(); ++i) {
    zero_i8[i] = static_cast<std::int8_t>(static_cast<int>(i * 5 % 17) - 8);
    zero_f32[i] = static_cast<float>(static_cast<int>(i * 3 % 13) - 6);
  }
  std::vector<T> position_table =
      make_values<T>(static_cast<std::size_t>(max_positions * dim), true, 22);
  std::vector<std::int64_t> ids(static_cast<std::size_t>(rows)),
      position_ids(static_cast<std::size_t>(rows));
  for (std::int64_t n = 0; n < rows; ++n) {
    ids[n] = (n * 7 + 3) % (vocab + 20);  // ids past the shard: zero token rows
    position_ids[n] = (n * 13) % max_positions;
  }
  const float scale = 0.75f;
  std::vector<T> want(static_cast<std::size_t>(rows * dim));
  for (std::int64_t n = 0; n < rows; ++n) {
    const std::uint8_t* row = data.data() + ids[n] * columns;
    for (std::int64_t j = 0; j < dim; ++j) {
      float x = 0.0f;
      if (ids[n] < vocab && gguf) {
        const std::int64_t b = j / block_values;
        x = d::gguf_value(block, row + b * d::gguf_block_bytes(block),
                          static_cast<int>(j - b * block_values));
      } else if (ids[n] < vocab) {
        const std::size_t g =
            static_cast<std::size_t>(c.groups == 0 ? 0 : ids[n] * groups + j / group);
        const float s = scales[g];
        const float z = c.zero_point_dtype == DType::int8      ? zero_i8[g]
                        : c.zero_point_dtype == DType::float32 ? zero_f32[g]
                                                               : 0.0f;
        if (c.format == QuantFormat::int8) {
          x = d::affine_value(static_cast<std::int8_t>(row[j]), z, s);
        } else if (c.format == QuantFormat::int4) {
          x = d::affine_value(d::int4_packed_value(row, j), z, s);
        } else if (c.format == QuantFormat::float8_e4m3fn) {
          x = to_float(d::Float8E4M3{row[j]}) * s;
        } else {
          x = to_float(d::Float8E5M2{row[j]}) * s;
        }
      }
      float a = ids[n] < vocab ? scale * x : 0.0f;
      if (c.learned) a += to_float(position_table[position_ids[n] * dim + j]);
      want[n * dim + j] = from_float<T>(a);
    }
  }
  DType data_dtype = DType::uint8;
  if (c.format == QuantFormat::int8) data_dtype = DType::int8;
  if (c.format == QuantFormat::float8_e4m3fn) data_dtype = DType::float8_e4m3fn;
  if (c.format == QuantFormat::float8_e5m2) data_dtype = DType::float8_e5m2;
  embrope::QuantizedTable table;
  table.format = c.format;
  table.data = Tensor(data.data(), data_dtype, {vocab, columns});
  table.dim = dim;
  if (!gguf) {
    const auto shaped = [&](void* p, DType dtype) {
      return c.groups == 0 ? Tensor(p, dtype, {1}) : Tensor(p, dtype, {vocab, groups});
    };
    table.scales = shaped(scales.data(), DType::float32);
    if (c.zero_point_dtype == DType::int8) table.zero_points = shaped(zero_i8.data(), DType::int8);
    if (c.zero_point_dtype == DType::float32) {
      table.zero_points = shaped(zero_f32.data(), DType::float32);
    }
  }
  embrope::EmbedOptions options;
  options.scale = scale;
  options.vocab_shard = true;
  if (c.learned) {
    options.positions = embrope::PositionEncoding::learned;
    options.position_table = Tensor(position_table.data(), dtype_of<T>(), {max_positions, dim});
    options.position_ids = Tensor(position_ids.data(), DType::int64, {rows});
  }
  const AlignedValues<T> aligned(want.size(), T{});
  embrope::embed(table, Tensor(ids.data(), DType::int64, {rows}),
                 Tensor(aligned.data, dtype_of<T>(), {rows, dim}), options);
  const std::vector<T> out = aligned.values(want.size());
  compare(std::string("embed quantized format ") + std::to_string(static_cast<int>(c.format)) +
              " -> " + name_of<T>() + " D " + std::to_string(dim) + " groups " +
              std::to_string(c.groups) + " rows " + std::to_string(rows) +
              (c.learned ? " learned" : ""),
          out, want);
}

// embed with a norm (learned positions and types, a scale, a weight in float32 or T, a bias,
// a pre-norm output in T): the vector bodies' sums, statistics and outputs.
template <typename T, typename W>
void embed_norm_case(embrope::Normalization norm, bool unit_offset, std::int64_t dim,
                     std::int64_t rows = 500) {
  using embrope::detail::NormStats;
  const std::int64_t vocab = 300, max_positions = 40;
  std::vector<T> table = make_values<T>(static_cast<std::size_t>(vocab * dim), true, 15);
  std::vector<T> position_table =
      make_values<T>(static_cast<std::size_t>(max_positions * dim), true, 16);
  std::vector<T> type_table = make_values<T>(static_cast<std::size_t>(2 * dim), true, 17);
  std::vector<W> weight = make_values<W>(static_cast<std::size_t>(dim), true, 18);
  std::vector<W> bias = make_values<W>(static_cast<std::size_t>(dim), true, 19);
  const bool layer = norm == embrope::Normalization::layer_norm;
  std::vector<std::int64_t> ids(rows), position_ids(rows), type_ids(rows);
  for (std::int64_t n = 0; n < rows; ++n) {
    ids[n] = (n * 7 + 3) % vocab;
    position_ids[n] = (n * 13) % max_positions;
    type_ids[n] = n % 2;
  }
  const float scale = 1.25f, eps = 1e-5f;
  std::vector<T> want(static_cast<std::size_t>(rows * dim)), want_pre(want.size());
  std::vector<float> a(static_cast<std::size_t>(dim));
  for (std::int64_t n = 0; n < rows; ++n) {
    for (std::int64_t j = 0; j < dim; ++j) {
      a[j] = scale * to_float(table[ids[n] * dim + j]);
      a[j] += to_float(position_table[position_ids[n] * dim + j]);
      a[j] += to_float(type_table[type_ids[n] * dim + j]);
      want_pre[n * dim + j] = from_float<T>(a[j]);
    }
    NormStats s;
    if (layer) {
      s.mean = embrope::detail::norm_mean(
          embrope::detail::canonical_row_sum(dim, [&](std::int64_t j) { return a[j]; }), dim);
    }
    s.rstd = embrope::detail::norm_rstd(
        embrope::detail::canonical_row_sum(
            dim, [&](std::int64_t j) { return embrope::detail::norm_square_term(a[j], s.mean); }),
        dim, eps);
    for (std::int64_t j = 0; j < dim; ++j) {
      const float w = embrope::detail::norm_weight_factor(to_float(weight[j]), unit_offset);
      want[n * dim + j] =
          from_float<T>(embrope::detail::norm_apply(a[j], s, w, layer ? to_float(bias[j]) : 0.0f));
    }
  }
  std::vector<T> out(want.size()), pre(want.size());
  embrope::EmbedOptions options;
  options.scale = scale;
  options.positions = embrope::PositionEncoding::learned;
  options.position_table = Tensor(position_table.data(), dtype_of<T>(), {max_positions, dim});
  options.position_ids = Tensor(position_ids.data(), DType::int64, {rows});
  options.type_table = Tensor(type_table.data(), dtype_of<T>(), {2, dim});
  options.type_ids = Tensor(type_ids.data(), DType::int64, {rows});
  options.norm = norm;
  options.norm_eps = eps;
  options.norm_unit_offset = unit_offset;
  options.norm_weight = Tensor(weight.data(), dtype_of<W>(), {dim});
  if (layer) options.norm_bias = Tensor(bias.data(), dtype_of<W>(), {dim});
  options.pre_norm_out = Tensor(pre.data(), dtype_of<T>(), {rows, dim});
  embrope::embed(Tensor(table.data(), dtype_of<T>(), {vocab, dim}),
                 Tensor(ids.data(), DType::int64, {rows}),
                 Tensor(out.data(), dtype_of<T>(), {rows, dim}), options);
  const std::string what = std::string("embed ") + name_of<T>() +
                           (layer ? " layer_norm" : " rms_norm") + " weight " + name_of<W>() +
                           (unit_offset ? " unit offset" : "") + " D " + std::to_string(dim);
  compare(what, out, want);
  compare(what + " pre_norm_out", pre, want_pre);
}

// The qk-norm + RoPE rows of x ([rows, D], row r at token r / heads) in float32, before the one
// rounding: detail/'s scalar forms of the sum of squares, rstd, weight and rotation.
template <typename T, typename W>
std::vector<float> qk_norm_rope_reference(const std::vector<T>& x, const std::vector<W>& w,
                                          std::int64_t heads, std::int64_t dim, std::int64_t rotary,
                                          embrope::RopeLayout layout,
                                          const std::vector<std::int64_t>& positions,
                                          const std::vector<float>& cos_sin,
                                          std::int64_t max_positions, float eps, bool unit_offset) {
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / dim, half = rotary / 2;
  std::vector<float> want(x.size());
  for (std::int64_t row = 0; row < rows; ++row) {
    const T* in = x.data() + row * dim;
    float* n = want.data() + row * dim;
    const float rstd = embrope::detail::norm_rstd(
        embrope::detail::canonical_row_sum(dim,
                                           [&](std::int64_t j) {
                                             return embrope::detail::norm_square_term(
                                                 to_float(in[j]), 0.0f);
                                           }),
        dim, eps);
    for (std::int64_t j = 0; j < dim; ++j) {
      n[j] = embrope::detail::norm_product(
          embrope::detail::rms_normalized(to_float(in[j]), rstd),
          embrope::detail::norm_weight_factor(to_float(w[j]), unit_offset));
    }
    const std::int64_t p = positions[row / heads];
    for (std::int64_t i = 0; i < half; ++i) {
      const bool neox = layout == embrope::RopeLayout::neox;
      const std::int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
      // The cache's rows (copy_to_host layout): cos [P, R/2], then sin [P, R/2].
      embrope::detail::rotate_pair(n[a], n[b], cos_sin[p * half + i],
                                   cos_sin[max_positions * half + p * half + i]);
    }
  }
  return want;
}

template <typename T>
std::vector<T> rounded(const std::vector<float>& x) {
  std::vector<T> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = from_float<T>(x[i]);
  return y;
}

// qk-norm + RoPE ([T, 3, D] q and [T, 2, D] k, weights in float32 or T, partial rotary): the
// vector bodies' sums of squares, rstd and rotations against detail/'s scalar forms. With a
// float8 O: apply_qk_norm_rope_append_kv's float8 q_out (value * scale, rounded once) and its
// float8 cache (k rounded to T, then divided by k_scale), each a vector body of float8.inc.
// Output::aligned and ::one_element_past: q and k written to q_out and k_out from a 64-byte
// boundary (past kStreamingOutputBytes with streaming stores) or an element past it (ordinary
// stores), the inputs left as they were.
enum class Output { in_place, aligned, one_element_past };
template <typename T, typename W, typename O = T>
void qk_norm_rope_case(embrope::RopeLayout layout, std::int64_t dim, std::int64_t rotary,
                       bool unit_offset, std::int64_t tokens = 37, Output output = Output::in_place,
                       std::int64_t hq = 3, std::int64_t hk = 2, bool special_weights = false) {
  const std::int64_t max_positions = 64;
  std::vector<T> q = make_values<T>(static_cast<std::size_t>(tokens * hq * dim), true, 31);
  std::vector<T> k = make_values<T>(static_cast<std::size_t>(tokens * hk * dim), true, 32);
  std::vector<W> wq = make_values<W>(static_cast<std::size_t>(dim), true, 33);
  std::vector<W> wk = make_values<W>(static_cast<std::size_t>(dim), true, 34);
  if (special_weights) {
    // float32 weights whose products reach the stores' special paths: q's scaled by 2^-130, so
    // that its outputs are float32 subnormals (which bfloat16 keeps and VCVTNEPS2BF16 would
    // flush), and one NaN in each weight with payload bits in its low 16 (rounding it as a
    // number would change its high half), at elements whose rotation partners (4 and 8 when
    // interleaved, 5 + D / 2 and 9 + D / 2 for neox) are finite, so that no operation meets two
    // NaNs. Weights of T cannot hold them: such a case is a mistake in this file.
    if constexpr (std::is_same_v<W, float>) {
      for (float& w : wq) w *= 0x1p-130f;
      const std::uint32_t nan_q = 0x7fc0ffffu, nan_k = 0xffc08001u;
      std::memcpy(&wq[5], &nan_q, sizeof nan_q);
      std::memcpy(&wk[9], &nan_k, sizeof nan_k);
    } else {
      std::fprintf(stderr, "qk_norm_rope_case: special_weights needs float32 weights\n");
      std::abort();
    }
  }
  std::vector<std::int64_t> positions(tokens);
  for (std::int64_t t = 0; t < tokens; ++t) positions[t] = (t * 11) % max_positions;
  const embrope::RopeCache cache({rotary, 10000.0, max_positions});
  std::vector<float> cos_sin(static_cast<std::size_t>(max_positions * rotary));
  cache.copy_to_host(cos_sin.data(), cos_sin.data() + max_positions * rotary / 2);
  const float eps = 1e-6f;
  const auto reference = [&](const std::vector<T>& x, const std::vector<W>& w, std::int64_t h) {
    return qk_norm_rope_reference(x, w, h, dim, rotary, layout, positions, cos_sin, max_positions,
                                  eps, unit_offset);
  };
  const std::vector<float> want_q = reference(q, wq, hq), want_k = reference(k, wk, hk);
  embrope::QkNorm norm;
  norm.q_weight = Tensor(wq.data(), dtype_of<W>(), {dim});
  norm.k_weight = Tensor(wk.data(), dtype_of<W>(), {dim});
  norm.eps = eps;
  norm.unit_offset = unit_offset;
  embrope::RopeOptions options;
  options.layout = layout;
  const Tensor tq(q.data(), dtype_of<T>(), {tokens, hq, dim});
  const Tensor tk(k.data(), dtype_of<T>(), {tokens, hk, dim});
  const Tensor tp(positions.data(), DType::int64, {tokens});
  std::string what = std::string("qk_norm_rope ") + name_of<T>() + " weight " + name_of<W>() +
                     " heads " + std::to_string(hq) + " + " + std::to_string(hk) + " D " +
                     std::to_string(dim) + " R " + std::to_string(rotary) +
                     (layout == embrope::RopeLayout::neox ? " neox" : " interleaved") +
                     (special_weights ? " (subnormal q, NaN weights)" : "");
  if constexpr (std::is_same_v<O, T>) {
    if (output != Output::in_place) {
      const std::vector<T> q_in = q, k_in = k;
      const std::size_t offset = output == Output::aligned ? 0 : 1;
      const AlignedValues<T> q_out(q.size(), from_float<T>(7.0f), offset);
      const AlignedValues<T> k_out(k.size(), from_float<T>(7.0f), offset);
      options.q_out = Tensor(q_out.data, dtype_of<T>(), {tokens, hq, dim});
      options.k_out = Tensor(k_out.data, dtype_of<T>(), {tokens, hk, dim});
      embrope::apply_qk_norm_rope(tq, tk, tp, cache, norm, options);
      what += std::string(" out of place") + (offset ? " (an element past 64 B)" : "") + ", T " +
              std::to_string(tokens);
      compare(what + " q_out", q_out.values(q.size()), rounded<T>(want_q));
      compare(what + " k_out", k_out.values(k.size()), rounded<T>(want_k));
      compare(what + " q", q, q_in);
      compare(what + " k", k, k_in);
      return;
    }
    embrope::apply_qk_norm_rope(tq, tk, tp, cache, norm, options);
    compare(what + " q", q, rounded<T>(want_q));
    compare(what + " k", k, rounded<T>(want_k));
  } else {
    constexpr DType out_dtype =
        std::is_same_v<O, embrope::detail::Float8E4M3> ? DType::float8_e4m3fn : DType::float8_e5m2;
    const float q_scale = 3.0f, k_scale = 0.5f;
    std::vector<std::uint8_t> q_out(q.size(), 0x55), want_q8(q.size()), want_cache(k.size());
    std::vector<std::uint8_t> k_cache(k.size(), 0x55), v_cache(k.size(), 0x55);
    for (std::size_t i = 0; i < q.size(); ++i) want_q8[i] = from_float<O>(want_q[i] * q_scale).bits;
    for (std::size_t i = 0; i < k.size(); ++i) {
      want_cache[i] = from_float<O>(to_float(from_float<T>(want_k[i])) / k_scale).bits;
    }
    std::vector<std::int64_t> slots(static_cast<std::size_t>(tokens));
    for (std::int64_t t = 0; t < tokens; ++t) slots[t] = t;
    embrope::KvCache kv;
    kv.k = Tensor(k_cache.data(), out_dtype, {1, tokens, hk, dim});
    kv.v = Tensor(v_cache.data(), out_dtype, {1, tokens, hk, dim});
    kv.k_scale = k_scale;
    options.q_out = Tensor(q_out.data(), out_dtype, {tokens, hq, dim});
    options.q_out_scale = q_scale;
    embrope::apply_qk_norm_rope_append_kv(
        tq, tk, tk, tp, cache, kv,
        embrope::KvSlots::paged(Tensor(slots.data(), DType::int64, {tokens})), norm, options);
    what += std::string(" append_kv -> ") + embrope::dtype_name(out_dtype);
    compare(what + " q_out", q_out, want_q8);
    compare(what + " k_cache", k_cache, want_cache);
  }
}

// The float8 conversion itself (float8.inc's store_float8 against detail::float_to_float8)
// over float32 bit patterns: every high half (sign, exponent, the mantissa bits either format
// rounds at) with low halves 0 (ties), 1 (just past), 0x8000 and 0xffff (just below the next
// high half): through apply_rope's pass-through elements, taken to float8 as value * 1.
template <typename O>
void float8_conversion_case(DType out_dtype) {
  const std::int64_t tokens = 1024, dim = 258, rotary = 2;
  const std::uint32_t lows[] = {0x0000u, 0x0001u, 0x8000u, 0xffffu};
  std::vector<float> q(static_cast<std::size_t>(tokens * dim), 0.0f);
  std::size_t next = 0;
  for (std::uint32_t high = 0; high < 0x10000u; ++high) {
    for (std::uint32_t low : lows) {
      const std::size_t row = next / (dim - rotary), col = next % (dim - rotary);
      const std::uint32_t bits = high << 16 | low;
      std::memcpy(&q[row * dim + rotary + col], &bits, sizeof bits);
      ++next;
    }
  }
  std::vector<std::uint8_t> want(q.size()), out(q.size(), 0x55);
  for (std::size_t i = 0; i < q.size(); ++i) want[i] = from_float<O>(q[i] * 1.0f).bits;
  std::vector<std::int64_t> positions(static_cast<std::size_t>(tokens), 0);
  float cos[1] = {1.0f}, sin[1] = {0.0f};
  embrope::RopeOptions options;
  options.q_out = Tensor(out.data(), out_dtype, {tokens, 1, dim});
  embrope::apply_rope(Tensor(q.data(), DType::float32, {tokens, 1, dim}), std::nullopt,
                      Tensor(positions.data(), DType::int64, {tokens}),
                      Tensor(cos, DType::float32, {1, 1}), Tensor(sin, DType::float32, {1, 1}),
                      options);
  compare(std::string("float32 -> ") + embrope::dtype_name(out_dtype) + " bit patterns", out, want);
}

template <typename T>
void all_cases_of() {
  for (auto layout : {embrope::RopeLayout::neox, embrope::RopeLayout::interleaved}) {
    for (int role : {0, 1}) {
      rope_case<T, float>(layout, false, true, role);
      rope_case<T, float>(layout, true, false, role);
      rope_case<T, Half>(layout, false, false, role);
      rope_case<T, BFloat16>(layout, true, true, role);
    }
    // Rows of whole vectors, the unrolled bodies' (apply_rope.inc's rotate_row_unrolled) and
    // the loop's past them, partial (GPT-J: 64 of 256) and full, in place and out of place; neox
    // halves of one to four whole vectors and a part (rotate_neox_row_overlapping: 24, 40, 56,
    // 72 on AVX2; 48, 80, 112, 144 on AVX-512) and of more (rotate_row's loop with the same
    // overlapping last vector: 88 on AVX2, 176 on AVX-512).
    for (std::int64_t rotary :
         {16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 112, 128, 144, 160, 176}) {
      rope_case<T, float>(layout, false, true, 0, rotary + 16, rotary, 400);
      rope_case<T, BFloat16>(layout, true, false, 1, rotary, rotary, 400);
    }
    // Subnormal results in rows of whole vectors (one test for a row of bfloat16 on AVX512_BF16;
    // at 256, AVX-512's longer rows: one for each half's pair of vectors; at 72, 80 and 144 on
    // AVX-512 (72 on AVX2) the overlapping rows' even number of whole vectors per half).
    for (std::int64_t rotary : {32, 64, 72, 80, 128, 144, 256}) {
      rope_case<T, float>(layout, false, true, 0, rotary, rotary, 200, true);
    }
    // NaNs whose rounding as numbers would change their high half, in rows of whole vectors
    // (one NaN test for a row of 16-bit results on AVX2 and AVX-512, or for a pair of bfloat16
    // vectors in rows longer than rotate_row_unrolled's) and in others.
    for (std::int64_t rotary : {32, 64, 68, 80, 112, 128, 160, 256}) {
      rope_case<T, float>(layout, false, true, 2, rotary, rotary, 200, false, true);
    }
    rope_float8_case<T, embrope::detail::Float8E4M3>(layout, DType::float8_e4m3fn);
    rope_float8_case<T, embrope::detail::Float8E5M2>(layout, DType::float8_e5m2);
  }
  embed_case<T>(0.75f, Positions::none, false);
  // Sums across the float32 subnormals (which bfloat16 keeps and VCVTNEPS2BF16 would flush).
  embed_case<T>(0x1.3p-110f, Positions::none, false);
  embed_case<T>(0x1.3p-110f, Positions::learned, false);
  embed_case<T>(1.0f, Positions::learned, false);
  embed_case<T>(3.0f, Positions::learned, true);
  embed_case<T>(1.0f, Positions::none, true);
  embed_case<T>(1.0f, Positions::sinusoidal, false);
  embed_case<T>(0.5f, Positions::sinusoidal_split, true);
  // 16-bit rows go two vectors at a time (store_row), then one, then scalars: D 76 is pairs and
  // a tail of 12 on AVX-512 (pairs, a vector and 4 on AVX2); D 92 pairs, a vector and 12 on
  // AVX-512 (pairs, a vector and 4 on AVX2).
  for (float scale : {0x1.3p-110f, 0.75f}) embed_case<T>(scale, Positions::none, false, 2000, 92);
  embed_case<T>(3.0f, Positions::learned, true, 2000, 92);
  embed_case<T>(1.0f, Positions::sinusoidal, false, 2000, 92);
  // Outputs past 16 MiB: streaming stores, on the rows aligned for them.
  embed_case<T>(1.0f, Positions::none, false, 120000);
  embed_case<T>(0.75f, Positions::learned, true, 120000);
  {
    using embrope::QuantFormat;
    const DType none = DType::uint8, i8 = DType::int8, f32 = DType::float32;
    for (bool learned : {false, true}) {
      for (const QuantCase& c : std::vector<QuantCase>{
               {QuantFormat::int8, 1000, 0, none},  // one scale; parts of 512, tails of 8
               {QuantFormat::int8, 1536, 16, i8},   // groups of 96 across the parts
               {QuantFormat::int4, 1536, 48, f32},  // groups of 32
               {QuantFormat::int4, 600, 25, i8},    // groups of 24: a tail of 8 per group
               {QuantFormat::int4, 630, 14, f32},   // groups of 45: groups share bytes
               {QuantFormat::int4, 1030, 1, none},  // a scale per row across three parts
               {QuantFormat::float8_e4m3fn, 1000, 1, none},
               {QuantFormat::float8_e5m2, 776, 8, none},
               // Groups of 1024 and 512: 16-bit rows by a group's table of 128 magnitudes.
               {QuantFormat::float8_e4m3fn, 1024, 1, none},
               {QuantFormat::float8_e5m2, 1024, 2, none},
               {QuantFormat::gguf_q8_0, 1056, 0, none},
               {QuantFormat::gguf_q4_0, 544, 0, none},
               {QuantFormat::gguf_q4_k, 768, 0, none},
               {QuantFormat::gguf_q6_k, 768, 0, none},
           }) {
        QuantCase with = c;
        with.learned = learned;
        embed_quantized_case<T>(with);
      }
    }
    // An output past 16 MiB: the parts' rows with streaming stores.
    const std::int64_t past_16_mib = sizeof(T) == 4 ? 4400 : 8400;
    embed_quantized_case<T>({QuantFormat::gguf_q6_k, 1024, 0, none, past_16_mib});
    embed_quantized_case<T>({QuantFormat::int4, 1024, 32, i8, past_16_mib});
    embed_quantized_case<T>({QuantFormat::int8, 1024, 1, none, past_16_mib});
  }
  // 300: a whole block of 256 partials, then whole vectors and scalars (AVX2 and AVX-512).
  for (std::int64_t dim : {76, 92, 300, 384, 1000}) {
    embed_norm_case<T, float>(embrope::Normalization::layer_norm, false, dim);
    embed_norm_case<T, T>(embrope::Normalization::layer_norm, true, dim);
    embed_norm_case<T, T>(embrope::Normalization::rms_norm, false, dim);
    embed_norm_case<T, float>(embrope::Normalization::rms_norm, true, dim);
  }
  // An output past 16 MiB: the normalised rows with streaming stores.
  embed_norm_case<T, float>(embrope::Normalization::layer_norm, false, 384, 24000);
  for (auto layout : {embrope::RopeLayout::neox, embrope::RopeLayout::interleaved}) {
    // Head dims of 2, 4 and 8 vectors rotated whole (AVX-512: 32, 64, 128; AVX2: 16 to 64)
    // take the row in registers; the others, the loops through memory.
    qk_norm_rope_case<T, float>(layout, 128, 128, false);
    qk_norm_rope_case<T, T>(layout, 64, 64, true);
    qk_norm_rope_case<T, float>(layout, 32, 32, false);
    qk_norm_rope_case<T, T>(layout, 16, 16, true);
    qk_norm_rope_case<T, T>(layout, 80, 64, true);
    qk_norm_rope_case<T, float>(layout, 256, 256, true);
    qk_norm_rope_case<T, T>(layout, 18, 12, false);
    qk_norm_rope_case<T, float>(layout, 300, 300, false);
    qk_norm_rope_case<T, float, embrope::detail::Float8E4M3>(layout, 128, 128, false);
    qk_norm_rope_case<T, T, embrope::detail::Float8E5M2>(layout, 80, 64, true);
  }
  // Out of place, the output past 16 MiB (the rows in registers with streaming stores; not
  // aligned for them, ordinary stores) and below it.
  const std::int64_t past_16_mib = (std::int64_t{1} << 24) / (5 * 128 * sizeof(T)) + 1;
  qk_norm_rope_case<T, float>(embrope::RopeLayout::neox, 128, 128, false, past_16_mib,
                              Output::aligned);
  qk_norm_rope_case<T, T>(embrope::RopeLayout::interleaved, 64, 64, true, 2 * past_16_mib,
                          Output::aligned);
  qk_norm_rope_case<T, float>(embrope::RopeLayout::neox, 128, 128, false, past_16_mib,
                              Output::one_element_past);
  qk_norm_rope_case<T, float>(embrope::RopeLayout::neox, 128, 128, true, 37, Output::aligned);
  // More head rows than a vector body takes at once (16): groups of 16 and 6, q's rows and k's
  // (with their own weights) in one group; in place, out of place, and into float8.
  qk_norm_rope_case<T, T>(embrope::RopeLayout::neox, 128, 128, false, 37, Output::in_place, 19, 3);
  qk_norm_rope_case<T, float>(embrope::RopeLayout::interleaved, 64, 64, true, 37, Output::aligned,
                              19, 3);
  qk_norm_rope_case<T, float, embrope::detail::Float8E4M3>(embrope::RopeLayout::neox, 128, 128,
                                                           false, 37, Output::in_place, 19, 3);
  // Rows in registers stored by the special paths (a 16-bit neox row of K vectors takes one
  // test for all K: store_vectors), in place and out of place, and the interleaved rows.
  for (auto layout : {embrope::RopeLayout::neox, embrope::RopeLayout::interleaved}) {
    for (std::int64_t dim : {64, 128}) {
      qk_norm_rope_case<T, float>(layout, dim, dim, false, 37, Output::in_place, 3, 2, true);
      qk_norm_rope_case<T, float>(layout, dim, dim, false, 37, Output::aligned, 3, 2, true);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s portable|avx2|avx512|avx512_bf16\n", argv[0]);
    return 2;
  }
  setenv("EMBROPE_CPU_ISA", argv[1], 1);  // before the first op chooses
  const std::string active = embrope::cpu_isa();
  if (active != argv[1]) {
    std::printf("skipped: this CPU has no %s (the kernels use %s)\n", argv[1], active.c_str());
    return 77;
  }
  float8_conversion_case<embrope::detail::Float8E4M3>(DType::float8_e4m3fn);
  float8_conversion_case<embrope::detail::Float8E5M2>(DType::float8_e5m2);
  all_cases_of<float>();
  all_cases_of<Half>();
  all_cases_of<BFloat16>();
  std::printf("%s: %s\n", active.c_str(),
              failures == 0 ? "every byte equals the portable path's" : "differences found");
  return failures == 0 ? 0 : 1;
}
