// Run-twice determinism and checkpoint-resume checks (docs/validation.md): a job run twice in one
// process under one layout must end in the same bits, and a run interrupted after step k and
// resumed from its checkpoint (under the same layout or another) must end in the bits of the
// uninterrupted run. Both compare final LogicalStates tensor by tensor (validators/compare.h).
//
// Index
//   StateCheck          the comparisons of two runs, the verdict, notes
//   run_state           the final logical state of a config, whatever its layout (in-process ranks)
//   check_determinism   a config run twice, compared
//   check_resume        N steps uninterrupted vs k steps, checkpoint, resume (maybe reconfigured)
//
// Both checks run the config as a validator would: without a run file, progress, llm.c export or
// the config's own checkpoint settings (the resume check sets its own, in a temporary folder that
// it removes). Under an MPI launch they are not available: they run the layout on in-process ranks.
#pragma once
#include <cstdint>
#include "core/base/config.h"
#include "core/io/state.h"
#include "validators/compare.h"

#include <string>
#include <vector>

namespace px {

struct StateCheck {
    std::string what;                     // "determinism: ..." / "resume: ..."
    std::vector<Comparison> comparisons;  // every tensor (compare_states' order)
    std::vector<std::string> notes;       // e.g. replicas that disagreed while gathering a state
    bool equal() const;                   // every comparison bitwise equal and no note
    std::vector<const Comparison*> differing() const;  // the comparisons that are not equal
    std::string text() const;  // the header, one line per differing tensor, the verdict
};

// The config as the checks run it: no run file, no progress, no llm.c export, no checkpoints.
Config validator_config(const Config& cfg);

// Trains cfg (on world_size(cfg.layout) in-process ranks; pipeline layouts too) and gathers its
// final logical state. `note` (when given) receives a sentence if ranks disagreed while gathering.
LogicalState run_state(const Config& cfg, std::string* note = nullptr);

// cfg run twice in this process under its layout; the second state compared with the first.
StateCheck check_determinism(const Config& cfg);

// The uninterrupted run of cfg (train.steps = N) against a run that writes a checkpoint after
// step `at` (1 <= at < N; kHalfway: N / 2) into a temporary folder and a run of `resumed` that starts
// from that checkpoint and ends at N. `resumed` is cfg with, e.g., another layout. Another model
// or train.steps is a ConfigError (before anything runs); anything else that makes the
// checkpoint unusable (e.g. another data stream) throws the checkpoint reader's error (naming
// the file and what differs), and a change the reader accepts (e.g. train.lr) shows up as
// differing tensors. `scratch`: the
// folder for the checkpoint ("": a fresh one under the system's temporary directory); removed
// afterwards.
inline constexpr i64 kHalfway = INT64_MIN;  // check_resume's default step: train.steps / 2
StateCheck check_resume(const Config& cfg, i64 at, const Config& resumed,
                        const std::string& scratch = "");
StateCheck check_resume(const Config& cfg, i64 at = kHalfway);  // resumed under cfg itself


}  // namespace px
