// The machine's fp32 FMA peak, measured: independent FMA chains in registers on every thread.
// Benchmarks report their rates as a share of this figure taken in the same run, because the
// host's speed drifts by tens of percent between runs.
#pragma once
#include "core/base/numerics.h"

namespace px::bench {

// GFLOP/s (2 flops per lane per FMA) of `threads` threads running the widest FMA `isa` has.
double fp32_fma_peak_gflops(int threads, Isa isa);

}  // namespace px::bench
