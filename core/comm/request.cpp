// The names and sizes of an operation's vocabulary (core/comm/request.h).
#include "core/comm/request.h"

namespace px::comm {

const char* algo_name(Algo algo) {
    return algo == Algo::canonical ? "canonical" : "ring";
}

const char* dtype_name(Dtype dt) {
    switch (dt) {
        case Dtype::f32:
            return "f32";
        case Dtype::f64:
            return "f64";
        case Dtype::i64:
            return "i64";
        case Dtype::b16:
            return "b16";
        case Dtype::b8:
            return "b8";
    }
    return "?";
}

i64 dtype_size(Dtype dt) {
    switch (dt) {
        case Dtype::f32:
            return 4;
        case Dtype::f64:
            return 8;
        case Dtype::i64:
            return 8;
        case Dtype::b16:
            return 2;
        case Dtype::b8:
            return 1;
    }
    return 0;
}

bool can_reduce(Dtype dt) {
    return dt == Dtype::f32 || dt == Dtype::f64 || dt == Dtype::i64;
}

bool is_reducing(Op op) {
    return op == Op::all_reduce || op == Op::all_reduce_max || op == Op::reduce_scatter;
}

bool is_p2p(Op op) {
    return op == Op::send || op == Op::recv;
}

}  // namespace px::comm
