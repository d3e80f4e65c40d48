// Links the installed embrope through find_package and rotates one vector by 90 degrees.
#include <embrope/embrope.hpp>

#include <cmath>
#include <cstdio>

int main() {
  // rotary_dim 2: inv_freq_0 = 1, so position pi/2 would rotate by pi/2; position 1 rotates
  // (1, 0) to (cos 1, sin 1).
  embrope::RopeCache cache({/*rotary_dim=*/2, /*base=*/10000.0, /*max_positions=*/4});
  float q[2] = {1.0f, 0.0f};
  std::int64_t position = 1;
  embrope::apply_rope(embrope::Tensor(q, embrope::DType::float32, {1, 1, 2}), std::nullopt,
                      embrope::Tensor(&position, embrope::DType::int64, {1}), cache);
  const bool ok = std::fabs(q[0] - std::cos(1.0)) < 1e-6 && std::fabs(q[1] - std::sin(1.0)) < 1e-6;
  std::printf("embrope %s: (%f, %f) %s\n", EMBROPE_VERSION_STRING, q[0], q[1], ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
