// DeferredStatus: where bad ids and positions found by kernels are kept until the caller
// checks (docs/errors.md).
//
// A kernel that meets an id outside the vocabulary or a position outside the cache reads and
// writes nothing out of bounds, zero-fills the affected output rows and records the first
// offending row. By default the op then throws an Error of code index_out_of_range (on a GPU
// this costs one stream synchronisation). A caller that cannot afford the synchronisation
// passes a DeferredStatus in the op's options: the op then returns without waiting, and the
// caller calls check() when it chooses to.
#pragma once

#include "embrope/export.hpp"
#include "embrope/types.hpp"
#include "embrope/version.hpp"

namespace embrope::internal {
struct BadIndexRecord;  // what a kernel writes; defined by the library (src/, not installed)
}  // namespace embrope::internal

EMBROPE_BEGIN_NAMESPACE

// Collects bad-index reports of any number of ops until check(). Not thread-safe: on the CPU
// a call updates the record after its kernel with plain loads and stores, and check() reads
// and clears it the same way, so two threads sharing one race; on a GPU the record also holds
// the counter by which a kernel's last block finds the first bad row, so kernels on different
// streams must not share one either. Give each thread (and each stream) its own, or order the
// calls that use it. Lives on the device of the ops that report to it.
class EMBROPE_EXPORT DeferredStatus {
 public:
  explicit DeferredStatus(Device device = Device::cpu());
  ~DeferredStatus();
  DeferredStatus(const DeferredStatus&) = delete;
  DeferredStatus& operator=(const DeferredStatus&) = delete;

  Device device() const { return device_; }
  // Throws Error(index_out_of_range) if a bad row was recorded since the last check, then
  // clears the record. When several calls recorded bad rows, the report kept is the one with
  // the lowest (row, argument) key, whichever call it came from: check after each call when
  // you need to know which call failed. On a GPU, synchronises the given stream first.
  void check(Stream stream = {});
  // True when nothing has been recorded (synchronises like check()).
  bool ok(Stream stream = {});

  // The record the kernels write; device memory for CUDA statuses.
  internal::BadIndexRecord* record() const { return record_; }

 private:
  // Copies the record to the host (synchronising a CUDA stream) and, when `clear`, resets it.
  void read(Stream stream, bool clear, internal::BadIndexRecord* out);
  Device device_;
  internal::BadIndexRecord* record_ = nullptr;
};

EMBROPE_END_NAMESPACE
