#include "comm/store_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "comm/store_wire.h"

namespace loom::comm {

using wire::Clock;

struct StoreServer::State {
  std::mutex mu;
  std::condition_variable changed;  // a key was set, or the server stops
  std::condition_variable idle;     // a connection ended
  std::map<std::string, std::string> kv;
  std::set<int> fds;  // open connections, shut down when the server stops
  int active = 0;     // connection threads still running
  bool stopping = false;
  std::string secret;
  std::string address;
  Log log;
  std::atomic<int> refused{0};
};

namespace {

// Time a connection has to present the secret.
constexpr auto kHandshakeTime = std::chrono::seconds(10);

struct Answer {
  uint8_t status = wire::kOk;
  std::vector<std::string> fields;
};

Answer failed(const std::string& why) { return {wire::kFailed, {why}}; }

bool parse_int(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

// Waits (the lock held) until every key is set, the deadline passes or the server stops.
bool wait_for(StoreServer::State& st, std::unique_lock<std::mutex>& lock,
              const std::vector<std::string>& keys, size_t first, int64_t timeout_ms) {
  auto all_set = [&] {
    for (size_t i = first; i < keys.size(); ++i)
      if (!st.kv.count(keys[i])) return false;
    return true;
  };
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms));
  st.changed.wait_until(lock, deadline, [&] { return st.stopping || all_set(); });
  return all_set();
}

Answer add(StoreServer::State& st, const std::vector<std::string>& f) {
  int64_t delta = 0, now = 0;
  if (f.size() != 2 || !parse_int(f[1], &delta)) return failed("malformed add");
  auto it = st.kv.find(f[0]);
  if (it != st.kv.end() && !parse_int(it->second, &now))
    return failed("add on key " + f[0] + ", which does not hold an integer");
  st.kv[f[0]] = std::to_string(now + delta);
  st.changed.notify_all();
  return {wire::kOk, {st.kv[f[0]]}};
}

// c10d's compareSet: set `desired` when the value is `expected` (or the key is absent and
// `expected` empty); the answer is the value afterwards (`expected` for an absent key).
Answer compare_set(StoreServer::State& st, const std::vector<std::string>& f) {
  if (f.size() != 3) return failed("malformed compareSet");
  auto it = st.kv.find(f[0]);
  if (it == st.kv.end() && !f[1].empty()) return {wire::kOk, {f[1]}};
  if (it == st.kv.end() || it->second == f[1]) {
    st.kv[f[0]] = f[2];
    st.changed.notify_all();
    return {wire::kOk, {f[2]}};
  }
  return {wire::kOk, {it->second}};
}

Answer apply(StoreServer::State& st, uint8_t op, const std::vector<std::string>& f) {
  std::unique_lock<std::mutex> lock(st.mu);
  int64_t timeout_ms = 0;
  switch (op) {
    case wire::kSet:
      if (f.size() != 2) return failed("malformed set");
      st.kv[f[0]] = f[1];
      st.changed.notify_all();
      return {};
    case wire::kGet:
      if (f.size() != 2 || !parse_int(f[1], &timeout_ms)) return failed("malformed get");
      if (!wait_for(st, lock, {f[0]}, 0, timeout_ms) || st.kv.count(f[0]) == 0)
        return {wire::kTimedOut, {}};
      return {wire::kOk, {st.kv[f[0]]}};
    case wire::kAdd:
      return add(st, f);
    case wire::kCheck:
      for (const std::string& key : f)
        if (!st.kv.count(key)) return {wire::kOk, {"0"}};
      return {wire::kOk, {"1"}};
    case wire::kWait:
      if (f.empty() || !parse_int(f[0], &timeout_ms)) return failed("malformed wait");
      return {wait_for(st, lock, f, 1, timeout_ms) ? wire::kOk : wire::kTimedOut, {}};
    case wire::kDelete:
      if (f.size() != 1) return failed("malformed delete");
      return {wire::kOk, {st.kv.erase(f[0]) ? "1" : "0"}};
    case wire::kCompareSet:
      return compare_set(st, f);
    case wire::kNumKeys:
      return {wire::kOk, {std::to_string(st.kv.size())}};
    default:
      return failed("unknown request " + std::to_string(op));
  }
}

// Compares in time independent of where the two differ.
bool same_secret(const std::string& given, const std::string& secret) {
  if (given.size() != secret.size() || secret.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < secret.size(); ++i) diff |= given[i] ^ secret[i];
  return diff == 0;
}

// The reason to refuse the connection, or "" to admit it. A byte that is not the magic refuses
// at once, so that a client of another protocol (c10d's TCPStore) is turned away immediately.
std::string handshake(const StoreServer::State& st, int fd) {
  const auto deadline = Clock::now() + kHandshakeTime;
  std::string why;
  for (char expected : wire::kMagic) {
    char c = 0;
    if (!wire::read_exact(fd, &c, 1, deadline, &why) || c != expected)
      return "it presented no secret (not a loom rendezvous client)";
  }
  uint32_t size = 0;
  if (!wire::read_exact(fd, &size, sizeof size, deadline, &why))
    return "it presented no secret (" + why + ")";
  size = ntohl(size);
  if (size == 0) return "it presented no secret";
  if (size > wire::kMaxSecret) return "it presented a malformed secret";
  std::string secret(size, '\0');
  if (!wire::read_exact(fd, secret.data(), size, deadline, &why))
    return "it presented no secret (" + why + ")";
  if (!same_secret(secret, st.secret)) return "it presented a wrong secret";
  return "";
}

void serve(std::shared_ptr<StoreServer::State> st, int fd, std::string peer) {
  const std::string refusal = handshake(*st, fd);
  if (!refusal.empty()) {
    ++st->refused;
    if (wire::write_exact(fd, &wire::kRefused, 1))
      wire::send_message(fd, wire::kFailed, {"not a member of this job: " + refusal});
    if (st->log)
      st->log("the rendezvous store at " + st->address + " refused a connection from " + peer +
              ": " + refusal + "; it is not a member of this job and is not taken for a rank");
  } else if (wire::write_exact(fd, &wire::kAdmitted, 1)) {
    uint8_t op = 0;
    std::vector<std::string> fields;
    std::string why;
    while (wire::recv_message(fd, Clock::time_point::max(), &op, &fields, &why)) {
      const Answer a = apply(*st, op, fields);
      if (!wire::send_message(fd, a.status, a.fields)) break;
    }
  }
  std::lock_guard<std::mutex> lock(st->mu);
  st->fds.erase(fd);
  close(fd);
  --st->active;
  st->idle.notify_all();
}

void accept_loop(std::shared_ptr<StoreServer::State> st, int listen_fd) {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(st->mu);
      if (st->stopping) return;
    }
    pollfd pfd{listen_fd, POLLIN, 0};
    if (poll(&pfd, 1, 200) <= 0) continue;
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    const int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard<std::mutex> lock(st->mu);
    if (st->stopping) {
      close(fd);
      return;
    }
    st->fds.insert(fd);
    ++st->active;
    // Detached: the thread owns its share of the state, and the server waits for it to end.
    std::thread(serve, st, fd, wire::to_string(peer)).detach();
  }
}

}  // namespace

Result<std::shared_ptr<StoreServer>> StoreServer::start(const std::string& host, int port,
                                                        std::string secret, Log log) {
  const std::string at = host + ":" + std::to_string(port);
  if (secret.empty()) return Error{"the rendezvous store at " + at + " needs a secret", {}};
  LOOM_ASSIGN_OR_RETURN(sockaddr_in address, wire::resolve(host, port));
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error{std::string("cannot open a socket: ") + std::strerror(errno), {}};
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  socklen_t len = sizeof address;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      listen(fd, 4096) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&address), &len) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return Error{"cannot listen on " + at + ": " + why, {}};
  }
  auto st = std::make_shared<State>();
  st->secret = std::move(secret);
  st->address = wire::to_string(address);
  st->log = std::move(log);
  return std::shared_ptr<StoreServer>(
      new StoreServer(st, fd, ntohs(address.sin_port), wire::to_string(address)));
}

StoreServer::StoreServer(std::shared_ptr<State> state, int listen_fd, int port, std::string address)
    : state_(std::move(state)), listen_fd_(listen_fd), port_(port), address_(std::move(address)) {
  acceptor_ = std::thread(accept_loop, state_, listen_fd_);
}

StoreServer::~StoreServer() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
    for (int fd : state_->fds) shutdown(fd, SHUT_RDWR);
  }
  state_->changed.notify_all();
  shutdown(listen_fd_, SHUT_RDWR);  // wakes the acceptor's poll
  acceptor_.join();
  close(listen_fd_);
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->idle.wait_for(lock, std::chrono::seconds(5), [&] { return state_->active == 0; });
}

int StoreServer::refused() const { return state_->refused.load(); }

}  // namespace loom::comm
