// Argument checks shared by every op: each failure throws Error(invalid_argument) with a
// message "<op>: <argument> <value> <rule>" (DESIGN.md section 5).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "embrope/error.hpp"
#include "embrope/tensor.hpp"

namespace embrope::validate {

template <typename... Args>
[[noreturn]] void fail(const char* op, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(ErrorCode::invalid_argument,
              fmt::format("{}: {}", op, fmt::format(format, std::forward<Args>(args)...)));
}

// "[2, 3, 8]"
std::string shape_string(const Tensor& t);

// The view itself is sound: 1 <= ndim (or min_ndim) and ndim within [min_ndim, max_ndim],
// no negative size or stride, element count and furthest offset within int64, and data
// non-null unless the tensor is empty.
void check_view(const char* op, const char* name, const Tensor& t, int min_ndim, int max_ndim);
void check_value_dtype(const char* op, const char* name, const Tensor& t);
void check_index_dtype(const char* op, const char* name, const Tensor& t);
// The last dimension has stride 1 (any stride is fine for a last dimension of size 1).
void check_last_contiguous(const char* op, const char* name, const Tensor& t);
void check_same_device(const char* op, const char* name, const Tensor& t, const char* other_name,
                       Device other);
void check_same_dtype(const char* op, const char* name, const Tensor& t, const char* other_name,
                      DType other);
// Dimension `dim` of t equals `expected`, which is described by `what` ("head_dim of q").
void check_dim(const char* op, const char* name, const Tensor& t, int dim, std::int64_t expected,
               const char* what);
// A CUDA device index must name a device this build can use.
void check_device_usable(const char* op, Device device);
}  // namespace embrope::validate
