// DeferredStatus: a bad-index record that outlives the calls reporting to it
// (deferred_status.hpp, docs/errors.md).
#include "embrope/deferred_status.hpp"
#include "embrope/version.hpp"

#include "device_runtime.hpp"
#include "bad_index.hpp"
#include "validate.hpp"

EMBROPE_BEGIN_NAMESPACE

using internal::BadIndexRecord;

DeferredStatus::DeferredStatus(Device device) : device_(device) {
  if (device.kind == DeviceKind::cpu) {
    record_ = new BadIndexRecord();
  } else {
    validate::check_device_usable("DeferredStatus", device);
    record_ = static_cast<BadIndexRecord*>(gpu::allocate(sizeof(BadIndexRecord), device));
    const BadIndexRecord empty;
    gpu::copy_to_device(record_, &empty, sizeof empty, device, Stream{});
    gpu::synchronize(Stream{}, device);
  }
}

DeferredStatus::~DeferredStatus() {
  if (device_.kind == DeviceKind::cpu) {
    delete record_;
  } else {
    gpu::release(record_, device_);
  }
}

void DeferredStatus::read(Stream stream, bool clear, BadIndexRecord* out) {
  const BadIndexRecord empty;
  if (device_.kind == DeviceKind::cpu) {
    *out = *record_;
    if (clear) *record_ = empty;
  } else {
    if (gpu::capturing(stream, device_)) {
      validate::fail("DeferredStatus",
                     "check or ok called on a stream capturing a CUDA graph, which it would "
                     "synchronise; call it after the graph runs");
    }
    gpu::copy_to_host(out, record_, sizeof *out, device_, stream);
    if (clear) gpu::copy_to_device(record_, &empty, sizeof empty, device_, stream);
  }
}

void DeferredStatus::check(Stream stream) {
  BadIndexRecord record;
  read(stream, /*clear=*/true, &record);
  if (record.key != internal::kNoBadIndex) throw_bad_index(record);
}

bool DeferredStatus::ok(Stream stream) {
  BadIndexRecord record;
  read(stream, /*clear=*/false, &record);
  return record.key == internal::kNoBadIndex;
}

EMBROPE_END_NAMESPACE
