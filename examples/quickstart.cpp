// Token ids -> embeddings -> q and k -> RoPE, on the CPU, with the C++ API.
#include <embrope/embrope.hpp>

#include <cstdio>
#include <vector>

int main() {
  const std::int64_t vocab = 100, dim = 64, heads = 2, head_dim = 32, tokens = 4;
  std::vector<float> table(vocab * dim, 0.01f), hidden(tokens * dim);
  std::vector<std::int64_t> ids = {17, 42, 42, 7}, positions = {0, 1, 2, 3};
  using embrope::DType;
  using embrope::Tensor;

  // 1. Lookup with sinusoidal positions added, in one pass.
  embrope::EmbedOptions embed_options;
  embed_options.positions = embrope::PositionEncoding::sinusoidal;
  embrope::embed(Tensor(table.data(), DType::float32, {vocab, dim}),
                 Tensor(ids.data(), DType::int64, {tokens}),
                 Tensor(hidden.data(), DType::float32, {tokens, dim}), embed_options);

  // 2. Treat the hidden states as q (a real model would project them first) and rotate.
  embrope::RopeCache cache({/*rotary_dim=*/head_dim, /*base=*/10000.0, /*max_positions=*/2048});
  embrope::apply_rope(Tensor(hidden.data(), DType::float32, {tokens, heads, head_dim}),
                      std::nullopt, Tensor(positions.data(), DType::int64, {tokens}), cache);

  std::printf("q[3][0][0..3] = %.4f %.4f %.4f %.4f\n", hidden[3 * dim], hidden[3 * dim + 1],
              hidden[3 * dim + 2], hidden[3 * dim + 3]);
  return 0;
}
