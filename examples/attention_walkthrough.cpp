// From a sentence to attention scores, the way tutorials on transformers tell it:
//   1. a toy vocabulary turns "What can I hold you with?" into token ids;
//   2. an embedding table turns ids into vectors (embed);
//   3. absolute positions: sinusoidal vectors are added to them (embed, fused);
//   4. rotary positions: q and k are rotated by their position (apply_rope), and the
//      attention score q_m . k_n then depends only on m - n.
#include <embrope/embrope.hpp>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

using embrope::DType;
using embrope::Tensor;

namespace {

constexpr std::int64_t kDim = 16;  // model width
constexpr std::int64_t kHeadDim = kDim;

std::vector<std::int64_t> tokenize(const std::string& text, const std::vector<std::string>& vocab) {
  std::vector<std::int64_t> ids;
  std::string word;
  auto flush = [&] {
    for (std::size_t i = 0; !word.empty() && i < vocab.size(); ++i) {
      if (vocab[i] == word) ids.push_back(static_cast<std::int64_t>(i));
    }
    word.clear();
  };
  for (char c : text) {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      flush();
      if (c == '?') {
        word = "?";
        flush();
      }
    }
  }
  flush();
  return ids;
}

// A deterministic pseudo-random number in [-1, 1).
float noise(std::uint32_t& state) {
  state = state * 1664525u + 1013904223u;
  return static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
}

float dot(const float* a, const float* b) {
  float s = 0;
  for (std::int64_t i = 0; i < kHeadDim; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

int main() {
  const std::vector<std::string> vocab = {"<pad>", "what", "can", "i", "hold", "you", "with", "?"};
  const std::string sentence = "What can I hold you with?";
  const std::vector<std::int64_t> ids = tokenize(sentence, vocab);
  const auto tokens = static_cast<std::int64_t>(ids.size());
  std::printf("1. \"%s\" -> ids:", sentence.c_str());
  for (std::int64_t id : ids)
    std::printf(" %lld (%s)", static_cast<long long>(id), vocab[id].c_str());
  std::printf("\n");

  // 2. The embedding table: one learned row per vocabulary entry (random here).
  const auto vocab_size = static_cast<std::int64_t>(vocab.size());
  std::vector<float> table(vocab_size * kDim);
  std::uint32_t state = 7;
  for (float& v : table) v = noise(state);
  std::vector<float> x(tokens * kDim);
  embrope::embed(Tensor(table.data(), DType::float32, {vocab_size, kDim}),
                 Tensor(const_cast<std::int64_t*>(ids.data()), DType::int64, {tokens}),
                 Tensor(x.data(), DType::float32, {tokens, kDim}));
  std::printf("2. embedding of \"what\": %.3f %.3f %.3f ...\n", x[0], x[1], x[2]);

  // 3. Absolute positions (Vaswani et al.): x + PE(p), fused into the lookup.
  std::vector<float> x_abs(tokens * kDim);
  embrope::EmbedOptions absolute;
  absolute.positions = embrope::PositionEncoding::sinusoidal;
  embrope::embed(Tensor(table.data(), DType::float32, {vocab_size, kDim}),
                 Tensor(const_cast<std::int64_t*>(ids.data()), DType::int64, {tokens}),
                 Tensor(x_abs.data(), DType::float32, {tokens, kDim}), absolute);
  std::printf("3. with sinusoidal position 0 added: %.3f %.3f %.3f ... (PE(0) = 0, 1, 0, 1, ...)\n",
              x_abs[0], x_abs[1], x_abs[2]);

  // 4. Rotary positions. q and k are projections of x (random matrices here); RoPE rotates
  // each pair of their features by position * frequency.
  std::vector<float> wq(kDim * kHeadDim), wk(kDim * kHeadDim);
  for (float& v : wq) v = noise(state) * 0.5f;
  for (float& v : wk) v = noise(state) * 0.5f;
  std::vector<float> q(tokens * kHeadDim, 0.0f), k(tokens * kHeadDim, 0.0f);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t o = 0; o < kHeadDim; ++o) {
      for (std::int64_t i = 0; i < kDim; ++i) {
        q[t * kHeadDim + o] += x[t * kDim + i] * wq[i * kHeadDim + o];
        k[t * kHeadDim + o] += x[t * kDim + i] * wk[i * kHeadDim + o];
      }
    }
  }
  embrope::RopeCache cache({/*rotary_dim=*/kHeadDim, /*base=*/10000.0, /*max_positions=*/4096});

  // Scores of the whole sentence placed at positions start, start + 1, ...
  auto scores_at = [&](std::int64_t start) {
    std::vector<float> qr = q, kr = k;
    std::vector<std::int64_t> positions(tokens);
    for (std::int64_t t = 0; t < tokens; ++t) positions[t] = start + t;
    embrope::apply_rope(Tensor(qr.data(), DType::float32, {tokens, 1, kHeadDim}),
                        Tensor(kr.data(), DType::float32, {tokens, 1, kHeadDim}),
                        Tensor(positions.data(), DType::int64, {tokens}), cache);
    std::vector<float> s(tokens * tokens);
    for (std::int64_t m = 0; m < tokens; ++m) {
      for (std::int64_t n = 0; n < tokens; ++n) {
        s[m * tokens + n] = dot(&qr[m * kHeadDim], &kr[n * kHeadDim]) / std::sqrt(float(kHeadDim));
      }
    }
    return s;
  };
  const std::vector<float> at0 = scores_at(0);
  std::printf("4. attention scores q_m . k_n / sqrt(d) with RoPE, sentence at positions 0..%lld:\n",
              static_cast<long long>(tokens - 1));
  for (std::int64_t m = 0; m < tokens; ++m) {
    std::printf("   %-6s", vocab[ids[m]].c_str());
    for (std::int64_t n = 0; n < tokens; ++n) std::printf(" %7.3f", at0[m * tokens + n]);
    std::printf("\n");
  }
  float worst = 0;
  for (std::int64_t start : {1, 100, 1000, 3000}) {
    const std::vector<float> moved = scores_at(start);
    float diff = 0;
    for (std::size_t i = 0; i < moved.size(); ++i)
      diff = std::fmax(diff, std::fabs(moved[i] - at0[i]));
    std::printf("   the same sentence at positions %lld..: largest score change %.2e\n",
                static_cast<long long>(start), diff);
    worst = std::fmax(worst, diff);
  }
  std::printf("   scores depend only on the relative position: %s\n", worst < 1e-4f ? "yes" : "NO");

  // The same scores from the formula, in double: with pairs (a, b) = (i, i + d/2) rotated by
  // the angle position * theta_i (theta_i = 10000^(-2i/d)), q_m . k_n is a function of n - m:
  //   sum_i (q_a k_a + q_b k_b) cos((n - m) theta_i) + (q_b k_a - q_a k_b) sin((n - m) theta_i)
  // (an identity rotation, the wrong direction or other frequencies would also pass the shift
  // test above; they fail this one).
  double formula_error = 0, largest = 0;
  for (std::int64_t m = 0; m < tokens; ++m) {
    for (std::int64_t n = 0; n < tokens; ++n) {
      const float* qm = &q[m * kHeadDim];
      const float* kn = &k[n * kHeadDim];
      double score = 0;
      for (std::int64_t i = 0; i < kHeadDim / 2; ++i) {
        const std::int64_t a = i, b = i + kHeadDim / 2;
        const double angle = static_cast<double>(n - m) *
                             std::pow(10000.0, -2.0 * static_cast<double>(i) / kHeadDim);
        score += (double(qm[a]) * kn[a] + double(qm[b]) * kn[b]) * std::cos(angle) +
                 (double(qm[b]) * kn[a] - double(qm[a]) * kn[b]) * std::sin(angle);
      }
      score /= std::sqrt(double(kHeadDim));
      formula_error = std::fmax(formula_error, std::fabs(score - at0[m * tokens + n]));
      largest = std::fmax(largest, std::fabs(score));
    }
  }
  const bool formula_holds = formula_error <= 1e-5 * std::fmax(1.0, largest);
  std::printf("   scores equal that formula in double: %s (largest difference %.2e)\n",
              formula_holds ? "yes" : "NO", formula_error);
  return worst < 1e-4f && formula_holds ? 0 : 1;
}
