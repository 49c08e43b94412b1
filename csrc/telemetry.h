// telemetry: how much memory there is, as the process sees it.
//
// Host: /proc/meminfo (MemTotal, MemAvailable) clipped by the process's
// memory cgroup (v1 memory.limit_in_bytes / usage_in_bytes, v2 memory.max /
// memory.current): in a container /proc/meminfo shows the host, not the
// limit. Clean, unmapped page cache of the cgroup counts as available (as
// MemAvailable counts it), so streaming a file is not memory pressure.
// Devices: ggml_backend_dev_memory for every registered device.
// Never throws: a value that cannot be read is 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace superggml {

struct host_memory {
    uint64_t total = 0;          // min(MemTotal, cgroup limit)
    uint64_t available = 0;      // min(MemAvailable, limit - cgroup usage)
    uint64_t cgroup_limit = 0;   // 0: no limit found
    uint64_t cgroup_usage = 0;   // as the cgroup reports it (page cache included)
    uint64_t cgroup_cache = 0;   // of that usage: clean page cache nothing maps
    uint64_t process_rss = 0;    // VmRSS
    uint64_t process_peak = 0;   // VmHWM
    double pressure() const { return total ? 1.0 - (double) available / (double) total : 0.0; }
};

struct device_memory {
    std::string name, description, type;
    uint64_t free = 0, total = 0;
};

host_memory host_memory_info();

// Gives freed heap memory back to the system (glibc's malloc_trim). glibc
// raises its mmap threshold as large blocks are freed, so buffers of a few
// MiB end up on the heap and stay in the RSS after they are freed. Returns
// whether anything was released; a no-op (false) off glibc.
bool host_memory_trim();
std::vector<device_memory> device_memory_info();

}  // namespace superggml
