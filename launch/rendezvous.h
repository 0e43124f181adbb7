// loomrun's elastic rendezvous: agents (one loomrun per node) meet in loom's store, one round per
// start of the workers. A round admits the agents that join it: it closes when MAX have joined,
// or MIN and no more within the last call; node ranks are the join order. While it runs every
// agent beats a heartbeat and watches the others'; the first failure (a worker's, or an agent
// gone silent) is written once and ends the round for all, and the survivors join the next.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "launch/rdzv_client.h"

namespace loom::launch {

using RdzvClock = std::chrono::steady_clock;

struct RdzvSettings {
  int min_nodes = 1;
  int max_nodes = 1;
  std::chrono::seconds timeout{600};           // a round without MIN agents fails
  std::chrono::seconds last_call{30};          // once MIN joined, the wait for more
  std::chrono::seconds heartbeat_timeout{30};  // an agent silent this long is lost
  bool scale_up = false;  // an agent waiting to join ends the running round (--scale-up)
};

// What a round gave this agent.
struct Round {
  int number = 0;           // 0 for the first start; the workers' LOOM_RESTART_COUNT
  int node_rank = 0;        // this agent's join index in the round
  int nnodes = 0;           // agents admitted
  std::string master_addr;  // node 0's address, where rank 0's worker hosts the workers' store
  int master_port = 0;      // a port node 0 found free for this round
};

// The error key join() gives when the job ended before this agent was admitted.
constexpr const char* kJobOver = "job-over";
// How the cause of a round ended for a scale-up begins: a restart that is not a failure.
constexpr const char* kScaleUpCause = "scale-up: ";

inline bool is_scale_up(const std::string& cause) { return cause.rfind(kScaleUpCause, 0) == 0; }

class Rendezvous {
 public:
  // `agent`: how this agent is named in other agents' messages ("host:pid").
  Rendezvous(std::unique_ptr<RdzvClient> store, RdzvSettings settings, std::string agent);

  // Joins the open round and waits until it closes: admitted, the round; closed without this
  // agent, it waits for the next. An error when MIN are not there within the timeout (naming
  // how many joined), when the store is lost, or (key kJobOver) when the job ended meanwhile.
  Result<Round> join();
  // While the round runs, at most once per heartbeat interval: beats, and watches the round's
  // failure, the other agents' heartbeats and (scale_up) agents waiting to join. "" while all is
  // well, else the cause that ends it (is_scale_up for a waiting agent).
  Result<std::string> watch();
  // Ends the round for every agent with `cause`, unless a cause came first; returns the winner.
  Result<std::string> fail(const std::string& cause);
  // This agent's workers all succeeded: beats until every agent's have (""), or until the round
  // fails (its cause).
  Result<std::string> finish();
  // Opens the round after this one (the same for every agent, whoever gets there first).
  Status advance();
  // Says how the job ended (for agents still waiting to be admitted) and leaves it. The agent
  // hosting the store waits (bounded) for the others to leave, so that they can read the end.
  void leave(const std::string& outcome, bool hosting);

  const std::string& address() const { return store_->address(); }
  std::chrono::milliseconds interval() const { return interval_; }

 private:
  std::string key(const std::string& name) const;
  Result<int> await_close(int round, int index);
  Result<Round> admitted(int round, int index, int members);
  Status await_next_round(int round);
  Result<std::string> check_heartbeats();
  Result<std::string> check_waiting();

  std::unique_ptr<RdzvClient> store_;
  RdzvSettings settings_;
  std::string agent_;
  std::chrono::milliseconds interval_;
  Round round_;
  int64_t beats_ = 0;
  RdzvClock::time_point next_beat_{};
  std::vector<std::string> last_beat_;            // per node of the round
  std::vector<RdzvClock::time_point> beat_seen_;  // when it last changed
};

// Hosts the rendezvous store on host:port in a child process (so that loomrun itself stays
// single-threaded: it forks workers) when this machine can bind that address; the store dies
// with this loomrun. Returns the child's pid, or 0 when another agent holds the address or it
// is not this machine's (then `why_not` says so); -1 when the child cannot be started.
pid_t keep_store(const std::string& host, int port, const std::string& secret,
                 std::string* why_not);

}  // namespace loom::launch
