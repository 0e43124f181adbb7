// The run configuration: one YAML file per run, typed and validated, with `a.b=c` overrides.
// Every error names the key and where it came from (file:line, or the command-line override).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"

namespace loom {

struct RunConfig {
  std::string name = "loom";
  std::string output_dir = "runs/loom";
  int64_t seed = 1234;
  int64_t steps = 100;
  std::string device = "cpu";  // cpu | cuda (one GPU per rank: LOCAL_RANK mod visible GPUs)
  // fp32 | bf16 (bf16 compute, fp32 master weights and state) | fp8 (bf16, with the linears'
  // matrix products in float8: e4m3 operands forward, e5m2 gradients; GPUs with FP8 only).
  std::string precision = "fp32";
  // Two runs of the same plan and seed give bitwise-equal losses and parameters on a GPU:
  // deterministic kernels only (cuBLAS's fixed workspace, deterministic attention backward).
  bool deterministic = false;
  // A fresh run into an output_dir that holds another run clears it first (else it is refused).
  bool overwrite = false;
};

// Model-specific hyperparameters (model.args) stay text until the model reads them, so a
// model can name its own keys; see ModelArgs.
// run.precision fp8: how each operand's float8 scale is found (current scaling, from the amax
// of the tensor as it is now): one scale per tensor, or one per row of the product's operands.
struct Fp8Config {
  std::string scaling = "tensorwise";  // tensorwise | rowwise
};

struct ModelConfig {
  std::string type = "gpt";
  std::string preset = "tiny";
  std::map<std::string, std::string> args;
  // A Hugging Face model folder whose config.json fills model.args (models/hf_config.h); an
  // explicit model.args value must agree with it. Empty: none.
  std::string from_hf;
};

struct ParallelConfig {
  int64_t dp = 1;
  int64_t tp = 1;
  int64_t pp = 1;
  // Context parallelism: every activation's sequence cut into cp chunks, chunk c on cp rank c.
  // cp_kind p2p (Megatron-Core's name): attention becomes ring attention, cp steps, step k
  // pairing each rank's query chunk c with key/value chunk (c - k) mod cp, sent point to point
  // from the rank holding it, the steps merged by their log-sum-exp (planner/context_parallel.h).
  // all-to-all (DeepSpeed Ulysses): attention takes whole sequences of 1/cp of the heads.
  // Parameters are replicated over the cp ranks like data-parallel replicas.
  int64_t cp = 1;
  std::string cp_kind = "p2p";
  // Expert parallelism: a mixture-of-experts layer's experts split over ep ranks carved out of
  // the data-parallel ranks (ep divides dp; ep groups are consecutive dp ranks, as in
  // Megatron-Core). Tokens reach their experts and return by all-to-all; expert parameters are
  // data-parallel over the dp / ep groups.
  int64_t ep = 1;
  bool sp = false;  // sequence parallelism over the tp ranks; needs tp > 1
  std::string schedule = "1f1b";
  // schedule csv: the torch.distributed.pipelining CSV whose order every rank runs (a path
  // relative to the working directory, as data.path and cost.file are).
  std::string schedule_csv;
  int64_t chunks = 1;
  std::string policy = "hybrid";
  // Activations the forward keeps for the backward: none keeps all; selective recomputes the
  // attention cores (their score-sized tensors) in the backward; full keeps only each model
  // layer's inputs and recomputes the layer in its backward.
  std::string recompute = "none";
  // Optimizer state over the ranks sharing a parameter piece (data-parallel replicas): 0 keeps
  // it whole on every rank; 1 (ZeRO-1) has one owner per piece update it and keep its state,
  // the gradients reduce-scattered to the owners and the updated values gathered back.
  int64_t zero = 0;
  // Explicit pipeline stage boundaries: each entry is [first_layer, last_layer] (inclusive).
  std::vector<std::vector<int64_t>> stages;
  // policy auto: the memory a plan may use per device, GB (1e9 bytes); 0: the cost model's
  // device memory.
  double memory_limit_gb = 0;

  int64_t world_size() const { return dp * cp * tp * pp; }
  // The ranks of one pipeline stage (the mesh lays pp outermost: planner/mesh.h).
  int64_t ranks_per_stage() const { return dp * cp * tp; }
  // "parallel.dp (2) x parallel.tp (2) x parallel.pp (1)", parallel.cp included where above 1.
  std::string degrees() const;
};

struct BatchConfig {
  int64_t global = 8;  // samples per optimizer step
  int64_t micro = 8;   // samples per micro-batch on one data-parallel replica
};

struct OptimizerConfig {
  std::string type = "adamw";  // adamw | sgd
  double lr = 1e-3;
  std::vector<double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;        // sgd only
  double clip_grad_norm = 0.0;  // 0 disables clipping
  int64_t warmup_steps = 0;
  std::string schedule = "constant";  // constant | cosine | linear (after warm-up)
  double min_lr = 0.0;
};

// One dataset of a blend: its share of the samples (weights need not sum to 1) and its prefix.
struct BlendEntry {
  double weight = 0;
  std::string path;
  bool operator==(const BlendEntry& o) const { return weight == o.weight && path == o.path; }
};

struct DataConfig {
  // synthetic | tokens (a flat file of ids, windows in file order) | indexed (Megatron-LM's
  // indexed dataset, PREFIX.bin + PREFIX.idx: documents shuffled and sampled across, data/)
  std::string type = "synthetic";
  std::string path;  // tokens: the file; indexed: the PREFIX (or data.blend)
  // Bytes per token id in a flat file: 2 (uint16, nanoGPT's .bin) or 4 (uint32, for
  // vocabularies past 65536 such as Llama 3's 128256). An indexed dataset names its own dtype.
  int64_t token_bytes = 2;
  // indexed: several datasets mixed by weight, [[weight, PREFIX], ...], instead of data.path.
  std::vector<BlendEntry> blend;
  int64_t seed = -1;    // the order's seed; -1: run.seed
  bool shuffle = true;  // indexed: documents and samples in a seeded order, new each epoch
};

// Validation: every `every` steps (and after the last), `steps` global batches of held-out
// samples run through the plan's forward alone; their mean token loss is `val_loss`.
struct EvalConfig {
  int64_t every = 0;  // 0: no validation
  int64_t steps = 10;
  // A dataset of its own (a PREFIX under data.type indexed, a token file under tokens) ...
  std::string data;
  // ... or this fraction of the training datasets' documents held out of training (indexed).
  double split = 0;
};

struct LoggingConfig {
  int64_t every = 1;
  std::string level = "info";
  std::string tensorboard;           // TensorBoard event files here (rank 0); empty: none
  std::vector<int64_t> trace_steps;  // steps (1-based) every rank traces: trace_step_N.json
};

struct CommConfig {
  std::string backend = "auto";  // auto | gloo | mpi | nccl | local
  double timeout_s = 300;
  // Gradient buckets all-reduced during backward: at most this many MiB each (DDP's default).
  double bucket_mb = 25;
  // gloo: a group whose ranks all run on one host reduces, gathers and broadcasts through
  // shared memory instead of sockets (comm/shm_collectives.h).
  bool shared_memory = true;
};

// The run's cost model (core/cost_model.h): a preset of configs/cost-model.yaml (or of `file`),
// with any value replaced by a positive cost.<key>.
struct CostConfig {
  std::string preset;  // empty: the file's default preset
  std::string file;    // empty: configs/cost-model.yaml as built into loom
  // 0: the preset's value.
  double device_flops_per_s = 0;
  double device_memory_bytes = 0;
  double intra_alpha_s = 0;
  double intra_beta_s_per_byte = 0;
  double inter_alpha_s = 0;
  double inter_beta_s_per_byte = 0;
  double local_beta_s_per_byte = 0;
  double node_flops_per_s = 0;
  // Per primitive within a node (core/cost_model.h's intra_<primitive>_alpha_s and
  // _beta_s_per_byte).
  double intra_send_recv_alpha_s = 0;
  double intra_send_recv_beta_s_per_byte = 0;
  double intra_all_reduce_alpha_s = 0;
  double intra_all_reduce_beta_s_per_byte = 0;
  double intra_all_gather_alpha_s = 0;
  double intra_all_gather_beta_s_per_byte = 0;
  double intra_reduce_scatter_alpha_s = 0;
  double intra_reduce_scatter_beta_s_per_byte = 0;
  double intra_all_to_all_alpha_s = 0;
  double intra_all_to_all_beta_s_per_byte = 0;
  int64_t devices_per_node = 0;
};

struct CheckpointConfig {
  std::string dir;    // empty: <run.output_dir>/checkpoints
  int64_t every = 0;  // 0: never
  int64_t keep = 2;
  // Whether a checkpoint is written on a background thread while the next steps run: the state
  // is copied at the step boundary, and at most one write is in flight.
  bool async = false;
  std::string resume = "none";  // none | latest | a path
  // A Hugging Face model folder the parameters start from instead of the seeded init (each rank
  // reads its pieces through the model's name map, checkpoint/hf_names.h); the optimizer starts
  // fresh at step 0. A run resumed from a checkpoint continues that checkpoint instead.
  std::string init_from;
};

class Config {
 public:
  RunConfig run;
  Fp8Config fp8;
  ModelConfig model;
  ParallelConfig parallel;
  BatchConfig batch;
  OptimizerConfig optimizer;
  DataConfig data;
  EvalConfig eval;
  LoggingConfig logging;
  CommConfig comm;
  CheckpointConfig checkpoint;
  CostConfig cost;

  // Where a key's value came from: "file.yaml:12", "command line (key=value)" or "default".
  std::string where(const std::string& key) const;
  // An error for `key` whose message starts with where it came from.
  Error error(const std::string& key, const std::string& message) const;
  // `error` with where its key came from ("file.yaml:12: key: message"): what the layers below
  // the config return (Error::at(key, ...)) located once, at the door. An error already located,
  // or without a key, is returned as it is.
  Error locate(Error error) const;

  // data.seed, or run.seed when it is not set.
  uint64_t data_seed() const {
    return static_cast<uint64_t>(data.seed >= 0 ? data.seed : run.seed);
  }
  // Micro-batches per optimizer step on each data-parallel replica.
  int64_t micro_batches() const { return batch.global / (batch.micro * parallel.dp); }

  std::string source;                         // the file it was read from
  std::vector<std::string> overrides;         // as given, in order
  std::map<std::string, std::string> where_;  // key -> origin; filled by the loader
};

// Reads and validates a config file, then applies `overrides` ("a.b=c", YAML values).
Result<Config> load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from text already in memory; `source` names it in messages.
Result<Config> parse_config(const std::string& yaml, const std::string& source,
                            const std::vector<std::string>& overrides = {});
// The fully resolved config as YAML (every key, defaults included); parse_config reads it back.
std::string to_yaml(const Config& config);
// Every key the loader knows, "section.key" (model.args.* is free-form).
std::vector<std::string> known_config_keys();

// Typed access to model.args with errors that name the key and its line.
class ModelArgs {
 public:
  explicit ModelArgs(const Config& config) : config_(config) {}
  Result<int64_t> get_int(const std::string& name, int64_t fallback) const;
  Result<double> get_double(const std::string& name, double fallback) const;
  Result<bool> get_bool(const std::string& name, bool fallback) const;
  Result<std::string> get_string(const std::string& name, const std::string& fallback) const;
  // Fails on any arg not in `known`, suggesting the closest known name.
  Status check_known(const std::vector<std::string>& known) const;

 private:
  const Config& config_;
};

}  // namespace loom
