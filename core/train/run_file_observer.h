// The run file of a training run, written as the job's steps finish (docs/files.md; the file's
// layout is core/io/runfile.h's).
#pragma once
#include "core/base/config.h"
#include "core/io/runfile.h"
#include "core/train/job.h"

#include <memory>
#include <string>
#include <vector>

namespace px {

// Writes the metrics to <dir>/run.h5 (docs/files.md; core/io/runfile.h, implemented there). Nothing
// is opened before the run starts. A fresh run (steps_done() == 0) creates the file, replacing an
// old one. A resumed run (steps_done() == k) continues the run file that is there: its rows after
// step k are dropped and a "resume" event is logged; when there is none (or it is not a run file)
// a new one starts with the k restored steps of history(). A run file that is there but cannot be
// opened read-write is an error, never replaced. A step reported again (a re-run) replaces its
// rows and drops the later ones. Either way the file holds each step once, in order, with its
// latest values; it is flushed after every step and closed at the run's end (on_end). Named
// values (on_values) are metrics of their own. Events reported through the job (alerts, spikes)
// go to /events as they come, with their evidence; the FP8 drift monitor's rows of a step go to
// /fp8 with that step's metrics (replaced alike when the step is run again).
class RunFileObserver : public Observer {
public:
    RunFileObserver(const std::string& path, const Config& cfg);  // opens nothing yet
    ~RunFileObserver() override;
    void on_start(const RunView& run) override;
    void on_values(const RunView& run, i64 step, const std::vector<NamedValue>& values) override;
    void on_step(const RunView& run, const StepMetrics& m) override;
    void on_end(const RunView& run) override;
    void on_event(const RunView& run, const RunEvent& e) override;
    void on_fp8(const RunView& run, const std::vector<Fp8Stat>& rows) override;

private:
    void begin_step(i64 step);         // a re-run step drops the rows from it on, once
    void resume();                     // opens the file of a resumed run (at its first step)
    void write(const StepMetrics& m);  // one step's rows

    std::string path_, config_toml_;
    CheckpointConfig checkpoint_;        // where a resume came from, for its event
    std::unique_ptr<RunFile> file_;
    std::vector<StepMetrics> restored_;  // a resumed run's history until the file is open
    i64 last_step_ = 0;                  // the last step written (or restored)
    std::vector<Fp8Stat> fp8_;           // the monitor's rows of the step being reported
};

}  // namespace px
