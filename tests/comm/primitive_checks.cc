#include "tests/comm/primitive_checks.h"

#include <ATen/ops/empty.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace loom::comm::testing {
namespace {

using Fill = std::function<double(int64_t)>;

// Tensors filled with closed-form values, made on the CPU and moved to the device under test.
struct Filled {
  at::Device device = at::kCPU;

  at::Tensor operator()(std::vector<int64_t> shape, const Fill& f,
                        at::ScalarType dtype = at::kFloat) const {
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(at::kDouble));
    double* p = t.data_ptr<double>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = f(i);
    return t.to(device, dtype);
  }

  at::Tensor operator()(int64_t n, const Fill& f, at::ScalarType dtype = at::kFloat) const {
    return (*this)(std::vector<int64_t>{n}, f, dtype);
  }
};

// Element i of `got` (row-major) equals want(i).
Status expect(const std::string& what, const Comm& comm, const at::Tensor& got, const Fill& want) {
  at::Tensor g = got.to(at::kCPU).contiguous().to(at::kDouble);
  const double* p = g.data_ptr<double>();
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double w = want(i);
    if (std::abs(p[i] - w) > 1e-6 * std::max(1.0, std::abs(w))) {
      return Error{what + " on " + comm.backend_name() + " group " + comm.group_name() + ", rank " +
                       comm.rank().to_string() + ": element " + std::to_string(i) + " is " +
                       std::to_string(p[i]) + ", expected " + std::to_string(w),
                   {}};
    }
  }
  return Status::success();
}

Status expect_numel(const std::string& what, const at::Tensor& t, int64_t n) {
  if (t.numel() != n) {
    return Error{
        what + ": " + std::to_string(t.numel()) + " elements, expected " + std::to_string(n), {}};
  }
  return Status::success();
}

Status check_all_reduce(Comm& comm, at::Device device) {
  const Filled filled{device};
  const int64_t s = comm.size(), r = comm.rank().value(), n = 5, S = s * (s - 1) / 2;
  auto base = [&](int64_t i) { return static_cast<double>(r * n + i); };

  at::Tensor t = filled(n, base);
  LOOM_TRY(comm.all_reduce(t, ReduceOp::kSum));
  LOOM_TRY(expect("all_reduce sum", comm, t, [&](int64_t i) { return n * S + s * i; }));

  t = filled(n, base);
  LOOM_TRY(comm.all_reduce(t, ReduceOp::kMax));
  LOOM_TRY(expect("all_reduce max", comm, t, [&](int64_t i) { return (s - 1) * n + i; }));

  t = filled(n, base);
  LOOM_TRY(comm.all_reduce(t, ReduceOp::kMin));
  LOOM_TRY(expect("all_reduce min", comm, t, [&](int64_t i) { return i; }));

  t = filled(n, base, at::kDouble);
  LOOM_TRY(comm.all_reduce(t, ReduceOp::kAvg));
  LOOM_TRY(expect("all_reduce avg", comm, t,
                  [&](int64_t i) { return static_cast<double>(n * S + s * i) / s; }));

  t = filled(n, base, at::kLong);
  LOOM_TRY(comm.all_reduce(t, ReduceOp::kSum));
  LOOM_TRY(expect("all_reduce sum int64", comm, t, [&](int64_t i) { return n * S + s * i; }));

  t = filled(n, base, at::kInt);
  LOOM_TRY(comm.all_reduce(t, ReduceOp::kMax));
  LOOM_TRY(expect("all_reduce max int32", comm, t, [&](int64_t i) { return (s - 1) * n + i; }));

  // A non-contiguous view is reduced in place too.
  at::Tensor grid = filled({n, 2}, [&](int64_t k) { return r * 10.0 + k; });
  LOOM_TRY(comm.all_reduce(grid.t(), ReduceOp::kSum));
  LOOM_TRY(expect("all_reduce of a transposed view", comm, grid,
                  [&](int64_t k) { return 10.0 * S + s * k; }));

  // Async: two in flight, waited in reverse order.
  at::Tensor a = filled(n, base), b = filled(3, [&](int64_t i) { return r + i; });
  Work wa = comm.all_reduce_async(a, ReduceOp::kSum);
  Work wb = comm.all_reduce_async(b, ReduceOp::kMax);
  LOOM_TRY(wb.wait());
  LOOM_TRY(wa.wait());
  LOOM_TRY(wa.wait());         // idempotent
  LOOM_TRY(wa.synchronize());  // the host waits too (nccl: wait() only orders the stream)
  if (!wa.is_completed()) return Error{"all_reduce_async: not completed after wait", {}};
  LOOM_TRY(expect("all_reduce_async sum", comm, a, [&](int64_t i) { return n * S + s * i; }));
  LOOM_TRY(expect("all_reduce_async max", comm, b, [&](int64_t i) { return (s - 1) + i; }));
  return Status::success();
}

Status check_broadcast(Comm& comm, at::Device device) {
  const Filled filled{device};
  const int64_t s = comm.size(), r = comm.rank().value(), n = 4;
  at::Tensor t = r == s - 1 ? filled(n, [](int64_t i) { return 100.0 + i; })
                            : filled(n, [](int64_t) { return -1.0; });
  LOOM_TRY(comm.broadcast(t, Rank(s - 1)));
  LOOM_TRY(expect("broadcast from the last rank", comm, t, [](int64_t i) { return 100.0 + i; }));

  at::Tensor u = filled(
      {2, 3}, [&](int64_t i) { return r == 0 ? 7.0 * i : 0.0; }, at::kLong);
  Work w = comm.broadcast_async(u, Rank(0));
  LOOM_TRY(w.wait());
  LOOM_TRY(expect("broadcast_async from rank 0", comm, u, [](int64_t i) { return 7.0 * i; }));
  return Status::success();
}

Status check_all_gather(Comm& comm, at::Device device) {
  const Filled filled{device};
  const int64_t s = comm.size(), r = comm.rank().value(), n = 3;
  at::Tensor in = filled(n, [&](int64_t i) { return r * n + i; });
  std::vector<at::Tensor> out;
  for (int64_t j = 0; j < s; ++j) out.push_back(filled(n, [](int64_t) { return -1.0; }));
  LOOM_TRY(comm.all_gather(out, in));
  for (int64_t j = 0; j < s; ++j) {
    LOOM_TRY(expect("all_gather piece " + std::to_string(j), comm, out[j],
                    [&](int64_t i) { return j * n + i; }));
  }
  // Flat: [s, n] rows in rank order; double and a 2-D input.
  at::Tensor in2 = filled(
      {1, n}, [&](int64_t i) { return r * n + i; }, at::kDouble);
  at::Tensor flat = filled(
      {s, n}, [](int64_t) { return -1.0; }, at::kDouble);
  LOOM_TRY(comm.all_gather_flat(flat, in2));
  LOOM_TRY(expect("all_gather_flat", comm, flat, [](int64_t k) { return static_cast<double>(k); }));
  // Async, into a non-contiguous output (columns of a [n, s] matrix).
  at::Tensor cols = filled({n, s}, [](int64_t) { return -1.0; });
  Work w = comm.all_gather_flat_async(cols.t(), in);
  LOOM_TRY(w.wait());
  LOOM_TRY(expect("all_gather_flat_async into a transposed view", comm, cols.t(),
                  [](int64_t k) { return static_cast<double>(k); }));
  return Status::success();
}

Status check_reduce_scatter(Comm& comm, at::Device device) {
  const Filled filled{device};
  const int64_t s = comm.size(), r = comm.rank().value(), n = 4, S = s * (s - 1) / 2;
  auto piece = [&](int64_t j) {
    return filled(n, [&, j](int64_t i) { return r * 100.0 + j * n + i; });
  };
  std::vector<at::Tensor> in;
  for (int64_t j = 0; j < s; ++j) in.push_back(piece(j));
  at::Tensor out = filled(n, [](int64_t) { return -1.0; });
  LOOM_TRY(comm.reduce_scatter(out, in, ReduceOp::kSum));
  LOOM_TRY(expect("reduce_scatter sum", comm, out,
                  [&](int64_t i) { return 100.0 * S + s * (r * n + i); }));

  LOOM_TRY(comm.reduce_scatter(out, in, ReduceOp::kMax));
  LOOM_TRY(expect("reduce_scatter max", comm, out,
                  [&](int64_t i) { return (s - 1) * 100.0 + r * n + i; }));

  at::Tensor flat_in = filled({s, n}, [&](int64_t k) { return r * 100.0 + k; });
  at::Tensor flat_out = filled(n, [](int64_t) { return -1.0; });
  LOOM_TRY(comm.reduce_scatter_flat(flat_out, flat_in, ReduceOp::kAvg));
  LOOM_TRY(expect("reduce_scatter_flat avg", comm, flat_out,
                  [&](int64_t i) { return (100.0 * S + s * (r * n + i)) / s; }));

  at::Tensor int_in = filled(
      {s * n}, [&](int64_t k) { return r + k; }, at::kLong);
  at::Tensor int_out = filled(
      n, [](int64_t) { return 0.0; }, at::kLong);
  Work w = comm.reduce_scatter_flat_async(int_out, int_in, ReduceOp::kMin);
  LOOM_TRY(w.wait());
  LOOM_TRY(expect("reduce_scatter_flat_async min int64", comm, int_out,
                  [&](int64_t i) { return static_cast<double>(r * n + i); }));
  return Status::success();
}

// Rank r sends rank j a piece of r + j + 1 elements filled with r * 1000 + j * 10 + k.
Status check_all_to_all(Comm& comm, at::Device device) {
  const Filled filled{device};
  const int64_t s = comm.size(), r = comm.rank().value();
  std::vector<at::Tensor> in, out;
  for (int64_t j = 0; j < s; ++j) {
    in.push_back(filled(r + j + 1, [&, j](int64_t k) { return r * 1000.0 + j * 10 + k; }));
    out.push_back(filled(j + r + 1, [](int64_t) { return -1.0; }));
  }
  LOOM_TRY(comm.all_to_all(out, in));
  for (int64_t j = 0; j < s; ++j) {
    LOOM_TRY(expect_numel("all_to_all piece", out[j], j + r + 1));
    LOOM_TRY(expect("all_to_all piece from rank " + std::to_string(j), comm, out[j],
                    [&](int64_t k) { return j * 1000.0 + r * 10 + k; }));
  }
  // Async, with empty pieces to and from rank 0.
  std::vector<at::Tensor> in2, out2;
  for (int64_t j = 0; j < s; ++j) {
    const int64_t send = (r == 0 || j == 0) ? 0 : 2, recv = send;
    in2.push_back(filled(
        send, [&, j](int64_t k) { return r * 10.0 + j + k; }, at::kLong));
    out2.push_back(filled(
        recv, [](int64_t) { return -1.0; }, at::kLong));
  }
  Work w = comm.all_to_all_async(out2, in2);
  LOOM_TRY(w.wait());
  for (int64_t j = 0; j < s; ++j) {
    LOOM_TRY(expect("all_to_all_async piece from rank " + std::to_string(j), comm, out2[j],
                    [&](int64_t k) { return j * 10.0 + r + k; }));
  }
  return Status::success();
}

Status check_send_recv(Comm& comm, at::Device device) {
  const Filled filled{device};
  const int64_t s = comm.size(), r = comm.rank().value(), n = 6;
  if (s == 1) return Status::success();
  // A ring with async sends (a blocking ring of sends could deadlock on a rendezvous backend).
  const int64_t next = (r + 1) % s, prev = (r + s - 1) % s;
  at::Tensor msg = filled(n, [&](int64_t i) { return r * 10.0 + i; });
  at::Tensor got = filled(n, [](int64_t) { return -1.0; });
  Work sent = comm.send_async(msg, Rank(next), 3);
  Work received = comm.recv_async(got, Rank(prev), 3);
  LOOM_TRY(received.wait());
  LOOM_TRY(sent.wait());
  LOOM_TRY(expect("ring recv", comm, got, [&](int64_t i) { return prev * 10.0 + i; }));

  // Blocking pairs: even ranks send first. Two messages with one tag arrive in order; a second
  // tag is independent.
  const int64_t partner = r ^ 1;
  if (partner < s) {
    at::Tensor first = filled(
        n, [&](int64_t i) { return 1000.0 + r + i; }, at::kLong);
    at::Tensor second = filled(
        {2, 2}, [&](int64_t i) { return 2000.0 + r + i; }, at::kLong);
    at::Tensor got1 = filled(
        n, [](int64_t) { return 0.0; }, at::kLong);
    at::Tensor got2 = filled(
        {4}, [](int64_t) { return 0.0; }, at::kLong);
    if (r % 2 == 0) {
      LOOM_TRY(comm.send(first, Rank(partner), 0));
      LOOM_TRY(comm.send(second, Rank(partner), 0));
      LOOM_TRY(comm.recv(got1, Rank(partner), 0));
      LOOM_TRY(comm.recv(got2, Rank(partner), 0));
    } else {
      LOOM_TRY(comm.recv(got1, Rank(partner), 0));
      LOOM_TRY(comm.recv(got2, Rank(partner), 0));
      LOOM_TRY(comm.send(first, Rank(partner), 0));
      LOOM_TRY(comm.send(second, Rank(partner), 0));
    }
    LOOM_TRY(expect("first message", comm, got1, [&](int64_t i) { return 1000.0 + partner + i; }));
    LOOM_TRY(expect("second message", comm, got2, [&](int64_t i) { return 2000.0 + partner + i; }));
  }
  return Status::success();
}

// batch_isend_irecv: a 1F1B-like exchange where both ranks of a pair send first (activations
// one way, gradients the other), a ring whose pieces differ in size, and a message to itself.
Status check_batch_p2p(Comm& comm, at::Device device) {
  const Filled filled{device};
  const int64_t s = comm.size(), r = comm.rank().value(), n = 5;
  // To itself: the only exchange a world of one has.
  {
    at::Tensor out = filled(n, [&](int64_t i) { return r * n + i; });
    at::Tensor in = filled(n, [](int64_t) { return -1.0; });
    Work w =
        comm.batch_isend_irecv({P2POp::recv(in, comm.rank(), 4), P2POp::send(out, comm.rank(), 4)});
    LOOM_TRY(w.wait());
    LOOM_TRY(expect("batch_isend_irecv to itself", comm, in, [&](int64_t i) { return r * n + i; }));
  }
  if (s == 1) return Status::success();
  // 1F1B: even rank r is the earlier stage of the pair (r, r + 1): it sends activations and
  // receives gradients; its partner sends gradients and receives activations; both send first.
  const int64_t partner = r ^ 1;
  if (partner < s) {
    const bool earlier = r % 2 == 0;
    at::Tensor mine = filled(n, [&](int64_t i) { return (earlier ? 1000.0 : 2000.0) + r * n + i; });
    at::Tensor got = filled(n, [](int64_t) { return -1.0; });
    Work w = comm.batch_isend_irecv({P2POp::send(mine, Rank(partner), earlier ? 0 : 1),
                                     P2POp::recv(got, Rank(partner), earlier ? 1 : 0)});
    LOOM_TRY(w.wait());
    LOOM_TRY(expect(earlier ? "1F1B gradients" : "1F1B activations", comm, got,
                    [&](int64_t i) { return (earlier ? 2000.0 : 1000.0) + partner * n + i; }));
  }
  // A ring, receive listed first: rank r sends r + 1 elements of r * n + i to the next rank.
  const int64_t next = (r + 1) % s, prev = (r + s - 1) % s;
  at::Tensor out = filled(
      r + 1, [&](int64_t i) { return r * n + i; }, at::kLong);
  at::Tensor in = filled(
      {1, prev + 1}, [](int64_t) { return -1.0; }, at::kLong);
  Work w =
      comm.batch_isend_irecv({P2POp::recv(in.t(), Rank(prev), 2), P2POp::send(out, Rank(next), 2)});
  LOOM_TRY(w.wait());
  LOOM_TRY(expect("batch_isend_irecv ring", comm, in, [&](int64_t i) { return prev * n + i; }));
  return Status::success();
}

Status sum_of_world_ranks(Comm& group, const std::string& what, at::Device device) {
  const Filled filled{device};
  at::Tensor t = filled(2, [&](int64_t i) {
    return static_cast<double>(group.world_ranks()[group.rank().value()].value() + i);
  });
  LOOM_TRY(group.all_reduce(t));
  double sum = 0;
  for (Rank w : group.world_ranks()) sum += static_cast<double>(w.value());
  return expect(what, group, t, [&](int64_t i) { return sum + group.size() * i; });
}

}  // namespace

Status check_large(Comm& comm) {
  const Filled filled{at::kCPU};
  const int64_t s = comm.size(), r = comm.rank().value(), S = s * (s + 1) / 2;
  // Small integers, so that every sum is exact in each dtype (bfloat16: up to 256).
  auto value = [](int64_t i, at::ScalarType dtype) {
    return static_cast<double>(i % (dtype == at::kBFloat16 ? 7 : 1009));
  };
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kDouble, at::kLong}) {
    const std::string name = std::string(" ") + c10::toString(dtype);
    const int64_t n = 700001;  // 2.7 MiB of float32
    auto mine = [&](int64_t i) { return static_cast<double>(r + 1) * value(i, dtype); };
    at::Tensor t = filled(n, mine, dtype);
    LOOM_TRY(comm.all_reduce(t, ReduceOp::kSum));
    LOOM_TRY(expect("large all_reduce sum" + name, comm, t,
                    [&](int64_t i) { return static_cast<double>(S) * value(i, dtype); }));
    t = filled(n, mine, dtype);
    LOOM_TRY(comm.all_reduce(t, ReduceOp::kMax));
    LOOM_TRY(expect("large all_reduce max" + name, comm, t,
                    [&](int64_t i) { return static_cast<double>(s) * value(i, dtype); }));

    const int64_t m = 300007;
    at::Tensor in_flat = filled(s * m, mine, dtype);
    at::Tensor out = at::empty({m}, in_flat.options());
    LOOM_TRY(comm.reduce_scatter_flat(out, in_flat, ReduceOp::kSum));
    LOOM_TRY(expect("large reduce_scatter" + name, comm, out,
                    [&](int64_t i) { return static_cast<double>(S) * value(r * m + i, dtype); }));

    at::Tensor gathered = at::empty({s * m}, in_flat.options());
    LOOM_TRY(comm.all_gather_flat(gathered, filled(m, mine, dtype)));
    LOOM_TRY(expect("large all_gather" + name, comm, gathered, [&](int64_t i) {
      return static_cast<double>(i / m + 1) * value(i % m, dtype);
    }));

    t = r == s - 1 ? filled(n, mine, dtype) : at::empty({n}, in_flat.options()).fill_(0);
    LOOM_TRY(comm.broadcast(t, Rank(s - 1)));
    LOOM_TRY(expect("large broadcast" + name, comm, t,
                    [&](int64_t i) { return static_cast<double>(s) * value(i, dtype); }));
  }
  return Status::success();
}

Status check_primitives(Comm& comm, at::Device device) {
  if (comm.size() < 1 || comm.rank().value() < 0 || comm.rank().value() >= comm.size()) {
    return Error{"rank " + comm.rank().to_string() + " of " + std::to_string(comm.size()), {}};
  }
  LOOM_TRY(check_all_reduce(comm, device));
  LOOM_TRY(check_broadcast(comm, device));
  LOOM_TRY(check_all_gather(comm, device));
  LOOM_TRY(check_reduce_scatter(comm, device));
  LOOM_TRY(check_all_to_all(comm, device));
  LOOM_TRY(check_send_recv(comm, device));
  LOOM_TRY(check_batch_p2p(comm, device));
  LOOM_TRY(comm.barrier());
  return Status::success();
}

Status check_groups(Comm& comm, at::Device device) {
  const Filled filled{device};
  const int64_t s = comm.size(), r = comm.rank().value();
  std::vector<Rank> even, odd, reversed;
  for (int64_t q = 0; q < s; ++q) (q % 2 == 0 ? even : odd).emplace_back(q);
  for (int64_t q = s - 1; q >= 0; --q) reversed.emplace_back(q);

  LOOM_ASSIGN_OR_RETURN(auto g_even, comm.new_group(even, "even"));
  std::shared_ptr<Comm> g_odd;
  if (!odd.empty()) {
    LOOM_ASSIGN_OR_RETURN(g_odd, comm.new_group(odd, "odd"));
  }
  std::shared_ptr<Comm> mine = r % 2 == 0 ? g_even : g_odd;
  std::shared_ptr<Comm> other = r % 2 == 0 ? g_odd : g_even;
  if (!mine) return Error{"rank " + std::to_string(r) + " got no group of its parity", {}};
  if (other) return Error{"rank " + std::to_string(r) + " got a group it is not in", {}};
  if (mine->rank().value() != r / 2 || mine->size() != (r % 2 == 0 ? (s + 1) / 2 : s / 2)) {
    return Error{"parity group of rank " + std::to_string(r) + " has rank " +
                     mine->rank().to_string() + " of " + std::to_string(mine->size()),
                 {}};
  }
  LOOM_TRY(sum_of_world_ranks(*mine, "all_reduce in a parity group", device));

  LOOM_ASSIGN_OR_RETURN(auto rev, comm.new_group(reversed, "rev"));
  if (!rev || rev->rank().value() != s - 1 - r) {
    return Error{"reversed group: rank " + std::to_string(r) + " has the wrong group rank", {}};
  }
  at::Tensor t = filled(3, [&](int64_t i) { return r == s - 1 ? 42.0 + i : 0.0; });
  LOOM_TRY(rev->broadcast(t, Rank(0)));  // group rank 0 is world rank s - 1
  LOOM_TRY(expect("broadcast in the reversed group", *rev, t, [](int64_t i) { return 42.0 + i; }));
  if (s >= 2) {
    at::Tensor m = filled(2, [&](int64_t i) { return r * 3.0 + i; });
    if (rev->rank().value() == 0) LOOM_TRY(rev->send(m, Rank(1), 9));
    if (rev->rank().value() == 1) {
      LOOM_TRY(rev->recv(m, Rank(0), 9));
      LOOM_TRY(expect("recv in the reversed group", *rev, m,
                      [&](int64_t i) { return (s - 1) * 3.0 + i; }));
    }
  }
  // Nested: the first member of each parity group on its own.
  LOOM_ASSIGN_OR_RETURN(auto solo, mine->new_group({Rank(0)}, "solo"));
  if ((solo != nullptr) != (mine->rank().value() == 0)) {
    return Error{"nested group membership is wrong on rank " + std::to_string(r), {}};
  }
  if (solo) LOOM_TRY(sum_of_world_ranks(*solo, "all_reduce in a group of one", device));
  // The world group still works after all that.
  LOOM_TRY(sum_of_world_ranks(comm, "all_reduce on the world after sub-groups", device));
  return Status::success();
}

}  // namespace loom::comm::testing
