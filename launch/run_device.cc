#include "launch/run_device.h"

#include "plan/plan_spec.h"

namespace loom::launch {

Result<runtime::DeviceRequest> device_request(const Config& config) {
  LOOM_ASSIGN_OR_RETURN(const plan::PlanSpec spec, plan::PlanSpec::of(config));
  return runtime::DeviceRequest::of(config, spec.device, spec.precision);
}

Result<runtime::RunDevice> select_device(const Config& config, int64_t local_rank) {
  LOOM_ASSIGN_OR_RETURN(const runtime::DeviceRequest request, device_request(config));
  Result<runtime::RunDevice> device = runtime::select_device(request, local_rank);
  if (!device.ok()) return config.locate(device.error());
  return device;
}

}  // namespace loom::launch
