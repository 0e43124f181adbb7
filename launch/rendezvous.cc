#include "launch/rendezvous.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/store_server.h"
#include "comm/store_wire.h"

namespace loom::launch {
namespace {

using std::chrono::milliseconds;

// The round open for joining; absent before the first round is over (round 0).
constexpr const char* kOpenRound = "loomrun/round";
// How long one store request may sleep while an agent waits for something to change.
constexpr milliseconds kPollWait{100};

std::string round_key(int round, const std::string& name) {
  return "loomrun/r" + std::to_string(round) + "/" + name;
}

int to_int(const std::optional<std::string>& v) { return v ? std::atoi(v->c_str()) : 0; }

// A port free on `host` a moment ago, for rank 0's worker to host its store on. A fresh one per
// round: the last round's may still be held by a worker being stopped.
Result<int> free_port(const std::string& host) {
  LOOM_ASSIGN_OR_RETURN(sockaddr_in address, comm::wire::resolve(host, 0));
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t len = sizeof address;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &len) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) close(fd);
    return Error{"cannot find a free port on " + host + " for the workers' store: " + why, {}};
  }
  close(fd);
  return static_cast<int>(ntohs(address.sin_port));
}

}  // namespace

Rendezvous::Rendezvous(std::unique_ptr<RdzvClient> store, RdzvSettings settings, std::string agent)
    : store_(std::move(store)),
      settings_(settings),
      agent_(std::move(agent)),
      // Several beats per timeout, so that one late beat is not taken for a lost agent.
      interval_(
          std::max(milliseconds(100),
                   std::chrono::duration_cast<milliseconds>(settings.heartbeat_timeout) / 5)) {}

std::string Rendezvous::key(const std::string& name) const {
  return round_key(round_.number, name);
}

Result<Round> Rendezvous::join() {
  while (true) {
    LOOM_ASSIGN_OR_RETURN(std::optional<std::string> open,
                          store_->get(kOpenRound, milliseconds(0)));
    const int round = to_int(open);
    LOOM_ASSIGN_OR_RETURN(int64_t joined, store_->add(round_key(round, "joined"), 1));
    const int index = static_cast<int>(joined - 1);
    LOOM_TRY(store_->set(round_key(round, "agent/" + std::to_string(index)), agent_));
    LOOM_ASSIGN_OR_RETURN(int members, await_close(round, index));
    if (index < members) return admitted(round, index, members);
    std::fprintf(stderr,
                 "loomrun: round %d started with %d agents before this one joined; it is admitted "
                 "at the next round\n",
                 round, members);
    LOOM_TRY(await_next_round(round));
  }
}

// The number of agents the round admitted (the first that many to join), once it has closed.
// Whichever agent first sees the round complete closes it, with compare-and-set, so all agree.
Result<int> Rendezvous::await_close(int round, int index) {
  const auto joined_at = RdzvClock::now();
  auto min_at = RdzvClock::time_point::max();
  const std::string closed_key = round_key(round, "closed");
  while (true) {
    LOOM_ASSIGN_OR_RETURN(std::optional<std::string> closed, store_->get(closed_key, kPollWait));
    if (closed) {
      if (to_int(closed) > 0) return to_int(closed);
      LOOM_ASSIGN_OR_RETURN(int64_t joined, store_->add(round_key(round, "joined"), 0));
      return Error{"rendezvous at " + address() + " timed out: " + std::to_string(joined) +
                       " agent(s) joined round " + std::to_string(round) +
                       " within --rdzv-timeout " + std::to_string(settings_.timeout.count()) +
                       " s; --nnodes needs at least " + std::to_string(settings_.min_nodes),
                   "--nnodes"};
    }
    LOOM_ASSIGN_OR_RETURN(int64_t joined, store_->add(round_key(round, "joined"), 0));
    const auto now = RdzvClock::now();
    if (joined >= settings_.min_nodes && min_at == RdzvClock::time_point::max()) min_at = now;
    std::string close_with;
    if (joined >= settings_.max_nodes ||
        (min_at != RdzvClock::time_point::max() && now - min_at >= settings_.last_call))
      close_with = std::to_string(std::min<int64_t>(joined, settings_.max_nodes));
    else if (joined < settings_.min_nodes && now - joined_at >= settings_.timeout)
      close_with = "0";  // no round: every agent waiting in it gives up
    if (!close_with.empty()) LOOM_TRY(store_->compare_set(closed_key, "", close_with));
  }
}

// Node 0 publishes where rank 0's worker will host the workers' store; the others read it.
Result<Round> Rendezvous::admitted(int round, int index, int members) {
  Round r;
  r.number = round;
  r.node_rank = index;
  r.nnodes = members;
  const std::string master_key = round_key(round, "master");
  if (index == 0) {
    const std::string host = store_->local_host();
    LOOM_ASSIGN_OR_RETURN(int port, free_port(host));
    LOOM_TRY(store_->set(master_key, host + ":" + std::to_string(port)));
  }
  LOOM_ASSIGN_OR_RETURN(std::optional<std::string> master,
                        store_->get(master_key, std::chrono::duration_cast<milliseconds>(
                                                    settings_.heartbeat_timeout)));
  if (!master)
    return Error{"node 0 of round " + std::to_string(round) + " published no address in " +
                     std::to_string(settings_.heartbeat_timeout.count()) + " s",
                 {}};
  const size_t colon = master->rfind(':');
  r.master_addr = master->substr(0, colon);
  r.master_port = std::atoi(master->c_str() + colon + 1);
  round_ = r;
  last_beat_.assign(static_cast<size_t>(members), std::string("never"));
  beat_seen_.assign(static_cast<size_t>(members), RdzvClock::now());
  next_beat_ = RdzvClock::now();
  return r;
}

// An agent left out of a round waits for the next one to open, or for the job to end.
Status Rendezvous::await_next_round(int round) {
  while (true) {
    LOOM_ASSIGN_OR_RETURN(std::optional<std::string> open,
                          store_->get(kOpenRound, milliseconds(0)));
    if (to_int(open) != round) return Status::success();
    LOOM_ASSIGN_OR_RETURN(std::optional<std::string> over,
                          store_->get(round_key(round, "over"), kPollWait));
    if (over)
      return Error{"the job ended (" + *over + ") before this agent was admitted", kJobOver};
  }
}

Result<std::string> Rendezvous::watch() {
  const auto now = RdzvClock::now();
  if (now < next_beat_) return std::string();
  next_beat_ = now + interval_;
  LOOM_TRY(store_->set(key("hb/" + std::to_string(round_.node_rank)), std::to_string(++beats_)));
  LOOM_ASSIGN_OR_RETURN(std::optional<std::string> failed,
                        store_->get(key("failed"), milliseconds(0)));
  if (failed) return *failed;
  LOOM_ASSIGN_OR_RETURN(std::string lost, check_heartbeats());
  if (!lost.empty()) return lost;
  return check_waiting();
}

// An agent that joined this round after it closed waits for the next one; with scale_up, and
// room for it, the round ends now so that the next admits it.
Result<std::string> Rendezvous::check_waiting() {
  if (!settings_.scale_up || round_.nnodes >= settings_.max_nodes) return std::string();
  LOOM_ASSIGN_OR_RETURN(int64_t joined, store_->add(key("joined"), 0));
  if (joined <= round_.nnodes) return std::string();
  LOOM_ASSIGN_OR_RETURN(
      std::optional<std::string> name,
      store_->get(key("agent/" + std::to_string(round_.nnodes)), milliseconds(0)));
  return fail(std::string(kScaleUpCause) + "agent " + name.value_or("?") + " joined round " +
              std::to_string(round_.number) + " while it ran (" +
              std::to_string(joined - round_.nnodes) + " waiting, room for " +
              std::to_string(settings_.max_nodes - round_.nnodes) +
              "); the workers stop after their step and the next round admits it");
}

Result<std::string> Rendezvous::check_heartbeats() {
  const auto now = RdzvClock::now();
  for (int k = 0; k < round_.nnodes; ++k) {
    if (k == round_.node_rank) continue;
    const std::string node = std::to_string(k);
    LOOM_ASSIGN_OR_RETURN(std::optional<std::string> beat,
                          store_->get(key("hb/" + node), milliseconds(0)));
    const std::string seen = beat.value_or("none");
    auto& last = last_beat_[static_cast<size_t>(k)];
    if (seen != last) {
      last = seen;
      beat_seen_[static_cast<size_t>(k)] = now;
    } else if (now - beat_seen_[static_cast<size_t>(k)] >= settings_.heartbeat_timeout) {
      LOOM_ASSIGN_OR_RETURN(std::optional<std::string> name,
                            store_->get(key("agent/" + node), milliseconds(0)));
      return fail("node " + node + " (agent " + name.value_or("?") +
                  ") was lost: no heartbeat for " +
                  std::to_string(settings_.heartbeat_timeout.count()) + " s");
    }
  }
  return std::string();
}

Result<std::string> Rendezvous::fail(const std::string& cause) {
  return store_->compare_set(key("failed"), "", cause);
}

Result<std::string> Rendezvous::finish() {
  LOOM_TRY(store_->add(key("done"), 1));
  while (true) {
    // Done agents stop beating once they see every agent done: count before judging silence.
    LOOM_ASSIGN_OR_RETURN(int64_t done, store_->add(key("done"), 0));
    if (done >= round_.nnodes) return std::string();
    LOOM_ASSIGN_OR_RETURN(std::string cause, watch());
    if (!cause.empty()) return cause;
    LOOM_TRY(store_->get(key("failed"), kPollWait));  // a bounded sleep a failure cuts short
  }
}

Status Rendezvous::advance() {
  const int r = round_.number;
  LOOM_TRY(store_->compare_set(kOpenRound, r == 0 ? "" : std::to_string(r), std::to_string(r + 1)));
  return Status::success();
}

void Rendezvous::leave(const std::string& outcome, bool hosting) {
  if (!store_->compare_set(key("over"), "", outcome).ok()) return;
  if (!store_->add(key("left"), 1).ok() || !hosting) return;
  const auto deadline = RdzvClock::now() + settings_.heartbeat_timeout;
  while (RdzvClock::now() < deadline) {
    Result<int64_t> left = store_->add(key("left"), 0);
    if (!left.ok() || *left >= round_.nnodes) return;
    if (!store_->get(key("never"), kPollWait).ok()) return;
  }
}

// --- the store's host ---------------------------------------------------------------------

namespace {

// In the child: serves until loomrun dies (the kernel's parent-death signal), ignoring the
// terminal's SIGINT so that loomrun can still say goodbye to the other agents.
[[noreturn]] void serve_store(const std::string& host, int port, const std::string& secret,
                              pid_t parent, int report_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(0);
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  signal(SIGCHLD, SIG_DFL);
  signal(SIGPIPE, SIG_IGN);
  auto log = [](const std::string& line) { std::fprintf(stderr, "loomrun: %s\n", line.c_str()); };
  Result<std::shared_ptr<comm::StoreServer>> server =
      comm::StoreServer::start(host, port, secret, log);
  const std::string report = server.ok() ? "ok" : server.error().message;
  if (write(report_fd, report.data(), report.size()) < 0) _exit(1);
  close(report_fd);
  if (!server.ok()) _exit(0);
  while (true) pause();
}

}  // namespace

pid_t keep_store(const std::string& host, int port, const std::string& secret,
                 std::string* why_not) {
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) return -1;
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    close(report[0]);
    serve_store(host, port, secret, parent, report[1]);
  }
  close(report[1]);
  // The child answers as soon as it has bound (or failed to); bounded all the same.
  std::string text;
  pollfd pfd{report[0], POLLIN, 0};
  char buf[512];
  while (poll(&pfd, 1, 10000) > 0) {
    const ssize_t n = read(report[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(report[0]);
  if (text == "ok") return pid;
  waitpid(pid, nullptr, 0);
  *why_not = text.empty() ? "the store's process did not start" : text;
  return 0;
}

}  // namespace loom::launch
