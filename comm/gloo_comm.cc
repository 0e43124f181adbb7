#include "comm/gloo_comm.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "comm/backend.h"
#include "comm/shm_collectives.h"
#include "comm/store.h"

namespace loom::comm {
namespace {

std::chrono::milliseconds millis(double seconds) {
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(seconds * 1000)));
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
    default:
      return c10d::ReduceOp::SUM;
  }
}

// "[./gloo/transport/tcp/pair.cc:598] Connection closed by peer" -> "Connection closed by peer".
std::string without_source_location(const std::string& message) {
  if (message.empty() || message[0] != '[') return message;
  const size_t end = message.find("] ");
  return end == std::string::npos ? message : message.substr(end + 2);
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// The address of the interface this host would use to reach `master_addr` (no packet is sent:
// a UDP socket is only connected). Peers on other nodes reach this rank there; the hostname may
// resolve to another interface, or to none. Empty when there is no route.
std::string local_address_towards(const std::string& master_addr) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(master_addr.c_str(), "9", &hints, &found) != 0 || !found) return "";
  std::string out;
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    char text[INET_ADDRSTRLEN] = {0};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, text, sizeof text))
      out = text;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return out;
}

class GlooOp : public PendingOp {
 public:
  explicit GlooOp(c10::intrusive_ptr<c10d::Work> work) : work_(std::move(work)) {}
  ~GlooOp() override {
    // A call that never finished may still be written into by gloo: its work (which holds the
    // tensors) is abandoned rather than freed.
    if (!finished_ && !work_->isCompleted()) (void)work_.release();
  }

  Outcome wait_until(Clock::time_point deadline) override {
    auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      work_->wait(std::max(remaining, std::chrono::milliseconds(1)));
      finished_ = true;
      return Outcome::done();
    } catch (const std::exception& e) {
      finished_ = work_->isCompleted();
      // gloo reports its own deadline and a dead peer alike by throwing; the clock tells them
      // apart.
      if (Clock::now() + std::chrono::milliseconds(10) >= deadline) return Outcome::timed_out();
      return Outcome::failed("gloo: " + without_source_location(exception_message(e)));
    }
  }

  bool test() override { return work_->isCompleted(); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  bool finished_ = false;
};

// What every group of one gloo world shares.
struct GlooWorld {
  std::shared_ptr<RendezvousStore> store;
  std::shared_ptr<::gloo::transport::Device> device;
  bool shared_memory = true;  // comm.shared_memory
};

class GlooComm : public Comm {
 public:
  GlooComm(GroupSpec spec, std::shared_ptr<GlooWorld> world,
           c10::intrusive_ptr<c10d::ProcessGroupGloo> pg, std::shared_ptr<ShmGroup> shm)
      : Comm(std::move(spec)), world_(std::move(world)), pg_(std::move(pg)), shm_(std::move(shm)) {}

  ~GlooComm() override {
    // A process group with a call still in flight would block its destructor until gloo gives
    // up; after a failure it is abandoned instead.
    if (broken()) (void)pg_.release();
  }

  const char* backend_name() const override { return "gloo"; }

  // The group's process group and, where its members share this host, its shared memory.
  static Result<std::shared_ptr<Comm>> make(std::shared_ptr<GlooWorld> world, GroupSpec spec,
                                            double timeout_s) {
    LOOM_ASSIGN_OR_RETURN(auto pg, connect(*world, spec, timeout_s));
    std::shared_ptr<ShmGroup> shm;
    if (world->shared_memory && spec.world_ranks.size() > 1) {
      // A member on another host cannot map the segment: the group then stays on sockets.
      LOOM_ASSIGN_OR_RETURN(shm,
                            ShmGroup::connect(*world->store, "loom/shm/" + spec.uid,
                                              static_cast<int>(spec.rank.value()),
                                              static_cast<int>(spec.world_ranks.size()), nullptr));
      if (shm) {
        std::vector<std::string> names;
        for (const Rank& r : spec.world_ranks) names.push_back("rank " + r.to_string());
        shm->set_member_names(std::move(names));
      }
    }
    return std::shared_ptr<Comm>(
        std::make_shared<GlooComm>(std::move(spec), std::move(world), pg, std::move(shm)));
  }

  static Result<c10::intrusive_ptr<c10d::ProcessGroupGloo>> connect(const GlooWorld& world,
                                                                    const GroupSpec& spec,
                                                                    double timeout_s) {
    auto options = c10d::ProcessGroupGloo::Options::create(millis(timeout_s));
    options->devices.push_back(world.device);
    try {
      auto prefixed =
          c10::make_intrusive<c10d::PrefixStore>("loom/pg/" + spec.uid, world.store->c10d_store());
      return c10::make_intrusive<c10d::ProcessGroupGloo>(
          prefixed, static_cast<int>(spec.rank.value()), static_cast<int>(spec.world_ranks.size()),
          options);
    } catch (const std::exception& e) {
      return Error{"gloo could not connect the members of group " + spec.name + " within " +
                       format_seconds(timeout_s) + " s: " + exception_message(e),
                   {}};
    }
  }

 protected:
  template <class F>
  Started run(const char* op, F&& f) {
    try {
      return std::shared_ptr<PendingOp>(std::make_shared<GlooOp>(f()));
    } catch (const std::exception& e) {
      return Error{
          std::string("the gloo backend cannot run this ") + op + ": " + exception_message(e), {}};
    }
  }

  Started start_send(const at::Tensor& tensor, int dst, int tag) override {
    std::vector<at::Tensor> v{tensor};
    return run("send", [&] { return pg_->send(v, dst, tag); });
  }

  Started start_recv(const at::Tensor& tensor, int src, int tag) override {
    std::vector<at::Tensor> v{tensor};
    return run("recv", [&] { return pg_->recv(v, src, tag); });
  }

  Started start_all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    if (shm_ && ShmGroup::reduces(tensor.scalar_type()))
      return shm_->all_reduce(tensor, op, deadline());
    std::vector<at::Tensor> v{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    opts.timeout = millis(timeout_s());
    return run("all_reduce", [&] { return pg_->allreduce(v, opts); });
  }

  // As an all-to-all of the input sent to every member: gloo's own all-gather (measured with
  // LibTorch 1.13's gloo, not since) moved an 8 MiB segment between two processes 4-6x slower
  // than an all-to-all of the same bytes (ZeRO-1's parameter gather, bench/RESULTS.md). The copies
  // it sends take a buffer of the output's size, as gloo's all-gather took for its flat output.
  Started start_all_gather(const at::Tensor& out_flat, const at::Tensor& in) override {
    if (shm_) return shm_->all_gather(out_flat, in, deadline());
    at::Tensor send = flat_view(in).repeat({size()});
    std::vector<int64_t> counts;
    c10d::AllToAllOptions opts;
    opts.timeout = millis(timeout_s());
    at::Tensor out = flat_view(out_flat);
    return run("all_gather", [&] { return pg_->alltoall_base(out, send, counts, counts, opts); });
  }

  // gloo has no reduce-scatter: pieces travel by all-to-all and are reduced here, which moves
  // the same volume as a ring reduce-scatter.
  Started start_reduce_scatter(const at::Tensor& out, const at::Tensor& in_flat,
                               ReduceOp op) override {
    const int64_t n = out.numel();
    at::Tensor send = flat_view(in_flat);
    at::Tensor got = send.new_empty({send.numel()});
    std::vector<int64_t> counts;  // empty: equal splits
    c10d::AllToAllOptions opts;
    opts.timeout = millis(timeout_s());
    Started started =
        run("reduce_scatter", [&] { return pg_->alltoall_base(got, send, counts, counts, opts); });
    if (!started.ok()) return started;
    const int ranks = size();
    return std::shared_ptr<PendingOp>(
        std::make_shared<ThenOp>(std::move(started).value(), [out, got, n, op, ranks] {
          std::vector<at::Tensor> parts;
          for (int j = 0; j < ranks; ++j) parts.push_back(got.narrow(0, j * n, n));
          reduce_into(out, parts, op);
        }));
  }

  Started start_all_to_all(const std::vector<at::Tensor>& out,
                           const std::vector<at::Tensor>& in) override {
    std::vector<int64_t> in_counts, out_counts;
    int64_t in_total = 0, out_total = 0;
    for (const at::Tensor& t : in) in_counts.push_back(t.numel()), in_total += t.numel();
    for (const at::Tensor& t : out) out_counts.push_back(t.numel()), out_total += t.numel();
    at::Tensor send = in[0].new_empty({in_total});
    at::Tensor got = in[0].new_empty({out_total});
    int64_t offset = 0;
    for (const at::Tensor& t : in) {
      send.narrow(0, offset, t.numel()).copy_(flat_view(t));
      offset += t.numel();
    }
    c10d::AllToAllOptions opts;
    opts.timeout = millis(timeout_s());
    Started started = run(
        "all_to_all", [&] { return pg_->alltoall_base(got, send, out_counts, in_counts, opts); });
    if (!started.ok()) return started;
    return std::shared_ptr<PendingOp>(
        std::make_shared<ThenOp>(std::move(started).value(), [out, got] {
          int64_t offset = 0;
          for (const at::Tensor& t : out) {
            flat_view(t).copy_(got.narrow(0, offset, t.numel()));
            offset += t.numel();
          }
        }));
  }

  Started start_broadcast(const at::Tensor& tensor, int root) override {
    if (shm_) return shm_->broadcast(tensor, root, deadline());
    std::vector<at::Tensor> v{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.rootTensor = 0;
    opts.timeout = millis(timeout_s());
    return run("broadcast", [&] { return pg_->broadcast(v, opts); });
  }

  Started start_barrier() override {
    c10d::BarrierOptions opts;
    opts.timeout = millis(timeout_s());
    return run("barrier", [&] { return pg_->barrier(opts); });
  }

  Result<std::shared_ptr<Comm>> make_group(const std::vector<int>&, GroupSpec spec,
                                           Clock::time_point deadline) override {
    if (!spec.rank.valid()) return std::shared_ptr<Comm>();
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    return make(world_, std::move(spec), std::max(0.001, left));
  }

 private:
  Clock::time_point deadline() const { return deadline_after(Clock::now(), timeout_s()); }

  std::shared_ptr<GlooWorld> world_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::shared_ptr<ShmGroup> shm_;  // null: every call goes through gloo
};

}  // namespace

Result<std::shared_ptr<Comm>> make_gloo_comm(std::shared_ptr<RendezvousStore> store, int rank,
                                             int size, const std::string& master_addr,
                                             double timeout_s, bool shared_memory) {
  auto world = std::make_shared<GlooWorld>();
  world->store = std::move(store);
  world->shared_memory = shared_memory;
  try {
    const std::string local =
        is_loopback(master_addr) ? "127.0.0.1" : local_address_towards(master_addr);
    world->device = local.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                                  : c10d::ProcessGroupGloo::createDeviceForHostname(local);
  } catch (const std::exception& e) {
    return Error{"gloo could not open a network device: " + exception_message(e), {}};
  }
  GroupSpec spec;
  spec.name = "world";
  spec.uid = "w";
  for (int r = 0; r < size; ++r) spec.world_ranks.emplace_back(r);
  spec.rank = Rank(rank);
  spec.timeout_s = timeout_s;
  spec.arrivals = world->store->arrivals();
  return GlooComm::make(world, std::move(spec), timeout_s);
}

}  // namespace loom::comm
