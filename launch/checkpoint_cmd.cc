// loom checkpoint inspect DIR | merge DIR OUT | export-hf DIR OUT: reads sharded checkpoints
// without a plan or LibTorch. DIR is a step_N directory or a run's checkpoint root (its newest
// checkpoint).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "checkpoint/merge.h"
#include "checkpoint/reader.h"
#include "core/durable_file.h"
#include "launch/cli_parse.h"
#include "launch/command.h"
#include "launch/hf_export.h"

namespace loom::cli {
namespace {

namespace fs = std::filesystem;

int bad_input(const std::string& message) {
  std::fprintf(stderr, "loom checkpoint: error: %s\n", message.c_str());
  return kExitBadInput;
}

Result<CheckpointReader> open_checkpoint(const fs::path& dir) {
  std::error_code ec;
  if (fs::is_directory(dir, ec) && !fs::exists(dir / kManifestName, ec)) {
    fs::path latest = latest_checkpoint(dir);
    if (!latest.empty()) return CheckpointReader::open(latest);
  }
  return CheckpointReader::open(dir);
}

// What the messages call the checkpoint: the merged file itself when one was given, else the
// step directory read.
std::string shown(const CheckpointReader& reader, const fs::path& given) {
  std::error_code ec;
  return fs::is_regular_file(given, ec) ? given.string() : reader.dir().string();
}

std::string ranges_text(const SliceRanges& ranges) {
  std::string s = "[";
  for (size_t d = 0; d < ranges.size(); ++d)
    s += (d ? ", " : "") + std::to_string(ranges[d].first) + ":" + std::to_string(ranges[d].second);
  return s + "]";
}

int inspect(const fs::path& dir) {
  auto reader = open_checkpoint(dir);
  if (!reader.ok()) return bad_input(reader.error().message);
  // The listing vouches for the shards it names: check them all before printing any of it.
  if (Status s = reader->verify(); !s.ok()) return bad_input(s.error().message);
  const CheckpointManifest& m = reader->manifest();
  std::printf("checkpoint %s\n", shown(*reader, dir).c_str());
  std::printf(
      "step %lld, samples seen %lld, saved under %s on %lld ranks, seed %lld, optimizer %s (%lld "
      "steps)\n",
      static_cast<long long>(m.step), static_cast<long long>(m.samples_seen), m.plan.c_str(),
      static_cast<long long>(m.world_size), static_cast<long long>(m.seed), m.optimizer.c_str(),
      static_cast<long long>(m.optimizer_steps));
  std::printf("files:\n");
  for (const auto& f : m.files)
    std::printf("  %-28s %12llu bytes  crc32 %08x\n", f.name.c_str(),
                static_cast<unsigned long long>(f.bytes), f.crc32);
  std::printf("tensors:\n");
  for (const char* kind : {kSliceParam, kSliceExpAvg, kSliceExpAvgSq, kSliceRng}) {
    for (const auto& name : reader->tensors(kind)) {
      auto desc = *reader->describe(name, kind);
      std::printf("  %-10s %-28s %-6s %s\n", kind, name.c_str(), desc.second.c_str(),
                  to_string(desc.first).c_str());
      for (const auto& s : m.slices) {
        if (s.tensor != name || s.kind != kind) continue;
        std::string chunk = s.value_chunks > 1 ? " value chunk " + std::to_string(s.value_chunk) +
                                                     "/" + std::to_string(s.value_chunks)
                                               : "";
        std::printf("      %s in %s%s\n", ranges_text(s.ranges).c_str(), s.file.c_str(),
                    chunk.c_str());
      }
    }
  }
  return kExitOk;
}

// Where merge may write: never over one of the checkpoint's own files (nor over one through
// the temporary name the durable write uses next to OUT), never onto a directory, and only in
// a folder that exists. The merge itself reads every shard before it writes anything.
Status check_merge_output(const CheckpointReader& reader, const fs::path& given,
                          const fs::path& out) {
  std::error_code ec;
  if (out.empty())
    return Error::at("OUT",
                     "OUT is empty; give the safetensors file to write, e.g. "
                     "'merged.safetensors'");
  if (fs::is_directory(out, ec))
    return Error::at(out.string(), "OUT '" + out.string() +
                                       "' is a directory; give the safetensors file to write, "
                                       "e.g. '" +
                                       (out / "merged.safetensors").string() + "'");
  const fs::path folder = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  if (!fs::is_directory(folder, ec))
    return Error::at(out.string(), "cannot write OUT '" + out.string() + "': its folder '" +
                                       folder.string() + "' does not exist");
  fs::path tmp = out;
  tmp += ".tmp";
  for (const fs::path& own : reader.files()) {
    for (const fs::path& target : {out, tmp}) {
      if (!fs::exists(target, ec) || !fs::equivalent(target, own, ec)) continue;
      return Error::at(
          out.string(),
          "OUT '" + out.string() + "' " +
              (target == out ? "is"
                             : "would be written through '" + target.string() + "', which is") +
              " the checkpoint's own file '" + own.string() +
              "'; merging over it would destroy the checkpoint: write the merged "
              "file somewhere else");
    }
  }
  // Inside the checkpoint, OUT could take the name of a file the checkpoint has or will look
  // for (a rank's manifest, a shard): never write there.
  const fs::path inside =
      fs::is_regular_file(given, ec) ? fs::path() : fs::weakly_canonical(folder, ec);
  for (fs::path d = inside; !d.empty() && d != d.parent_path(); d = d.parent_path()) {
    if (!fs::equivalent(d, reader.dir(), ec)) continue;
    return Error::at(out.string(), "OUT '" + out.string() + "' is inside the checkpoint '" +
                                       reader.dir().string() +
                                       "'; merging into it could destroy the checkpoint: write "
                                       "the merged file somewhere else");
  }
  return Status::success();
}

int merge(const fs::path& dir, const fs::path& out) {
  auto reader = open_checkpoint(dir);
  if (!reader.ok()) return bad_input(reader.error().message);
  if (Status s = check_merge_output(*reader, dir, out); !s.ok())
    return bad_input(s.error().message);
  auto bytes = merge_checkpoint(*reader);
  if (!bytes.ok()) return bad_input(bytes.error().message);
  if (Status s = write_file_durably(out, *bytes); !s.ok()) return bad_input(s.error().message);
  std::printf("loom: merged %s (step %lld, %zu shards) into %s\n", shown(*reader, dir).c_str(),
              static_cast<long long>(reader->manifest().step), reader->manifest().files.size(),
              out.string().c_str());
  return kExitOk;
}

int export_hf_folder(const fs::path& dir, const fs::path& out) {
  auto reader = open_checkpoint(dir);
  if (!reader.ok()) return bad_input(reader.error().message);
  std::string note;
  if (Status s = export_hf(*reader, out, &note); !s.ok()) return bad_input(s.error().message);
  if (!note.empty()) std::fprintf(stderr, "loom: note: %s\n", note.c_str());
  std::printf("loom: exported %s (step %lld) as the Hugging Face folder %s\n",
              shown(*reader, dir).c_str(), static_cast<long long>(reader->manifest().step),
              out.string().c_str());
  return kExitOk;
}

}  // namespace

int checkpoint_main(const Args& args) {
  CLI::App app{"Inspect, merge or export a sharded checkpoint.", "loom checkpoint"};
  app.require_subcommand(1);
  std::string dir, out;
  CLI::App* inspect_cmd =
      app.add_subcommand("inspect", "list tensors, shapes and shards: inspect DIR");
  inspect_cmd->add_option("dir", dir, "a step_N directory or a checkpoint root")->required();
  CLI::App* merge_cmd =
      app.add_subcommand("merge", "write one full safetensors file: merge DIR OUT");
  merge_cmd->add_option("dir", dir, "a step_N directory or a checkpoint root")->required();
  merge_cmd->add_option("out", out, "the safetensors file to write")->required();
  CLI::App* export_cmd = app.add_subcommand(
      "export-hf", "write a Hugging Face folder transformers loads: export-hf DIR OUT");
  export_cmd->add_option("dir", dir, "a step_N directory or a checkpoint root")->required();
  export_cmd->add_option("out", out, "the folder to write (must not exist)")->required();
  if (auto code = parse_args(app, args, "checkpoint")) return *code;
  if (inspect_cmd->parsed()) return inspect(dir);
  if (export_cmd->parsed()) return export_hf_folder(dir, out);
  return merge(dir, out);
}

}  // namespace loom::cli
