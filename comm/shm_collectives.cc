#include "comm/shm_collectives.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "comm/shm_segment.h"
#include "comm/store.h"

namespace loom::comm {
namespace {

// The segment's data: two banks (consecutive chunks alternate, so a member may fill its slot for
// the next chunk while the others still read the last one) of one slot per member, within
// 16 MiB per group whatever its size. Slots of 1 MiB keep a chunk's working set in a core's L2:
// a 16 MiB all-reduce of two processes on these machines took 3.1-3.8 ms with 1 MiB slots,
// 4.1 with 512 KiB, 4.7-5.2 with 256 KiB and 6.5-6.9 with 4 or 16 MiB (gloo's sockets: 18 ms).
constexpr int64_t kSegmentBytes = int64_t{16} << 20;
constexpr int64_t kMaxSlotBytes = int64_t{1} << 20;
constexpr int64_t kMinSlotBytes = int64_t{64} << 10;

int64_t slot_bytes_for(int members) {
  const int64_t per = kSegmentBytes / (2 * members);
  return std::clamp<int64_t>(per, kMinSlotBytes, kMaxSlotBytes) / 64 * 64;
}

struct Job {
  std::function<Outcome()> run;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Outcome outcome;
};

class ShmOp : public PendingOp {
 public:
  explicit ShmOp(std::shared_ptr<Job> job) : job_(std::move(job)) {}
  Outcome wait_until(Clock::time_point deadline) override {
    std::unique_lock<std::mutex> lock(job_->mu);
    if (!job_->cv.wait_until(lock, deadline, [&] { return job_->done; }))
      return Outcome::timed_out();
    return job_->outcome;
  }
  bool test() override {
    std::lock_guard<std::mutex> lock(job_->mu);
    return job_->done;
  }

 private:
  std::shared_ptr<Job> job_;
};

// Element [begin, end) of the n elements of a chunk that member `m` of `k` reduces.
std::pair<int64_t, int64_t> part_of(int64_t n, int m, int k) {
  return {n * m / k, n * (m + 1) / k};
}

at::Tensor view_of(std::byte* p, int64_t elements, at::ScalarType dtype) {
  return at::from_blob(p, {elements}, at::TensorOptions().dtype(dtype).device(at::kCPU));
}

}  // namespace

struct ShmGroup::Impl {
  std::unique_ptr<SharedSegment> segment;
  int rank = 0, size = 0;
  int64_t slot_bytes = 0;
  std::vector<std::string> member_names;  // how messages name each member (set_member_names)

  // The worker's: the last step reached, the chunks run so far (the bank is chunk % 2), and
  // the failure that ended the group.
  uint32_t step = 0;
  uint64_t chunks = 0;
  std::optional<Outcome> broken;

  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Job>> queue;
  std::thread worker;

  std::byte* slot(int member) const {
    return segment->data() + ((chunks % 2) * size + member) * slot_bytes;
  }

  // Every member reached the next step; else the outcome that fails the call.
  std::optional<Outcome> sync(Clock::time_point deadline) {
    ++step;
    segment->arrive(rank, step);
    switch (segment->wait_all(rank, step, deadline, stop)) {
      case SharedSegment::Wait::kDone:
        return std::nullopt;
      case SharedSegment::Wait::kTimedOut:
        return Outcome::timed_out();
      case SharedSegment::Wait::kPeerLost: {
        const int m = segment->lost_member();
        const std::string who = m >= 0 && static_cast<size_t>(m) < member_names.size()
                                    ? member_names[static_cast<size_t>(m)]
                                    : "group member " + std::to_string(m);
        return Outcome::lost("shared memory: " + who + " (pid " +
                             std::to_string(segment->pid_of(m)) +
                             ") died while this rank waited for it");
      }
      default:
        return Outcome::failed("shared memory: the group was closed");
    }
  }

  void run_jobs() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop.load() || !queue.empty(); });
        if (queue.empty()) return;
        job = std::move(queue.front());
        queue.pop_front();
      }
      Outcome outcome = broken ? *broken : Outcome::done();
      if (!broken) {
        try {
          outcome = job->run();
        } catch (const std::exception& e) {
          outcome = Outcome::failed(std::string("shared memory: ") + exception_message(e));
        }
        // A member that gave up is at another step than its peers: nothing after it can run.
        if (!outcome.ok())
          broken = Outcome::failed("shared memory: an earlier call on this group did not finish");
      }
      std::lock_guard<std::mutex> lock(job->mu);
      job->outcome = std::move(outcome);
      job->done = true;
      job->cv.notify_all();
    }
  }

  std::shared_ptr<PendingOp> submit(std::function<Outcome()> run) {
    auto job = std::make_shared<Job>();
    job->run = std::move(run);
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(job);
    }
    cv.notify_one();
    return std::make_shared<ShmOp>(std::move(job));
  }

  // In place: each chunk is copied into this member's slot; each member reduces its part of the
  // chunk over all slots into its own slot; then everyone copies the others' parts out.
  Outcome all_reduce(const at::Tensor& t, ReduceOp op, Clock::time_point deadline) {
    const int64_t e = static_cast<int64_t>(t.element_size());
    const int64_t per_chunk = slot_bytes / e, n = t.numel();
    auto* base = static_cast<std::byte*>(t.data_ptr());
    for (int64_t at = 0; at < n; at += per_chunk, ++chunks) {
      const int64_t len = std::min(per_chunk, n - at);
      std::memcpy(slot(rank), base + at * e, static_cast<size_t>(len * e));
      if (auto failed = sync(deadline)) return *failed;
      const auto [b, end] = part_of(len, rank, size);
      if (end > b) {
        // Part `rank` is always reduced here, starting from this member's own slot: the same
        // order on every run.
        std::vector<at::Tensor> parts{view_of(slot(rank) + b * e, end - b, t.scalar_type())};
        for (int m = 0; m < size; ++m)
          if (m != rank) parts.push_back(view_of(slot(m) + b * e, end - b, t.scalar_type()));
        reduce_into(parts[0], parts, op);
      }
      if (auto failed = sync(deadline)) return *failed;
      for (int m = 0; m < size; ++m) {
        const auto [mb, me] = part_of(len, m, size);
        std::memcpy(base + (at + mb) * e, slot(m) + mb * e, static_cast<size_t>((me - mb) * e));
      }
    }
    return Outcome::done();
  }

  // Piece j of out_flat is member j's `in`: each chunk of `in` goes into this member's slot, and
  // every slot is copied out.
  Outcome all_gather(const at::Tensor& out_flat, const at::Tensor& in, Clock::time_point deadline) {
    const int64_t e = static_cast<int64_t>(in.element_size());
    const int64_t per_chunk = slot_bytes / e, n = in.numel();
    const auto* src = static_cast<const std::byte*>(in.data_ptr());
    auto* out = static_cast<std::byte*>(out_flat.data_ptr());
    for (int64_t at = 0; at < n; at += per_chunk, ++chunks) {
      const int64_t len = std::min(per_chunk, n - at);
      std::memcpy(slot(rank), src + at * e, static_cast<size_t>(len * e));
      if (auto failed = sync(deadline)) return *failed;
      for (int m = 0; m < size; ++m)
        std::memcpy(out + (m * n + at) * e, slot(m), static_cast<size_t>(len * e));
    }
    return Outcome::done();
  }

  // out = the reduction of every member's piece `rank` of in_flat: each chunk of the pieces goes
  // into this member's slot (piece j in the slot's j-th share), and each member reduces its own
  // share over all slots.
  Outcome reduce_scatter(const at::Tensor& out, const at::Tensor& in_flat, ReduceOp op,
                         Clock::time_point deadline) {
    const int64_t e = static_cast<int64_t>(out.element_size());
    const int64_t share = slot_bytes / e / size, n = out.numel();
    const auto* src = static_cast<const std::byte*>(in_flat.data_ptr());
    auto* dst = static_cast<std::byte*>(out.data_ptr());
    for (int64_t at = 0; at < n; at += share, ++chunks) {
      const int64_t len = std::min(share, n - at);
      for (int j = 0; j < size; ++j)
        std::memcpy(slot(rank) + j * share * e, src + (j * n + at) * e,
                    static_cast<size_t>(len * e));
      if (auto failed = sync(deadline)) return *failed;
      std::vector<at::Tensor> parts;
      for (int m = 0; m < size; ++m)
        parts.push_back(view_of(slot(m) + rank * share * e, len, out.scalar_type()));
      reduce_into(view_of(dst + at * e, len, out.scalar_type()), parts, op);
    }
    return Outcome::done();
  }

  Outcome broadcast(const at::Tensor& t, int root, Clock::time_point deadline) {
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    auto* base = static_cast<std::byte*>(t.data_ptr());
    for (int64_t at = 0; at < bytes; at += slot_bytes, ++chunks) {
      const int64_t len = std::min(slot_bytes, bytes - at);
      if (rank == root) std::memcpy(slot(root), base + at, static_cast<size_t>(len));
      if (auto failed = sync(deadline)) return *failed;
      if (rank != root) std::memcpy(base + at, slot(root), static_cast<size_t>(len));
    }
    return Outcome::done();
  }
};

ShmGroup::ShmGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->worker = std::thread([impl = impl_.get()] { impl->run_jobs(); });
}

ShmGroup::~ShmGroup() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->worker.join();
  // Calls never run fail rather than hang their waiters.
  for (auto& job : impl_->queue) {
    std::lock_guard<std::mutex> lock(job->mu);
    job->outcome = Outcome::failed("shared memory: the group was closed");
    job->done = true;
    job->cv.notify_all();
  }
}

bool ShmGroup::reduces(at::ScalarType dtype) {
  return at::isFloatingType(dtype) || at::isIntegralType(dtype, /*includeBool=*/false);
}

Result<std::shared_ptr<ShmGroup>> ShmGroup::connect(RendezvousStore& store, const std::string& key,
                                                    int rank, int size, std::string* why) {
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->size = size;
  impl->slot_bytes = slot_bytes_for(size);
  const int64_t data_bytes = 2 * size * impl->slot_bytes;
  // Member 0 creates the segment and publishes its name and token ("!" and the reason when it
  // could not); each member says whether it mapped it; all read the same answers.
  std::string mine = "1";
  if (rank == 0) {
    std::random_device rd;
    const uint64_t token = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    auto created = SharedSegment::create(size, data_bytes, token);
    if (created.ok()) {
      impl->segment = std::move(created).value();
      impl->segment->enter(rank, getpid());
    }
    LOOM_TRY(store.set(key + "/name", created.ok()
                                          ? impl->segment->name() + " " + std::to_string(token)
                                          : "! " + created.error().message));
    if (!created.ok()) mine = "0 " + created.error().message;
  } else {
    LOOM_ASSIGN_OR_RETURN(std::string named, store.get(key + "/name"));
    const size_t space = named.find(' ');
    if (named.rfind("! ", 0) == 0 || space == std::string::npos) {
      mine = "0 member 0 could not create a segment";
    } else {
      auto opened = SharedSegment::open(named.substr(0, space), size, data_bytes,
                                        std::stoull(named.substr(space + 1)));
      if (opened.ok()) {
        impl->segment = std::move(opened).value();
        impl->segment->enter(rank, getpid());
      } else {
        mine = "0 " + opened.error().message;
      }
    }
  }
  LOOM_TRY(store.set(key + "/mapped/" + std::to_string(rank), mine));
  std::string refusal;
  for (int m = 0; m < size; ++m) {
    LOOM_ASSIGN_OR_RETURN(std::string said, store.get(key + "/mapped/" + std::to_string(m)));
    if (said != "1" && refusal.empty())
      refusal = "member " + std::to_string(m) + ": " + said.substr(2);
  }
  // Everyone that will ever map it has: member 0 closes the name, and the memory goes with the
  // last mapping.
  if (impl->segment) impl->segment->unlink();
  if (!refusal.empty()) {
    if (why != nullptr) *why = refusal;
    return std::shared_ptr<ShmGroup>();
  }
  return std::shared_ptr<ShmGroup>(new ShmGroup(std::move(impl)));
}

std::shared_ptr<PendingOp> ShmGroup::all_reduce(const at::Tensor& tensor, ReduceOp op,
                                                Clock::time_point deadline) {
  return impl_->submit([impl = impl_.get(), tensor, op, deadline] {
    return impl->all_reduce(tensor, op, deadline);
  });
}

std::shared_ptr<PendingOp> ShmGroup::all_gather(const at::Tensor& out_flat, const at::Tensor& in,
                                                Clock::time_point deadline) {
  return impl_->submit([impl = impl_.get(), out_flat, in, deadline] {
    return impl->all_gather(out_flat, in, deadline);
  });
}

std::shared_ptr<PendingOp> ShmGroup::reduce_scatter(const at::Tensor& out,
                                                    const at::Tensor& in_flat, ReduceOp op,
                                                    Clock::time_point deadline) {
  return impl_->submit([impl = impl_.get(), out, in_flat, op, deadline] {
    return impl->reduce_scatter(out, in_flat, op, deadline);
  });
}

std::shared_ptr<PendingOp> ShmGroup::broadcast(const at::Tensor& tensor, int root,
                                               Clock::time_point deadline) {
  return impl_->submit([impl = impl_.get(), tensor, root, deadline] {
    return impl->broadcast(tensor, root, deadline);
  });
}

void ShmGroup::set_member_names(std::vector<std::string> names) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->member_names = std::move(names);
}

}  // namespace loom::comm
