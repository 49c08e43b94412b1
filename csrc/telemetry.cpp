#include "telemetry.h"

#include "remote.h"

#include "ggml-backend.h"

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <sstream>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <unistd.h>
#include <unordered_map>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace superggml {

// A small file's text by read(2) until EOF (procfs and cgroupfs files report a size of 0).
static std::string read_text(const std::string & path) {
    std::string out;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return out;
    char buf[16384];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n > 0) { out.append(buf, (size_t) n); continue; }
        if (n < 0 && errno == EINTR) continue;
        break;
    }
    ::close(fd);
    return out;
}

static uint64_t read_u64(const std::string & path) {
    std::istringstream f(read_text(path));
    std::string s;
    if (!(f >> s) || s == "max") return 0;
    try { return std::stoull(s); } catch (...) { return 0; }
}

// kB value of `key` in a /proc file of "Key:   123 kB" lines, in bytes
static uint64_t proc_kb(const std::string & path, const std::string & key) {
    std::istringstream f(read_text(path));
    std::string line;
    while (std::getline(f, line)) {
        if (line.compare(0, key.size(), key) == 0 && line.size() > key.size() && line[key.size()] == ':') {
            std::istringstream is(line.substr(key.size() + 1));
            uint64_t v = 0;
            is >> v;
            return v * 1024;
        }
    }
    return 0;
}

// The `key value` lines of a cgroup memory.stat file (read once per call).
static std::unordered_map<std::string, uint64_t> read_stat(const std::string & path) {
    std::unordered_map<std::string, uint64_t> m;
    std::istringstream f(read_text(path));
    std::string k;
    uint64_t v;
    while (f >> k >> v) m[k] = v;
    return m;
}

// Clean page cache nothing maps: `file` less mapped, dirty, writeback and shmem
// (the key names differ between v1 and v2).
static uint64_t clean_cache(const std::unordered_map<std::string, uint64_t> & st, const char * file,
                            const char * mapped, const char * dirty, const char * writeback, const char * shmem) {
    auto get = [&](const char * k) { auto it = st.find(k); return it == st.end() ? 0 : it->second; };
    const uint64_t pinned = get(mapped) + get(dirty) + get(writeback) + get(shmem);
    const uint64_t c = get(file);
    return c > pinned ? c - pinned : 0;
}

// Limit and usage of the process's memory cgroup. Usage leaves out clean
// page cache that nothing maps (the kernel drops it before reclaiming
// anything else); streaming a file through read() would otherwise look like
// memory pressure.
static void cgroup_memory(uint64_t & limit, uint64_t & usage, uint64_t & cache) {
    std::istringstream f(read_text("/proc/self/cgroup"));
    std::string line, v2;
    while (std::getline(f, line)) {
        auto a = line.find(':'), b = line.find(':', a + 1);
        if (a == std::string::npos || b == std::string::npos) continue;
        std::string ctrl = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
        if (("," + ctrl + ",").find(",memory,") != std::string::npos) {
            const std::string d = "/sys/fs/cgroup/memory" + path;
            const auto st = read_stat(d + "/memory.stat");
            limit = read_u64(d + "/memory.limit_in_bytes");
            auto hier = st.find("hierarchical_memory_limit");
            if (hier != st.end() && hier->second && hier->second < limit) limit = hier->second;   // an ancestor's binds too
            usage = read_u64(d + "/memory.usage_in_bytes");
            cache = clean_cache(st, "total_cache", "total_mapped_file", "total_dirty", "total_writeback", "total_shmem");
            if (limit >= (1ull << 62)) limit = 0;   // v1 "no limit" is a huge number
            return;
        }
        if (ctrl.empty()) v2 = path;
    }
    if (!v2.empty()) {
        const std::string d = "/sys/fs/cgroup" + v2;
        limit = read_u64(d + "/memory.max");
        usage = read_u64(d + "/memory.current");
        cache = clean_cache(read_stat(d + "/memory.stat"), "file", "file_mapped", "file_dirty", "file_writeback", "shmem");
    }
}

host_memory host_memory_info() {
    host_memory h;
    h.total = proc_kb("/proc/meminfo", "MemTotal");
    h.available = proc_kb("/proc/meminfo", "MemAvailable");
    struct sysinfo si {};
    if (h.total == 0 && ::sysinfo(&si) == 0) {
        // a sandbox whose /proc this process cannot read (measured on a lent GPU machine: every reading 0, so no
        // host tier was planned): the kernel's counters, free and buffer memory as available (page cache left out)
        h.total = (uint64_t) si.totalram * si.mem_unit;
        h.available = ((uint64_t) si.freeram + si.bufferram) * si.mem_unit;
    }
    cgroup_memory(h.cgroup_limit, h.cgroup_usage, h.cgroup_cache);
    if (h.cgroup_limit) {
        h.total = std::min(h.total ? h.total : h.cgroup_limit, h.cgroup_limit);
        const uint64_t used = h.cgroup_usage > h.cgroup_cache ? h.cgroup_usage - h.cgroup_cache : 0;
        uint64_t left = h.cgroup_limit > used ? h.cgroup_limit - used : 0;
        h.available = std::min(h.available, left);
    }
    h.process_rss = proc_kb("/proc/self/status", "VmRSS");
    h.process_peak = proc_kb("/proc/self/status", "VmHWM");
    struct rusage ru {};
    if (h.process_peak == 0 && ::getrusage(RUSAGE_SELF, &ru) == 0) h.process_peak = (uint64_t) ru.ru_maxrss * 1024;
    return h;
}

std::vector<device_memory> device_memory_info() {
    std::vector<device_memory> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        if (!remote_device_usable(d)) continue;       // a server that failed: not reached again unless re-added
        device_memory m;
        m.name = ggml_backend_dev_name(d);
        m.description = remote_device_endpoint(d);   // an RPC device: its server, not the relay ggml talks to
        if (m.description.empty()) m.description = ggml_backend_dev_description(d);
        switch (ggml_backend_dev_type(d)) {
            case GGML_BACKEND_DEVICE_TYPE_GPU: m.type = "gpu"; break;
            case GGML_BACKEND_DEVICE_TYPE_IGPU: m.type = "igpu"; break;
            case GGML_BACKEND_DEVICE_TYPE_ACCEL: m.type = "accel"; break;
            default: m.type = "cpu";
        }
        size_t free = 0, total = 0;
        ggml_backend_dev_memory(d, &free, &total);
        m.free = free;
        m.total = total;
        out.push_back(m);
    }
    return out;
}

bool host_memory_trim() {
#if defined(__GLIBC__)
    return malloc_trim(0) != 0;
#else
    return false;
#endif
}

}  // namespace superggml
