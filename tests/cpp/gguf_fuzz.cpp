// Loads every file of a directory through the C++ GGUF path (parse, validate,
// map, bind every tensor to the mapping, read its bytes back): built with
// AddressSanitizer + UndefinedBehaviorSanitizer, it proves the mutated inputs
// of tests/support/fuzz_gguf.py neither crash nor read out of bounds. Every input must
// load or throw superggml::Error.
#include "gguf-file.h"
#include "weight-store.h"

#include "ggml.h"
#include "ggml-backend.h"

#include <dirent.h>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

using namespace superggml;

int main(int argc, char ** argv) {
    if (argc < 2) { std::fprintf(stderr, "usage: gguf_fuzz DIR\n"); return 2; }
    ggml_log_set([](ggml_log_level, const char *, void *) {}, nullptr);   // the parser's complaints are expected
    DIR * d = opendir(argv[1]);
    if (!d) return 2;
    int ok = 0, rejected = 0;
    std::vector<uint8_t> buf;
    while (dirent * e = readdir(d)) {
        std::string name = e->d_name;
        if (name.size() < 5 || name.substr(name.size() - 5) != ".gguf") continue;
        const std::string path = std::string(argv[1]) + "/" + name;
        try {
            auto f = std::make_shared<gguf_file>(path);
            {
                weight_store ws(f);
                ws.bind_mmap();
                for (const auto & ti : f->tensors()) {
                    ggml_tensor * t = ws.get(ti.name);
                    buf.resize(ggml_nbytes(t));
                    ggml_backend_tensor_get(t, buf.data(), 0, buf.size());
                }
            }
            ok++;
        } catch (const Error &) {
            rejected++;
        }
    }
    closedir(d);
    std::printf("gguf_fuzz: %d loaded, %d rejected\n", ok, rejected);
    return ok + rejected > 0 ? 0 : 1;
}
