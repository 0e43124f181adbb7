#include "runtime/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <malloc.h>
#include <torch/version.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

namespace loom::runtime {
namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_tracked{false};

void add(int64_t n) {
  const int64_t now = g_live.fetch_add(n) + n;
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

// Each counted allocation carries a header in front of the data with its size and the base
// allocator's deleter, so freeing needs no shared table (no lock on the allocation path).
// 64 bytes keep the data at LibTorch's CPU alignment.
constexpr size_t kHeader = 64;
struct Header {
  int64_t bytes;
  c10::DeleterFnPtr base_deleter;
};
static_assert(sizeof(Header) <= kHeader);

void release(void* ptr) {
  if (!ptr) return;
  char* base = static_cast<char*>(ptr) - kHeader;
  const Header h = *reinterpret_cast<Header*>(base);
  g_live.fetch_sub(h.bytes);
  h.base_deleter(base);
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n + kHeader);
    char* base = static_cast<char*>(inner.get());
    // LibTorch's CPU allocator keeps the data pointer as the context: take it over. Another
    // allocator's memory is handed out as it is, uncounted.
    if (!base || inner.get_context() != base) return inner;
    const c10::Device device = inner.device();
    *reinterpret_cast<Header*>(base) = Header{static_cast<int64_t>(n), inner.get_deleter()};
    inner.release_context();
    add(static_cast<int64_t>(n));
    return c10::DataPtr(base + kHeader, base + kHeader, &release, device);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

}  // namespace

namespace {

// CPU tensors come from glibc's malloc through LibTorch's CPU allocator. glibc serves large
// blocks with mmap and, by default, adapts that threshold as blocks are freed, so a training
// step's activations are returned to the kernel and page-faulted back in at every step (on GPT
// tiny, 40% of a step in page faults). Fixed thresholds keep freed blocks in the heap for the
// next step, as a caching allocator does; the live bytes stay what the step needs. An explicit
// MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ in the environment wins.
void keep_freed_cpu_blocks() {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") || std::getenv("MALLOC_TRIM_THRESHOLD_")) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);   // glibc's largest: blocks above it are rare and huge
  mallopt(M_TRIM_THRESHOLD, 256 << 20);  // keep up to 256 MiB of freed heap for the next step
}

}  // namespace

void track_cpu_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    keep_freed_cpu_blocks();
    // Lives as long as the process: LibTorch holds a raw pointer to it.
    static CountingAllocator counting(c10::GetCPUAllocator());
    c10::SetAllocator(c10::DeviceType::CPU, &counting, /*priority=*/100);
    g_tracked = true;
  });
}

bool cpu_memory_tracked() { return g_tracked.load(); }
int64_t live_cpu_bytes() { return g_live.load(); }
int64_t peak_cpu_bytes() { return g_peak.load(); }
void reset_peak_cpu_bytes() { g_peak.store(g_live.load()); }

}  // namespace loom::runtime
