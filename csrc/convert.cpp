#include "convert.h"

#include <ggml.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace superggml {

static ggml_type checked(int type) {
    if (type < 0 || type >= GGML_TYPE_COUNT || ggml_blck_size((ggml_type) type) == 0) {
        throw Error("unknown ggml type " + std::to_string(type));
    }
    return (ggml_type) type;
}

size_t rows_bytes(int type, int64_t n_rows, int64_t row_len) {
    const ggml_type t = checked(type);
    if (n_rows < 0 || row_len < 0) throw Error("negative row count or length");
    if (row_len % ggml_blck_size(t)) {
        throw Error("row length " + std::to_string(row_len) + " is not a multiple of " + ggml_type_name(t) +
                    "'s block size " + std::to_string(ggml_blck_size(t)));
    }
    return (size_t) n_rows * ggml_row_size(t, row_len);
}

void convert_rows(int src_type, const void * src, int64_t n_rows, int64_t row_len, int dst_type, void * dst,
                  int n_threads) {
    const ggml_type st = checked(src_type), dt = checked(dst_type);
    if (dt != GGML_TYPE_F32 && dt != GGML_TYPE_F16) {
        throw Error(std::string("cannot convert to ") + ggml_type_name(dt) + ": F32 or F16 only");
    }
    const size_t src_row = rows_bytes(st, 1, row_len);
    const ggml_to_float_t to_float = ggml_get_type_traits(st)->to_float;
    if (st != GGML_TYPE_F32 && !to_float) throw Error(std::string("ggml cannot convert ") + ggml_type_name(st) + " to float");
    const size_t dst_row = (size_t) row_len * ggml_type_size(dt);
    auto run = [&](int64_t r0, int64_t r1) {
        std::vector<float> tmp(dt == GGML_TYPE_F16 ? (size_t) row_len : 0);
        for (int64_t r = r0; r < r1; ++r) {
            const uint8_t * s = static_cast<const uint8_t *>(src) + r * src_row;
            uint8_t * d = static_cast<uint8_t *>(dst) + r * dst_row;
            if (st == dt) {
                std::memcpy(d, s, src_row);
                continue;
            }
            float * f = dt == GGML_TYPE_F32 ? reinterpret_cast<float *>(d) : tmp.data();
            if (st == GGML_TYPE_F32) std::memcpy(f, s, src_row); else to_float(s, f, row_len);
            if (dt == GGML_TYPE_F16) ggml_fp32_to_fp16_row(f, reinterpret_cast<ggml_fp16_t *>(d), row_len);
        }
    };
    const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(n_threads, n_rows / 16));
    if (nt == 1) {
        run(0, n_rows);
        return;
    }
    std::vector<std::thread> ts;
    const int64_t per = (n_rows + nt - 1) / nt;
    for (int64_t i = 0; i < nt; ++i) ts.emplace_back(run, std::min(n_rows, i * per), std::min(n_rows, (i + 1) * per));
    for (auto & t : ts) t.join();
}

}  // namespace superggml
