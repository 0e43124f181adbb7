#include "runtime/device.h"

#include <ATen/Context.h>

#include "runtime/memory.h"

#if LOOM_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace loom::runtime {

std::string RunDevice::to_string() const {
  return device.str() + (compute == at::kBFloat16 ? " bf16" : " fp32");
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

Result<RunDevice> select_device(const Config& config, int64_t local_rank) {
  RunDevice d;
  d.compute = config.run.precision == "bf16" ? at::kBFloat16 : at::kFloat;
  if (config.run.device != "cuda") return d;
#if LOOM_TORCH_CUDA
  const int64_t count = cuda_device_count();
  if (count < 1)
    return config.error(
        "run.device",
        "cuda asked for, but this machine has no usable GPU (CUDA sees no "
        "device: check the driver and CUDA_VISIBLE_DEVICES), or use run.device=cpu");
  const auto index = static_cast<c10::DeviceIndex>(local_rank % count);
  c10::cuda::set_device(index);
  d.device = at::Device(at::kCUDA, index);
  // fp32 means fp32: matrix products in TF32 would differ from the CPU by ~1e-3.
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  return d;
#else
  (void)local_rank;
  return config.error("run.device",
                      "cuda asked for, but this build of loom runs on CPUs only (its LibTorch "
                      "has no CUDA): build against a CUDA LibTorch, or use run.device=cpu");
#endif
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
