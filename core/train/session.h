// One run of a job config, set up the same way for every face that starts one: `parallax train`
// (in-process ranks, or this process's rank under mpirun), the Python module's parallax.Job and
// the workbench's job bar. A key means the same wherever the config came from.
//
// What a session does, in order:
//   1. checks every output the config writes (output.dir's run file, checkpoint.dir,
//      output.export_llmc, a dump) and that the run fits in memory, before anything is computed;
//   2. locks the folders it writes (by one process of an MPI job), so that a second run into
//      them stops instead of writing over this one's files; a dead process's lock is taken over
//      and the options' note says so;
//   3. opens the run file (<output.dir>/run.h5: run_file_path) when output.run_file is on, as an
//      observer of world rank 0 beside the face's own;
//   4. runs the ranks, on each of which the rank's guards attach the run-time monitors the
//      config asks for: resume and checkpoints, the fault injector, the replica check, the spike
//      guard and the FP8 drift monitor (rank_guards.h); and the probe recorder when the face
//      asks for probes;
//   5. lets go of its folders and its run file when the run ends: at once when it fails or is
//      finished (release), at the latest when the session is destroyed.
//
// Index
//   SessionOptions   what a face adds: its observers and hooks, a dump, probes, its notes
//   RunSession       the session: run (in-process, to the end), run_rank (MPI), start (paused
//                    between steps: SteppedRun), release
#pragma once
#include "core/base/config.h"
#include "core/comm/comm.h"
#include "core/train/job.h"
#include "core/train/runner.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace px {

class FolderLock;        // core/io/output_paths.h
class ProbeRecorder;     // core/train/probe_recorder.h
class RunFileObserver;   // core/train/run_file_observer.h
class SteppedRun;        // core/train/stepped_run.h

struct SessionOptions {
    std::vector<Observer*> observers;  // the face's own, on world rank 0 (a console, a job view)
    RunHooks hooks;                    // the face's own, on every rank (a tracer, a dump)
    std::string dump;                  // parallax train --dump: an output checked in step 1
    // Probes recorded on every rank into one recorder (probes()), at steps 1, 1 + stride, ...
    std::vector<std::string> probes;
    i64 probe_stride = 1;
    // Under mpirun: this process is one rank of the job, and `ranks_on_node` of them share its
    // node's memory; only world rank 0 writes the run file and holds the locks. 0: the job runs
    // on in-process ranks (threads).
    int ranks_on_node = 0;
    bool writer = true;  // this process writes the run file and holds the locks
    // Told, in a sentence, when a dead process's folder lock is taken over (default: stderr).
    std::function<void(const std::string&)> note;
};

class RunSession {
public:
    // Steps 1-3 (ConfigError naming the key or the folder, before any rank starts).
    RunSession(const Config& cfg, SessionOptions opt);
    ~RunSession();
    RunSession(const RunSession&) = delete;
    RunSession& operator=(const RunSession&) = delete;

    const Config& config() const { return cfg_; }
    // Trains the layout's in-process ranks to train.steps (run_layout), then releases.
    void run();
    // This process's rank of an MPI job, on `world` (run_rank; train.threads shares the node's
    // cores among its ranks), then releases. A rank that fails first fails the world's
    // communicator, so that the other ranks stop waiting for it.
    void run_rank(comm::Communicator& world);
    // The in-process ranks, built and paused before their first step (stepped_run.h). The
    // session holds the run; release() once it ended.
    SteppedRun& start();
    SteppedRun* stepped() { return stepped_.get(); }
    ProbeRecorder* probes() { return probes_.get(); }  // null: none asked
    // Lets go of the folders and the run file. A running run's ranks must have ended (run and
    // run_rank release on their own; a stepped run once finished or failed).
    void release();

private:
    RunHooks hooks() const;  // the probe recorder's, then the face's
    std::vector<Observer*> observers() const;

    Config cfg_;
    SessionOptions opt_;
    std::vector<std::unique_ptr<FolderLock>> locks_;
    std::unique_ptr<RunFileObserver> run_file_;
    std::unique_ptr<ProbeRecorder> probes_;
    std::unique_ptr<SteppedRun> stepped_;  // last: destroyed first, while what its ranks use lives
};

}  // namespace px
