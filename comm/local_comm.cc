#include "comm/local_comm.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>

#include "comm/arrivals.h"
#include "comm/backend.h"

namespace loom::comm {
namespace {

// One collective call of a group: what each member brought. Contributions are snapshots
// (clones) taken when the member started the call, so members may return and reuse their
// tensors while others still read.
struct Slot {
  std::string op;
  int op_rank = -1;  // who named it first
  std::string mismatch;
  int arrived = 0;
  int released = 0;
  std::vector<std::vector<at::Tensor>> data;  // per member
};

struct Channel {
  uint64_t sent = 0;
  uint64_t tickets = 0;
  std::map<uint64_t, at::Tensor> messages;
};

struct LocalGroup {
  explicit LocalGroup(int n) : size(n) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, Slot> slots;                         // by collective number
  std::map<std::tuple<int, int, int>, Channel> channels;  // (src, dst, tag)
};

std::string elements(int64_t n) { return std::to_string(n) + (n == 1 ? " element" : " elements"); }

}  // namespace

struct LocalShared {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<LocalGroup>> groups;  // by uid
  std::shared_ptr<LocalArrivals> arrivals = std::make_shared<LocalArrivals>();

  std::shared_ptr<LocalGroup> group(const std::string& uid, int size) {
    std::lock_guard<std::mutex> lock(mu);
    auto& g = groups[uid];
    if (!g) g = std::make_shared<LocalGroup>(size);
    return g;
  }
};

namespace {

using Compute = std::function<Outcome(const std::vector<std::vector<at::Tensor>>& data)>;

// Waits until every member brought its contribution, then computes this member's outputs from
// the snapshots outside the lock.
class CollectiveOp : public PendingOp {
 public:
  CollectiveOp(std::shared_ptr<LocalGroup> group, uint64_t seq, Compute compute)
      : group_(std::move(group)), seq_(seq), compute_(std::move(compute)) {}
  ~CollectiveOp() override { release(); }

  Outcome wait_until(Clock::time_point deadline) override {
    std::vector<std::vector<at::Tensor>> data;
    {
      std::unique_lock<std::mutex> lock(group_->mu);
      Slot& slot = group_->slots[seq_];
      const bool ready = group_->cv.wait_until(
          lock, deadline, [&] { return slot.arrived == group_->size || !slot.mismatch.empty(); });
      if (!slot.mismatch.empty()) return Outcome::failed(slot.mismatch);
      if (!ready) return Outcome::timed_out();
      data = slot.data;
    }
    Outcome outcome;
    try {
      outcome = compute_(data);
    } catch (const std::exception& e) {
      outcome = Outcome::failed(exception_message(e));
    }
    release();
    return outcome;
  }

  bool test() override {
    std::lock_guard<std::mutex> lock(group_->mu);
    const Slot& slot = group_->slots[seq_];
    return slot.arrived == group_->size || !slot.mismatch.empty();
  }

 private:
  void release() {
    if (released_) return;
    released_ = true;
    std::lock_guard<std::mutex> lock(group_->mu);
    auto it = group_->slots.find(seq_);
    if (it != group_->slots.end() && ++it->second.released == group_->size) {
      group_->slots.erase(it);
    }
  }

  std::shared_ptr<LocalGroup> group_;
  uint64_t seq_;
  Compute compute_;
  bool released_ = false;
};

class RecvOp : public PendingOp {
 public:
  RecvOp(std::shared_ptr<LocalGroup> group, std::tuple<int, int, int> key, uint64_t ticket,
         at::Tensor out, std::string from)
      : group_(std::move(group)),
        key_(key),
        ticket_(ticket),
        out_(std::move(out)),
        from_(std::move(from)) {}

  Outcome wait_until(Clock::time_point deadline) override {
    at::Tensor message;
    {
      std::unique_lock<std::mutex> lock(group_->mu);
      Channel& ch = group_->channels[key_];
      if (!group_->cv.wait_until(lock, deadline, [&] { return ch.messages.count(ticket_) > 0; })) {
        return Outcome::timed_out();
      }
      auto it = ch.messages.find(ticket_);
      message = std::move(it->second);
      ch.messages.erase(it);
    }
    if (message.numel() != out_.numel() || message.scalar_type() != out_.scalar_type()) {
      return Outcome::failed(from_ + " sent " + elements(message.numel()) + " of " +
                             c10::toString(message.scalar_type()) + ", the receiving tensor has " +
                             elements(out_.numel()) + " of " + c10::toString(out_.scalar_type()));
    }
    out_.copy_(message.view(out_.sizes()));
    return Outcome::done();
  }

  bool test() override {
    std::lock_guard<std::mutex> lock(group_->mu);
    return group_->channels[key_].messages.count(ticket_) > 0;
  }

 private:
  std::shared_ptr<LocalGroup> group_;
  std::tuple<int, int, int> key_;
  uint64_t ticket_;
  at::Tensor out_;
  std::string from_;
};

class LocalComm : public Comm {
 public:
  LocalComm(GroupSpec spec, std::shared_ptr<LocalShared> shared)
      : Comm(std::move(spec)),
        shared_(std::move(shared)),
        group_(shared_->group(this->spec().uid, size())),
        me_(static_cast<int>(rank().value())) {}

  const char* backend_name() const override { return "local"; }

 protected:
  Started start_send(const at::Tensor& tensor, int dst, int tag) override {
    {
      std::lock_guard<std::mutex> lock(group_->mu);
      Channel& ch = group_->channels[{me_, dst, tag}];
      ch.messages[ch.sent++] = tensor.clone();
    }
    group_->cv.notify_all();
    return std::shared_ptr<PendingOp>(std::make_shared<FinishedOp>());
  }

  Started start_recv(const at::Tensor& tensor, int src, int tag) override {
    uint64_t ticket;
    {
      std::lock_guard<std::mutex> lock(group_->mu);
      ticket = group_->channels[{src, me_, tag}].tickets++;
    }
    return std::shared_ptr<PendingOp>(std::make_shared<RecvOp>(
        group_, std::make_tuple(src, me_, tag), ticket, tensor, world_rank(src)));
  }

  Started start_all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    return arrive("all_reduce", {tensor.clone()}, [tensor, op](const auto& data) {
      std::vector<at::Tensor> parts;
      for (const auto& d : data) parts.push_back(d[0]);
      reduce_into(tensor, parts, op);
      return Outcome::done();
    });
  }

  Started start_all_gather(const at::Tensor& out_flat, const at::Tensor& in) override {
    const int64_t n = in.numel();
    return arrive("all_gather", {in.clone()}, [this, out_flat, n](const auto& data) {
      for (size_t j = 0; j < data.size(); ++j) {
        const at::Tensor& piece = data[j][0];
        if (piece.numel() != n) {
          return Outcome::failed(world_rank(static_cast<int>(j)) + " brought " +
                                 elements(piece.numel()) + ", " + world_rank(me_) + " expected " +
                                 elements(n));
        }
        flat_view(out_flat).narrow(0, static_cast<int64_t>(j) * n, n).copy_(flat_view(piece));
      }
      return Outcome::done();
    });
  }

  Started start_reduce_scatter(const at::Tensor& out, const at::Tensor& in_flat,
                               ReduceOp op) override {
    const int64_t n = out.numel();
    return arrive("reduce_scatter", {in_flat.clone()}, [this, out, n, op](const auto& data) {
      std::vector<at::Tensor> parts;
      for (size_t j = 0; j < data.size(); ++j) {
        const at::Tensor& in = data[j][0];
        if (in.numel() != n * size()) {
          return Outcome::failed(world_rank(static_cast<int>(j)) + " brought " +
                                 elements(in.numel()) + ", " + world_rank(me_) + " expected " +
                                 elements(n * size()));
        }
        parts.push_back(flat_view(in).narrow(0, me_ * n, n));
      }
      reduce_into(out, parts, op);
      return Outcome::done();
    });
  }

  Started start_all_to_all(const std::vector<at::Tensor>& out,
                           const std::vector<at::Tensor>& in) override {
    std::vector<at::Tensor> snapshot;
    for (const at::Tensor& t : in) snapshot.push_back(t.clone());
    return arrive("all_to_all", std::move(snapshot), [this, out](const auto& data) {
      for (size_t j = 0; j < data.size(); ++j) {
        const at::Tensor& piece = data[j][me_];
        if (piece.numel() != out[j].numel()) {
          return Outcome::failed(world_rank(static_cast<int>(j)) + " sent " +
                                 elements(piece.numel()) + " to " + world_rank(me_) +
                                 ", which expected " + elements(out[j].numel()));
        }
        out[j].copy_(piece.view(out[j].sizes()));
      }
      return Outcome::done();
    });
  }

  Started start_broadcast(const at::Tensor& tensor, int root) override {
    std::vector<at::Tensor> mine;
    if (root == me_) mine.push_back(tensor.clone());
    const std::string name = "broadcast from " + std::to_string(root);
    return arrive(name, std::move(mine), [this, tensor, root](const auto& data) {
      if (root == me_) return Outcome::done();
      const at::Tensor& src = data[root][0];
      if (src.numel() != tensor.numel()) {
        return Outcome::failed(world_rank(root) + " broadcast " + elements(src.numel()) + ", " +
                               world_rank(me_) + " expected " + elements(tensor.numel()));
      }
      tensor.copy_(src.view(tensor.sizes()));
      return Outcome::done();
    });
  }

  Started start_barrier() override {
    return arrive("barrier", {}, [](const auto&) { return Outcome::done(); });
  }

  // Like the process backends, a collective over this group: every rank must arrive.
  Result<std::shared_ptr<Comm>> make_group(const std::vector<int>&, GroupSpec spec,
                                           Clock::time_point deadline) override {
    LOOM_ASSIGN_OR_RETURN(std::shared_ptr<PendingOp> all,
                          arrive("new_group", {}, [](const auto&) { return Outcome::done(); }));
    Outcome outcome = all->wait_until(deadline);
    if (outcome.kind == Outcome::Kind::kTimedOut) {
      return Error{"not every rank of the group arrived before the deadline", {}};
    }
    if (!outcome.ok()) return Error{outcome.detail, {}};
    if (!spec.rank.valid()) return std::shared_ptr<Comm>();
    return std::shared_ptr<Comm>(std::make_shared<LocalComm>(std::move(spec), shared_));
  }

 private:
  std::string world_rank(int member) const { return "rank " + world_ranks()[member].to_string(); }

  Started arrive(const std::string& op, std::vector<at::Tensor> contribution, Compute compute) {
    const uint64_t seq = collective_count();
    {
      std::lock_guard<std::mutex> lock(group_->mu);
      Slot& slot = group_->slots[seq];
      if (slot.data.empty()) slot.data.resize(size());
      if (slot.op.empty()) {
        slot.op = op;
        slot.op_rank = me_;
      } else if (slot.op != op && slot.mismatch.empty()) {
        slot.mismatch = world_rank(me_) + " called " + op + " as collective #" +
                        std::to_string(seq) + " while " + world_rank(slot.op_rank) + " called " +
                        slot.op;
      }
      slot.data[me_] = std::move(contribution);
      ++slot.arrived;
    }
    group_->cv.notify_all();
    return std::shared_ptr<PendingOp>(
        std::make_shared<CollectiveOp>(group_, seq, std::move(compute)));
  }

  std::shared_ptr<LocalShared> shared_;
  std::shared_ptr<LocalGroup> group_;
  int me_;
};

}  // namespace

LocalWorld::LocalWorld(int size, double timeout_s) : shared_(std::make_shared<LocalShared>()) {
  LOOM_CHECK(size >= 1) << "a local world needs at least one rank, got " << size;
  std::vector<Rank> ranks;
  for (int r = 0; r < size; ++r) ranks.emplace_back(r);
  for (int r = 0; r < size; ++r) {
    GroupSpec spec;
    spec.name = "world";
    spec.uid = "w";
    spec.world_ranks = ranks;
    spec.rank = Rank(r);
    spec.timeout_s = timeout_s;
    spec.arrivals = shared_->arrivals;
    comms_.push_back(std::make_shared<LocalComm>(std::move(spec), shared_));
  }
}

std::shared_ptr<Comm> LocalWorld::comm(Rank rank) const {
  LOOM_CHECK(rank.value() >= 0 && rank.value() < size()) << "rank " << rank << " of " << size();
  return comms_[rank.value()];
}

std::vector<Status> LocalWorld::run(const std::function<Status(Comm&)>& fn) const {
  std::vector<Status> out(comms_.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms_.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        out[r] = fn(*comms_[r]);
      } catch (const std::exception& e) {
        out[r] = Error{"rank " + std::to_string(r) + " threw: " + exception_message(e), {}};
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace loom::comm
