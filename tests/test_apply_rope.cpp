// apply_rope (docs/ops.md, docs/numerics.md, docs/errors.md) against the float64 reference of
// tests/reference.hpp: both overloads, every value dtype, both index dtypes, both pairings, full
// and partial rotary dims, [T, H, D] and [B, S, H, D], strided views, in place and out of place,
// the inverse; properties of the rotation; argument errors and bad positions.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "apply_rope_cases.hpp"
#include "embrope/embrope.hpp"
#include "reference.hpp"
#include "test_support.hpp"

namespace {

using embrope::DeferredStatus;
using embrope::Device;
using embrope::DType;
using embrope::Error;
using embrope::ErrorCode;
using embrope::RopeCache;
using embrope::RopeConfig;
using embrope::RopeLayout;
using embrope::RopeOptions;
using embrope::Tensor;
using op_cases::Arrangement;
using op_cases::RopeCase;
using op_cases::TableKind;

// Where one of q, k (or an output) lives in its buffer: element offset and strides.
struct Placement {
  std::int64_t offset = 0, sb = 0, ss = 0, sh = 0;
  std::int64_t index(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
    return offset + b * sb + s * ss + h * sh + d;
  }
};

struct HeadsMemory {
  ref::Buffer q_buf, k_buf;
  bool shared = false;  // k lives in q_buf
  Placement q, k;
  ref::Buffer& kb() { return shared ? q_buf : k_buf; }
};

HeadsMemory make_memory(Arrangement a, DType dtype, std::int64_t b, std::int64_t s, std::int64_t hq,
                        std::int64_t hk, std::int64_t d) {
  HeadsMemory m;
  switch (a) {
    case Arrangement::contiguous:
      m.q = {0, s * hq * d, hq * d, d};
      m.k = {0, s * hk * d, hk * d, d};
      m.q_buf = ref::Buffer(dtype, b * s * hq * d);
      m.k_buf = ref::Buffer(dtype, b * s * hk * d);
      break;
    case Arrangement::fused_qkv: {
      const std::int64_t hp = d + 3;
      const std::int64_t row = (hq + 2 * std::max<std::int64_t>(hk, 1)) * hp + 5;
      const std::int64_t sb = s * row + 7;
      m.shared = true;
      m.q = {0, sb, row, hp};
      m.k = {hq * hp, sb, row, hp};
      m.q_buf = ref::Buffer(dtype, b * sb);
      break;
    }
    case Arrangement::transposed: {
      const std::int64_t sd = d + 2;
      m.q = {0, hq * s * sd, sd, s * sd};
      m.k = {0, hk * s * sd, sd, s * sd};
      m.q_buf = ref::Buffer(dtype, b * hq * s * sd);
      m.k_buf = ref::Buffer(dtype, b * hk * s * sd);
      break;
    }
  }
  return m;
}

Tensor heads_view(ref::Buffer& buf, const Placement& p, const RopeCase& c, std::int64_t heads) {
  if (c.batch == 0) return ref::view(buf, p.offset, {c.seq, heads, c.head_dim}, {p.ss, p.sh, 1});
  return ref::view(buf, p.offset, {c.batch, c.seq, heads, c.head_dim}, {p.sb, p.ss, p.sh, 1});
}

void mark(std::vector<char>& mask, const Placement& p, std::int64_t b, std::int64_t s,
          std::int64_t heads, std::int64_t d) {
  for (std::int64_t ib = 0; ib < b; ++ib)
    for (std::int64_t is = 0; is < s; ++is)
      for (std::int64_t ih = 0; ih < heads; ++ih)
        for (std::int64_t id = 0; id < d; ++id)
          mask[static_cast<std::size_t>(p.index(ib, is, ih, id))] = 1;
}

// Elements of buf outside mask must still have the bits of `before`.
void expect_untouched_outside(const char* name, const ref::Buffer& buf,
                              const std::vector<std::uint64_t>& before,
                              const std::vector<char>& mask) {
  ref::Mismatches m;
  for (std::int64_t i = 0; i < buf.size(); ++i) {
    if (mask[static_cast<std::size_t>(i)] != 0) continue;
    m.expect_bits(
        [&] { return std::string(name) + " element " + std::to_string(i) + " outside the views"; },
        buf.bits(i), before[static_cast<std::size_t>(i)]);
  }
  INFO(m.summary());
  CHECK(m.count == 0);
}

// Runs one apply_rope case and checks every output element against the float64 reference,
// the pass-through elements bit for bit, zero rows for positions outside the table, and that
// nothing outside the views changed. Returns the Error the call threw, if any (bad
// positions); any other exception propagates.
std::optional<Error> run_rope(const RopeCase& c, DeferredStatus* deferred = nullptr) {
  INFO(describe(c));
  const std::int64_t b = std::max<std::int64_t>(c.batch, 1), s = c.seq, t = b * s;
  const std::int64_t d = c.head_dim, r = c.rotary_dim;

  HeadsMemory in = make_memory(c.arrangement, c.dtype, b, s, c.hq, c.hk, d);
  ref::fill_random(in.q_buf, ref::seed_of({c.seed, 1}));
  ref::fill_random(in.k_buf, ref::seed_of({c.seed, 2}));
  const ref::Buffer q_before = in.q_buf, k_before = in.k_buf;

  // Outputs in another arrangement than the inputs, poisoned.
  HeadsMemory out;
  if (c.out_of_place) {
    const Arrangement oa =
        c.arrangement == Arrangement::transposed ? Arrangement::fused_qkv : Arrangement::transposed;
    out = make_memory(oa, c.dtype, b, s, c.hq, c.hk, d);
    ref::poison(out.q_buf);
    ref::poison(out.k_buf);
  }

  // Positions, with gaps of random in-range values when strided.
  ref::Buffer pos(c.pos_dtype, t * c.position_stride);
  ref::fill_random_indices(pos, ref::seed_of({c.seed, 3}), 0, c.max_positions - 1);
  for (std::size_t i = 0; i < c.positions.size(); ++i) {
    pos.set_index(static_cast<std::int64_t>(i) * c.position_stride, c.positions[i]);
  }
  const Tensor pos_t = c.batch == 0
                           ? ref::view(pos, 0, {s}, {c.position_stride})
                           : ref::view(pos, 0, {b, s}, {s * c.position_stride, c.position_stride});

  // The cos/sin source and its reference values.
  std::optional<RopeCache> cache;
  ref::Buffer table;
  const std::int64_t row = r + 2;  // caller tables: vLLM-style rows [cos | sin | padding]
  if (c.table == TableKind::cache) {
    cache.emplace(RopeConfig{r, c.base, c.max_positions});
  } else {
    table = ref::Buffer(c.table_dtype, c.max_positions * row);
    ref::fill_random(table, ref::seed_of({c.seed, 4}));
    for (std::int64_t p = 0; p < c.max_positions; ++p) {
      std::vector<double> cv, sv;
      ref::rope_cos_sin(p, r, c.base, cv, sv);
      for (std::int64_t i = 0; i < r / 2; ++i) {
        table.set(p * row + i, cv[static_cast<std::size_t>(i)]);
        table.set(p * row + r / 2 + i, sv[static_cast<std::size_t>(i)]);
      }
    }
  }
  auto cos_sin = [&](std::int64_t p, std::vector<double>& cv, std::vector<double>& sv) {
    if (cache) {
      ref::rope_cos_sin(p, r, c.base, cv, sv);
      return;
    }
    cv.resize(static_cast<std::size_t>(r / 2));
    sv.resize(static_cast<std::size_t>(r / 2));
    for (std::int64_t i = 0; i < r / 2; ++i) {
      cv[static_cast<std::size_t>(i)] = table.get(p * row + i);
      sv[static_cast<std::size_t>(i)] = table.get(p * row + r / 2 + i);
    }
  };

  RopeOptions opt;
  opt.layout = c.interleaved ? RopeLayout::interleaved : RopeLayout::neox;
  opt.inverse = c.inverse;
  opt.deferred = deferred;
  if (c.out_of_place) {
    opt.q_out = heads_view(out.q_buf, out.q, c, c.hq);
    if (c.hk > 0) opt.k_out = heads_view(out.kb(), out.k, c, c.hk);
  }
  const Tensor q_t = heads_view(in.q_buf, in.q, c, c.hq);
  std::optional<Tensor> k_t;
  if (c.hk > 0) k_t = heads_view(in.kb(), in.k, c, c.hk);
  const auto out_q_before = out.q_buf.snapshot();
  const auto out_k_before = out.k_buf.snapshot();

  std::optional<Error> error;
  try {
    if (cache) {
      embrope::apply_rope(q_t, k_t, pos_t, *cache, opt);
    } else {
      const Tensor cos_t = ref::view(table, 0, {c.max_positions, r / 2}, {row, 1});
      const Tensor sin_t = ref::view(table, r / 2, {c.max_positions, r / 2}, {row, 1});
      embrope::apply_rope(q_t, k_t, pos_t, cos_t, sin_t, opt);
    }
  } catch (const Error& e) {
    if (e.code() != ErrorCode::index_out_of_range) throw;
    error = e;
  }

  // Every output element.
  ref::Mismatches m;
  auto check_heads = [&](const char* name, std::int64_t heads, const ref::Buffer& before,
                         const Placement& in_p, const ref::Buffer& got_buf,
                         const Placement& out_p) {
    std::vector<double> x(static_cast<std::size_t>(d)), mag, cv, sv;
    for (std::int64_t ib = 0; ib < b; ++ib) {
      for (std::int64_t is = 0; is < s; ++is) {
        const std::int64_t p = pos.get_index((ib * s + is) * c.position_stride);
        const bool bad = p < 0 || p >= c.max_positions;
        if (!bad) cos_sin(p, cv, sv);
        for (std::int64_t ih = 0; ih < heads; ++ih) {
          auto loc = [&](std::int64_t e) {
            return [=] {
              return ref::where(name, {ib, is, ih, e}) + " position " + std::to_string(p);
            };
          };
          if (bad) {  // the whole row is zero-filled
            for (std::int64_t e = 0; e < d; ++e) {
              m.expect_close(loc(e), got_buf.get(out_p.index(ib, is, ih, e)), 0.0, 0.0);
            }
            continue;
          }
          for (std::int64_t e = 0; e < d; ++e) {
            x[static_cast<std::size_t>(e)] = before.get(in_p.index(ib, is, ih, e));
          }
          const std::vector<double> y =
              ref::rope_rotate(x, r, c.interleaved, c.inverse, cv, sv, &mag);
          const double n = ref::norm(y);
          for (std::int64_t e = 0; e < d; ++e) {
            const auto ue = static_cast<std::size_t>(e);
            if (e < r) {
              m.expect_close(loc(e), got_buf.get(out_p.index(ib, is, ih, e)), y[ue],
                             ref::tolerance(c.dtype, y[ue], n, mag[ue]));
            } else {  // pass-through: copied bit for bit
              m.expect_bits(loc(e), got_buf.bits(out_p.index(ib, is, ih, e)),
                            before.bits(in_p.index(ib, is, ih, e)));
            }
          }
        }
      }
    }
  };
  const HeadsMemory& o = c.out_of_place ? out : in;
  check_heads("q", c.hq, q_before, in.q, o.q_buf, o.q);
  if (c.hk > 0) {
    check_heads("k", c.hk, in.shared ? q_before : k_before, in.k, o.shared ? o.q_buf : o.k_buf,
                o.k);
  }
  INFO(m.summary());
  CHECK(m.count == 0);
  CHECK(m.checked == t * (c.hq + c.hk) * d);

  // Nothing outside the views changed; out of place, the inputs did not change at all.
  std::vector<char> in_mask_q(static_cast<std::size_t>(in.q_buf.size()), 0);
  std::vector<char> in_mask_k(static_cast<std::size_t>(in.k_buf.size()), 0);
  if (!c.out_of_place) {
    mark(in_mask_q, in.q, b, s, c.hq, d);
    if (c.hk > 0) mark(in.shared ? in_mask_q : in_mask_k, in.k, b, s, c.hk, d);
  }
  expect_untouched_outside("q buffer", in.q_buf, q_before.snapshot(), in_mask_q);
  expect_untouched_outside("k buffer", in.k_buf, k_before.snapshot(), in_mask_k);
  if (c.out_of_place) {
    std::vector<char> mask_q(static_cast<std::size_t>(out.q_buf.size()), 0);
    std::vector<char> mask_k(static_cast<std::size_t>(out.k_buf.size()), 0);
    mark(mask_q, out.q, b, s, c.hq, d);
    if (c.hk > 0) mark(out.shared ? mask_q : mask_k, out.k, b, s, c.hk, d);
    expect_untouched_outside("q_out buffer", out.q_buf, out_q_before, mask_q);
    expect_untouched_outside("k_out buffer", out.k_buf, out_k_before, mask_k);
  }
  return error;
}

// Runs a case that must succeed.
void run_ok(const RopeCase& c) {
  const std::optional<Error> e = run_rope(c);
  if (e) FAIL_CHECK("unexpected error: " << e->what() << " in case " << describe(c));
}

}  // namespace

// ------------------------------------------------------------ reference grids -------------

TEST_CASE(
    "apply_rope with a RopeCache matches the float64 reference for each dtype, pairing, "
    "head_dim and rotary_dim",
    "[rope]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const bool interleaved = GENERATE(false, true);
  const auto dims =
      GENERATE(std::make_pair(64, 64), std::make_pair(80, 80), std::make_pair(96, 96),
               std::make_pair(112, 112), std::make_pair(128, 128), std::make_pair(128, 64),
               std::make_pair(96, 32), std::make_pair(80, 16), std::make_pair(64, 2),
               std::make_pair(72, 72), std::make_pair(88, 88), std::make_pair(40, 40));
  RopeCase c;
  c.dtype = dtype;
  c.interleaved = interleaved;
  c.head_dim = dims.first;
  c.rotary_dim = dims.second;
  c.pos_dtype = (dims.first + (interleaved ? 1 : 0)) % 2 == 0 ? DType::int64 : DType::int32;
  c.hq = 7;
  c.hk = 3;
  c.seq = 5;
  c.max_positions = 4096;
  c.seed = static_cast<std::int64_t>(
      ref::seed_of({static_cast<int>(dtype), interleaved ? 1 : 0, dims.first, dims.second}));
  run_ok(c);
}

TEST_CASE("apply_rope with caller cos/sin tables of each value dtype matches the reference",
          "[rope]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const DType table_dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const bool interleaved = GENERATE(false, true);
  RopeCase c;
  c.dtype = dtype;
  c.table = TableKind::caller;
  c.table_dtype = table_dtype;
  c.interleaved = interleaved;
  c.head_dim = 96;
  c.rotary_dim = 64;
  c.base = 500000.0;
  c.max_positions = 300;
  c.pos_dtype = interleaved ? DType::int32 : DType::int64;
  c.seed = static_cast<std::int64_t>(ref::seed_of(
      {static_cast<int>(dtype), static_cast<int>(table_dtype), interleaved ? 1 : 0, 17}));
  run_ok(c);
  SECTION("and with [B, S, H, D] tensors, out of place") {
    c.batch = 2;
    c.seq = 3;
    c.out_of_place = true;
    c.seed += 1;
    run_ok(c);
  }
}

TEST_CASE("apply_rope on [B, S, H, D] tensors with [B, S] positions, contiguous and strided",
          "[rope]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const DType pos_dtype = GENERATE(DType::int32, DType::int64);
  const std::int64_t position_stride = GENERATE(1, 3);
  RopeCase c;
  c.dtype = dtype;
  c.pos_dtype = pos_dtype;
  c.batch = 3;
  c.seq = 4;
  c.hq = 4;
  c.hk = 4;
  c.head_dim = 128;
  c.rotary_dim = 128;
  c.position_stride = position_stride;
  c.max_positions = 2048;
  c.seed = static_cast<std::int64_t>(
      ref::seed_of({static_cast<int>(dtype), static_cast<int>(pos_dtype), position_stride, 3}));
  run_ok(c);
}

TEST_CASE(
    "apply_rope in place on views into a fused QKV buffer with padding between heads, "
    "tokens and batch rows",
    "[rope][strided]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const bool batched = GENERATE(false, true);
  const bool interleaved = GENERATE(false, true);
  RopeCase c;
  c.dtype = dtype;
  c.arrangement = Arrangement::fused_qkv;
  c.batch = batched ? 2 : 0;
  c.seq = 3;
  c.hq = 8;
  c.hk = 2;
  c.head_dim = 80;
  c.rotary_dim = 48;
  c.interleaved = interleaved;
  c.seed = static_cast<std::int64_t>(
      ref::seed_of({static_cast<int>(dtype), batched ? 1 : 0, interleaved ? 1 : 0, 4}));
  run_ok(c);
}

TEST_CASE("apply_rope on a [B, H, S, D] buffer viewed as [B, S, H, D] through its strides",
          "[rope][strided]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const bool out_of_place = GENERATE(false, true);
  RopeCase c;
  c.dtype = dtype;
  c.arrangement = Arrangement::transposed;
  c.batch = 2;
  c.seq = 6;
  c.hq = 3;
  c.hk = 1;
  c.head_dim = 64;
  c.rotary_dim = 64;
  c.out_of_place = out_of_place;
  c.seed = static_cast<std::int64_t>(ref::seed_of({static_cast<int>(dtype), out_of_place, 5}));
  run_ok(c);
}

TEST_CASE(
    "apply_rope out of place writes q_out and k_out only, copies the pass-through dims "
    "and leaves the inputs untouched",
    "[rope][out_of_place]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const Arrangement arrangement =
      GENERATE(Arrangement::contiguous, Arrangement::fused_qkv, Arrangement::transposed);
  const std::int64_t rotary_dim = GENERATE(32, 112);
  RopeCase c;
  c.dtype = dtype;
  c.arrangement = arrangement;
  c.out_of_place = true;
  c.head_dim = 112;
  c.rotary_dim = rotary_dim;
  c.hq = 4;
  c.hk = 2;
  c.batch = arrangement == Arrangement::contiguous ? 0 : 2;
  c.seq = 3;
  c.seed = static_cast<std::int64_t>(
      ref::seed_of({static_cast<int>(dtype), static_cast<int>(arrangement), rotary_dim, 6}));
  run_ok(c);
}

TEST_CASE("apply_rope with one token, seven heads, GQA, MQA and without k", "[rope]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  RopeCase c;
  c.dtype = dtype;
  c.head_dim = 128;
  c.rotary_dim = 128;
  c.max_positions = 32768;
  c.seed = static_cast<std::int64_t>(ref::seed_of({static_cast<int>(dtype), 7}));
  SECTION("one token, 7 q heads and 7 k heads") {
    c.seq = 1;
    c.hq = 7;
    c.hk = 7;
    c.positions = {32767};
    run_ok(c);
  }
  SECTION("GQA: 8 q heads, 2 k heads") {
    c.seq = 9;
    c.hq = 8;
    c.hk = 2;
    run_ok(c);
  }
  SECTION("MQA: 7 q heads, one k head, [B, S, H, D]") {
    c.batch = 2;
    c.seq = 3;
    c.hq = 7;
    c.hk = 1;
    run_ok(c);
  }
  SECTION("k absent (std::nullopt), in place and out of place") {
    c.seq = 4;
    c.hq = 7;
    c.hk = 0;
    run_ok(c);
    c.out_of_place = true;
    run_ok(c);
  }
  SECTION("no tokens at all is a no-op") {
    ref::Buffer q(dtype, 0), pos(DType::int64, 0);
    const RopeCache cache(RopeConfig{128, 10000.0, 8});
    CHECK_NOTHROW(embrope::apply_rope(ref::view(q, 0, {0, 7, 128}), std::nullopt,
                                      ref::view(pos, 0, {0}), cache));
  }
}

TEST_CASE("apply_rope inverse rotates by -angle (the reference with -sin)", "[rope][inverse]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const bool interleaved = GENERATE(false, true);
  const bool caller_table = GENERATE(false, true);
  RopeCase c;
  c.dtype = dtype;
  c.interleaved = interleaved;
  c.inverse = true;
  c.head_dim = 96;
  c.rotary_dim = 64;
  c.table = caller_table ? TableKind::caller : TableKind::cache;
  c.out_of_place = caller_table;
  c.seed = static_cast<std::int64_t>(
      ref::seed_of({static_cast<int>(dtype), interleaved, caller_table, 8}));
  run_ok(c);
}

TEST_CASE(
    "apply_rope on a prefill-sized call (the threaded path) matches the reference and "
    "reports the first bad token",
    "[rope][threaded]") {
  const DType dtype = GENERATE(DType::float32, DType::bfloat16);
  RopeCase c;
  c.dtype = dtype;
  c.seq = 80;  // 80 tokens x 12 heads x 128: well past any serial cut-off
  c.hq = 8;
  c.hk = 4;
  c.head_dim = 128;
  c.rotary_dim = 128;
  c.max_positions = 4096;
  c.seed = static_cast<std::int64_t>(ref::seed_of({static_cast<int>(dtype), 30}));
  SECTION("all positions valid") {
    run_ok(c);
  }
  SECTION("bad positions at tokens 61 and 37") {
    c.positions.resize(80);
    for (std::size_t i = 0; i < c.positions.size(); ++i) {
      c.positions[i] = static_cast<std::int64_t>(i * 37 % 4096);
    }
    c.positions[61] = 4096;
    c.positions[37] = -2;
    const std::optional<Error> e = run_rope(c);
    REQUIRE(e.has_value());
    CHECK(e->code() == ErrorCode::index_out_of_range);
    CHECK_THAT(e->what(), Catch::Contains("positions[37]") && Catch::Contains("-2"));
  }
}

// -------------------------------------------------------------------- properties ---------

TEST_CASE("apply_rope inverse after forward is the identity", "[rope][inverse][property]") {
  const DType dtype = GENERATE(DType::float32, DType::float16, DType::bfloat16);
  const bool interleaved = GENERATE(false, true);
  const std::int64_t t = 6, h = 3, d = 128, r = 96;
  const RopeCache cache(RopeConfig{r, 10000.0, 70000});
  ref::Buffer q(dtype, t * h * d), pos(DType::int64, t);
  ref::fill_random(q, ref::seed_of({static_cast<int>(dtype), interleaved, 9}));
  ref::fill_random_indices(pos, ref::seed_of({static_cast<int>(dtype), 10}), 0, 69999);
  const ref::Buffer original = q;
  RopeOptions opt;
  opt.layout = interleaved ? RopeLayout::interleaved : RopeLayout::neox;
  const Tensor qt = ref::view(q, 0, {t, h, d});
  const Tensor pt = ref::view(pos, 0, {t});
  embrope::apply_rope(qt, std::nullopt, pt, cache, opt);
  // The forward pass changed the rotated part.
  std::int64_t changed = 0;
  for (std::int64_t i = 0; i < q.size(); ++i) changed += q.bits(i) != original.bits(i) ? 1 : 0;
  CHECK(changed > q.size() / 2);
  opt.inverse = true;
  embrope::apply_rope(qt, std::nullopt, pt, cache, opt);
  ref::Mismatches m;
  for (std::int64_t n = 0; n < t * h; ++n) {
    std::vector<double> x(static_cast<std::size_t>(d));
    for (std::int64_t e = 0; e < d; ++e) x[static_cast<std::size_t>(e)] = original.get(n * d + e);
    const double row_norm = ref::norm(x);
    for (std::int64_t i = 0; i < r / 2; ++i) {
      std::int64_t ia = 0, ib = 0;
      ref::rope_pair(interleaved, r, i, &ia, &ib);
      const double a = x[static_cast<std::size_t>(ia)], bv = x[static_cast<std::size_t>(ib)];
      // Two roundings of the pair's magnitude in 16-bit dtypes.
      const double tol = dtype == DType::float32 ? ref::kFloat32RelTol * row_norm
                                                 : 2 * ref::ulp(dtype, std::hypot(a, bv));
      for (std::int64_t e : {ia, ib}) {
        m.expect_close(
            [&] {
              return ref::where("q", {n, e});
            },
            q.get(n * d + e), x[static_cast<std::size_t>(e)], tol);
      }
    }
    for (std::int64_t e = r; e < d; ++e) {
      m.expect_bits(
          [&] {
            return ref::where("q", {n, e});
          },
          q.bits(n * d + e), original.bits(n * d + e));
    }
  }
  INFO(m.summary());
  CHECK(m.count == 0);
}

TEST_CASE("apply_rope preserves the norm of every head vector", "[rope][property]") {
  const bool interleaved = GENERATE(false, true);
  const std::int64_t t = 16, h = 4, d = 128;
  const RopeCache cache(RopeConfig{d, 10000.0, 1 << 16});
  ref::Buffer q(DType::float32, t * h * d), pos(DType::int32, t);
  ref::fill_random(q, ref::seed_of({interleaved, 11}));
  ref::fill_random_indices(pos, ref::seed_of({interleaved, 12}), 0, (1 << 16) - 1);
  const ref::Buffer original = q;
  RopeOptions opt;
  opt.layout = interleaved ? RopeLayout::interleaved : RopeLayout::neox;
  embrope::apply_rope(ref::view(q, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {t}), cache, opt);
  for (std::int64_t n = 0; n < t * h; ++n) {
    double before = 0, after = 0;
    for (std::int64_t e = 0; e < d; ++e) {
      before += original.get(n * d + e) * original.get(n * d + e);
      after += q.get(n * d + e) * q.get(n * d + e);
    }
    INFO("head row " << n << " position " << pos.get_index(n / h));
    CHECK(std::fabs(std::sqrt(after) - std::sqrt(before)) <=
          ref::kFloat32RelTol * std::sqrt(before));
  }
}

TEST_CASE("dot(rope(q, m), rope(k, n)) depends only on m - n", "[rope][property]") {
  const bool interleaved = GENERATE(false, true);
  const std::int64_t d = 128;
  // Token j holds the same q and k vectors at positions (m_j, n_j); m_j - n_j is 3 for the
  // first five tokens and 40 for the last two.
  const std::vector<std::int64_t> m_pos = {3, 10, 1000, 4000, 65003, 40, 60040};
  const std::vector<std::int64_t> n_pos = {0, 7, 997, 3997, 65000, 0, 60000};
  const auto t = static_cast<std::int64_t>(m_pos.size());
  const RopeCache cache(RopeConfig{d, 10000.0, 65536});
  ref::Buffer qk1(DType::float32, d), q(DType::float32, t * d), k(DType::float32, t * d);
  ref::Buffer qpos(DType::int64, t), kpos(DType::int64, t);
  ref::fill_random(qk1, ref::seed_of({interleaved, 13}));
  ref::Buffer kk1(DType::float32, d);
  ref::fill_random(kk1, ref::seed_of({interleaved, 14}));
  for (std::int64_t j = 0; j < t; ++j) {
    qpos.set_index(j, m_pos[static_cast<std::size_t>(j)]);
    kpos.set_index(j, n_pos[static_cast<std::size_t>(j)]);
    for (std::int64_t e = 0; e < d; ++e) {
      q.set(j * d + e, qk1.get(e));
      k.set(j * d + e, kk1.get(e));
    }
  }
  RopeOptions opt;
  opt.layout = interleaved ? RopeLayout::interleaved : RopeLayout::neox;
  embrope::apply_rope(ref::view(q, 0, {t, 1, d}), std::nullopt, ref::view(qpos, 0, {t}), cache,
                      opt);
  embrope::apply_rope(ref::view(k, 0, {t, 1, d}), std::nullopt, ref::view(kpos, 0, {t}), cache,
                      opt);
  std::vector<double> dots(static_cast<std::size_t>(t));
  double qn = 0, kn = 0;
  for (std::int64_t e = 0; e < d; ++e) {
    qn += qk1.get(e) * qk1.get(e);
    kn += kk1.get(e) * kk1.get(e);
  }
  const double scale = std::sqrt(qn * kn);
  for (std::int64_t j = 0; j < t; ++j) {
    double dot = 0;
    for (std::int64_t e = 0; e < d; ++e) dot += q.get(j * d + e) * k.get(j * d + e);
    dots[static_cast<std::size_t>(j)] = dot;
  }
  // The float64 reference of the dot product at offsets 3 and 40: rope(q, delta) . k.
  std::vector<double> qv(static_cast<std::size_t>(d)), kv(static_cast<std::size_t>(d));
  for (std::int64_t e = 0; e < d; ++e) {
    qv[static_cast<std::size_t>(e)] = qk1.get(e);
    kv[static_cast<std::size_t>(e)] = kk1.get(e);
  }
  auto ref_dot = [&](std::int64_t delta) {
    const std::vector<double> rq = ref::rope(qv, delta, d, 10000.0, interleaved);
    double s = 0;
    for (std::size_t e = 0; e < rq.size(); ++e) s += rq[e] * kv[e];
    return s;
  };
  const double tol = 4 * ref::kFloat32RelTol * scale;
  for (std::size_t j = 0; j < dots.size(); ++j) {
    const std::int64_t delta = m_pos[j] - n_pos[j];
    INFO("token " << j << " m " << m_pos[j] << " n " << n_pos[j]);
    CHECK(std::fabs(dots[j] - ref_dot(delta)) <= tol);
    CHECK(std::fabs(dots[j] - dots[delta == 3 ? 0 : 5]) <= tol);
  }
  // The two offsets give different dot products (the positions are used at all).
  CHECK(std::fabs(dots[0] - dots[5]) > 100 * tol);
}

TEST_CASE("a float32 RoPE at position 1,000,000 matches the float64 reference within 2e-6",
          "[rope][long]") {
  const std::int64_t d = 96, r = 64, max_positions = 1000001;
  const RopeCache cache(RopeConfig{r, 10000.0, max_positions});  // built once for both pairings
  const std::vector<std::int64_t> positions = {1000000, 999999, 131071, 524287, 1 << 19, 0};
  const auto t = static_cast<std::int64_t>(positions.size());
  const std::int64_t h = 2;
  for (const bool interleaved : {false, true}) {
    INFO((interleaved ? "interleaved" : "neox"));
    ref::Buffer q(DType::float32, t * h * d), pos(DType::int64, t);
    ref::fill_random(q, ref::seed_of({interleaved, 15}));
    for (std::int64_t j = 0; j < t; ++j) pos.set_index(j, positions[static_cast<std::size_t>(j)]);
    const ref::Buffer original = q;
    RopeOptions opt;
    opt.layout = interleaved ? RopeLayout::interleaved : RopeLayout::neox;
    embrope::apply_rope(ref::view(q, 0, {t, h, d}), std::nullopt, ref::view(pos, 0, {t}), cache,
                        opt);
    ref::Mismatches m;
    for (std::int64_t j = 0; j < t * h; ++j) {
      std::vector<double> x(static_cast<std::size_t>(d));
      for (std::int64_t e = 0; e < d; ++e) {
        x[static_cast<std::size_t>(e)] = original.get(j * d + e);
      }
      const std::int64_t p = positions[static_cast<std::size_t>(j / h)];
      const std::vector<double> y = ref::rope(x, p, r, 10000.0, interleaved);
      const double n = ref::norm(y);
      for (std::int64_t e = 0; e < d; ++e) {
        m.expect_close(
            [&] {
              return ref::where("q", {j, e}) + " position " + std::to_string(p);
            },
            q.get(j * d + e), y[static_cast<std::size_t>(e)], ref::kFloat32RelTol * n);
      }
    }
    INFO(m.summary());
    CHECK(m.count == 0);
  }
}

// ------------------------------------------------------------------------ errors ---------

namespace {

// A valid call that each error test breaks in one way.
struct RopeFixture {
  static constexpr std::int64_t t = 3, hq = 2, hk = 1, d = 128, r = 64, n = 16;
  ref::Buffer q{DType::float32, t* hq* d};
  ref::Buffer k{DType::float32, t* hk* d};
  ref::Buffer pos{DType::int64, t};
  RopeCache cache{RopeConfig{r, 10000.0, n}};
  ref::Buffer cos{DType::float32, n*r / 2}, sin{DType::float32, n*r / 2};

  RopeFixture() {
    ref::fill_random(q, 101);
    ref::fill_random(k, 102);
    ref::fill_random_indices(pos, 103, 0, n - 1);
    ref::fill_random(cos, 104);
    ref::fill_random(sin, 105);
  }
  Tensor qt() { return ref::view(q, 0, {t, hq, d}); }
  Tensor kt() { return ref::view(k, 0, {t, hk, d}); }
  Tensor pt() { return ref::view(pos, 0, {t}); }
  Tensor cos_t() { return ref::view(cos, 0, {n, r / 2}); }
  Tensor sin_t() { return ref::view(sin, 0, {n, r / 2}); }
};

constexpr std::initializer_list<ErrorCode> kInvalid = {ErrorCode::invalid_argument};

}  // namespace

TEST_CASE("apply_rope error fixture is a valid call (positive control)", "[rope][errors]") {
  RopeFixture f;
  CHECK_NOTHROW(embrope::apply_rope(f.qt(), f.kt(), f.pt(), f.cache));
  CHECK_NOTHROW(embrope::apply_rope(f.qt(), f.kt(), f.pt(), f.cos_t(), f.sin_t()));
  RopeOptions opt;
  opt.rotary_dim = RopeFixture::r;
  CHECK_NOTHROW(embrope::apply_rope(f.qt(), f.kt(), f.pt(), f.cache, opt));
}

TEST_CASE("apply_rope rejects wrong dtypes with a message naming the argument", "[rope][errors]") {
  RopeFixture f;
  const auto q_before = f.q.snapshot();
  SECTION("positions given as float32") {
    ref::Buffer p(DType::float32, RopeFixture::t);
    ref::fill_random(p, 1);
    expect_error([&] { embrope::apply_rope(f.qt(), f.kt(), ref::view(p, 0, {3}), f.cache); },
                 kInvalid, {"apply_rope", "positions"});
  }
  SECTION("q of dtype int32") {
    ref::Buffer qi(DType::int32, f.q.size());
    expect_error(
        [&] {
          embrope::apply_rope(ref::view(qi, 0, {3, 2, 128}), f.kt(), f.pt(), f.cache);
        },
        kInvalid, {"apply_rope", "q"});
  }
  SECTION("k float16 with q float32") {
    ref::Buffer kh(DType::float16, f.k.size());
    ref::fill_random(kh, 2);
    expect_error(
        [&] {
          embrope::apply_rope(f.qt(), ref::view(kh, 0, {3, 1, 128}), f.pt(), f.cache);
        },
        kInvalid, {"apply_rope", "k"});
  }
  SECTION("q_out of another dtype than q") {
    ref::Buffer o(DType::bfloat16, f.q.size());
    RopeOptions opt;
    opt.q_out = ref::view(o, 0, {3, 2, 128});
    expect_error([&] { embrope::apply_rope(f.qt(), f.kt(), f.pt(), f.cache, opt); }, kInvalid,
                 {"apply_rope", "q_out"});
  }
  SECTION("cos float32 with sin float16") {
    ref::Buffer sh(DType::float16, f.sin.size());
    ref::fill_random(sh, 3);
    expect_error(
        [&] {
          embrope::apply_rope(f.qt(), f.kt(), f.pt(), f.cos_t(), ref::view(sh, 0, {16, 32}));
        },
        kInvalid, {"apply_rope", "sin"});
  }
  SECTION("cos of dtype int64") {
    ref::Buffer ci(DType::int64, f.cos.size()), si(DType::int64, f.sin.size());
    expect_error(
        [&] {
          embrope::apply_rope(f.qt(), f.kt(), f.pt(), ref::view(ci, 0, {16, 32}),
                              ref::view(si, 0, {16, 32}));
        },
        kInvalid, {"apply_rope", "cos"});
  }
  CHECK(f.q.snapshot() == q_before);  // validation happens before anything is written
}

TEST_CASE("apply_rope rejects tensors on a CUDA device it cannot use, naming the op",
          "[rope][errors][device]") {
  RopeFixture f;
  const auto q_before = f.q.snapshot();
  const std::int64_t qs[] = {3, 2, 128}, ks[] = {3, 1, 128}, ps[] = {3};
  const Tensor q_cuda(f.q.data(), DType::float32, 3, qs, nullptr, Device::cuda(0));
  const Tensor k_cuda(f.k.data(), DType::float32, 3, ks, nullptr, Device::cuda(0));
  const Tensor p_cuda(f.pos.data(), DType::int64, 1, ps, nullptr, Device::cuda(0));
  const std::initializer_list<ErrorCode> codes = {ErrorCode::invalid_argument,
                                                  ErrorCode::not_implemented};
  SECTION("k on cuda:0, the rest on the CPU") {
    expect_error([&] { embrope::apply_rope(f.qt(), k_cuda, f.pt(), f.cache); }, codes,
                 {"apply_rope", "k"});
  }
  SECTION("positions on cuda:0, the rest on the CPU") {
    expect_error([&] { embrope::apply_rope(f.qt(), f.kt(), p_cuda, f.cache); }, codes,
                 {"apply_rope", "positions"});
  }
  SECTION("q on cuda:0 with a CPU cache") {
    expect_error([&] { embrope::apply_rope(q_cuda, std::nullopt, f.pt(), f.cache); }, codes,
                 {"apply_rope"});
  }
  SECTION("q_out on cuda:0") {
    RopeOptions opt;
    opt.q_out = q_cuda;
    expect_error([&] { embrope::apply_rope(f.qt(), f.kt(), f.pt(), f.cache, opt); }, codes,
                 {"apply_rope", "q_out"});
  }
  SECTION("every tensor on cuda:0 without a GPU") {
    if (embrope::cuda_device_count() > 0) {
      WARN("a GPU is present: the all-CUDA no-GPU path is not exercised");
      return;
    }
    const std::int64_t cs[] = {16, 32};
    const Tensor c_cuda(f.cos.data(), DType::float32, 2, cs, nullptr, Device::cuda(0));
    const Tensor s_cuda(f.sin.data(), DType::float32, 2, cs, nullptr, Device::cuda(0));
    expect_error([&] { embrope::apply_rope(q_cuda, k_cuda, p_cuda, c_cuda, s_cuda); }, codes,
                 {"apply_rope", "cuda"});
    try {
      embrope::apply_rope(q_cuda, k_cuda, p_cuda, c_cuda, s_cuda);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::not_implemented);  // no GPU: the path does not exist
    }
  }
  CHECK(f.q.snapshot() == q_before);
}

TEST_CASE("apply_rope rejects a rotary_dim option that does not match the table",
          "[rope][errors]") {
  RopeFixture f;
  RopeOptions opt;
  opt.rotary_dim = 32;
  expect_error([&] { embrope::apply_rope(f.qt(), f.kt(), f.pt(), f.cache, opt); }, kInvalid,
               {"apply_rope", "rotary_dim", "32", "64"});
  opt.rotary_dim = 48;
  expect_error([&] { embrope::apply_rope(f.qt(), f.kt(), f.pt(), f.cos_t(), f.sin_t(), opt); },
               kInvalid, {"apply_rope", "rotary_dim", "48"});
}

TEST_CASE("apply_rope rejects a rotary dim larger than head_dim", "[rope][errors]") {
  RopeFixture f;
  const auto q_before = f.q.snapshot();
  SECTION("with a RopeCache") {
    const RopeCache big(RopeConfig{130, 10000.0, 16});
    expect_error([&] { embrope::apply_rope(f.qt(), f.kt(), f.pt(), big); }, kInvalid,
                 {"apply_rope: rotary_dim 130 exceeds head_dim 128"});
  }
  SECTION("with caller tables [N, 65]") {
    ref::Buffer c(DType::float32, 16 * 65), s(DType::float32, 16 * 65);
    ref::fill_random(c, 4);
    ref::fill_random(s, 5);
    expect_error(
        [&] {
          embrope::apply_rope(f.qt(), f.kt(), f.pt(), ref::view(c, 0, {16, 65}),
                              ref::view(s, 0, {16, 65}));
        },
        kInvalid, {"apply_rope: rotary_dim 130 exceeds head_dim 128"});
  }
  CHECK(f.q.snapshot() == q_before);
}

TEST_CASE("apply_rope rejects a layout outside RopeLayout's enumerators", "[rope][errors]") {
  // A uint8_t enum holds any byte; layout 7 was rotated as interleaved.
  RopeFixture f;
  const auto q_before = f.q.snapshot();
  const RopeCache cache(RopeConfig{128, 10000.0, 16});
  RopeOptions o;
  o.layout = static_cast<RopeLayout>(7);
  expect_error([&] { embrope::apply_rope(f.qt(), f.kt(), f.pt(), cache, o); }, kInvalid,
               {"apply_rope: layout 7 is not a RopeLayout"});
  expect_error([&] { embrope::apply_rope_backward(f.qt(), f.kt(), f.pt(), cache, o); }, kInvalid,
               {"apply_rope_backward: layout 7 is not a RopeLayout"});
  CHECK(f.q.snapshot() == q_before);
}

TEST_CASE("apply_rope rejects shapes that disagree", "[rope][errors]") {
  RopeFixture f;
  const auto q_before = f.q.snapshot();
  SECTION("positions [T + 1] for T tokens") {
    ref::Buffer p(DType::int64, 4);
    ref::fill_random_indices(p, 6, 0, 15);
    expect_error([&] { embrope::apply_rope(f.qt(), f.kt(), ref::view(p, 0, {4}), f.cache); },
                 kInvalid, {"apply_rope", "positions"});
  }
  SECTION("positions [B, S] for [T, H, D] tensors") {
    expect_error(
        [&] {
          embrope::apply_rope(f.qt(), f.kt(), ref::view(f.pos, 0, {1, 3}), f.cache);
        },
        kInvalid, {"apply_rope", "positions"});
  }
  SECTION("positions [B, S + 1] for [B, S, H, D] tensors") {
    ref::Buffer p(DType::int64, 4);
    ref::fill_random_indices(p, 7, 0, 15);
    expect_error(
        [&] {
          embrope::apply_rope(ref::view(f.q, 0, {1, 3, 2, 128}), ref::view(f.k, 0, {1, 3, 1, 128}),
                              ref::view(p, 0, {1, 4}), f.cache);
        },
        kInvalid, {"apply_rope", "positions"});
  }
  SECTION("k head_dim 64 with q head_dim 128") {
    expect_error(
        [&] {
          embrope::apply_rope(f.qt(), ref::view(f.k, 0, {3, 2, 64}), f.pt(), f.cache);
        },
        kInvalid, {"apply_rope", "k"});
  }
  SECTION("k with fewer tokens than q") {
    expect_error(
        [&] {
          embrope::apply_rope(f.qt(), ref::view(f.k, 0, {2, 1, 128}), f.pt(), f.cache);
        },
        kInvalid, {"apply_rope", "k"});
  }
  SECTION("k of another rank than q") {
    expect_error(
        [&] {
          embrope::apply_rope(f.qt(), ref::view(f.k, 0, {1, 3, 1, 128}), f.pt(), f.cache);
        },
        kInvalid, {"apply_rope", "k"});
  }
  SECTION("q of rank 2 and of rank 5") {
    expect_error(
        [&] {
          embrope::apply_rope(ref::view(f.q, 0, {6, 128}), std::nullopt, f.pt(), f.cache);
        },
        kInvalid, {"apply_rope", "q"});
    expect_error(
        [&] {
          embrope::apply_rope(ref::view(f.q, 0, {1, 1, 3, 2, 128}), std::nullopt, f.pt(), f.cache);
        },
        kInvalid, {"apply_rope", "q"});
  }
  SECTION("q_out of another shape than q") {
    ref::Buffer o(DType::float32, f.q.size());
    RopeOptions opt;
    opt.q_out = ref::view(o, 0, {3, 1, 256});
    expect_error([&] { embrope::apply_rope(f.qt(), f.kt(), f.pt(), f.cache, opt); }, kInvalid,
                 {"apply_rope", "q_out"});
  }
  SECTION("k_out without k") {
    ref::Buffer o(DType::float32, f.k.size());
    RopeOptions opt;
    opt.k_out = ref::view(o, 0, {3, 1, 128});
    expect_error([&] { embrope::apply_rope(f.qt(), std::nullopt, f.pt(), f.cache, opt); }, kInvalid,
                 {"apply_rope", "k_out"});
  }
  SECTION("cos and sin of different shapes") {
    expect_error(
        [&] {
          embrope::apply_rope(f.qt(), f.kt(), f.pt(), f.cos_t(), ref::view(f.sin, 0, {8, 32}));
        },
        kInvalid, {"apply_rope", "sin"});
  }
  SECTION("cos of rank 3 (an unflattened [B, S, R/2] table)") {
    expect_error(
        [&] {
          embrope::apply_rope(f.qt(), f.kt(), f.pt(), ref::view(f.cos, 0, {2, 8, 32}),
                              ref::view(f.sin, 0, {2, 8, 32}));
        },
        kInvalid, {"apply_rope", "cos"});
  }
  CHECK(f.q.snapshot() == q_before);
}

TEST_CASE("apply_rope rejects a last dimension with a stride other than 1", "[rope][errors]") {
  RopeFixture f;
  const auto q_before = f.q.snapshot();
  SECTION("q") {
    expect_error(
        [&] {
          embrope::apply_rope(ref::view(f.q, 0, {3, 1, 64}, {256, 128, 2}), std::nullopt, f.pt(),
                              f.cache);
        },
        kInvalid, {"apply_rope", "q", "stride"});
  }
  SECTION("k") {
    expect_error(
        [&] {
          embrope::apply_rope(f.qt(), ref::view(f.k, 0, {3, 1, 128}, {128, 128, 0}), f.pt(),
                              f.cache);
        },
        kInvalid, {"apply_rope", "k", "stride"});
  }
  SECTION("q_out") {
    ref::Buffer o(DType::float32, 2 * f.q.size());
    RopeOptions opt;
    opt.q_out = ref::view(o, 0, {3, 2, 128}, {512, 256, 2});
    expect_error([&] { embrope::apply_rope(f.qt(), f.kt(), f.pt(), f.cache, opt); }, kInvalid,
                 {"apply_rope", "q_out", "stride"});
  }
  SECTION("cos") {
    expect_error(
        [&] {
          embrope::apply_rope(f.qt(), f.kt(), f.pt(), ref::view(f.cos, 0, {8, 32}, {64, 2}),
                              ref::view(f.sin, 0, {8, 32}, {64, 2}));
        },
        kInvalid, {"apply_rope", "cos", "stride"});
  }
  CHECK(f.q.snapshot() == q_before);
}

TEST_CASE("apply_rope rejects null data and negative strides", "[rope][errors]") {
  RopeFixture f;
  SECTION("q with null data") {
    const Tensor q(nullptr, DType::float32, {3, 2, 128});
    expect_error([&] { embrope::apply_rope(q, f.kt(), f.pt(), f.cache); }, kInvalid,
                 {"apply_rope", "q"});
  }
  SECTION("positions with null data") {
    const Tensor p(nullptr, DType::int64, {3});
    expect_error([&] { embrope::apply_rope(f.qt(), f.kt(), p, f.cache); }, kInvalid,
                 {"apply_rope", "positions"});
  }
  SECTION("sin with null data") {
    const Tensor s(nullptr, DType::float32, {16, 32});
    expect_error([&] { embrope::apply_rope(f.qt(), f.kt(), f.pt(), f.cos_t(), s); }, kInvalid,
                 {"apply_rope", "sin"});
  }
  SECTION("q with a negative head stride") {
    expect_error(
        [&] {
          embrope::apply_rope(ref::view(f.q, 128, {3, 2, 128}, {256, -128, 1}), std::nullopt,
                              f.pt(), f.cache);
        },
        kInvalid, {"apply_rope", "q"});
  }
}

// ------------------------------------------------------------------ bad positions --------

TEST_CASE(
    "apply_rope with a position outside the cache zero-fills that token's rows and "
    "reports positions[index] and the value",
    "[rope][errors][bad_index]") {
  struct Bad {
    DType pos_dtype;
    std::int64_t value;
  };
  const Bad bad = GENERATE(
      Bad{DType::int64, -1}, Bad{DType::int64, 16}, Bad{DType::int64, std::int64_t{1} << 40},
      Bad{DType::int64, INT64_MAX}, Bad{DType::int64, INT64_MIN}, Bad{DType::int32, -7},
      Bad{DType::int32, 16}, Bad{DType::int32, INT32_MAX}, Bad{DType::int32, INT32_MIN});
  const bool out_of_place = GENERATE(false, true);
  const DType dtype = GENERATE(DType::float32, DType::bfloat16);
  const bool caller_table = GENERATE(false, true);
  RopeCase c;
  c.dtype = dtype;
  c.pos_dtype = bad.pos_dtype;
  c.seq = 5;
  c.hq = 3;
  c.hk = 2;
  c.head_dim = 64;
  c.rotary_dim = 32;
  c.max_positions = 16;
  c.out_of_place = out_of_place;
  c.table = caller_table ? TableKind::caller : TableKind::cache;
  c.positions = {4, 15, 0, bad.value, 9};
  c.seed = static_cast<std::int64_t>(
      ref::seed_of({bad.value, out_of_place, static_cast<int>(dtype), caller_table, 20}));
  const std::optional<Error> e = run_rope(c);  // checks zero rows and the other rows
  REQUIRE(e.has_value());
  INFO("message: " << e->what());
  CHECK(e->code() == ErrorCode::index_out_of_range);
  CHECK_THAT(e->what(), Catch::Contains("apply_rope"));
  CHECK_THAT(e->what(), Catch::Contains("positions[3]"));
  CHECK_THAT(e->what(), Catch::Contains(std::to_string(bad.value)));
}

TEST_CASE(
    "apply_rope reports the first bad token and zero-fills every bad one, "
    "[B, S] positions too",
    "[rope][errors][bad_index]") {
  RopeCase c;
  c.seq = 6;
  c.hq = 2;
  c.hk = 2;
  c.head_dim = 64;
  c.rotary_dim = 64;
  c.max_positions = 32;
  SECTION("[T] positions") {
    c.positions = {1, 2, 99, 3, -5, 31};
    const std::optional<Error> e = run_rope(c);
    REQUIRE(e.has_value());
    CHECK(e->code() == ErrorCode::index_out_of_range);
    CHECK_THAT(e->what(), Catch::Contains("positions[2]") && Catch::Contains("99"));
  }
  SECTION("[B, S] positions (flat row-major token index)") {
    c.batch = 2;
    c.seq = 3;
    c.positions = {1, 2, 3, 4, 32, -1};
    const std::optional<Error> e = run_rope(c);
    REQUIRE(e.has_value());
    CHECK(e->code() == ErrorCode::index_out_of_range);
    CHECK_THAT(e->what(), Catch::Contains("positions") && Catch::Contains("32"));
  }
}

TEST_CASE("a DeferredStatus on a CUDA device without a usable GPU is a clear error",
          "[rope][errors][deferred][device]") {
  if (embrope::cuda_device_count() > 0) {
    WARN("a GPU is present: the no-GPU error path is not exercised");
    return;
  }
  expect_error([] { DeferredStatus status(Device::cuda(0)); },
               {ErrorCode::not_implemented, ErrorCode::invalid_argument}, {"DeferredStatus"});
}

TEST_CASE(
    "apply_rope with a DeferredStatus returns normally and reports bad positions at "
    "check()",
    "[rope][errors][deferred]") {
  DeferredStatus status;
  CHECK(status.device() == Device::cpu());
  CHECK(status.ok());
  CHECK_NOTHROW(status.check());

  RopeCase c;
  c.seq = 4;
  c.hq = 2;
  c.hk = 1;
  c.max_positions = 10;
  SECTION("good positions leave the status clean") {
    c.positions = {0, 9, 5, 1};
    CHECK_FALSE(run_rope(c, &status).has_value());
    CHECK(status.ok());
    CHECK_NOTHROW(status.check());
  }
  SECTION("a bad position is recorded, rows zero-filled, check() throws once then clears") {
    c.positions = {0, 9, 10, 1};
    const std::optional<Error> e = run_rope(c, &status);  // zero rows and others checked
    CHECK_FALSE(e.has_value());
    CHECK_FALSE(status.ok());
    CHECK_FALSE(status.ok());  // ok() does not clear
    try {
      status.check();
      FAIL("check() did not throw");
    } catch (const Error& err) {
      CHECK(err.code() == ErrorCode::index_out_of_range);
      CHECK_THAT(err.what(), Catch::Contains("apply_rope") && Catch::Contains("positions[2]") &&
                                 Catch::Contains("10"));
    }
    CHECK(status.ok());
    CHECK_NOTHROW(status.check());
  }
  SECTION("the same row bad in two calls: the first call's value is reported") {
    c.positions = {0, 1, 12, 3};
    CHECK_FALSE(run_rope(c, &status).has_value());
    c.positions = {0, 1, 13, 3};
    CHECK_FALSE(run_rope(c, &status).has_value());
    expect_error([&] { status.check(); }, {ErrorCode::index_out_of_range}, {"positions[2] = 12"});
  }
  SECTION("the first bad token of several calls is kept until check()") {
    c.positions = {0, 1, 2, -3};
    CHECK_FALSE(run_rope(c, &status).has_value());
    c.positions = {11, 1, 2, 3};
    c.seed = 2;
    CHECK_FALSE(run_rope(c, &status).has_value());
    CHECK_FALSE(status.ok());
    CHECK_THROWS_AS(status.check(), Error);
    CHECK(status.ok());
  }
}
