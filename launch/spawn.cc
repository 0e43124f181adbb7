#include "launch/spawn.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace loom::launch {
namespace {

using Clock = std::chrono::steady_clock;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string ProcessResult::describe() const {
  std::string head = killed        ? "killed at the deadline"
                     : signal != 0 ? "killed by signal " + std::to_string(signal)
                                   : "exit " + std::to_string(exit_code);
  return head + " after " + std::to_string(elapsed_s) + " s; output:\n" + output;
}

std::string describe(const std::vector<ProcessResult>& results) {
  std::string out;
  for (size_t i = 0; i < results.size(); ++i) {
    out += "--- process " + std::to_string(i) + ": " + results[i].describe() + "\n";
  }
  return out;
}

namespace {

struct Child {
  pid_t pid = -1;
  std::string log;
  bool done = false;
};

// Starts `launch` in a process group of its own, its output to a fresh log file.
Child start_child(const Launch& launch) {
  Child child;
  // Everything the child needs is built before fork: only async-signal-safe calls after it.
  char log_template[] = "/tmp/loom-comm-test-XXXXXX";
  const int log_fd = mkstemp(log_template);
  child.log = log_template;
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv(*e);
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : launch.env) env[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = launch.argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execve(argv[0], argv.data(), envp.data());
    const char msg[] = "exec failed\n";
    (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
    _exit(127);
  }
  close(log_fd);
  child.pid = pid;
  if (pid > 0) setpgid(pid, pid);  // also here, so a kill cannot race the child's own call
  return child;
}

// Polls the children until all have ended or `deadline` passes, then kills the rest (and
// their process groups).
void wait_children(std::vector<Child>& children, std::vector<ProcessResult>& results,
                   Clock::time_point start, Clock::time_point deadline) {
  size_t running = children.size();
  for (size_t i = 0; i < children.size(); ++i) {
    if (children[i].pid < 0) {
      children[i].done = true;
      results[i].exit_code = 127;
      --running;
    }
  }
  while (running > 0) {
    for (size_t i = 0; i < children.size(); ++i) {
      if (children[i].done) continue;
      int status = 0;
      if (waitpid(children[i].pid, &status, WNOHANG) == children[i].pid) {
        children[i].done = true;
        --running;
        results[i].elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
        if (WIFEXITED(status)) results[i].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) results[i].signal = WTERMSIG(status);
        kill(-children[i].pid, SIGKILL);  // anything it left behind in its group
      }
    }
    if (running == 0) break;
    if (Clock::now() >= deadline) {
      for (size_t i = 0; i < children.size(); ++i) {
        if (children[i].done) continue;
        kill(-children[i].pid, SIGKILL);
        kill(children[i].pid, SIGKILL);
        int status = 0;
        waitpid(children[i].pid, &status, 0);
        children[i].done = true;
        results[i].killed = true;
        results[i].elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

std::vector<ProcessResult> run_processes(const std::vector<Launch>& launches, double deadline_s) {
  std::vector<Child> children;
  std::vector<ProcessResult> results(launches.size());
  const auto start = Clock::now();
  for (const Launch& launch : launches) children.push_back(start_child(launch));
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(deadline_s));
  wait_children(children, results, start, deadline);
  for (size_t i = 0; i < children.size(); ++i) {
    results[i].output = read_file(children[i].log);
    unlink(children[i].log.c_str());
  }
  return results;
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::vector<ProcessResult> spawn_workers(const std::string& worker, int world_size,
                                         const std::vector<std::string>& args, double deadline_s,
                                         const std::map<std::string, std::string>& env) {
  const std::string port = std::to_string(free_port());
  std::vector<Launch> launches;
  for (int r = 0; r < world_size; ++r) {
    Launch l;
    l.argv.push_back(worker);
    for (const auto& a : args) l.argv.push_back(a);
    l.env = env;
    l.env["RANK"] = l.env["LOCAL_RANK"] = std::to_string(r);
    l.env["WORLD_SIZE"] = l.env["LOCAL_WORLD_SIZE"] = std::to_string(world_size);
    l.env["MASTER_ADDR"] = "127.0.0.1";
    l.env["MASTER_PORT"] = port;
    l.env.emplace("LOOM_RDZV_TOKEN", "spawned-job-" + port);  // unless the caller gave one
    launches.push_back(std::move(l));
  }
  return run_processes(launches, deadline_s);
}

std::string find_program(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/usr/local/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string candidate = dirs.substr(start, end - start) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

std::vector<std::string> mpirun_argv() {
  return {find_program("mpirun"),
          "--allow-run-as-root",
          "--oversubscribe",
          "--bind-to",
          "none",
          "--mca",
          "btl_vader_single_copy_mechanism",
          "none"};
}

}  // namespace loom::launch
