// The run's device and precision (run.device, run.precision): where the executor makes every
// tensor and in which dtype matrix work and activations run. Parameters, their gradients and the
// optimizer state stay float32 (master weights); the graph says each tensor's dtype
// (graph/precision.h), this says where it lives.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <string>

#include "core/config.h"
#include "core/result.h"
#include "core/run_spec.h"
#include "core/shape.h"
#include "runtime/linear.h"

namespace loom::runtime {

struct RunDevice {
  at::Device device = at::Device(at::kCPU);
  at::ScalarType compute = at::kFloat;  // activations and matrix work
  // run.precision fp8: the linears' products in float8 (compute stays bf16 around them).
  LinearMath linear = LinearMath::kDefault;
  bool deterministic = false;  // run.deterministic

  bool cuda() const { return device.is_cuda(); }
  at::TensorOptions options(at::ScalarType dtype) const {
    return at::TensorOptions().device(device).dtype(dtype);
  }
  std::string to_string() const;  // "cuda:0 bf16", "cpu fp32", "cuda:0 fp8 rowwise"
};

// LibTorch's dtype of a graph dtype (u16 widens to i32: ATen's unsigned 16-bit type has few
// kernels).
at::ScalarType scalar_type(DType dtype);

// What a rank's device is made of: the plan's device and precision (PlanSpec's, from run.device
// and run.precision), fp8.scaling and run.deterministic.
struct DeviceRequest {
  Device device = Device::kCpu;
  Precision precision = Precision::kFp32;
  bool rowwise = false;        // fp8.scaling rowwise (else tensorwise)
  bool deterministic = false;  // run.deterministic

  // `device` and `precision` (the plan's) with the config's fp8.scaling and run.deterministic.
  static DeviceRequest of(const Config& config, Device device, Precision precision);
};

// The device of this process for `request`: cuda takes GPU `local_rank` modulo the visible
// GPUs, makes it LibTorch's current device and turns TF32 off (so fp32 on a GPU compares with
// the CPU). Fails keyed run.device (Error::at: the caller locates it in its config) when this
// build's LibTorch has no CUDA or the machine no usable GPU, and run.precision when fp8 is asked
// of a device without float8 units. Deterministic turns on LibTorch's deterministic algorithms
// (an op without one then fails naming itself) and fixes cuBLAS's workspace.
Result<RunDevice> select_device(const DeviceRequest& request, int64_t local_rank);

// How many GPUs this process can use (0 without CUDA).
int64_t cuda_device_count();

// Bytes of live tensors on the device: the CUDA caching allocator's figures on a GPU, the
// counting CPU allocator's (runtime/memory.h) on the CPU.
int64_t peak_device_bytes(const RunDevice& d);  // since the last reset
void reset_peak_device_bytes(const RunDevice& d);

// Waits until the device has finished the work queued on it (a traced step's timestamps, so a
// GPU block ends when its kernels do); nothing on the CPU.
void synchronize_device(const RunDevice& d);

// The memory one rank may use: the GPU's total, or the machine's MemTotal shared by the
// `ranks_per_machine` ranks on it (defined in calibration.cc).
double device_memory_bytes(const RunDevice& d, int64_t ranks_per_machine);

}  // namespace loom::runtime
