#include "comm/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <new>

#include "core/log.h"

namespace loom::comm {
namespace {

constexpr uint64_t kMagic = 0x6c6f6f6d73686d31;  // "loomshm1"
constexpr size_t kPage = 4096;
constexpr size_t kFlagBytes = 64;  // one cache line per member's flag: no false sharing

struct Header {
  uint64_t magic;
  uint64_t token;
  int64_t data_bytes;
  int64_t members;
};

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
size_t flags_offset() { return kPage; }
size_t data_offset(int members) {
  return round_up(flags_offset() + static_cast<size_t>(members) * kFlagBytes, kPage);
}

std::string errno_text(int err) { return std::strerror(err); }

// A process-shared futex (the segment is mapped by several processes).
long futex(void* addr, int op, uint32_t value, const timespec* timeout) {
  return syscall(SYS_futex, addr, op, value, timeout, nullptr, 0);
}

}  // namespace

std::atomic<uint32_t>& SharedSegment::flag(int member) const {
  return *reinterpret_cast<std::atomic<uint32_t>*>(static_cast<std::byte*>(base_) + flags_offset() +
                                                   member * kFlagBytes);
}

// A member's process id sits in its flag's cache line, after the flag.
std::atomic<int32_t>& SharedSegment::pid_slot(int member) const {
  return *reinterpret_cast<std::atomic<int32_t>*>(static_cast<std::byte*>(base_) + flags_offset() +
                                                  member * kFlagBytes + 8);
}

int SharedSegment::pid_of(int member) const {
  return pid_slot(member).load(std::memory_order_acquire);
}

void SharedSegment::enter(int me, int pid) { pid_slot(me).store(pid, std::memory_order_release); }

// Whether `member`'s process has ended or is ending: no such process, one that died and was
// not reaped yet (a zombie holds its pid but never runs again), or one in its exit (the kernel's
// PF_EXITING flag: a killed process of a few GB takes a second to tear down its memory).
bool SharedSegment::gone(int member) const {
  const int pid = pid_of(member);
  if (pid <= 0) return false;  // not entered: nothing to watch
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  // "pid (comm) S ppid pgrp session tty_nr tpgid flags ...": the state follows the last ')', as
  // the name may hold one; flags is the sixth field after it.
  const char* paren = std::strrchr(buf, ')');
  if (paren == nullptr || paren[1] != ' ') return false;
  const char state = paren[2];
  if (state == 'Z' || state == 'X') return true;
  unsigned long flags = 0;
  if (std::sscanf(paren + 3, "%*d %*d %*d %*d %*d %lu", &flags) != 1) return false;
  constexpr unsigned long kExiting = 0x4;  // PF_EXITING (linux/sched.h)
  return (flags & kExiting) != 0;
}

Result<std::unique_ptr<SharedSegment>> SharedSegment::create(int members, int64_t data_bytes,
                                                             uint64_t token) {
  std::unique_ptr<SharedSegment> s(new SharedSegment());
  s->members_ = members;
  s->data_bytes_ = data_bytes;
  s->mapped_ = data_offset(members) + static_cast<size_t>(data_bytes);
  // An anonymous file: it has no name anywhere a killed process could leave it behind, and its
  // memory goes when the last member unmaps it. The others open it through this process's
  // /proc entry.
  const int fd = memfd_create("loom-shm", MFD_CLOEXEC);
  if (fd < 0) return Error{"memfd_create: " + errno_text(errno), {}};
  s->fd_ = fd;
  s->name_ = "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(fd);
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(s->mapped_));
  if (err != 0) {
    log_warning("comm: could not reserve a " + std::to_string(s->mapped_ >> 20) +
                " MiB shared-memory segment (" + errno_text(err) +
                "): a group's collectives go through gloo's sockets instead (slower)");
    return Error{"posix_fallocate(" + s->name_ + "): " + errno_text(err), {}};
  }
  s->base_ = mmap(nullptr, s->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (s->base_ == MAP_FAILED) {
    s->base_ = nullptr;
    return Error{"mmap(" + s->name_ + "): " + errno_text(errno), {}};
  }
  for (int m = 0; m < members; ++m) {
    new (&s->flag(m)) std::atomic<uint32_t>(0);
    new (&s->pid_slot(m)) std::atomic<int32_t>(0);
  }
  s->data_ = static_cast<std::byte*>(s->base_) + data_offset(members);
  auto* header = static_cast<Header*>(s->base_);
  header->token = token;
  header->data_bytes = data_bytes;
  header->members = members;
  std::atomic_thread_fence(std::memory_order_release);
  header->magic = kMagic;
  return s;
}

Result<std::unique_ptr<SharedSegment>> SharedSegment::open(const std::string& name, int members,
                                                           int64_t data_bytes, uint64_t token) {
  std::unique_ptr<SharedSegment> s(new SharedSegment());
  s->name_ = name;
  s->members_ = members;
  s->data_bytes_ = data_bytes;
  s->mapped_ = data_offset(members) + static_cast<size_t>(data_bytes);
  const int fd = ::open(name.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Error{"open(" + name + "): " + errno_text(errno), {}};
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != s->mapped_) {
    close(fd);
    return Error{name + " is not a segment of the expected size", {}};
  }
  s->base_ = mmap(nullptr, s->mapped_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (s->base_ == MAP_FAILED) {
    s->base_ = nullptr;
    return Error{"mmap(" + name + "): " + errno_text(errno), {}};
  }
  const auto* header = static_cast<const Header*>(s->base_);
  if (header->magic != kMagic || header->token != token || header->data_bytes != data_bytes ||
      header->members != members)
    return Error{name + " belongs to another group", {}};
  s->data_ = static_cast<std::byte*>(s->base_) + data_offset(members);
  return s;
}

SharedSegment::~SharedSegment() {
  if (base_ != nullptr) munmap(base_, mapped_);
  unlink();
}

void SharedSegment::unlink() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void SharedSegment::arrive(int me, uint32_t step) {
  flag(me).store(step, std::memory_order_release);
  futex(&flag(me), FUTEX_WAKE, INT_MAX, nullptr);
}

SharedSegment::Wait SharedSegment::wait_all(int me, uint32_t step,
                                            std::chrono::steady_clock::time_point deadline,
                                            const std::atomic<bool>& stop) const {
  for (int m = 0; m < members_; ++m) {
    if (m == me) continue;
    std::atomic<uint32_t>& f = flag(m);
    for (int spins = 0;; ++spins) {
      const uint32_t seen = f.load(std::memory_order_acquire);
      if (static_cast<int32_t>(seen - step) >= 0) break;
      // A peer a few microseconds behind is worth a short spin; then sleep in the kernel until
      // it arrives (its arrive() wakes us) or the next check of the deadline.
      if (spins < 64) continue;
      if (stop.load(std::memory_order_relaxed)) return Wait::kStopped;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return Wait::kTimedOut;
      const auto slice = std::min<std::chrono::steady_clock::duration>(
          deadline - now, std::chrono::milliseconds(50));
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
      timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      futex(&f, FUTEX_WAIT, seen, &ts);
      if (gone(m)) {
        lost_member_ = m;
        return Wait::kPeerLost;
      }
    }
  }
  return Wait::kDone;
}

}  // namespace loom::comm
