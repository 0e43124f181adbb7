#include "core/run_spec.h"

#include <array>
#include <utility>

namespace loom {
namespace {

template <class E, size_t N>
using Names = std::array<std::pair<E, std::string_view>, N>;

constexpr Names<Device, 2> kDevices{{{Device::kCpu, "cpu"}, {Device::kCuda, "cuda"}}};
constexpr Names<Precision, 3> kPrecisions{
    {{Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}, {Precision::kFp8, "fp8"}}};
constexpr Names<CommBackend, 5> kBackends{{{CommBackend::kAuto, "auto"},
                                           {CommBackend::kGloo, "gloo"},
                                           {CommBackend::kMpi, "mpi"},
                                           {CommBackend::kNccl, "nccl"},
                                           {CommBackend::kLocal, "local"}}};
constexpr Names<OptimizerKind, 2> kOptimizers{
    {{OptimizerKind::kAdamw, "adamw"}, {OptimizerKind::kSgd, "sgd"}}};

template <class E, size_t N>
std::string_view name_in(const Names<E, N>& names, E value) {
  for (const auto& [v, n] : names)
    if (v == value) return n;
  LOOM_CHECK(false) << "an enumerator without a name: " << static_cast<int>(value);
  return {};
}

template <class E, size_t N>
Result<E> parse_in(const Names<E, N>& names, std::string_view text, const char* what) {
  std::string known;
  for (const auto& [v, n] : names) {
    if (n == text) return v;
    known += (known.empty() ? "" : ", ") + std::string(n);
  }
  return Error::at(
      "", "unknown " + std::string(what) + " '" + std::string(text) + "' (expected " + known + ")");
}

}  // namespace

std::string_view name(Device device) { return name_in(kDevices, device); }
std::string_view name(Precision precision) { return name_in(kPrecisions, precision); }
std::string_view name(CommBackend backend) { return name_in(kBackends, backend); }
std::string_view name(OptimizerKind optimizer) { return name_in(kOptimizers, optimizer); }

Result<Device> parse_device(std::string_view text) { return parse_in(kDevices, text, "device"); }
Result<Precision> parse_precision(std::string_view text) {
  return parse_in(kPrecisions, text, "precision");
}
Result<CommBackend> parse_backend(std::string_view text) {
  return parse_in(kBackends, text, "backend");
}
Result<OptimizerKind> parse_optimizer(std::string_view text) {
  return parse_in(kOptimizers, text, "optimizer");
}

std::string BatchSpec::formula() const {
  return "batch.global " + std::to_string(global) + " / (batch.micro " + std::to_string(micro) +
         " x parallel.dp " + std::to_string(dp) + ")";
}

CommTraits CommTraits::of(CommBackend backend) {
  CommTraits t;
  switch (backend) {
    case CommBackend::kGloo:
    case CommBackend::kLocal:
      t.collectives_through_all_to_all = true;
      break;
    case CommBackend::kMpi:
      t.shard_out_of_place = true;
      break;
    case CommBackend::kNccl:
      t.defers_sends = true;
      break;
    case CommBackend::kAuto:
      LOOM_CHECK(false) << "CommTraits of comm.backend auto: resolve it first (job_backend)";
  }
  return t;
}

CommBackend job_backend(CommBackend requested, Device device) {
  if (requested != CommBackend::kAuto) return requested;
  return device == Device::kCuda ? CommBackend::kNccl : CommBackend::kGloo;
}

}  // namespace loom
