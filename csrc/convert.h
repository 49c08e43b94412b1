// convert: rows of any ggml weight type to F32 or F16, with ggml's own type
// traits (the to_float of each quantized type: the numbers ggml's kernels
// see), for stacks that compute on the bytes outside ggml.
#pragma once

#include "error.h"

#include <cstddef>
#include <cstdint>

namespace superggml {

// Bytes of `n_rows` rows of `row_len` elements of `type`. Throws Error if
// row_len is not a multiple of the type's block size.
size_t rows_bytes(int type, int64_t n_rows, int64_t row_len);

// Converts `n_rows` rows of `row_len` elements from `src` (bytes of
// `src_type`, rows back to back) to `dst` (`dst_type`: F32 or F16, rows back
// to back), on up to `n_threads` threads. Throws Error for a destination type
// other than F32/F16, a source type ggml cannot convert (I32, I64) or a row
// length that is not a multiple of the block size; nothing is written then.
void convert_rows(int src_type, const void * src, int64_t n_rows, int64_t row_len, int dst_type, void * dst,
                  int n_threads = 1);

}  // namespace superggml
