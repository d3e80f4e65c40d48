// CUDA runtime services of the backend: devices, memory, copies, synchronisation.
#include <algorithm>
#include <atomic>
#include <fmt/format.h>
#include <map>
#include <mutex>

#include "../src/device_runtime.hpp"
#include "common.cuh"
#include "workspace.cuh"

namespace embrope::gpu {

void throw_cuda_error(cudaError_t status, const char* what) {
  (void)cudaGetLastError();  // clear a sticky launch error so the context stays usable
  const ErrorCode code =
      status == cudaErrorMemoryAllocation ? ErrorCode::out_of_memory : ErrorCode::cuda_error;
  throw Error(
      code, fmt::format("{}: {} ({})", what, cudaGetErrorString(status), cudaGetErrorName(status)));
}

DeviceGuard::DeviceGuard(Device device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device.index) {
    check(cudaSetDevice(device.index), "cudaSetDevice");
  } else {
    previous_ = -1;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
}

int device_count() {
  int count = 0;
  // Without a driver this returns an error rather than 0 devices (docs/errors.md).
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

namespace {
// While another thread captures a CUDA graph in the global mode (torch.cuda.graph's
// default), cudaMalloc and cudaFree from this thread are refused and invalidate that capture;
// in the relaxed mode they are allowed (as PyTorch's caching allocator calls them). The memory
// allocate and release handle (a thread's bad-index record, a deferred status, a cos/sin
// table) belongs to no graph.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() noexcept {
#if defined(CUDART_VERSION)
    if (cudaThreadExchangeStreamCaptureMode(&mode_) != cudaSuccess) {
      (void)cudaGetLastError();
      exchanged_ = false;
    }
#endif
  }
  ~RelaxedCaptureMode() {
#if defined(CUDART_VERSION)
    if (exchanged_) (void)cudaThreadExchangeStreamCaptureMode(&mode_);
#endif
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
#if defined(CUDART_VERSION)
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool exchanged_ = true;
#endif
};
}  // namespace

void* allocate(std::size_t bytes, Device device) {
  DeviceGuard guard(device);
  const RelaxedCaptureMode relaxed;
  void* pointer = nullptr;
  check(cudaMalloc(&pointer, bytes == 0 ? 1 : bytes), "cudaMalloc");
  return pointer;
}

void release(void* pointer, Device device) noexcept {
  if (pointer == nullptr) return;
  int previous = -1;
  if (cudaGetDevice(&previous) == cudaSuccess && previous != device.index) {
    (void)cudaSetDevice(device.index);
  }
  {
    const RelaxedCaptureMode relaxed;
    (void)cudaFree(pointer);
  }
  if (previous >= 0 && previous != device.index) (void)cudaSetDevice(previous);
  (void)cudaGetLastError();
}

void copy_to_host(void* host, const void* device_pointer, std::size_t bytes, Device device,
                  Stream stream) {
  DeviceGuard guard(device);
  check(cudaMemcpyAsync(host, device_pointer, bytes, cudaMemcpyDeviceToHost, to_cuda(stream)),
        "cudaMemcpyAsync (device to host)");
  check(cudaStreamSynchronize(to_cuda(stream)), "cudaStreamSynchronize");
}

void copy_to_device(void* device_pointer, const void* host, std::size_t bytes, Device device,
                    Stream stream) {
  DeviceGuard guard(device);
  check(cudaMemcpyAsync(device_pointer, host, bytes, cudaMemcpyHostToDevice, to_cuda(stream)),
        "cudaMemcpyAsync (host to device)");
}

void synchronize(Stream stream, Device device) {
  DeviceGuard guard(device);
  check(cudaStreamSynchronize(to_cuda(stream)), "cudaStreamSynchronize");
}

bool capturing(Stream stream, Device device) {
#if defined(CUDART_VERSION)
  DeviceGuard guard(device);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t status = cudaStreamIsCapturing(to_cuda(stream), &capture);
  if (status == cudaErrorStreamCaptureImplicit) {
    // The legacy stream while a blocking stream of the device captures: using it would
    // invalidate that capture, as a capture of its own would be.
    (void)cudaGetLastError();
    return true;
  }
  check(status, "cudaStreamIsCapturing");
  return capture != cudaStreamCaptureStatusNone;
#else
  (void)stream;
  (void)device;
  return false;
#endif
}

namespace {

// One attribute of the current device, queried once per device.
template <cudaDeviceAttr kAttribute>
int cached_attribute(const char* what) {
  constexpr int kCachedDevices = 64;
  static std::atomic<int> cached[kCachedDevices] = {};
  int device = 0, value = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  if (device >= 0 && device < kCachedDevices) {
    value = cached[device].load(std::memory_order_relaxed);
    if (value > 0) return value;
  }
  check(cudaDeviceGetAttribute(&value, kAttribute, device), what);
  if (device >= 0 && device < kCachedDevices)
    cached[device].store(value, std::memory_order_relaxed);
  return value;
}

}  // namespace

int multiprocessor_count() {
  return cached_attribute<cudaDevAttrMultiProcessorCount>(
      "cudaDeviceGetAttribute (multiprocessor count)");
}

std::int64_t blocks_per_multiprocessor(std::int64_t threads_per_block) {
  constexpr std::int64_t kMaxBlocks = 32;  // sm_50 to sm_90
  const std::int64_t threads = cached_attribute<cudaDevAttrMaxThreadsPerMultiProcessor>(
      "cudaDeviceGetAttribute (threads per multiprocessor)");
  const std::int64_t blocks = threads / std::max<std::int64_t>(1, threads_per_block);
  return std::max<std::int64_t>(1, std::min(kMaxBlocks, blocks));
}

namespace {

#if defined(CUDART_VERSION)  // a CUDA runtime, with stream-ordered memory pools (CUDA 11.2)
// The workspace pool of `device` (workspace.cuh), or null where the device has no memory
// pools.
cudaMemPool_t make_workspace_pool(int device) {
  int supported = 0;
  if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device) != cudaSuccess ||
      supported == 0) {
    (void)cudaGetLastError();
    return nullptr;
  }
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate (workspace pool)");
  std::uint64_t keep = kWorkspacePoolKeepBytes;
  const cudaError_t status = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  if (status != cudaSuccess) {
    (void)cudaMemPoolDestroy(pool);
    check(status, "cudaMemPoolSetAttribute (workspace pool release threshold)");
  }
  return pool;
}

// The current device's workspace pool, made at its first use. The pools are never destroyed:
// a workspace may still be in flight on some stream when the process exits, and the
// driver releases them with the context.
cudaMemPool_t workspace_pool() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  static std::mutex mutex;
  static std::map<int, cudaMemPool_t> pools;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = pools.find(device);
  if (it == pools.end()) it = pools.emplace(device, make_workspace_pool(device)).first;
  return it->second;
}
#endif

}  // namespace

void* allocate_workspace(std::size_t bytes, cudaStream_t stream, const char* op) {
  void* memory = nullptr;
#if defined(CUDART_VERSION)
  // In a stream capture the allocation becomes a node of the graph, which owns its memory
  // (cudaMallocAsync's memory as any pool's); the pool is neither needed nor made there.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  cudaMemPool_t pool = capture == cudaStreamCaptureStatusNone ? workspace_pool() : nullptr;
  if (pool != nullptr) {
    check(cudaMallocFromPoolAsync(&memory, bytes, pool, stream),
          fmt::format("cudaMallocFromPoolAsync ({} workspace)", op).c_str());
    return memory;
  }
#endif
  check(cudaMallocAsync(&memory, bytes, stream),
        fmt::format("cudaMallocAsync ({} workspace)", op).c_str());
  return memory;
}

}  // namespace embrope::gpu
