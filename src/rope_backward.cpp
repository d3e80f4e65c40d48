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

bool identifier_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// The forward's argument names as this op's: q, k, q_out, k_out (whole words) become dq, dk,
// dq_out, dk_out.
std::string backward_names(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const bool starts_word = i == 0 || !identifier_char(text[i - 1]);
    if (starts_word && (text[i] == 'q' || text[i] == 'k')) {
      std::size_t end = i + 1;
      while (end < text.size() && identifier_char(text[end])) ++end;
      const std::string word = text.substr(i, end - i);
      if (word == "q" || word == "k" || word == "q_out" || word == "k_out") {
        out += "d" + word;
        i = end;
        continue;
      }
    }
    out += text[i++];
  }
  return out;
}

// Runs the forward and words its errors as this op's: "apply_rope: q has ..." becomes
// "apply_rope_backward: dq has ...".
template <typename Call>
void as_backward(Call&& call) {
  try {
    call();
  } catch (const Error& e) {
    const char* what = e.what();
    if (std::strncmp(what, kForwardPrefix, std::strlen(kForwardPrefix)) != 0) throw;
    throw Error(e.code(),
                std::string(kOp) + ":" + backward_names(what + std::strlen(kForwardPrefix)));
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
