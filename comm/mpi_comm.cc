#include "comm/mpi_comm.h"

#include <arpa/inet.h>
#include <c10/util/BFloat16.h>
#include <mpi.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/arrivals.h"
#include "comm/backend.h"
#include "comm/store.h"
#include "core/secret.h"

namespace loom::comm {
namespace {

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, len);
}

// MPI is one library per process: one runtime object, shared by every group, serialises calls
// (the library may not give MPI_THREAD_MULTIPLE) and finalises MPI when the last group is gone,
// unless a call is still in flight after a failure.
class MpiRuntime {
 public:
  // The runtime of this process: a second make_comm(mpi) shares the first one's, so that MPI is
  // finalised once, after both.
  static Result<std::shared_ptr<MpiRuntime>> start() {
    static std::mutex mu;
    static std::weak_ptr<MpiRuntime> current;
    std::lock_guard<std::mutex> lock(mu);
    if (auto rt = current.lock()) return rt;
    LOOM_ASSIGN_OR_RETURN(auto rt, init());
    current = rt;
    return rt;
  }

 private:
  static Result<std::shared_ptr<MpiRuntime>> init() {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) return Error{"MPI was already finalized in this process", {}};
    auto rt = std::shared_ptr<MpiRuntime>(new MpiRuntime());
    if (!initialized) {
      int provided = 0;
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      if (rc != MPI_SUCCESS) return Error{"MPI_Init_thread failed: " + mpi_error(rc), {}};
      rt->owns_ = true;
    }
    return rt;
  }

 public:
  ~MpiRuntime() {
    if (owns_ && !abandoned_) MPI_Finalize();
  }

  std::mutex& mu() { return mu_; }
  // A call timed out and its buffers must stay valid: never finalise (MPI would wait for it).
  void abandon() { abandoned_ = true; }

 private:
  MpiRuntime() = default;
  std::mutex mu_;
  bool owns_ = false;
  std::atomic<bool> abandoned_{false};
};

struct MpiType {
  MPI_Datatype type = MPI_BYTE;
  bool reducible = false;
  bool bf16 = false;  // reduced by loom's own MPI operations (MPI has no bfloat16 type)
};

MpiType mpi_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return {MPI_FLOAT, true};
    case at::kDouble:
      return {MPI_DOUBLE, true};
    case at::kInt:
      return {MPI_INT32_T, true};
    case at::kLong:
      return {MPI_INT64_T, true};
    case at::kShort:
      return {MPI_INT16_T, true};
    case at::kChar:
      return {MPI_INT8_T, true};
    case at::kByte:
      return {MPI_UINT8_T, true};
    case at::kBFloat16:
      return {MPI_UINT16_T, true, true};
    default:
      return {MPI_BYTE, false};
  }
}

// bfloat16 travels as itself (two bytes a value, as on gloo and nccl) and is reduced by these
// user-defined operations: each pair of values is combined in float32 and rounded back to
// bfloat16, as a bf16 add does.
template <class F>
void bf16_combine(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const c10::BFloat16*>(in);
  auto* b = static_cast<c10::BFloat16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = c10::BFloat16(F{}(float(a[i]), float(b[i])));
}
struct Sum {
  float operator()(float a, float b) const { return a + b; }
};
struct Max {
  float operator()(float a, float b) const { return std::max(a, b); }
};
struct Min {
  float operator()(float a, float b) const { return std::min(a, b); }
};

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
    default:
      return MPI_SUM;
  }
}

// The bfloat16 operation for `op`, made once per process (after MPI_Init; never freed: MPI
// frees user operations at MPI_Finalize).
MPI_Op bf16_op(ReduceOp op) {
  static const std::array<MPI_Op, 3> ops = [] {
    std::array<MPI_Op, 3> made{};
    MPI_Op_create(&bf16_combine<Sum>, 1, &made[0]);
    MPI_Op_create(&bf16_combine<Max>, 1, &made[1]);
    MPI_Op_create(&bf16_combine<Min>, 1, &made[2]);
    return made;
  }();
  switch (op) {
    case ReduceOp::kMax:
      return ops[1];
    case ReduceOp::kMin:
      return ops[2];
    default:
      return ops[0];
  }
}

Result<int> as_int(int64_t n, const char* what) {
  if (n > INT_MAX) {
    return Error{std::string("the mpi backend cannot move ") + what + " of " + std::to_string(n) +
                     " (MPI counts are int); split the tensor",
                 {}};
  }
  return static_cast<int>(n);
}

MPI_Op reduce_op(const MpiType& type, ReduceOp op) { return type.bf16 ? bf16_op(op) : mpi_op(op); }

// Requests polled with MPI_Testall until done or the deadline. Keeps the tensors alive: MPI
// writes into them until the requests complete.
class MpiOp : public PendingOp {
 public:
  MpiOp(std::shared_ptr<MpiRuntime> rt, std::vector<at::Tensor> keep)
      : rt_(std::move(rt)), keep_(std::move(keep)) {}

  ~MpiOp() override {
    if (!finished_ && !requests_.empty()) {
      int done = 0;
      std::lock_guard<std::mutex> lock(rt_->mu());
      MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
      finished_ = done != 0;
    }
    if (!finished_) {
      // Never completed (timed out): the request may still write into keep_, so both leak.
      rt_->abandon();
      new std::vector<at::Tensor>(std::move(keep_));
    }
  }

  std::vector<MPI_Request>& requests() { return requests_; }
  // For a receive: the byte count it must have got.
  void expect_bytes(int bytes, std::string from) {
    expect_bytes_ = bytes;
    from_ = std::move(from);
  }

  Outcome wait_until(Clock::time_point deadline) override {
    // MPI progresses only inside MPI calls: poll hot for a moment (small calls finish there),
    // then back off so that a long wait leaves the cores to the work.
    const Clock::time_point hot_until = Clock::now() + std::chrono::milliseconds(2);
    auto pause = std::chrono::microseconds(50);
    while (true) {
      int done = 0;
      std::vector<MPI_Status> statuses(requests_.size());
      int rc;
      {
        std::lock_guard<std::mutex> lock(rt_->mu());
        rc = MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done,
                         statuses.data());
      }
      if (rc != MPI_SUCCESS) {
        finished_ = true;  // MPI gave up on the requests
        return Outcome::failed("mpi: " + mpi_error(rc));
      }
      if (done) {
        finished_ = true;
        if (expect_bytes_ >= 0) {
          int got = 0;
          MPI_Get_count(&statuses[0], MPI_BYTE, &got);
          if (got != expect_bytes_) {
            return Outcome::failed(from_ + " sent " + std::to_string(got) +
                                   " bytes, the receiving tensor has " +
                                   std::to_string(expect_bytes_));
          }
        }
        return Outcome::done();
      }
      const Clock::time_point now = Clock::now();
      if (now >= deadline) return Outcome::timed_out();
      if (now < hot_until) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(500));
      }
    }
  }

  bool test() override {
    if (finished_) return true;
    std::lock_guard<std::mutex> lock(rt_->mu());
    // MPI_Testall would release the requests: only peek with MPI_Request_get_status.
    for (MPI_Request& r : requests_) {
      int flag = 0;
      MPI_Request_get_status(r, &flag, MPI_STATUS_IGNORE);
      if (!flag) return false;
    }
    return true;
  }

 private:
  std::shared_ptr<MpiRuntime> rt_;
  std::vector<at::Tensor> keep_;
  std::vector<MPI_Request> requests_;
  bool finished_ = false;
  int expect_bytes_ = -1;
  std::string from_;
};

class MpiComm : public Comm {
 public:
  MpiComm(GroupSpec spec, std::shared_ptr<MpiRuntime> rt, MPI_Comm collectives, MPI_Comm p2p)
      : Comm(std::move(spec)), rt_(std::move(rt)), coll_(collectives), p2p_(p2p) {}

  ~MpiComm() override {
    if (broken()) return;  // calls may be in flight on these communicators
    std::lock_guard<std::mutex> lock(rt_->mu());
    MPI_Comm_free(&coll_);
    MPI_Comm_free(&p2p_);
  }

  const char* backend_name() const override { return "mpi"; }

  // Two duplicates of `base`: collectives and point-to-point never match each other's messages.
  static Result<std::pair<MPI_Comm, MPI_Comm>> duplicate(MPI_Comm base) {
    MPI_Comm coll = MPI_COMM_NULL, p2p = MPI_COMM_NULL;
    int rc = MPI_Comm_dup(base, &coll);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(base, &p2p);
    if (rc != MPI_SUCCESS) return Error{"MPI_Comm_dup failed: " + mpi_error(rc), {}};
    MPI_Comm_set_errhandler(coll, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(p2p, MPI_ERRORS_RETURN);
    return std::make_pair(coll, p2p);
  }

 protected:
  using Post = std::function<int(MpiOp&)>;

  Started post(const char* what, std::vector<at::Tensor> keep, const Post& f) {
    auto op = std::make_shared<MpiOp>(rt_, std::move(keep));
    int rc;
    {
      std::lock_guard<std::mutex> lock(rt_->mu());
      rc = f(*op);
    }
    if (rc != MPI_SUCCESS) {
      return Error{std::string("the mpi backend could not start ") + what + ": " + mpi_error(rc),
                   {}};
    }
    return std::shared_ptr<PendingOp>(op);
  }

  Result<MpiType> reducible(const at::Tensor& t, const char* what) {
    MpiType type = mpi_type(t.scalar_type());
    if (!type.reducible) {
      return Error{std::string("the mpi backend cannot ") + what + " " +
                       c10::toString(t.scalar_type()) + " tensors",
                   {}};
    }
    return type;
  }

  Started start_send(const at::Tensor& tensor, int dst, int tag) override {
    LOOM_TRY(check_tag(tag));
    LOOM_ASSIGN_OR_RETURN(int bytes, as_int(tensor.nbytes(), "a message"));
    return post("send", {tensor}, [&](MpiOp& op) {
      op.requests().resize(1);
      return MPI_Isend(tensor.data_ptr(), bytes, MPI_BYTE, dst, tag, p2p_, &op.requests()[0]);
    });
  }

  Started start_recv(const at::Tensor& tensor, int src, int tag) override {
    LOOM_TRY(check_tag(tag));
    LOOM_ASSIGN_OR_RETURN(int bytes, as_int(tensor.nbytes(), "a message"));
    return post("recv", {tensor}, [&](MpiOp& op) {
      op.requests().resize(1);
      op.expect_bytes(bytes, "rank " + world_ranks()[src].to_string());
      return MPI_Irecv(tensor.data_ptr(), bytes, MPI_BYTE, src, tag, p2p_, &op.requests()[0]);
    });
  }

  Started start_all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    LOOM_ASSIGN_OR_RETURN(MpiType type, reducible(tensor, "all_reduce"));
    LOOM_ASSIGN_OR_RETURN(int count, as_int(tensor.numel(), "a tensor"));
    return post("all_reduce", {tensor}, [&](MpiOp& o) {
      o.requests().resize(1);
      return MPI_Iallreduce(MPI_IN_PLACE, tensor.data_ptr(), count, type.type, reduce_op(type, op),
                            coll_, &o.requests()[0]);
    });
  }

  Started start_all_gather(const at::Tensor& out_flat, const at::Tensor& in) override {
    LOOM_ASSIGN_OR_RETURN(int bytes, as_int(in.nbytes(), "a piece"));
    return post("all_gather", {out_flat, in}, [&](MpiOp& o) {
      o.requests().resize(1);
      return MPI_Iallgather(in.data_ptr(), bytes, MPI_BYTE, out_flat.data_ptr(), bytes, MPI_BYTE,
                            coll_, &o.requests()[0]);
    });
  }

  Started start_reduce_scatter(const at::Tensor& out, const at::Tensor& in_flat,
                               ReduceOp op) override {
    LOOM_ASSIGN_OR_RETURN(MpiType type, reducible(out, "reduce_scatter"));
    LOOM_ASSIGN_OR_RETURN(int count, as_int(out.numel(), "a piece"));
    return post("reduce_scatter", {out, in_flat}, [&](MpiOp& o) {
      o.requests().resize(1);
      return MPI_Ireduce_scatter_block(in_flat.data_ptr(), out.data_ptr(), count, type.type,
                                       reduce_op(type, op), coll_, &o.requests()[0]);
    });
  }

  Started start_all_to_all(const std::vector<at::Tensor>& out,
                           const std::vector<at::Tensor>& in) override {
    auto counts = std::make_shared<std::vector<int>>(4 * size());  // send, sdispl, recv, rdispl
    int64_t sent = 0, got = 0;
    for (int j = 0; j < size(); ++j) {
      LOOM_ASSIGN_OR_RETURN((*counts)[j], as_int(in[j].nbytes(), "a piece"));
      LOOM_ASSIGN_OR_RETURN((*counts)[size() + j], as_int(sent, "all_to_all data"));
      LOOM_ASSIGN_OR_RETURN((*counts)[2 * size() + j], as_int(out[j].nbytes(), "a piece"));
      LOOM_ASSIGN_OR_RETURN((*counts)[3 * size() + j], as_int(got, "all_to_all data"));
      sent += in[j].nbytes();
      got += out[j].nbytes();
    }
    // Byte buffers: MPI needs one send and one receive buffer.
    at::Tensor send = in[0].new_empty({sent}, at::kByte);
    at::Tensor recv = in[0].new_empty({got}, at::kByte);
    for (int j = 0; j < size(); ++j) {
      if (in[j].nbytes() == 0) continue;
      std::memcpy(static_cast<char*>(send.data_ptr()) + (*counts)[size() + j], in[j].data_ptr(),
                  in[j].nbytes());
    }
    const int n = size();
    Started started = post("all_to_all", {send, recv}, [&](MpiOp& o) {
      o.requests().resize(1);
      return MPI_Ialltoallv(send.data_ptr(), counts->data(), counts->data() + n, MPI_BYTE,
                            recv.data_ptr(), counts->data() + 2 * n, counts->data() + 3 * n,
                            MPI_BYTE, coll_, &o.requests()[0]);
    });
    if (!started.ok()) return started;
    // Non-blocking MPI may read the count arrays until completion: they live in the callback.
    return std::shared_ptr<PendingOp>(
        std::make_shared<ThenOp>(std::move(started).value(), [out, recv, counts, n] {
          for (int j = 0; j < n; ++j) {
            if (out[j].nbytes() == 0) continue;
            std::memcpy(out[j].data_ptr(),
                        static_cast<const char*>(recv.data_ptr()) + (*counts)[3 * n + j],
                        out[j].nbytes());
          }
        }));
  }

  Started start_broadcast(const at::Tensor& tensor, int root) override {
    LOOM_ASSIGN_OR_RETURN(int bytes, as_int(tensor.nbytes(), "a tensor"));
    return post("broadcast", {tensor}, [&](MpiOp& o) {
      o.requests().resize(1);
      return MPI_Ibcast(tensor.data_ptr(), bytes, MPI_BYTE, root, coll_, &o.requests()[0]);
    });
  }

  Started start_barrier() override {
    return post("barrier", {}, [&](MpiOp& o) {
      o.requests().resize(1);
      return MPI_Ibarrier(coll_, &o.requests()[0]);
    });
  }

  // A barrier over this group bounded by the deadline, then MPI_Comm_split, which cannot hang
  // once everyone is known to have arrived.
  Result<std::shared_ptr<Comm>> make_group(const std::vector<int>& members, GroupSpec spec,
                                           Clock::time_point deadline) override {
    LOOM_ASSIGN_OR_RETURN(std::shared_ptr<PendingOp> arrived, start_barrier());
    Outcome outcome = arrived->wait_until(deadline);
    if (outcome.kind == Outcome::Kind::kTimedOut) {
      return Error{"not every rank of the group arrived before the deadline", {}};
    }
    if (!outcome.ok()) return Error{outcome.detail, {}};
    const int me = static_cast<int>(rank().value());
    int color = MPI_UNDEFINED, key = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i] == me) color = 0, key = static_cast<int>(i);
    }
    MPI_Comm sub = MPI_COMM_NULL;
    int rc;
    {
      std::lock_guard<std::mutex> lock(rt_->mu());
      rc = MPI_Comm_split(coll_, color, key, &sub);
    }
    if (rc != MPI_SUCCESS) return Error{"MPI_Comm_split failed: " + mpi_error(rc), {}};
    if (!spec.rank.valid()) return std::shared_ptr<Comm>();
    Result<std::pair<MPI_Comm, MPI_Comm>> dup = [&] {
      std::lock_guard<std::mutex> lock(rt_->mu());
      auto d = duplicate(sub);
      MPI_Comm_free(&sub);
      return d;
    }();
    if (!dup.ok()) return dup.error();
    return std::shared_ptr<Comm>(
        std::make_shared<MpiComm>(std::move(spec), rt_, dup->first, dup->second));
  }

 private:
  Status check_tag(int tag) const {
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    if (flag && ub != nullptr && tag > *ub) {
      return Error{
          "tag " + std::to_string(tag) + " is above this MPI's limit of " + std::to_string(*ub),
          {}};
    }
    return Status::success();
  }

  std::shared_ptr<MpiRuntime> rt_;
  MPI_Comm coll_;
  MPI_Comm p2p_;
};

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof addr;
  int port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

// The arrival board: a rendezvous store hosted by rank 0. Its address and secret go round by
// MPI_Bcast.
std::shared_ptr<Arrivals> arrival_board(std::optional<std::string> addr, std::optional<int> port,
                                        int rank, int size, double timeout_s) {
  char host[256] = {0};
  char secret[64] = {0};  // made by rank 0, shared by MPI: the store admits only this job
  int port_value = port.value_or(0);
  if (rank == 0) {
    gethostname(host, sizeof host - 1);
    if (!port) port_value = free_port();
    const std::string made = random_secret();
    std::memcpy(secret, made.data(), std::min(made.size(), sizeof secret - 1));
  }
  MPI_Bcast(host, sizeof host, MPI_CHAR, 0, MPI_COMM_WORLD);
  MPI_Bcast(&port_value, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Bcast(secret, sizeof secret, MPI_CHAR, 0, MPI_COMM_WORLD);
  std::string where = addr.value_or("");
  if (where.empty()) {
    char mine[256] = {0};
    gethostname(mine, sizeof mine - 1);
    where = std::strcmp(mine, host) == 0 ? "127.0.0.1" : host;
  }
  if (port_value <= 0) return std::make_shared<NoArrivals>("rank 0 found no free port");
  // Without MASTER_ADDR rank 0 cannot tell which of its interfaces the others route to; the
  // secret keeps strangers out.
  auto store = RendezvousStore::connect(
      StoreAddress{where, port_value, secret, addr && !addr->empty() ? *addr : "0.0.0.0"}, rank,
      size, timeout_s);
  if (!store.ok()) return std::make_shared<NoArrivals>(store.error().message);
  // The store lives as long as the board.
  auto board = (*store)->arrivals();
  struct Holder : Arrivals {
    std::shared_ptr<RendezvousStore> store;
    std::shared_ptr<Arrivals> inner;
    Status mark(const std::string& k, uint64_t c) override { return inner->mark(k, c); }
    Result<std::vector<uint64_t>> read(const std::vector<std::string>& keys) override {
      return inner->read(keys);
    }
  };
  auto holder = std::make_shared<Holder>();
  holder->store = std::move(store).value();
  holder->inner = std::move(board);
  return holder;
}

}  // namespace

Result<std::shared_ptr<Comm>> make_mpi_comm(std::optional<std::string> master_addr,
                                            std::optional<int> master_port, double timeout_s) {
  LOOM_ASSIGN_OR_RETURN(auto rt, MpiRuntime::start());
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  GroupSpec spec;
  spec.name = "world";
  spec.uid = "w";
  for (int r = 0; r < size; ++r) spec.world_ranks.emplace_back(r);
  spec.rank = Rank(rank);
  spec.timeout_s = timeout_s;
  spec.arrivals = arrival_board(std::move(master_addr), master_port, rank, size, timeout_s);
  LOOM_ASSIGN_OR_RETURN(auto comms, MpiComm::duplicate(MPI_COMM_WORLD));
  return std::shared_ptr<Comm>(
      std::make_shared<MpiComm>(std::move(spec), rt, comms.first, comms.second));
}

}  // namespace loom::comm
