// Device workspaces, after CUB's two-phase temporary storage: an op first asks how many
// bytes its call needs (a size query that reads no data and launches nothing), and the
// caller may pass that much device memory; otherwise the call allocates it on its stream
// from embrope's workspace pool and frees it in stream order (no synchronisation).
//
// A workspace is laid out by a WorkspaceLayout walked twice with the same requests: once
// without a base (sizes only), once on the real base. Every piece starts on a
// kWorkspaceAlign boundary, as CUB's temporary storage expects.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common.cuh"

namespace embrope::gpu {

constexpr std::size_t kWorkspaceAlign = 256;

// Bytes of workspace memory the pool of each device keeps reserved across synchronisations
// (cudaMemPoolAttrReleaseThreshold); what a call takes beyond it goes back to the system at
// the next synchronisation.
constexpr std::uint64_t kWorkspacePoolKeepBytes = std::uint64_t{64} << 20;

// A call's own workspace: `bytes` from the current device's workspace pool, in the order of
// `stream` (cudaMallocFromPoolAsync; cudaMallocAsync, as before, where the runtime or the device
// has no memory pools). The pool is embrope's own, one per device, made at its first use and kept
// for the process, so that a workspace stays mapped from one call to the next. The device's
// default pool, which cudaMallocAsync takes from, keeps nothing across a synchronisation
// (its release threshold is 0 unless the application raises it, and raising it would change
// the application's pool): every call after one, that is every call of an op that reports
// its status synchronously, mapped its workspace afresh. On an H200 a sinusoidal lookup of
// one token took 134 us where a learned one took 25, and embed + LayerNorm of 1,024 tokens
// 169 us (benchmarks/results/gpu-2026-11-27-h200-10a536d).
void* allocate_workspace(std::size_t bytes, cudaStream_t stream, const char* op);

class WorkspaceLayout {
 public:
  // base null: sizes only (every piece is null).
  explicit WorkspaceLayout(char* base) : base_(base) {}

  // The next piece of `count` elements of T.
  template <typename T>
  T* take(std::size_t count) {
    return static_cast<T*>(take_bytes(count * sizeof(T)));
  }
  void* take_bytes(std::size_t bytes) {
    char* piece = base_ == nullptr ? nullptr : base_ + used_;
    used_ += (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
    return piece;
  }
  // Bytes a caller must provide: the pieces, and room to align an arbitrary base.
  std::size_t required_bytes() const { return used_ + kWorkspaceAlign - 1; }
  // Bytes the pieces span from an aligned base (a multiple of kWorkspaceAlign): where the
  // next layout may start, aligned, when two share one workspace.
  std::size_t used_bytes() const { return used_; }

 private:
  char* base_;
  std::size_t used_ = 0;
};

// The workspace of one call: the caller's memory (given: at least the required bytes,
// checked by the op's host code), or an allocation on `stream` freed in stream order however
// the call ends. base() is aligned to kWorkspaceAlign.
class Workspace {
 public:
  Workspace(void* caller_memory, std::size_t required_bytes, cudaStream_t stream, const char* op)
      : stream_(stream) {
    char* base = static_cast<char*>(caller_memory);
    if (base == nullptr) {
      owned_ = allocate_workspace(required_bytes, stream, op);
      base = static_cast<char*>(owned_);
    }
    const auto address = reinterpret_cast<std::uintptr_t>(base);
    base_ = base + (kWorkspaceAlign - address % kWorkspaceAlign) % kWorkspaceAlign;
  }
  ~Workspace() {
    // A failed free (the capture it was queued in invalidated) must not leave its error for
    // the next launch check, ours or the caller's framework's, to report.
    if (owned_ != nullptr && cudaFreeAsync(owned_, stream_) != cudaSuccess) {
      (void)cudaGetLastError();
    }
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  char* base() const { return base_; }

 private:
  void* owned_ = nullptr;
  char* base_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace embrope::gpu
