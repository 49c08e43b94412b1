// superggml core errors. Every failure of the core surfaces as one of these
// C++ exceptions; the bindings turn them into Python exceptions.
#pragma once

#include <stdexcept>
#include <string>

namespace superggml {

// Generic core failure (superggml.SuperggmlError in Python).
struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The GGUF file is malformed, truncated or inconsistent (superggml.GGUFError).
struct GGUFError : Error {
    using Error::Error;
};

// A file could not be opened, read or written: the message names it and the
// offset; `err` is the errno (OSError(errno, message) in Python, which picks
// FileNotFoundError and the other subclasses).
struct FileError : Error {
    int err;
    FileError(const std::string & msg, int err) : Error(msg), err(err) {}
};

// A device (an RPC server: csrc/rpc/) failed or cannot be reached (superggml.DeviceError, a ConnectionError).
struct DeviceError : Error {
    using Error::Error;
};

}  // namespace superggml
