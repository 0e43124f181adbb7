// The `loom` tool's sub-commands. Each takes the arguments after its name and returns the
// process exit code: 0 success, 1 a failure while running, 2 bad input (config, flags, files).
#pragma once

#include <string>
#include <vector>

namespace loom::cli {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;

using Args = std::vector<std::string>;

int train_main(const Args& args);     // loom train CONFIG [key=value ...]
int schedule_main(const Args& args);  // loom schedule --kind ... (scheduler/)
int config_main(const Args& args);
int checkpoint_main(const Args& args);  // loom checkpoint inspect DIR | merge DIR OUT
int plan_main(const Args& args);        // loom plan CONFIG [key=value ...] --world-size N --out DIR
int env_main(const Args& args);         // loom env: LibTorch, CPU kernels, BLAS and threads
int version_main(const Args& args);     // loom --version: loom, its build, LibTorch, CUDA, NCCL
int calibrate_main(
    const Args& args);              // loom calibrate [CONFIG] [--out FILE]: a measured cost model
int verify_main(const Args& args);  // loom verify CONFIG [key=value ...] [--steps N] [--json FILE]
int data_main(const Args& args);    // loom data prepare ... | inspect PREFIX [--doc K]

}  // namespace loom::cli
