#include "runtime/step_trace.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/durable_file.h"
#include "scheduler/render.h"

namespace loom::runtime {

observe::TraceEvent block_event(const lower::ProgramBlock& block) {
  observe::TraceEvent e;
  const char kind = sched::to_char(block.kind);
  e.name = sched::block_slice_name(kind, block.stage, block.micro_batch);
  e.track = observe::Track::kCompute;
  e.kind = std::string(1, kind);
  e.stage = block.stage.value();
  e.micro_batch = block.micro_batch.value();
  return e;
}

observe::TraceEvent comm_event(const char* name, const at::Tensor& tensor, int64_t peer,
                               int64_t tag, const comm::Comm* group) {
  std::string members;
  if (group) {
    members = "[";
    for (Rank r : group->world_ranks()) members += (members.size() > 1 ? "," : "") + r.to_string();
    members += "]";
  }
  const int64_t bytes =
      tensor.defined() ? tensor.numel() * static_cast<int64_t>(tensor.element_size()) : 0;
  return observe::comm_event(name, peer, tag, bytes, std::move(members));
}

namespace {

// Every rank's serialized events, on rank 0 (empty elsewhere).
Result<std::vector<std::string>> gather_bytes(const std::string& mine, comm::Comm& world,
                                              const RunDevice& device) {
  const int64_t n = world.size();
  if (n == 1) return std::vector<std::string>{mine};
  const auto longs = device.options(at::kLong);
  at::Tensor sizes = at::empty({n}, longs);
  LOOM_TRY(world.all_gather_flat(sizes, at::full({1}, static_cast<int64_t>(mine.size()), longs)));
  sizes = sizes.cpu();
  const int64_t longest = std::max<int64_t>(1, sizes.max().item<int64_t>());
  at::Tensor padded = at::zeros({longest}, at::kByte);
  std::memcpy(padded.data_ptr<uint8_t>(), mine.data(), mine.size());
  at::Tensor all = at::empty({n * longest}, device.options(at::kByte));
  LOOM_TRY(world.all_gather_flat(all, padded.to(device.device)));
  if (world.rank().value() != 0) return std::vector<std::string>{};
  all = all.cpu();
  std::vector<std::string> out;
  for (int64_t r = 0; r < n; ++r)
    out.emplace_back(reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + r * longest,
                     static_cast<size_t>(sizes[r].item<int64_t>()));
  return out;
}

}  // namespace

Result<std::string> finish_step_trace(const observe::Tracer& tracer, comm::Comm& world,
                                      const RunDevice& device, int64_t step,
                                      const std::string& output_dir,
                                      const observe::EstimateFigures& estimate) {
  std::vector<std::string> bytes;
  try {
    LOOM_ASSIGN_OR_RETURN(bytes, gather_bytes(observe::serialize(tracer.events()), world, device));
  } catch (const c10::Error& e) {
    return Error::at("comm", e.what_without_backtrace());
  }
  if (bytes.empty()) return std::string();
  std::vector<std::vector<observe::TraceEvent>> ranks;
  for (const std::string& b : bytes) {
    LOOM_ASSIGN_OR_RETURN(auto events, observe::parse_events(b));
    ranks.push_back(std::move(events));
  }
  const observe::TraceSummary summary = observe::summarize(ranks);
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(output_dir, ec);
  const fs::path file = fs::path(output_dir) / ("trace_step_" + std::to_string(step) + ".json");
  if (Status s = write_file_atomically(file, observe::to_chrome_trace(step, ranks, summary));
      !s.ok())
    return Error::at("logging.trace_steps", "logging.trace_steps: " + s.error().message);
  return observe::summary_line(step, file.string(), summary, estimate);
}

}  // namespace loom::runtime
