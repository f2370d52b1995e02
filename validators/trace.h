// Golden traces (docs/validation.md): the single-device reference's probes recorded to one HDF5
// file, so that a layout — on a cluster, under mpirun — is checked against it later without running
// the reference (parallax record, parallax validate --golden).
//
// Index
//   TraceInfo       what a trace holds besides its tensors: config, patterns, stride, steps, order
//   write_trace     a recorder's probes to a file (atomically: temporary file, rename)
//   record_trace    runs a config on the single device with probes and writes its trace
//   TraceReader     opens and checks a trace; reads one probe's logical tensor (checksum verified)
//   data_fingerprint    a hash of the tokens a config's data source gives for some steps
//   check_trace_config  a run's config computes what the trace's did (model, train, data, numerics)
//                       and its data source gives the trace's tokens
//   GoldenResult    the first probe where a rank's piece differs from the trace
//   compare_to_trace    recorders (one per rank) against a trace, in the trace's order
//   combine_golden      every process's result, combined over the world (mpirun)
//
// File (format "parallax-trace", format_version 1; HDF5 1.8 format, compact groups, fixed-length
// strings, as checkpoints, core/io/checkpoint.h):
//   /                                  attributes: format, format_version, created, config (the
//                                      job's TOML), patterns (newline-joined globs), stride, steps,
//                                      data_hash (data_fingerprint; absent in older traces)
//   /order                             uint8: probe names in the reference's order of execution,
//                                      newline-joined
//   /probes/<step>/<phase>/<layer>/<op>/<tensor>   float32 in the probe's logical shape (the
//                                      probe name is the path), attribute checksum (uint64, the
//                                      checkpoint checksum of its elements)
// Optional, written by other recorders (the PyTorch recorder, parallax.torch):
//   / attributes source ("parallax" when absent, or "torch"), precision ("fp32", "bf16", "fp16",
//                "fp8"; absent: the config's), layout (JSON: {"world": N, "axes": {"dp": ..,
//                "fsdp": .., "tp": .., "pp": ..}, "ranks": [{"dp": 0, "tp": 0, "pp": 0}, ...]};
//                "" or
//                absent: one device); a torch trace's config is ""
//   /pieces      uint8: newline-joined lines "<probe>\t<rank>\t<lo,lo,..>\t<hi,hi,..>", the
//                hyperslab of each probe each rank held
//   /replicas/<probe>/<rank>   float32: a rank's piece that differs, bit for bit, from the
//                logical tensor in /probes (assembled from the lowest rank holding each element),
//                attributes lo, hi (int64 arrays, the slab) and checksum
#pragma once
#include "core/base/config.h"
#include "core/train/runner.h"
#include "validators/compare.h"
#include "core/train/probe_recorder.h"

#include <memory>
#include <string>
#include <vector>

namespace px {

namespace comm {
class Communicator;
}

struct TraceInfo {
    std::string config_toml;
    std::vector<std::string> patterns;
    i64 stride = 1, steps = 0;
    std::vector<std::string> order;  // probe names, the reference's order of execution
    std::string data_hash;  // data_fingerprint of the recorded steps ("0x..."); "": not recorded
    std::string source = "parallax";  // who recorded it: "parallax" or "torch"
    std::string precision;            // "fp32", "bf16", "fp16", "fp8"; "": the config's
    std::string layout_json;          // the recording layout's ranks (format above); "": one device
};

// A rank's hyperslab of a probe, as /pieces lists it; with its values when it is a replica that
// differs from the logical tensor (/replicas).
struct TracePiece {
    int rank = 0;
    Hyperslab slab;
    std::vector<float> values;  // only for TraceReader::replicas
};

// A hash of the tokens (inputs and targets) of every sequence of steps 1..steps of cfg's data
// source: two machines whose libm draws another Markov table, or whose data file differs, give
// different ones. "0x" and 16 hex digits.
std::string data_fingerprint(const Config& cfg, i64 steps);

// Throws DataError naming the file when it cannot be written.
void write_trace(const std::string& path, const ProbeRecorder& rec, const TraceInfo& info);
// cfg on the single device for `steps` steps, probes `patterns` every `stride` steps; returns the
// bytes of tensors written. Microbatch gradients ("mgrad") are left out: they are cut as the
// recording run's microbatches are, which a layout under test need not share. `cancel` is asked
// after every step: true throws Cancelled before anything is written.
i64 record_trace(const Config& cfg, const std::vector<std::string>& patterns, i64 stride, i64 steps,
                 const std::string& path, const Cancel& cancel = {});

class TraceReader {
public:
    explicit TraceReader(const std::string& path);  // DataError naming the file and the problem
    ~TraceReader();
    TraceReader(const TraceReader&) = delete;
    TraceReader& operator=(const TraceReader&) = delete;

    const TraceInfo& info() const;
    const std::string& path() const;
    // One probe's logical tensor; DataError when it is missing or its checksum does not verify.
    std::vector<float> read(const std::string& name, std::vector<i64>* shape) const;
    // Which rank held which slab of the probe (/pieces); empty when the trace does not say.
    const std::vector<TracePiece>& pieces(const std::string& name) const;
    // The ranks' pieces of the probe that differ from its logical tensor (/replicas), checksums
    // verified; empty when none do.
    std::vector<TracePiece> replicas(const std::string& name) const;

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

// The run's config must compute what the trace's did: the same [model], [train] (threads aside),
// [data] and numerics.block; the layout and numerics.mode may differ. ConfigError naming the
// section and the trace otherwise. Then this machine's data source must give the trace's tokens
// (data_fingerprint, when the trace has one): DataError otherwise, since no layout could match.
void check_trace_config(const TraceInfo& trace, const Config& cfg, const std::string& path);

struct GoldenResult {
    i64 probes = 0;            // probes compared (each over every rank's pieces)
    std::int64_t max_ulp = 0;  // over every element compared (kNoUlp: a NaN mismatch)
    i64 first_order = -1;      // index in the trace's order of the first differing probe; -1: none
    int rank = -1;             // the rank whose piece differs there
    Comparison first;          // in logical coordinates; name: the probe
    i64 missing = 0;           // probes of the trace that no rank recorded
    // whole: probes of which some elements no rank's pieces hold (they were not compared), and
    // the first of them.
    i64 partial = 0;
    std::string partial_probe;
};

// ranks[k] recorded world rank (rank0 + k). Every probe of the trace, in order, against every
// recorder's pieces of it, each piece where it sits in the logical tensor (validators/pieces.h).
// whole: the recorders are every rank of the layout, so together they must cover each probe
// they record (false under mpirun, where a process holds one rank's).
GoldenResult compare_to_trace(const TraceReader& trace,
                              const std::vector<const ProbeRecorder*>& ranks, int rank0 = 0,
                              bool whole = true);

// One process per rank (mpirun): this rank's result `mine` (compare_to_trace of its recorder
// `rec`) combined over `world`, a collective: the earliest differing probe over the ranks (then
// the lowest rank), with its Comparison sent to rank 0 (only rank 0's `first` is filled); the
// worst distance; the probes compared; and, when nothing differs, the trace's probes that no
// rank recorded.
GoldenResult combine_golden(const GoldenResult& mine, const TraceReader& trace,
                            const ProbeRecorder& rec, comm::Communicator& world);

}  // namespace px
