// Checkpoint cost against baselines measured in the same run, one process: a save (shard,
// index and manifest, each fsynced, plus pruning) against a training step and against one
// durable write of the same number of bytes; a step that saves every step with checkpoint.async
// (the copy at the boundary, and any wait for the previous write) against a step without; a resume
// (Trainer::create with checkpoint.resume) against Trainer::create without one. Medians of several
// repetitions.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/durable_file.h"
#include "launch/planned_trainer.h"
#include "runtime/trainer.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double seconds(F f) {
  auto start = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

uint64_t dir_bytes(const fs::path& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

// A benchmark on a failed trainer would time nothing: stop naming the error.
template <class T>
T must(loom::Result<T> r) {
  if (!r.ok()) {
    std::fprintf(stderr, "bench_checkpoint: %s\n", r.error().message.c_str());
    std::exit(2);
  }
  return std::move(r).value();
}

void run(const std::string& label, const std::vector<std::string>& overrides, int reps) {
  const fs::path root = fs::temp_directory_path() / "loom_bench_checkpoint";
  fs::remove_all(root);
  std::vector<std::string> base = overrides;
  base.push_back("checkpoint.dir=" + root.string());
  auto config = loom::parse_config("run: {steps: 1000}\n", "bench.yaml", base);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.error().message.c_str());
    std::exit(2);
  }
  // Step times without checkpoints, then the same steps with a checkpoint after each.
  std::vector<double> step, step_and_save, step_and_async, create, create_resume, raw;
  {
    auto t = must(loom::launch::create_trainer(*config));
    must(t->step());
    for (int i = 0; i < reps; ++i) step.push_back(seconds([&] { must(t->step()); }));
  }
  auto with_ckpt = *config;
  with_ckpt.checkpoint.every = 1;
  {
    auto t = must(loom::launch::create_trainer(with_ckpt));
    must(t->step());
    for (int i = 0; i < reps; ++i) step_and_save.push_back(seconds([&] { must(t->step()); }));
  }
  const uint64_t bytes =
      dir_bytes(root) / static_cast<uint64_t>(with_ckpt.checkpoint.keep);  // one checkpoint
  // The same with checkpoint.async, into a directory of its own (a checkpoint directory is one
  // run's).
  auto with_async = with_ckpt;
  with_async.checkpoint.async = true;
  with_async.checkpoint.dir = root.string() + "_async";
  fs::remove_all(with_async.checkpoint.dir);
  {
    auto t = must(loom::launch::create_trainer(with_async));
    must(t->step());
    for (int i = 0; i < reps; ++i) step_and_async.push_back(seconds([&] { must(t->step()); }));
  }
  fs::remove_all(with_async.checkpoint.dir);
  const std::string payload(bytes, '\x5a');
  for (int i = 0; i < reps; ++i)
    raw.push_back(seconds([&] { (void)loom::write_file_durably(root / "raw.bin", payload); }));
  auto resume = *config;
  resume.checkpoint.resume = "latest";
  for (int i = 0; i < reps; ++i) {
    create.push_back(seconds([&] { must(loom::launch::create_trainer(*config)); }));
    create_resume.push_back(seconds([&] { must(loom::launch::create_trainer(resume)); }));
  }
  const double s = median(step), save = median(step_and_save) - s, w = median(raw);
  const double c = median(create), load = median(create_resume) - c;
  const double async_step = median(step_and_async);
  std::printf(
      "%-28s checkpoint %6.2f MB | step %8.2f ms | save %8.2f ms (save/step %.2f, save/durable "
      "write %.2f) | step with an async save %8.2f ms (/step %.3f) "
      "| create %8.2f ms, resume +%7.2f ms (resume/create %.2f)\n",
      label.c_str(), static_cast<double>(bytes) / 1e6, s * 1e3, save * 1e3, save / s, save / w,
      async_step * 1e3, async_step / s, c * 1e3, load * 1e3, (c + load) / c);
  fs::remove_all(root);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  run("gpt tiny", {"model.preset=tiny", "batch.global=8", "batch.micro=8"}, quick ? 3 : 15);
  if (!quick)
    run("gpt h256 x 4 layers",
        {"model.preset=tiny", "model.args.hidden=256", "model.args.layers=4",
         "model.args.vocab=4096", "batch.global=8", "batch.micro=8"},
        9);
  // GPT-2 small, where a step outlasts a write: what checkpoint.async is for.
  if (!quick)
    run("gpt2-124m, batch 8 x seq 256",
        {"model.preset=gpt2-124m", "model.args.seq=256", "batch.global=8", "batch.micro=8"}, 3);
  return 0;
}
