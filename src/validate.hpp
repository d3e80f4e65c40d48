// Argument checks shared by every op: each failure throws Error(invalid_argument) with a
// message "<op>: <argument> <value> <rule>" (docs/errors.md).
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
// t is float32 or `other`, the dtype of `other_name` (a float32 gradient, weight or output
// beside 16-bit values).
void check_float32_or_dtype(const char* op, const char* name, const Tensor& t,
                            const char* other_name, DType other);
// Dimension `dim` of t equals `expected`, which is described by `what` ("head_dim of q").
void check_dim(const char* op, const char* name, const Tensor& t, int dim, std::int64_t expected,
               const char* what);
// A CUDA device index must name a device this build can use.
void check_device_usable(const char* op, Device device);

// Memory overlap between views (both already passed check_view). Each view is the set of
// bytes its elements occupy; strides make that set a lattice, not an interval, so two views
// can interleave without sharing a byte (q and k in a fused QKV buffer).
enum class Overlap { none, same_view, partial };
Overlap overlap(const Tensor& a, const Tensor& b);
// An output shares no byte with `in`. When `in_place` (the output is the in-place partner
// of `in`, e.g. q_out and q), the exact same view is allowed; any other sharing is an error.
void check_no_overlap(const char* op, const char* out_name, const Tensor& out, const char* in_name,
                      const Tensor& in, bool in_place = false);
// No two elements of an output share a byte (a zero stride or interleaving strides would
// make threads race on one element and leave its final value to chance).
void check_no_self_overlap(const char* op, const char* name, const Tensor& t);
}  // namespace embrope::validate
