// What a run is made of besides its split, as values: the device, the precision, the
// communication backend, the optimizer and the batch. plan::PlanSpec::of reads them from the
// config once; everything below plan/ (and the runtime, through the plan) takes these values,
// so adding a backend, a precision or an optimizer means adding an enumerator and following the
// compiler's switch warnings, not finding string comparisons.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/result.h"

namespace loom {

enum class Device { kCpu, kCuda };                             // run.device
enum class Precision { kFp32, kBf16, kFp8 };                   // run.precision
enum class CommBackend { kAuto, kGloo, kMpi, kNccl, kLocal };  // comm.backend
enum class OptimizerKind { kAdamw, kSgd };                     // optimizer.type

// Whether activations and matrix work are bf16: bf16, and fp8 (whose linears take bf16 operands
// and quantize them to float8 for the product alone).
inline bool bf16_activations(Precision p) { return p == Precision::kBf16 || p == Precision::kFp8; }

// The config's spelling of each value ("cuda", "bf16", "nccl", "adamw").
std::string_view name(Device device);
std::string_view name(Precision precision);
std::string_view name(CommBackend backend);
std::string_view name(OptimizerKind optimizer);
// The value a config spelling names; the error lists the known spellings.
Result<Device> parse_device(std::string_view text);
Result<Precision> parse_precision(std::string_view text);
Result<CommBackend> parse_backend(std::string_view text);
Result<OptimizerKind> parse_optimizer(std::string_view text);

// batch.*: samples per optimizer step and per micro-batch of one data-parallel replica.
struct BatchSpec {
  int64_t global = 8;
  int64_t micro = 8;
  int64_t dp = 1;  // the data-parallel replicas the global batch is shared by

  // Micro-batches per optimizer step on each replica.
  int64_t micro_batches() const { return global / (micro * dp); }
  // "batch.global 8 / (batch.micro 2 x parallel.dp 2)": where micro_batches() comes from.
  std::string formula() const;
  bool operator==(const BatchSpec& o) const {
    return global == o.global && micro == o.micro && dp == o.dp;
  }
};

// What a communication backend does that the plan's estimates and the runtime's buffers depend
// on, decided once per backend.
struct CommTraits {
  // Sends are queued and posted with the block's receives as one group (NCCL), so a rank's
  // sends never wait on its peer's receive being posted first.
  bool defers_sends = false;
  // A reduce-scatter runs as an all-to-all into a buffer of the input's size and a local sum,
  // an all-gather as an all-to-all from a buffer of the output's size (gloo, local): either
  // holds a copy as large as its larger side.
  bool collectives_through_all_to_all = false;
  // A reduce-scatter may not write its result inside the buffer it reads (MPI): the summed
  // shard needs a buffer of its own.
  bool shard_out_of_place = false;

  static CommTraits of(CommBackend backend);  // backend resolved, not kAuto
};

// The backend comm.backend auto resolves to for a job of several processes that loomrun (or
// torchrun) started on `device`: nccl on GPUs, gloo on CPUs. (Under mpirun without loomrun's
// variables auto is mpi, and one process alone runs the local backend, whose traits are gloo's:
// comm/make_comm.h.) An explicit backend is itself.
CommBackend job_backend(CommBackend requested, Device device);

}  // namespace loom
