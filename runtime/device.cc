#include "runtime/device.h"

#include <ATen/Context.h>

#include <cstdlib>

#include "runtime/fp8.h"
#include "runtime/memory.h"

#if LOOM_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace loom::runtime {

std::string RunDevice::to_string() const {
  const char* math = linear == LinearMath::kFp8Rowwise      ? " fp8 rowwise"
                     : linear == LinearMath::kFp8Tensorwise ? " fp8 tensorwise"
                     : compute == at::kBFloat16             ? " bf16"
                                                            : " fp32";
  return device.str() + math + (deterministic ? " deterministic" : "");
}

at::ScalarType scalar_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return at::kFloat;
    case DType::kFloat16:
      return at::kHalf;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kInt64:
      return at::kLong;
    case DType::kInt32:
    case DType::kUInt16:
      return at::kInt;
  }
  return at::kFloat;
}

int64_t cuda_device_count() {
#if LOOM_TORCH_CUDA
  return static_cast<int64_t>(c10::cuda::device_count());
#else
  return 0;
#endif
}

namespace {

// run.deterministic: LibTorch's deterministic algorithms everywhere (an op with none fails
// naming itself rather than varying), and on a GPU cuBLAS with a fixed workspace per stream
// (CUBLAS_WORKSPACE_CONFIG, read when LibTorch first sizes the workspace: before any product,
// as select_device runs). Flash attention's backward is then its deterministic variant.
void make_deterministic(RunDevice& d) {
  d.deterministic = true;
  if (d.cuda()) setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
}

// run.precision fp8 on `d`: refused naming the device where it has no float8 units.
Status select_fp8(const DeviceRequest& request, RunDevice& d) {
  if (request.precision != Precision::kFp8) return Status::success();
  if (auto why = fp8_refusal(d.device)) return Error::at("run.precision", "fp8: " + *why);
  d.linear = request.rowwise ? LinearMath::kFp8Rowwise : LinearMath::kFp8Tensorwise;
  return Status::success();
}

}  // namespace

DeviceRequest DeviceRequest::of(const Config& config, Device device, Precision precision) {
  return {device, precision, config.fp8.scaling == "rowwise", config.run.deterministic};
}

Result<RunDevice> select_device(const DeviceRequest& request, int64_t local_rank) {
  RunDevice d;
  d.compute = bf16_activations(request.precision) ? at::kBFloat16 : at::kFloat;
  if (request.device == Device::kCuda) {
#if LOOM_TORCH_CUDA
    const int64_t count = cuda_device_count();
    if (count < 1)
      return Error::at("run.device",
                       "cuda asked for, but this machine has no usable GPU (CUDA sees no "
                       "device: check the driver and CUDA_VISIBLE_DEVICES), or use run.device=cpu");
    const auto index = static_cast<c10::DeviceIndex>(local_rank % count);
    c10::cuda::set_device(index);
    d.device = at::Device(at::kCUDA, index);
    // fp32 means fp32: matrix products in TF32 would differ from the CPU by ~1e-3.
    at::globalContext().setAllowTF32CuBLAS(false);
    at::globalContext().setAllowTF32CuDNN(false);
#else
    (void)local_rank;
    return Error::at("run.device",
                     "cuda asked for, but this build of loom runs on CPUs only (its LibTorch "
                     "has no CUDA): build against a CUDA LibTorch, or use run.device=cpu");
#endif
  }
  LOOM_TRY(select_fp8(request, d));
  if (request.deterministic) make_deterministic(d);
  return d;
}

int64_t peak_device_bytes(const RunDevice& d) {
#if LOOM_TORCH_CUDA
  if (d.cuda()) {
    // Index 0 of every stat array is the aggregate over the allocator's pools.
    return c10::cuda::CUDACachingAllocator::getDeviceStats(d.device.index())
        .allocated_bytes[0]
        .peak;
  }
#endif
  (void)d;
  return peak_cpu_bytes();
}

void reset_peak_device_bytes(const RunDevice& d) {
#if LOOM_TORCH_CUDA
  if (d.cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(d.device.index());
    return;
  }
#endif
  (void)d;
  reset_peak_cpu_bytes();
}

void synchronize_device(const RunDevice& d) {
#if LOOM_TORCH_CUDA
  if (d.cuda()) c10::cuda::device_synchronize();
#endif
  (void)d;
}

}  // namespace loom::runtime
