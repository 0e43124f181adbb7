// A shared-memory segment that the members of a group on one host map (an anonymous memfd of the
// creating member, opened by the others through its /proc entry: nothing is left in /dev/shm by a
// process that dies), and the step flags they synchronise on inside it (one 32-bit counter per
// member, waited on with a futex, so a waiting member sleeps instead of spinning on a core its
// peers need). LibTorch-free: the collectives that use it live in shm_collectives.h.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/result.h"

namespace loom::comm {

class SharedSegment {
 public:
  enum class Wait { kDone, kTimedOut, kStopped, kPeerLost };

  // Creates and maps a segment of `data_bytes` after the flags of `members` members, reserving
  // its pages up front (posix_fallocate: a lack of memory fails here, not later with SIGBUS).
  // `token` is written into the header so that opening checks it.
  static Result<std::unique_ptr<SharedSegment>> create(int members, int64_t data_bytes,
                                                       uint64_t token);
  // Maps the segment another member created, by the name it published; fails when this process
  // cannot open it (the member runs on another host or in another PID namespace) or its header
  // is not the expected one.
  static Result<std::unique_ptr<SharedSegment>> open(const std::string& name, int members,
                                                     int64_t data_bytes, uint64_t token);
  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  const std::string& name() const { return name_; }
  // Closes the name (the creator's file descriptor): no member can open the segment any more,
  // and the memory stays until every member has unmapped it. Idempotent.
  void unlink();

  std::byte* data() const { return data_; }
  int64_t data_bytes() const { return data_bytes_; }

  // Records process `pid` as member `me`, so that the others see it die while they wait for it.
  void enter(int me, int pid);
  // Member `me` has reached `step` (steps only grow, modulo 2^32) and wakes whoever waits on it.
  void arrive(int me, uint32_t step);
  // Waits until every member other than `me` has reached `step`, `deadline` passes, `stop`
  // becomes true, or the process of the member waited for is gone (kPeerLost, lost_member() says
  // which; a dead process never arrives, so waiting out the deadline would only delay the
  // failure). Checked at least every 50 ms.
  Wait wait_all(int me, uint32_t step, std::chrono::steady_clock::time_point deadline,
                const std::atomic<bool>& stop) const;
  // After kPeerLost: the member whose process is gone, and its process id.
  int lost_member() const { return lost_member_; }
  int pid_of(int member) const;

 private:
  SharedSegment() = default;
  std::atomic<uint32_t>& flag(int member) const;
  std::atomic<int32_t>& pid_slot(int member) const;
  bool gone(int member) const;

  std::string name_;
  int fd_ = -1;  // the creator's, until unlink()
  int members_ = 0;
  void* base_ = nullptr;
  size_t mapped_ = 0;
  std::byte* data_ = nullptr;
  int64_t data_bytes_ = 0;
  mutable int lost_member_ = -1;
};

}  // namespace loom::comm
