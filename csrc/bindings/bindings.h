// Shared declarations of the pybind11 binding files (one per core subsystem).
#pragma once

#include "remote.h"

#include <pybind11/pybind11.h>

#include <memory>

struct ggml_tensor;

namespace superggml {

struct prefetch_stats;
struct pool_stats;
struct pager_stats;
struct kv_stats;
struct loader_stats;
struct expert_cache_stats;

// A ggml tensor seen from Python; `owner` keeps its context (or store) alive.
struct tensor_ref {
    ggml_tensor * t = nullptr;
    std::shared_ptr<void> owner;
};

// The one conversion of each stats struct to the dict its stats() returns
// (defined in the binding file of its subsystem).
pybind11::dict to_dict(const prefetch_stats & s);
pybind11::dict to_dict(const pool_stats & s);
pybind11::dict to_dict(const pager_stats & s);   // the pager's own counts (LayerPager.stats() adds I/O ones)
pybind11::dict to_dict(const kv_stats & s);
pybind11::dict to_dict(const loader_stats & s);
pybind11::dict to_dict(const expert_cache_stats & s);

// The writer of content-addressed ranges (remote.h) that every weight store, layer pager and prefetcher made
// from Python is handed: csrc/rpc/rpc-content.h's content_write (defined in rpc.cpp, the RPC module's binding).
range_writer content_writer();

void init_errors(pybind11::module_ & m);
void init_gguf_file(pybind11::module_ & m);
void init_weight_store(pybind11::module_ & m);
void init_graph(pybind11::module_ & m);
void init_host_reserve(pybind11::module_ & m);
void init_ops(pybind11::module_ & m);
void init_buffer_pool(pybind11::module_ & m);
void init_prefetch(pybind11::module_ & m);
void init_pager(pybind11::module_ & m);
void init_telemetry(pybind11::module_ & m);
void init_expert_cache(pybind11::module_ & m);
void init_kv_cache(pybind11::module_ & m);
void init_io(pybind11::module_ & m);
void init_content_hash(pybind11::module_ & m);
void init_weight_loader(pybind11::module_ & m);
void init_rpc(pybind11::module_ & m);

}  // namespace superggml
