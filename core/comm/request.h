// One operation as data: its kind (Op), the elements it moves (Dtype), how a reducing one adds
// (Algo), and the Request that carries them to a backend. The vocabulary shared by the
// Communicator (core/comm/comm.h, which includes this header), its backends and its accounting
// (core/comm/stats.h).
//
// Index
//   Algo, algo_for        canonical (bitwise mode) or ring (fast mode), for reducing collectives
//   chunk_lo              where chunk c starts when an algorithm cuts a buffer into p chunks
//   Dtype, dtype_of       element types a collective moves: f32, f64, i64; b16, b8 (bits only)
//   Op, op_name           the kinds of operation; labels of the accounting table
//   Request               one operation as plain data: what a backend receives
#pragma once
#include "core/base/numerics.h"  // Mode
#include "core/base/shapes.h"    // i64

#include <cstdint>
#include <iterator>
#include <string>
#include <type_traits>
#include <vector>

namespace px::comm {

// ---- algorithms and element types ------------------------------------------------------------

enum class Algo : std::uint8_t { canonical, ring };
inline Algo algo_for(Mode mode) {
    return mode == Mode::bitwise ? Algo::canonical : Algo::ring;
}
const char* algo_name(Algo algo);  // "canonical", "ring"

// First element of chunk c when n elements are cut into p chunks [lo(c), lo(c+1)) whose sizes
// differ by at most 1: the chunks of all_reduce's reduce-scatter phase, for both algorithms.
inline i64 chunk_lo(i64 n, int p, int c) {
    return n * c / p;
}

// f32, f64, i64: any collective. b16 and b8 are 16- and 8-bit floats (bf16, fp16; fp8 e4m3, e5m2)
// moved as their bits: every collective that moves data (pipeline messages, sequence-parallel
// gathers, ZeRO-3 gathers of a cast weight), none that adds. The numerics contract sums in fp32
// (docs/numerics.md), so a 16-bit tensor's partial sums travel as f32 and are rounded once after.
enum class Dtype : std::uint8_t { f32, f64, i64, b16, b8 };
const char* dtype_name(Dtype dt);  // "f32", "f64", "i64", "b16", "b8"
i64 dtype_size(Dtype dt);          // bytes per element
bool can_reduce(Dtype dt);         // f32, f64, i64

template <class T>
constexpr Dtype dtype_of() {
    if constexpr (std::is_same_v<T, float>)
        return Dtype::f32;
    else if constexpr (std::is_same_v<T, double>)
        return Dtype::f64;
    else if constexpr (std::is_same_v<T, std::uint16_t>)
        return Dtype::b16;
    else if constexpr (std::is_same_v<T, std::uint8_t>)
        return Dtype::b8;
    else {
        static_assert(
            std::is_same_v<T, i64>,
            "collectives move float, double, px::i64, or 16/8-bit floats as uint16_t/uint8_t");
        return Dtype::i64;
    }
}

// ---- operations ------------------------------------------------------------------------------

enum class Op : std::uint8_t {
    all_reduce,      // sum over ranks, in place
    all_reduce_max,  // max over ranks, in place
    reduce_scatter,  // rank r gets the sum of chunk r
    all_gather,      // every rank gets every rank's chunk, in rank order
    all_gather_v,    // the same with per-rank counts
    broadcast,       // every rank gets root's buffer
    all_to_all,      // rank r gets chunk r of every rank
    all_to_all_v,    // the same with per-pair counts
    send,            // one message to a peer (blocks until the peer received it)
    recv,            // one message from a peer
    barrier,         // no rank leaves before every rank arrived
    split,           // a new communicator per color
};
inline constexpr int kNumOps = 12;
inline constexpr const char* kOpNames[] = {
    "all_reduce", "all_reduce_max", "reduce_scatter", "all_gather", "all_gather_v", "broadcast",
    "all_to_all", "all_to_all_v",   "send",           "recv",       "barrier",      "split",
};
static_assert(std::size(kOpNames) == kNumOps, "kOpNames and Op are out of sync");
static_assert(static_cast<int>(Op::split) == kNumOps - 1, "kNumOps and Op are out of sync");
inline const char* op_name(Op op) {
    return kOpNames[static_cast<int>(op)];
}
bool is_reducing(Op op);  // all_reduce, all_reduce_max, reduce_scatter
bool is_p2p(Op op);       // send, recv

// ---- one operation as data -------------------------------------------------------------------

// What a backend receives. Element counts, never bytes. Pointers stay owned by the caller and
// must stay valid until the operation completes (return, or Handle::wait()).
struct Request {
    Op op = Op::barrier;
    Dtype dtype = Dtype::f32;
    Algo algo = Algo::canonical;  // reducing collectives only
    void* out = nullptr;          // output; all_reduce and broadcast: the buffer (== in)
    const void* in = nullptr;     // this rank's contribution
    i64 n = 0;                    // whole buffer (all_reduce, broadcast, send, recv) or per rank
    std::vector<i64> counts;      // all_gather_v: per-rank counts; all_to_all_v: in counts
    std::vector<i64> out_counts;  // all_to_all_v: out counts
    int peer = 0;                 // broadcast root, send destination, recv source
    int tag = 0;                  // send/recv
    int color = 0, key = 0;       // split
    std::string name;             // split: the new group's name
};

}  // namespace px::comm
