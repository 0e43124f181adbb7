// The device of a process that selects one without a trainer (verify's ranks, benches, tests):
// the device and precision its config's PlanSpec parses, as the trainer's RunPlan carries them.
#pragma once

#include <cstdint>

#include "core/config.h"
#include "core/result.h"
#include "runtime/device.h"

namespace loom::launch {

// The device request of `config`'s run: its PlanSpec's device and precision, fp8.scaling and
// run.deterministic.
Result<runtime::DeviceRequest> device_request(const Config& config);

// runtime::select_device of `device_request(config)`, its errors located in `config`.
Result<runtime::RunDevice> select_device(const Config& config, int64_t local_rank);

}  // namespace loom::launch
