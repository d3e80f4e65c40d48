// Bad-index records turned into errors, under the caller's policy (bad_index.hpp).
#include "bad_index.hpp"

#include <fmt/format.h>

#include <unordered_map>

#include "device_runtime.hpp"
#include "embrope/error.hpp"
#include "embrope/version.hpp"
#include "validate.hpp"

EMBROPE_BEGIN_NAMESPACE

using internal::BadIndexArg;
using internal::BadIndexOp;
using internal::BadIndexRecord;

std::string describe_bad_index(const BadIndexRecord& record) {
  const std::int64_t row = internal::bad_index_row(record.key);
  const BadIndexArg arg = internal::bad_index_arg(record.key);
  const auto which = static_cast<BadIndexOp>(record.op);
  const char* op =
      which == BadIndexOp::apply_rope                     ? "apply_rope"
      : which == BadIndexOp::apply_rope_backward          ? "apply_rope_backward"
      : which == BadIndexOp::apply_rope_append_kv         ? "apply_rope_append_kv"
      : which == BadIndexOp::apply_qk_norm_rope           ? "apply_qk_norm_rope"
      : which == BadIndexOp::apply_qk_norm_rope_backward  ? "apply_qk_norm_rope_backward"
      : which == BadIndexOp::apply_qk_norm_rope_append_kv ? "apply_qk_norm_rope_append_kv"
      : which == BadIndexOp::packed_positions             ? "packed_positions"
      : which == BadIndexOp::embed_backward               ? "embed_backward"
                                                          : "embed";
  std::string subject;
  const char* table = "";
  switch (arg) {
    case BadIndexArg::ids:
      subject = fmt::format("ids[{}]", row);
      table = "the vocabulary";
      break;
    case BadIndexArg::position_ids:
      subject = fmt::format("position_ids[{}]", row);
      table = "the valid positions";  // the learned table's rows, or sinusoids' range
      break;
    case BadIndexArg::implicit_position:
      subject = fmt::format("the implicit position (position_offsets[b] + s) of ids[{}]", row);
      table = "the valid positions";  // the learned table's rows, or sinusoids' range
      break;
    case BadIndexArg::type_ids:
      subject = fmt::format("type_ids[{}]", row);
      table = "the type table";
      break;
    case BadIndexArg::positions:
      subject = fmt::format("positions[{}]", row);
      table = "the cos/sin table";
      break;
    case BadIndexArg::cu_seqlens:
      subject = fmt::format("cu_seqlens[{}]", row);
      table = "the values allowed there (non-decreasing from 0 to the token count T)";
      break;
    case BadIndexArg::start_offsets:
      subject = fmt::format("start_offsets[{}]", row);
      table = "the starts that keep the sequence's positions representable";
      break;
    case BadIndexArg::slot_mapping:
      subject = fmt::format("slot_mapping[{}]", row);
      table = "the cache's slots (-1 skips a token)";
      break;
    case BadIndexArg::cache_offsets:
      subject = fmt::format("the cache write position (cache_offsets[b] + s) of token {}", row);
      table = "the cache's rows";
      break;
  }
  if (record.upper == INT64_MAX && record.value < 0) {
    return fmt::format("{}: {} = {} is negative (flat row-major index)", op, subject, record.value);
  }
  return fmt::format("{}: {} = {} is outside {} [{}, {}) (flat row-major index)", op, subject,
                     record.value, table, record.lower, record.upper);
}

void throw_bad_index(const BadIndexRecord& record) {
  throw Error(ErrorCode::index_out_of_range, describe_bad_index(record));
}

namespace {
// One device-side record per thread and CUDA device, for the default (raising) policy.
class ScratchRecords {
 public:
  ~ScratchRecords() {
    for (auto& [index, pointer] : records_) gpu::release(pointer, Device::cuda(index));
  }
  BadIndexRecord* get(Device device) {
    auto& pointer = records_[device.index];
    if (pointer == nullptr) {
      pointer = static_cast<BadIndexRecord*>(gpu::allocate(sizeof(BadIndexRecord), device));
    }
    return pointer;
  }

 private:
  std::unordered_map<int, BadIndexRecord*> records_;
};
}  // namespace

void run_with_bad_index_policy(const char* op, Device device, Stream stream,
                               DeferredStatus* deferred,
                               const std::function<void(BadIndexRecord*)>& launch) {
  if (deferred != nullptr) {
    if (deferred->device() != device) {
      validate::fail(op, "the deferred status lives on another device than the tensors");
    }
    launch(deferred->record());
    return;
  }
  BadIndexRecord record;
  if (device.kind == DeviceKind::cpu) {
    launch(&record);
  } else {
    if (gpu::capturing(stream, device)) {
      validate::fail(op,
                     "called during CUDA graph capture without a deferred status: reporting a bad "
                     "index would synchronise the stream; give options.deferred a DeferredStatus "
                     "and check it after the graph runs");
    }
    thread_local ScratchRecords scratch;
    BadIndexRecord* on_device = scratch.get(device);
    gpu::copy_to_device(on_device, &record, sizeof record, device, stream);
    try {
      launch(on_device);
    } catch (...) {
      // A launch refused after an earlier kernel of the op was queued leaves that kernel
      // writing this thread's record, which the thread's next call resets and reads on its
      // own stream: wait for it here. Best effort; the error reported is the launch's.
      try {
        gpu::synchronize(stream, device);
      } catch (...) {
      }
      throw;
    }
    gpu::copy_to_host(&record, on_device, sizeof record, device, stream);  // synchronises
  }
  if (record.key != internal::kNoBadIndex) throw_bad_index(record);
}

EMBROPE_END_NAMESPACE
