// embrope::Error: the one exception type of the C++ API (docs/errors.md).
#pragma once

#include <stdexcept>
#include <string>

#include "embrope/export.hpp"
#include "embrope/version.hpp"

EMBROPE_BEGIN_NAMESPACE

// The same numbers as embrope_status_t in embrope.h.
enum class ErrorCode : int {
  ok = 0,
  invalid_argument = 1,    // a shape, stride, dtype, device or option breaks a rule
  index_out_of_range = 2,  // an id, position or type id found by a kernel outside its table
  not_implemented = 3,     // a path this build does not have (CUDA tensors without CUDA)
  cuda_error = 4,          // the CUDA runtime reported an error
  out_of_memory = 5,       // an allocation failed
  internal = 6,            // a bug in embrope
};

// Thrown by every C++ entry point. what() names the op, the argument, the value and the rule:
// "apply_rope: rotary_dim 130 exceeds head_dim 128".
class EMBROPE_EXPORT Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

EMBROPE_END_NAMESPACE
