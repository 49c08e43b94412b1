#include "remote.h"

#include <atomic>

namespace superggml {

namespace {
std::atomic<std::string (*)(ggml_backend_device *)> g_endpoint{nullptr};
std::atomic<bool (*)(ggml_backend_device *)> g_usable{nullptr};
std::atomic<void (*)(ggml_backend_device *)> g_check{nullptr};
}  // namespace

void remote_devices_set(const remote_device_hooks & hooks) {
    g_endpoint.store(hooks.endpoint);
    g_usable.store(hooks.usable);
    g_check.store(hooks.check);
}

std::string remote_device_endpoint(ggml_backend_device * dev) {
    auto f = g_endpoint.load();
    return f ? f(dev) : std::string();
}

bool remote_device_usable(ggml_backend_device * dev) {
    auto f = g_usable.load();
    return f ? f(dev) : true;
}

void remote_device_check(ggml_backend_device * dev) {
    if (auto f = g_check.load()) f(dev);
}

}  // namespace superggml
