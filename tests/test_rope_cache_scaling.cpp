// RoPE scaling variants (docs/ops.md): each variant's frequencies and attention factor
// against an independent float64 transliteration of HF transformers (reference_rope_scaling.hpp),
// and apply_rope's float32 outputs against the float64 rotation at positions up to 131071 and
// around each variant's switch points. Also AdaptiveRopeCache's rules and invalid parameters.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "embrope/embrope.hpp"
#include "reference.hpp"
#include "reference_rope_scaling.hpp"
#include "test_support.hpp"

namespace {

using embrope::DType;
using embrope::ErrorCode;
using embrope::RopeCache;
using embrope::RopeConfig;
using embrope::RopeLayout;
using embrope::RopeOptions;
using embrope::RopeScaling;

// Phi-3-vision-128k-instruct's rope_scaling (its config.json; head_dim 96, so 48 values).
const std::vector<double> kPhi3Long = {
    1.0299999713897705, 1.0499999523162842, 1.0499999523162842, 1.0799999237060547,
    1.2299998998641968, 1.2299998998641968, 1.2999999523162842, 1.4499999284744263,
    1.5999999046325684, 1.6499998569488525, 1.8999998569488525, 2.859999895095825,
    3.68999981880188,   5.419999599456787,  5.489999771118164,  5.489999771118164,
    9.09000015258789,   11.579999923706055, 15.65999984741211,  15.769999504089355,
    15.789999961853027, 18.360000610351562, 21.989999771118164, 23.079999923706055,
    30.009998321533203, 32.35000228881836,  32.590003967285156, 35.56000518798828,
    39.95000457763672,  53.840003967285156, 56.20000457763672,  57.95000457763672,
    59.29000473022461,  59.77000427246094,  59.920005798339844, 61.190006256103516,
    61.96000671386719,  62.50000762939453,  63.3700065612793,   63.48000717163086,
    63.48000717163086,  63.66000747680664,  63.850006103515625, 64.08000946044922,
    64.760009765625,    64.80001068115234,  64.81001281738281,  64.81001281738281};
const std::vector<double> kPhi3Short = {1.05,
                                        1.05,
                                        1.05,
                                        1.1,
                                        1.1,
                                        1.1,
                                        1.2500000000000002,
                                        1.2500000000000002,
                                        1.4000000000000004,
                                        1.4500000000000004,
                                        1.5500000000000005,
                                        1.8500000000000008,
                                        1.9000000000000008,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.000000000000001,
                                        2.1000000000000005,
                                        2.1000000000000005,
                                        2.2,
                                        2.3499999999999996,
                                        2.3499999999999996,
                                        2.3499999999999996,
                                        2.3499999999999996,
                                        2.3999999999999995,
                                        2.3999999999999995,
                                        2.6499999999999986,
                                        2.6999999999999984,
                                        2.8999999999999977,
                                        2.9499999999999975,
                                        3.049999999999997,
                                        3.049999999999997,
                                        3.049999999999997};

constexpr std::int64_t kMaxPositions = 131072;

// f() throws Error(invalid_argument) whose message mentions every part.
template <typename F>
void expect_invalid(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    FAIL("no embrope::Error was thrown");
  } catch (const embrope::Error& e) {
    INFO("message: " << e.what());
    CHECK(e.code() == ErrorCode::invalid_argument);
    for (const std::string& part : parts) {
      INFO("expected the message to mention \"" << part << "\"");
      CHECK(ref::mentions(e.what(), part));
    }
  }
}

// The positions every variant is tested at, plus its own switch points.
std::vector<std::int64_t> positions_with(std::vector<std::int64_t> extra) {
  std::vector<std::int64_t> p = {0, 1, 4095, 8191, 32767, 131071};
  p.insert(p.end(), extra.begin(), extra.end());
  return p;
}

// The cache's frequencies and attention factor equal the reference's (float64, up to the
// rounding differences of a different order of operations).
void check_frequencies(const RopeCache& cache, const ref::hf::Result& want) {
  REQUIRE(static_cast<std::int64_t>(want.inv_freq.size()) == cache.rotary_dim() / 2);
  ref::Mismatches m;
  for (std::int64_t i = 0; i < cache.rotary_dim() / 2; ++i) {
    const double w = want.inv_freq[static_cast<std::size_t>(i)];
    m.expect_close([&] { return ref::where("inv_freq", {i}); }, cache.inv_freq(i), w,
                   1e-13 * std::fabs(w));
  }
  m.expect_close([] { return std::string("attention_factor"); }, cache.attention_factor(),
                 want.attention_factor, 1e-14 * want.attention_factor);
  INFO(m.summary());
  CHECK(m.count == 0);
}

// apply_rope with the cache at `positions` (q only, [T, 2, D], both layouts) against the
// float64 rotation by angle p * inv_freq_i scaled by the attention factor.
void check_outputs(const RopeCache& cache, const ref::hf::Result& want,
                   const std::vector<std::int64_t>& positions, std::int64_t head_dim) {
  const std::int64_t r = cache.rotary_dim();
  const auto t = static_cast<std::int64_t>(positions.size());
  const std::int64_t h = 2;
  for (const bool interleaved : {false, true}) {
    INFO((interleaved ? "interleaved" : "neox"));
    ref::Buffer q(DType::float32, t * h * head_dim), pos(DType::int64, t);
    ref::fill_random(q, ref::seed_of({r, t, interleaved, 51}));
    for (std::int64_t j = 0; j < t; ++j) pos.set_index(j, positions[static_cast<std::size_t>(j)]);
    const ref::Buffer original = q;
    RopeOptions opt;
    opt.layout = interleaved ? RopeLayout::interleaved : RopeLayout::neox;
    embrope::apply_rope(ref::view(q, 0, {t, h, head_dim}), std::nullopt, ref::view(pos, 0, {t}),
                        cache, opt);
    ref::Mismatches m;
    for (std::int64_t j = 0; j < t * h; ++j) {
      const std::int64_t p = positions[static_cast<std::size_t>(j / h)];
      std::vector<double> c(static_cast<std::size_t>(r / 2)), s(c.size());
      for (std::size_t i = 0; i < c.size(); ++i) {
        const double angle = static_cast<double>(p) * want.inv_freq[i];
        c[i] = std::cos(angle) * want.attention_factor;
        s[i] = std::sin(angle) * want.attention_factor;
      }
      std::vector<double> x(static_cast<std::size_t>(head_dim));
      for (std::int64_t e = 0; e < head_dim; ++e) {
        x[static_cast<std::size_t>(e)] = original.get(j * head_dim + e);
      }
      const std::vector<double> y = ref::rope_rotate(x, r, interleaved, false, c, s);
      const double n = std::max(ref::norm(y), ref::norm(x));
      for (std::int64_t e = 0; e < head_dim; ++e) {
        m.expect_close(
            [&] {
              return ref::where("q", {j, e}) + " position " + std::to_string(p);
            },
            q.get(j * head_dim + e), y[static_cast<std::size_t>(e)], ref::kFloat32RelTol * n);
      }
    }
    INFO(m.summary());
    CHECK(m.count == 0);
  }
}

}  // namespace

TEST_CASE("linear scaling divides every frequency by the factor", "[rope][scaling]") {
  RopeConfig c{64, 10000.0, kMaxPositions};
  c.scaling = RopeScaling::linear;
  c.factor = 4.0;
  ref::hf::RopeParameters hf;
  hf.rope_type = "linear";
  hf.dim = 64;
  hf.factor = 4.0;
  const auto want = ref::hf::compute_linear(hf);
  const RopeCache cache(c);
  check_frequencies(cache, want);
  check_outputs(cache, want, positions_with({16383, 16384}), 80);
}

TEST_CASE("llama3 scaling (Llama 3.1) matches HF at every frequency band and position",
          "[rope][scaling]") {
  RopeConfig c{128, 500000.0, kMaxPositions};
  c.scaling = RopeScaling::llama3;
  c.factor = 8.0;
  c.low_freq_factor = 1.0;
  c.high_freq_factor = 4.0;
  c.original_max_positions = 8192;
  ref::hf::RopeParameters hf;
  hf.rope_type = "llama3";
  hf.rope_theta = 500000.0;
  hf.dim = 128;
  hf.factor = 8.0;
  hf.low_freq_factor = 1.0;
  hf.high_freq_factor = 4.0;
  hf.original_max_position_embeddings = 8192;
  const auto want = ref::hf::compute_llama3(hf);
  // The configuration has frequencies in all three bands (kept, blended, divided), so the
  // band edges are exercised.
  int kept = 0, blended = 0, divided = 0;
  for (std::int64_t i = 0; i < 64; ++i) {
    const double wavelen = 2.0 * ref::hf::kPi / ref::rope_inv_freq(i, 128, 500000.0);
    if (wavelen < 8192.0 / 4.0) {
      ++kept;
    } else if (wavelen > 8192.0) {
      ++divided;
    } else {
      ++blended;
    }
  }
  CHECK(kept > 0);
  CHECK(blended > 0);
  CHECK(divided > 0);
  const RopeCache cache(c);
  check_frequencies(cache, want);
  check_outputs(cache, want, positions_with({8191, 8192, 8193}), 128);
}

TEST_CASE("llama3 band edges: a wavelength exactly on an edge takes the blended branch",
          "[rope][scaling]") {
  // R = 2 has the single frequency 1; wavelength 2 pi. original = 2 pi * high_freq_factor would
  // put it exactly on the high edge, but original is an integer, so edges are approached from
  // both sides with originals around 2 pi * 4 = 25.13 instead.
  for (const std::int64_t original : {24, 25, 26, 100, 101}) {
    INFO("original " << original);
    RopeConfig c{2, 10000.0, 64};
    c.scaling = RopeScaling::llama3;
    c.factor = 8.0;
    c.original_max_positions = original;
    ref::hf::RopeParameters hf;
    hf.dim = 2;
    hf.factor = 8.0;
    hf.low_freq_factor = 1.0;
    hf.high_freq_factor = 4.0;
    hf.original_max_position_embeddings = original;
    check_frequencies(RopeCache(c), ref::hf::compute_llama3(hf));
  }
}

TEST_CASE("yarn scaling matches HF: ramp, mscale attention factor, truncate, explicit factor",
          "[rope][scaling]") {
  struct Case {
    const char* name;
    std::int64_t r;
    double base, factor;
    std::int64_t original;
    double mscale, mscale_all_dim, attention;
    bool truncate;
    double beta_fast, beta_slow;
  };
  const Case cases[] = {
      // Qwen2.5 long-context recipe: factor 4 over 32768.
      {"qwen2.5", 128, 1000000.0, 4.0, 32768, 0.0, 0.0, 0.0, true, 32.0, 1.0},
      // DeepSeek-V3: rope head 64, factor 40 over 4096, mscale = mscale_all_dim = 1.
      {"deepseek-v3", 64, 10000.0, 40.0, 4096, 1.0, 1.0, 0.0, true, 32.0, 1.0},
      // DeepSeek-V2-Lite style: mscale 0.707, mscale_all_dim 0.707.
      {"deepseek-v2", 64, 10000.0, 40.0, 4096, 0.707, 0.707, 0.0, true, 32.0, 1.0},
      // mscale differing from mscale_all_dim: the ratio is not 1.
      {"mscale-ratio", 64, 10000.0, 16.0, 4096, 1.0, 0.5, 0.0, true, 32.0, 1.0},
      // mscale alone (mscale_all_dim unset) leaves the default 0.1 ln(factor) + 1.
      {"mscale-only", 64, 10000.0, 16.0, 4096, 0.5, 0.0, 0.0, true, 32.0, 1.0},
      // gpt-oss: no truncation of the ramp ends.
      {"gpt-oss", 64, 150000.0, 32.0, 4096, 0.0, 0.0, 0.0, false, 32.0, 1.0},
      // An explicit attention factor overrides the derived one; other betas.
      {"explicit", 64, 10000.0, 8.0, 2048, 0.0, 0.0, 1.25, true, 16.0, 2.0},
  };
  for (const Case& k : cases) {
    INFO(k.name);
    RopeConfig c{k.r, k.base, kMaxPositions};
    c.scaling = RopeScaling::yarn;
    c.factor = k.factor;
    c.original_max_positions = k.original;
    c.mscale = k.mscale;
    c.mscale_all_dim = k.mscale_all_dim;
    c.attention_factor = k.attention;
    c.truncate = k.truncate;
    c.beta_fast = k.beta_fast;
    c.beta_slow = k.beta_slow;
    ref::hf::RopeParameters hf;
    hf.rope_theta = k.base;
    hf.dim = k.r;
    hf.factor = k.factor;
    hf.max_position_embeddings = kMaxPositions;
    hf.original_max_position_embeddings = k.original;
    if (k.mscale != 0.0) hf.mscale = k.mscale;
    if (k.mscale_all_dim != 0.0) hf.mscale_all_dim = k.mscale_all_dim;
    if (k.attention != 0.0) hf.attention_factor = k.attention;
    hf.truncate = k.truncate;
    hf.beta_fast = k.beta_fast;
    hf.beta_slow = k.beta_slow;
    const auto want = ref::hf::compute_yarn(hf);
    // The ramp is really inside the frequency range: some frequencies are kept, some divided.
    CHECK(want.inv_freq.front() == Approx(ref::rope_inv_freq(0, k.r, k.base)).epsilon(1e-12));
    CHECK(want.inv_freq.back() ==
          Approx(ref::rope_inv_freq(k.r / 2 - 1, k.r, k.base) / k.factor).epsilon(1e-12));
    const RopeCache cache(c);
    check_frequencies(cache, want);
    check_outputs(cache, want, positions_with({k.original - 1, k.original, k.original + 1}),
                  k.r + 16);
  }
}

TEST_CASE("dynamic NTK scaling matches HF for sequences within and beyond the original context",
          "[rope][scaling]") {
  ref::hf::RopeParameters hf;
  hf.rope_type = "dynamic";
  hf.dim = 64;
  hf.factor = 2.0;
  hf.max_position_embeddings = 4096;
  for (const std::int64_t length : {std::int64_t{0}, std::int64_t{1}, std::int64_t{4096},
                                    std::int64_t{4097}, std::int64_t{8192}}) {
    INFO("sequence_length " << length);
    RopeConfig c{64, 10000.0, kMaxPositions};
    c.scaling = RopeScaling::dynamic;
    c.factor = 2.0;
    c.original_max_positions = 4096;
    c.sequence_length = length;
    // 0 means max_positions.
    const auto want = ref::hf::compute_dynamic(hf, length == 0 ? kMaxPositions : length);
    const RopeCache cache(c);
    check_frequencies(cache, want);
    if (length == 4097 || length == 0) {
      check_outputs(cache, want, positions_with({4095, 4096, 4097}), 64);
    }
  }
  // Within the original context the frequencies are the default ones.
  RopeConfig c{64, 10000.0, 4096};
  c.scaling = RopeScaling::dynamic;
  c.factor = 2.0;
  c.original_max_positions = 4096;
  check_frequencies(RopeCache(c), ref::hf::compute_default(hf));
}

TEST_CASE("longrope scaling (Phi-3) switches from short to long factors past the original context",
          "[rope][scaling]") {
  ref::hf::RopeParameters hf;
  hf.rope_type = "longrope";
  hf.dim = 96;
  hf.factor = 32.0;  // 131072 / 4096, as HF derives it for Phi-3
  hf.short_factor = kPhi3Short;
  hf.long_factor = kPhi3Long;
  for (const std::int64_t length :
       {std::int64_t{1}, std::int64_t{4096}, std::int64_t{4097}, std::int64_t{0}}) {
    INFO("sequence_length " << length);
    RopeConfig c{96, 10000.0, kMaxPositions};
    c.scaling = RopeScaling::longrope;
    c.factor = 32.0;
    c.original_max_positions = 4096;
    c.short_factor = kPhi3Short;
    c.long_factor = kPhi3Long;
    c.sequence_length = length;
    const auto want = ref::hf::compute_longrope(hf, 4096, length == 0 ? kMaxPositions : length);
    const RopeCache cache(c);
    check_frequencies(cache, want);
    if (length == 4096 || length == 0) {
      check_outputs(cache, want, positions_with({4095, 4096, 4097}), 96);
    }
  }
  // An explicit attention factor overrides sqrt(1 + ln(factor) / ln(original)).
  RopeConfig c{96, 10000.0, 8192};
  c.scaling = RopeScaling::longrope;
  c.factor = 32.0;
  c.original_max_positions = 4096;
  c.short_factor = kPhi3Short;
  c.long_factor = kPhi3Long;
  c.attention_factor = 1.1902380714238083;
  hf.attention_factor = 1.1902380714238083;
  check_frequencies(RopeCache(c), ref::hf::compute_longrope(hf, 4096, 8192));
}

TEST_CASE("AdaptiveRopeCache follows HF's dynamic_rope_update: grow, keep, reset",
          "[rope][scaling]") {
  RopeConfig c{64, 10000.0, 2048};
  c.scaling = RopeScaling::dynamic;
  c.factor = 4.0;
  c.original_max_positions = 4096;
  embrope::AdaptiveRopeCache adaptive(c);
  ref::hf::RopeParameters hf;
  hf.dim = 64;
  hf.factor = 4.0;
  hf.max_position_embeddings = 4096;

  // HF's state machine, written from dynamic_rope_update.
  std::int64_t max_seq_len_cached = 4096;
  ref::hf::Result inv = ref::hf::compute_dynamic(hf, std::nullopt);
  const ref::hf::Result original_inv = inv;
  for (const std::int64_t length : {100, 4096, 5000, 4096, 4095, 9000, 6000, 10, 4097}) {
    INFO("sequence length " << length);
    if (length > max_seq_len_cached) {
      inv = ref::hf::compute_dynamic(hf, length);
      max_seq_len_cached = length;
    }
    if (length < 4096 && max_seq_len_cached > 4096) {
      inv = original_inv;
      max_seq_len_cached = 4096;
    }
    const auto cache = adaptive.get(length);
    check_frequencies(*cache, inv);
    CHECK(cache->max_positions() >= length);
  }
}

TEST_CASE("AdaptiveRopeCache: longrope picks short or long tables by length, others one table",
          "[rope][scaling]") {
  RopeConfig c{96, 10000.0, 8192};
  c.scaling = RopeScaling::longrope;
  c.factor = 32.0;
  c.original_max_positions = 4096;
  c.short_factor = kPhi3Short;
  c.long_factor = kPhi3Long;
  embrope::AdaptiveRopeCache adaptive(c);
  const auto short_a = adaptive.get(4096);
  const auto long_a = adaptive.get(4097);
  CHECK(short_a != long_a);
  CHECK(adaptive.get(10) == short_a);  // built once, then shared
  CHECK(adaptive.get(8192) == long_a);
  CHECK(short_a->inv_freq(47) == Approx(ref::rope_inv_freq(47, 96, 10000.0) / kPhi3Short[47]));
  CHECK(long_a->inv_freq(47) == Approx(ref::rope_inv_freq(47, 96, 10000.0) / kPhi3Long[47]));
  expect_invalid([&] { adaptive.get(8193); },
                 {"AdaptiveRopeCache", "sequence_length 8193", "max_positions 8192"});
  expect_invalid([&] { adaptive.get(0); }, {"AdaptiveRopeCache", "sequence_length 0", "positive"});

  embrope::AdaptiveRopeCache plain(RopeConfig{64, 10000.0, 128});
  CHECK(plain.get(1) == plain.get(128));
}

TEST_CASE("rope_frequencies rejects invalid scaling parameters, naming the field and rule",
          "[rope][scaling][errors]") {
  const auto base = [] {
    RopeConfig c{64, 10000.0, 1024};
    return c;
  };
  struct Case {
    const char* what;
    RopeConfig config;
    std::vector<std::string> words;
  };
  std::vector<Case> cases;
  auto add = [&](const char* what, auto edit, std::vector<std::string> words) {
    RopeConfig c = base();
    edit(c);
    cases.push_back({what, c, std::move(words)});
  };
  add("linear factor 0",
      [](RopeConfig& c) {
        c.scaling = RopeScaling::linear;
        c.factor = 0.0;
      },
      {"factor 0", "positive"});
  add("linear factor -2",
      [](RopeConfig& c) {
        c.scaling = RopeScaling::linear;
        c.factor = -2.0;
      },
      {"factor -2", "positive"});
  add("yarn factor NaN",
      [](RopeConfig& c) {
        c.scaling = RopeScaling::yarn;
        c.factor = std::nan("");
        c.original_max_positions = 512;
      },
      {"factor nan", "finite"});
  add("yarn without original",
      [](RopeConfig& c) {
        c.scaling = RopeScaling::yarn;
        c.factor = 4.0;
      },
      {"original_max_positions 0", "positive"});
  add("yarn beta_fast <= beta_slow",
      [](RopeConfig& c) {
        c.scaling = RopeScaling::yarn;
        c.factor = 4.0;
        c.original_max_positions = 512;
        c.beta_fast = 1.0;
        c.beta_slow = 1.0;
      },
      {"beta_fast 1", "must exceed", "beta_slow 1"});
  add("yarn negative mscale",
      [](RopeConfig& c) {
        c.scaling = RopeScaling::yarn;
        c.factor = 4.0;
        c.original_max_positions = 512;
        c.mscale = -1.0;
      },
      {"mscale -1", "non-negative"});
  add("llama3 low >= high",
      [](RopeConfig& c) {
        c.scaling = RopeScaling::llama3;
        c.factor = 8.0;
        c.original_max_positions = 512;
        c.low_freq_factor = 4.0;
        c.high_freq_factor = 4.0;
      },
      {"low_freq_factor 4", "high_freq_factor 4", "0 < low < high"});
  add("longrope wrong length",
      [](RopeConfig& c) {
        c.scaling = RopeScaling::longrope;
        c.original_max_positions = 512;
        c.short_factor.assign(31, 1.0);
        c.long_factor.assign(32, 1.0);
      },
      {"short_factor has 31 values", "rotary_dim / 2 = 32"});
  add("longrope zero factor",
      [](RopeConfig& c) {
        c.scaling = RopeScaling::longrope;
        c.original_max_positions = 512;
        c.short_factor.assign(32, 1.0);
        c.long_factor.assign(32, 1.0);
        c.long_factor[5] = 0.0;
      },
      {"long_factor[5] 0", "positive"});
  add("dynamic with rotary_dim 2",
      [](RopeConfig& c) {
        c.rotary_dim = 2;
        c.scaling = RopeScaling::dynamic;
        c.factor = 2.0;
        c.original_max_positions = 512;
      },
      {"rotary_dim 2", "dynamic"});
  add("factor without scaling", [](RopeConfig& c) { c.factor = 8.0; },
      {"factor", "scaling none", "does not use it"});
  add("long_factor with yarn",
      [](RopeConfig& c) {
        c.scaling = RopeScaling::yarn;
        c.factor = 4.0;
        c.original_max_positions = 512;
        c.long_factor.assign(32, 1.0);
      },
      {"long_factor", "scaling yarn", "does not use it"});
  add("attention_factor with llama3",
      [](RopeConfig& c) {
        c.scaling = RopeScaling::llama3;
        c.factor = 8.0;
        c.original_max_positions = 512;
        c.attention_factor = 2.0;
      },
      {"attention_factor", "scaling llama3", "does not use it"});
  add("negative sequence_length",
      [](RopeConfig& c) {
        c.scaling = RopeScaling::dynamic;
        c.factor = 2.0;
        c.original_max_positions = 512;
        c.sequence_length = -1;
      },
      {"sequence_length -1", "non-negative"});
  add("a frequency times the last position overflows",
      [](RopeConfig& c) {
        c.scaling = RopeScaling::linear;
        c.factor = 1e-306;  // inv_freq_0 = 1e306, times position 1023
      },
      {"frequency 0", "position 1023", "finite angle"});
  add("an attention factor float32 cannot hold",
      [](RopeConfig& c) {
        c.scaling = RopeScaling::yarn;
        c.factor = 4.0;
        c.original_max_positions = 512;
        c.attention_factor = 1e31;
      },
      {"attention factor", "[1e-30, 1e30]"});
  add("scaling out of range", [](RopeConfig& c) { c.scaling = static_cast<RopeScaling>(17); },
      {"scaling 17"});
  for (const Case& k : cases) {
    INFO(k.what);
    std::vector<std::string> words = {"RopeCache"};
    words.insert(words.end(), k.words.begin(), k.words.end());
    expect_invalid([&] { embrope::rope_frequencies(k.config); }, words);
    expect_invalid([&] { RopeCache cache(k.config); }, words);
  }
}
