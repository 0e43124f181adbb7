#include "runtime/build_info.h"

#include <ATen/Version.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <torch/version.h>

#include <cstring>
#include <sstream>

#if LOOM_COMM_HAVE_NCCL
#include "comm/nccl_comm.h"
#endif

#ifndef LOOM_VERSION_STRING
#define LOOM_VERSION_STRING "unknown"
#endif

namespace loom::runtime {
namespace {

struct Search {
  uintptr_t address;     // an address inside the object sought
  std::string build_id;  // found: hex
};

// The NT_GNU_BUILD_ID note of one PT_NOTE segment, as hex; "" when it has none.
std::string build_id_note(const char* p, size_t size) {
  const char* end = p + size;
  while (p + sizeof(ElfW(Nhdr)) <= end) {
    const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(p);
    const char* name = p + sizeof(ElfW(Nhdr));
    const char* desc = name + ((note->n_namesz + 3) & ~3u);
    if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 &&
        std::memcmp(name, "GNU", 4) == 0) {
      static const char* kHex = "0123456789abcdef";
      std::string hex;
      for (uint32_t i = 0; i < note->n_descsz; ++i) {
        const auto b = static_cast<unsigned char>(desc[i]);
        hex += kHex[b >> 4];
        hex += kHex[b & 15];
      }
      return hex;
    }
    p = desc + ((note->n_descsz + 3) & ~3u);
  }
  return "";
}

int visit(dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<Search*>(data);
  bool holds = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && search->address >= start && search->address < start + ph.p_memsz)
      holds = true;
  }
  if (!holds) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    std::string id =
        build_id_note(reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr), ph.p_memsz);
    if (!id.empty()) search->build_id = id;
  }
  return 1;
}

// The GNU build id of the executable or library that holds this function.
std::string own_build_id() {
  Search search{reinterpret_cast<uintptr_t>(&own_build_id), ""};
  dl_iterate_phdr(visit, &search);
  return search.build_id.empty() ? "unknown" : search.build_id;
}

// "13.0" from ATen's build description ("CUDA Runtime 13.0"), or "none (a CPU build)".
std::string libtorch_cuda() {
  std::istringstream in(at::show_config());
  const std::string key = "CUDA Runtime ";
  for (std::string line; std::getline(in, line);)
    if (auto at = line.find(key); at != std::string::npos) return line.substr(at + key.size());
  return "none (a CPU build)";
}

}  // namespace

std::vector<std::pair<std::string, std::string>> BuildInfo::lines() const {
  return {{"loom", loom},
          {"build id", build_id},
          {"libtorch", libtorch},
          {"cuda", cuda},
          {"nccl", nccl}};
}

BuildInfo build_info() {
  BuildInfo b;
  b.loom = LOOM_VERSION_STRING;
  b.build_id = own_build_id();
  b.libtorch = TORCH_VERSION;
  b.cuda = libtorch_cuda();
#if LOOM_COMM_HAVE_NCCL
  b.nccl = comm::nccl_versions();
#else
  b.nccl = "none (no nccl backend in this build)";
#endif
  return b;
}

}  // namespace loom::runtime
