// Collectives of a group whose members all run on one host, through a shared-memory segment
// instead of sockets (as NCCL and Open MPI do within a node). Each member copies its data into
// its own slot of the segment, the members reduce disjoint parts of every chunk, and each copies
// the results out: a few passes over memory per byte, where the loopback TCP path costs
// several copies through the kernel and its CPU time. Results are the same on every member and
// from run to run: each part is summed by one member, in a fixed order.
//
// The gloo backend runs all_reduce, all_gather, reduce_scatter and broadcast here when its group
// is on one host (comm.shared_memory, on by default); point-to-point, all-to-all and barriers
// stay on gloo.
// Operations run in order on one thread per group, each bounded by its deadline.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "comm/comm.h"

namespace loom::comm {

class RendezvousStore;

class ShmGroup {
 public:
  // Collective over the group's `size` members (through `store`, keys under `key`): member 0
  // creates a segment and the others map it. nullptr, with the reason in `why`, when some member
  // could not (it runs on another host or in another PID namespace, or memory ran short): every
  // member then decides the
  // same. Errors only for a store that failed.
  static Result<std::shared_ptr<ShmGroup>> connect(RendezvousStore& store, const std::string& key,
                                                   int rank, int size, std::string* why);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  // How messages name each member ("rank 3": its world rank), "group member m" by default.
  // Before the first operation.
  void set_member_names(std::vector<std::string> names);

  // Whether tensors of this dtype can be reduced here (floating point and integers).
  static bool reduces(at::ScalarType dtype);

  // Contiguous CPU tensors, as Comm's start_* hooks receive them.
  std::shared_ptr<PendingOp> all_reduce(const at::Tensor& tensor, ReduceOp op,
                                        Clock::time_point deadline);
  std::shared_ptr<PendingOp> all_gather(const at::Tensor& out_flat, const at::Tensor& in,
                                        Clock::time_point deadline);
  std::shared_ptr<PendingOp> reduce_scatter(const at::Tensor& out, const at::Tensor& in_flat,
                                            ReduceOp op, Clock::time_point deadline);
  std::shared_ptr<PendingOp> broadcast(const at::Tensor& tensor, int root,
                                       Clock::time_point deadline);

  struct Impl;

 private:
  explicit ShmGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::comm
