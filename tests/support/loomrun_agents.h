// loomrun agents in tests: each in its own process group (so that a test can kill one with its
// workers, as losing a node would), its output in files, every wait a poll with a deadline; and
// the free loopback ports they meet at. Header-only: tests/launch and tests/e2e include it.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace loom::testing_support {

using Clock = std::chrono::steady_clock;

inline const std::string kLoomrun = std::string(LOOM_BINARY_DIR) + "/bin/loomrun";

// A fresh directory of the test's own.
inline std::string temp_dir() {
  char tmpl[] = "/tmp/loomrun_agents_XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  return tmpl;
}

// A port that was free a moment ago on 127.0.0.1.
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

// Whether something listens on 127.0.0.1:`port` (an agent hosting the store).
inline bool accepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Polls `done` every 20 ms until it holds or `seconds` pass.
template <class F>
bool eventually(F done, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    usleep(20 * 1000);
  }
  return true;
}

// One loomrun agent in its own process group, its stderr in DIR/NAME.err, run in DIR.
struct Agent {
  pid_t pid = -1;
  std::string err;
  int code = -1;  // exit code, 128 + signal, -1 while running

  // Waits up to `seconds` for the agent's exit; past it kills its group and fails the test.
  int wait(double seconds) {
    int status = 0;
    const bool ended = eventually([&] { return waitpid(pid, &status, WNOHANG) == pid; }, seconds);
    if (!ended) {
      ADD_FAILURE() << "the agent did not finish within " << seconds << " s; stderr:\n"
                    << read_file(err);
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
    code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return code;
  }
  std::string stderr_text() const { return read_file(err); }
};

inline Agent start_agent(const std::string& dir, const std::string& name,
                         const std::vector<std::string>& args) {
  Agent a;
  a.err = dir + "/" + name + ".err";
  a.pid = fork();
  if (a.pid == 0) {
    setpgid(0, 0);
    if (chdir(dir.c_str()) != 0) _exit(126);
    const int err = open(a.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int out = open((dir + "/" + name + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err, 2);
    setenv("LOOM_RDZV_TOKEN", "elastic-test-secret", 1);
    std::vector<char*> argv{const_cast<char*>(kLoomrun.c_str())};
    for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  setpgid(a.pid, a.pid);
  return a;
}

}  // namespace loom::testing_support
