// Errors. Library code throws; it never calls exit() or abort() on bad input.
//
//   Error        base class: a sentence that says what was wrong, where, and what to do
//   ConfigError  a job config key is unknown, mistyped or out of range (names the key)
//   DataError    a data or checkpoint file is malformed (names the file)
//   CorruptionError  silent data corruption that a re-run reproduced (names the ranks and step)
//   Cancelled    long work stopped between steps because its caller asked (core/train/runner.h
//                Cancel): not a failure
//   PX_ASSERT    an internal invariant; violated means a bug in Parallax, not bad input
#pragma once
#include <stdexcept>
#include <string>

namespace px {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};
struct ConfigError : Error {
    using Error::Error;
};
struct DataError : Error {
    using Error::Error;
};
struct CorruptionError : Error {
    using Error::Error;
};
// Work that checks a Cancel (validation, recording a trace) stopped after a step because its
// caller asked it to; what it made so far is dropped. Not a failure of the work.
struct Cancelled : Error {
    using Error::Error;
};
struct InternalError : Error {
    using Error::Error;
};
// An output that could not be written: its file system is full or failing. What was written
// before stays whole (the writers leave no half-written file in its place).
struct StorageError : Error {
    using Error::Error;
};

[[noreturn]] void assert_failed(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace px

#define PX_ASSERT(cond, msg)                                                                       \
    do {                                                                                           \
        if (!(cond)) ::px::assert_failed(#cond, __FILE__, __LINE__, (msg));                        \
    } while (0)
