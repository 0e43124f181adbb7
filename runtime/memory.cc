#include "runtime/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <malloc.h>
#include <torch/version.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace loom::runtime {
namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_most{0};  // the most live bytes ever (g_peak is reset)
std::atomic<bool> g_tracked{false};

void add(int64_t n) {
  const int64_t now = g_live.fetch_add(n) + n;
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  int64_t most = g_most.load();
  while (now > most && !g_most.compare_exchange_weak(most, now)) {
  }
}

// Each counted allocation carries a header in front of the data with its size, its capacity
// (what the base allocator gave, header included) and the base allocator's deleter, so freeing
// needs no shared table (no lock for blocks under kCachedBlock). 64 bytes keep the data at
// LibTorch's CPU alignment.
constexpr size_t kHeader = 64;
struct Header {
  int64_t bytes;
  size_t capacity;
  c10::DeleterFnPtr base_deleter;
};
static_assert(sizeof(Header) <= kHeader);

// glibc's mmap threshold as keep_freed_cpu_blocks sets it (its largest).
constexpr size_t kMmapThreshold = size_t{32} << 20;

// Freed blocks of kCachedBlock bytes and more, kept for the next allocation of about their size.
// glibc maps each block from kMmapThreshold up afresh and unmaps it when it is freed, and gives
// the top of its heap back to the kernel once M_TRIM_THRESHOLD bytes are free there (as when a
// step drops its gradients at once), so every step page-faulted its largest tensors in again: on
// gpt2-124m with a 50304 vocabulary, 132,000 faults (500 MiB, each zeroing a page in the
// kernel) per step, the logits and their gradients, the embedding's and the head's gradients,
// and the layers' weight gradients. A step allocates the same sizes every time, so the next
// step finds them here, mapped (no fault per step). The cache holds at most as many bytes as
// tensors ever held at once (the oldest blocks go first), so the process holds at most twice its
// largest working set; smaller blocks stay with glibc, whose bins reuse them.
constexpr size_t kCachedBlock = size_t{1} << 20;

class LargeBlockCache {
 public:
  // A cached block of `capacity` to capacity + capacity / 8 bytes, else null.
  char* take(size_t capacity) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto best = blocks_.end();
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it)
      if (it->capacity >= capacity && it->capacity - capacity <= capacity / 8 &&
          (best == blocks_.end() || it->capacity < best->capacity))
        best = it;
    if (best == blocks_.end()) return nullptr;
    char* base = best->base;
    cached_ -= best->capacity;
    blocks_.erase(best);
    hits_.fetch_add(1);
    return base;
  }
  // Keeps a freed block; frees the oldest cached blocks beyond `limit` bytes (the newest stays).
  void give_back(char* base, size_t limit) {
    std::vector<char*> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const size_t capacity = reinterpret_cast<Header*>(base)->capacity;
      blocks_.push_back(Block{base, capacity});
      cached_ += capacity;
      while (cached_ > limit && blocks_.size() > 1) {
        evicted.push_back(blocks_.front().base);
        cached_ -= blocks_.front().capacity;
        blocks_.erase(blocks_.begin());
      }
    }
    for (char* b : evicted) reinterpret_cast<Header*>(b)->base_deleter(b);
  }
  int64_t hits() const { return hits_.load(); }

 private:
  struct Block {
    char* base;
    size_t capacity;
  };
  std::mutex mutex_;
  std::vector<Block> blocks_;  // oldest first
  size_t cached_ = 0;
  std::atomic<int64_t> hits_{0};
};

LargeBlockCache& large_blocks() {
  // Never destroyed: tensors freed during the process's exit still return here.
  static LargeBlockCache* cache = new LargeBlockCache();
  return *cache;
}

void release(void* ptr) {
  if (!ptr) return;
  char* base = static_cast<char*>(ptr) - kHeader;
  const Header h = *reinterpret_cast<Header*>(base);
  g_live.fetch_sub(h.bytes);
  if (h.capacity >= kCachedBlock) {
    large_blocks().give_back(base, static_cast<size_t>(g_most.load()));
    return;
  }
  h.base_deleter(base);
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) override {
    const c10::Device device(c10::DeviceType::CPU);
    if (n + kHeader >= kCachedBlock) {
      if (char* base = large_blocks().take(n + kHeader)) {
        reinterpret_cast<Header*>(base)->bytes = static_cast<int64_t>(n);
        add(static_cast<int64_t>(n));
        return c10::DataPtr(base + kHeader, base + kHeader, &release, device);
      }
    }
    c10::DataPtr inner = base_->allocate(n + kHeader);
    char* base = static_cast<char*>(inner.get());
    // LibTorch's CPU allocator keeps the data pointer as the context: take it over. Another
    // allocator's memory is handed out as it is, uncounted.
    if (!base || inner.get_context() != base) return inner;
    *reinterpret_cast<Header*>(base) =
        Header{static_cast<int64_t>(n), n + kHeader, inner.get_deleter()};
    inner.release_context();
    add(static_cast<int64_t>(n));
    return c10::DataPtr(base + kHeader, base + kHeader, &release, inner.device());
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
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThreshold));  // glibc's largest
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
int64_t large_cpu_block_reuses() { return large_blocks().hits(); }

}  // namespace loom::runtime
