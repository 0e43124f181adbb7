#include "exec/runtime/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>

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

// Sizes and base deleters of live counted allocations, by pointer. LibTorch's raw_allocate
// needs a DataPtr whose context is its data pointer, so the size cannot travel in the context.
struct Ledger {
  std::mutex mutex;
  std::unordered_map<void*, std::pair<int64_t, c10::DeleterFnPtr>> live;
};

Ledger& ledger() {
  static Ledger* l = new Ledger();  // never destroyed: tensors may be freed during exit
  return *l;
}

void release(void* ptr) {
  if (!ptr) return;
  std::pair<int64_t, c10::DeleterFnPtr> entry{0, nullptr};
  {
    Ledger& l = ledger();
    std::lock_guard<std::mutex> lock(l.mutex);
    auto it = l.live.find(ptr);
    if (it == l.live.end()) return;
    entry = it->second;
    l.live.erase(it);
  }
  g_live.fetch_sub(entry.first);
  if (entry.second) entry.second(ptr);
}

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) const override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    // LibTorch's CPU allocator keeps the data pointer as the context: take it over.
    if (!data || inner.get_context() != data) return inner;
    const c10::DeleterFnPtr base_deleter = inner.get_deleter();
    const c10::Device device = inner.device();
    inner.release_context();
    {
      Ledger& l = ledger();
      std::lock_guard<std::mutex> lock(l.mutex);
      l.live[data] = {static_cast<int64_t>(n), base_deleter};
    }
    add(static_cast<int64_t>(n));
    return c10::DataPtr(data, data, &release, device);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

 private:
  c10::Allocator* base_;
};

}  // namespace

void track_cpu_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
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
