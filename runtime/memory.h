// Live tensor bytes on the CPU, measured: an allocator that wraps LibTorch's CPU allocator and
// counts bytes allocated minus bytes freed, with the peak since the last reset. LibTorch keeps
// one allocator per device type for the whole process, so this is process-wide by nature: one
// rank per process (loomrun, mpirun) measures one rank. Freed blocks of 1 MiB and more are kept
// for the next allocation of their size (runtime/memory.cc), so a step does not page-fault its
// largest tensors in again; they count as live only while a tensor holds them.
#pragma once

#include <cstdint>

namespace loom::runtime {

// Puts the counting allocator in front of LibTorch's CPU allocator (once; later calls do
// nothing). Tensors allocated before are not counted when freed.
void track_cpu_memory();
bool cpu_memory_tracked();

int64_t live_cpu_bytes();
int64_t peak_cpu_bytes();     // the most live bytes since the last reset
void reset_peak_cpu_bytes();  // the peak restarts from the bytes live now

// How many allocations of 1 MiB or more took a freed block back from the cache.
int64_t large_cpu_block_reuses();

}  // namespace loom::runtime
