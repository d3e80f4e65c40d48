// apply_rope_backward: apply_rope with the rotation transposed (options.inverse flipped).
// The forward validates and dispatches; its kernels already rotate by -theta when asked
// (DESIGN.md 3.3: "inverse (backward) rotation uses -sin").
#include "embrope/rope_backward.hpp"

#include <cstring>
#include <string>

#include "embrope/error.hpp"

namespace embrope {
namespace {

constexpr const char* kOp = "apply_rope_backward";
constexpr const char* kForwardPrefix = "apply_rope:";

RopeOptions transposed(const RopeOptions& options) {
  RopeOptions o = options;
  o.inverse = !options.inverse;
  return o;
}

// Runs the forward and words its errors as this op's: "apply_rope: q has ..." becomes
// "apply_rope_backward: q has ...".
template <typename Call>
void as_backward(Call&& call) {
  try {
    call();
  } catch (const Error& e) {
    const char* what = e.what();
    if (std::strncmp(what, kForwardPrefix, std::strlen(kForwardPrefix)) != 0) throw;
    throw Error(e.code(), std::string(kOp) + ":" + (what + std::strlen(kForwardPrefix)));
  }
}

}  // namespace

void apply_rope_backward(const Tensor& dq, const std::optional<Tensor>& dk, const Tensor& positions,
                         const RopeCache& cache, const RopeOptions& options) {
  as_backward([&] { apply_rope(dq, dk, positions, cache, transposed(options)); });
}

void apply_rope_backward(const Tensor& dq, const std::optional<Tensor>& dk, const Tensor& positions,
                         const Tensor& cos, const Tensor& sin, const RopeOptions& options) {
  as_backward([&] { apply_rope(dq, dk, positions, cos, sin, transposed(options)); });
}

}  // namespace embrope
