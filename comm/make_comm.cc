#include "comm/make_comm.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <thread>

#include "comm/local_comm.h"
#include "comm/store.h"
#include "core/run_spec.h"
#include "core/secret.h"
#if LOOM_COMM_HAVE_GLOO
#include "comm/gloo_comm.h"
#endif
#if LOOM_COMM_HAVE_MPI
#include "comm/mpi_comm.h"
#endif
#if LOOM_COMM_HAVE_NCCL
#include "comm/nccl_comm.h"
#endif

namespace loom::comm {
namespace {

constexpr const char* kKey = "comm.backend";

Error backend_error(const std::string& backend, const std::string& message) {
  return Error::at(kKey, backend + ": " + message);
}

// An integer variable in [lo, hi]; nullopt when unset.
Result<std::optional<int64_t>> int_var(const EnvLookup& env, const std::string& backend,
                                       const std::string& name, int64_t lo, int64_t hi,
                                       const std::string& expected) {
  std::optional<std::string> v = env(name);
  if (!v) return std::optional<int64_t>();
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno != 0 || parsed < lo || parsed > hi) {
    return backend_error(backend, name + "=" + *v + " is not valid: expected " + expected);
  }
  return std::optional<int64_t>(parsed);
}

struct ProcessWorld {
  int rank = 0;
  int size = 1;
  std::string addr = "127.0.0.1";
  int port = 0;        // 0: any free port (a world of one)
  std::string secret;  // LOOM_RDZV_TOKEN; a world of one makes its own
};

// RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as set by loomrun or torchrun.
Result<ProcessWorld> world_from_env(const EnvLookup& env, const std::string& backend) {
  ProcessWorld w;
  LOOM_ASSIGN_OR_RETURN(auto size,
                        int_var(env, backend, "WORLD_SIZE", 1, 1 << 20, "a number of ranks >= 1"));
  if (!size) {
    return backend_error(backend,
                         "WORLD_SIZE is not set; start the workers with loomrun (or set "
                         "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)");
  }
  w.size = static_cast<int>(*size);
  LOOM_ASSIGN_OR_RETURN(auto rank, int_var(env, backend, "RANK", 0, w.size - 1,
                                           "a rank in [0, " + std::to_string(w.size - 1) + "]"));
  if (!rank) return backend_error(backend, "RANK is not set (WORLD_SIZE is)");
  w.rank = static_cast<int>(*rank);
  std::optional<std::string> addr = env("MASTER_ADDR");
  if (addr && addr->empty()) return backend_error(backend, "MASTER_ADDR is empty");
  LOOM_ASSIGN_OR_RETURN(auto port,
                        int_var(env, backend, "MASTER_PORT", 1, 65535, "a TCP port in [1, 65535]"));
  if (w.size > 1) {
    if (!addr) {
      return backend_error(backend,
                           "MASTER_ADDR is not set; it names the host of rank 0, which "
                           "hosts the rendezvous store");
    }
    if (!port)
      return backend_error(backend, "MASTER_PORT is not set; rank 0 hosts the store there");
  }
  if (addr) w.addr = *addr;
  if (port) w.port = static_cast<int>(*port);
  w.secret = env(kRdzvTokenEnv).value_or("");
  if (w.secret.empty() && w.size == 1) w.secret = random_secret();
  if (w.secret.empty()) {
    return backend_error(backend, std::string(kRdzvTokenEnv) +
                                      " is not set: the rendezvous store admits only the ranks "
                                      "that present the job's secret; loomrun sets it for its "
                                      "workers, under another launcher set the same value for "
                                      "every rank (e.g. openssl rand -hex 16)");
  }
  return w;
}

Result<std::shared_ptr<RendezvousStore>> store_for(const ProcessWorld& w,
                                                   const std::string& backend, double timeout_s) {
  Result<std::shared_ptr<RendezvousStore>> store = RendezvousStore::connect(
      StoreAddress{w.addr, w.port, w.secret, ""}, w.rank, w.size, timeout_s);
  if (!store.ok()) return backend_error(backend, store.error().message);
  return store;
}

bool started_by_mpi(const EnvLookup& env) {
  return env("OMPI_COMM_WORLD_SIZE").has_value() || env("PMI_SIZE").has_value() ||
         env("PMIX_RANK").has_value();
}

Result<std::shared_ptr<Comm>> make_gloo(const CommConfig& config, const EnvLookup& env) {
#if LOOM_COMM_HAVE_GLOO
  LOOM_ASSIGN_OR_RETURN(ProcessWorld w, world_from_env(env, "gloo"));
  LOOM_ASSIGN_OR_RETURN(auto store, store_for(w, "gloo", config.timeout_s));
  Result<std::shared_ptr<Comm>> comm = make_gloo_comm(std::move(store), w.rank, w.size, w.addr,
                                                      config.timeout_s, config.shared_memory);
  if (!comm.ok()) return backend_error("gloo", comm.error().message);
  return comm;
#else
  (void)config;
  (void)env;
  return backend_error("gloo",
                       "this build of loom has no gloo backend (gloo's headers were not found "
                       "when it was configured: LibTorch wheels do not ship them, see "
                       "LOOM_GLOO); use nccl, mpi or local");
#endif
}

Result<std::shared_ptr<Comm>> make_mpi(const CommConfig& config, const EnvLookup& env) {
#if LOOM_COMM_HAVE_MPI
  LOOM_ASSIGN_OR_RETURN(auto port,
                        int_var(env, "mpi", "MASTER_PORT", 1, 65535, "a TCP port in [1, 65535]"));
  Result<std::shared_ptr<Comm>> comm = make_mpi_comm(
      env("MASTER_ADDR"), port ? std::optional<int>(static_cast<int>(*port)) : std::optional<int>(),
      config.timeout_s);
  if (!comm.ok()) return backend_error("mpi", comm.error().message);
  return comm;
#else
  (void)config;
  (void)env;
  return backend_error("mpi",
                       "this build of loom has no mpi backend (Open MPI's development "
                       "files were not found when it was configured)");
#endif
}

Result<std::shared_ptr<Comm>> make_nccl(const CommConfig& config, const EnvLookup& env) {
#if LOOM_COMM_HAVE_NCCL
  LOOM_ASSIGN_OR_RETURN(ProcessWorld w, world_from_env(env, "nccl"));
  LOOM_ASSIGN_OR_RETURN(auto local_rank,
                        int_var(env, "nccl", "LOCAL_RANK", 0, 1 << 16, "a device index >= 0"));
  // Fail before hosting a store when this process cannot run NCCL at all.
  if (Status s = nccl_usable(); !s.ok()) return backend_error("nccl", s.error().message);
  LOOM_ASSIGN_OR_RETURN(auto store, store_for(w, "nccl", config.timeout_s));
  Result<std::shared_ptr<Comm>> comm =
      make_nccl_comm(std::move(store), w.rank, w.size,
                     local_rank ? static_cast<int>(*local_rank) : -1, config.timeout_s);
  if (!comm.ok()) return backend_error("nccl", comm.error().message);
  return comm;
#else
  (void)config;
  (void)env;
  return backend_error("nccl",
                       "this build of loom has no nccl backend (it needs the CUDA "
                       "toolkit and NCCL at configure time, see LOOM_CUDA)");
#endif
}

}  // namespace

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

bool started_by_launcher(const EnvLookup& env) {
  for (const char* name : {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (std::optional<std::string> v = env(name); v && std::atoll(v->c_str()) > 1) return true;
  return false;
}

int64_t local_rank(const EnvLookup& env) {
  const std::optional<std::string> v = env("LOCAL_RANK");
  return v ? std::max<int64_t>(0, std::atoll(v->c_str())) : 0;
}

std::vector<std::string> built_backends() {
  std::vector<std::string> out{"local"};
#if LOOM_COMM_HAVE_GLOO
  out.push_back("gloo");
#endif
#if LOOM_COMM_HAVE_MPI
  out.push_back("mpi");
#endif
#if LOOM_COMM_HAVE_NCCL
  out.push_back("nccl");
#endif
  return out;
}

namespace {

bool has(CommBackend backend) {
  auto built = built_backends();
  return std::find(built.begin(), built.end(), name(backend)) != built.end();
}

// The backend of processes started by loomrun: gloo where this build has it, else nccl (a
// build against a LibTorch wheel).
CommBackend default_process_backend() {
  return has(CommBackend::kGloo) || !has(CommBackend::kNccl) ? CommBackend::kGloo
                                                             : CommBackend::kNccl;
}

// What comm.backend auto is for this process (make_comm.h).
CommBackend auto_backend(const EnvLookup& env, bool gpu) {
  if (gpu && (env("WORLD_SIZE") || started_by_mpi(env)))
    return CommBackend::kNccl;  // a build without nccl says so, naming comm.backend
  if (started_by_mpi(env) && !env("WORLD_SIZE")) return CommBackend::kMpi;
  if (started_by_mpi(env))  // under mpirun with loomrun's variables as well: mpi if built
    return has(CommBackend::kMpi) ? CommBackend::kMpi : default_process_backend();
  if (env("WORLD_SIZE")) return default_process_backend();
  return CommBackend::kLocal;
}

// One process alone, as a world of one.
Result<std::shared_ptr<Comm>> make_local(const CommConfig& config, const EnvLookup& env) {
  LOOM_ASSIGN_OR_RETURN(auto size,
                        int_var(env, "local", "WORLD_SIZE", 1, 1 << 20, "a number of ranks >= 1"));
  if (size && *size > 1) {
    return backend_error("local",
                         "runs every rank as a thread of one process, so it cannot "
                         "join a world of WORLD_SIZE=" +
                             std::to_string(*size) + " processes; use gloo, mpi or nccl");
  }
  return LocalWorld(1, config.timeout_s).comm(Rank(0));
}

}  // namespace

Result<std::shared_ptr<Comm>> make_comm(const CommConfig& config, const EnvLookup& env, bool gpu) {
  if (!(config.timeout_s > 0)) {
    return Error::at("comm.timeout_s", "must be a positive number of seconds, got " +
                                           std::to_string(config.timeout_s));
  }
  Result<CommBackend> asked = parse_backend(config.backend);
  if (!asked.ok()) return Error::at(kKey, asked.error().message);
  const CommBackend backend = *asked == CommBackend::kAuto ? auto_backend(env, gpu) : *asked;
  switch (backend) {
    case CommBackend::kLocal:
      return make_local(config, env);
    case CommBackend::kGloo:
      return make_gloo(config, env);
    case CommBackend::kMpi:
      return make_mpi(config, env);
    case CommBackend::kNccl:
      return make_nccl(config, env);
    case CommBackend::kAuto:
      break;  // resolved above
  }
  return Error::at(kKey, "comm.backend auto resolved to no backend");
}

int configure_worker_threads(const EnvLookup& env) {
  if (std::optional<std::string> omp = env("OMP_NUM_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(omp->c_str(), &end, 10);
    if (end != omp->c_str() && *end == '\0' && n > 0 && n <= 4096) {
      at::set_num_threads(static_cast<int>(n));
      return static_cast<int>(n);
    }
  }
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);
  // Workers on this machine: loomrun/torchrun say LOCAL_WORLD_SIZE, Open MPI
  // OMPI_COMM_WORLD_LOCAL_SIZE, Slurm SLURM_NTASKS_PER_NODE, MPICH/Hydra MPI_LOCALNRANKS.
  int per_machine = 1;
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                           "SLURM_NTASKS_PER_NODE"})
    if (std::optional<std::string> v = env(name)) {
      per_machine = std::max(1, std::atoi(v->c_str()));
      break;
    }
  const int threads = std::max(1, cores / per_machine);
  at::set_num_threads(threads);
  return threads;
}

}  // namespace loom::comm
