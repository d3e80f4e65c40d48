// Turning kernel-side bad-index records into errors, under the caller's policy (status.hpp).
#pragma once

#include <functional>
#include <string>

#include "embrope/detail/bad_index.hpp"
#include "embrope/status.hpp"

namespace embrope {

std::string describe_bad_index(const detail::BadIndexRecord& record);
[[noreturn]] void throw_bad_index(const detail::BadIndexRecord& record);

// Runs launch(record) where record is where the kernel reports bad rows: the caller's deferred
// status, or (default policy) a record of this call that is checked before returning, which
// on a GPU costs one synchronisation of the stream.
void run_with_bad_index_policy(const char* op, Device device, Stream stream,
                               DeferredStatus* deferred,
                               const std::function<void(detail::BadIndexRecord*)>& launch);

}  // namespace embrope
