// out[i] += tmp[i] on the GPU, for the benchmark's unfused embedding baseline.
#pragma once

#include <cstdint>

void bench_add_rows(void* out, const void* tmp, std::int64_t n, int element_bytes, bool bf16,
                    void* stream);
