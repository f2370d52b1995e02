// parallax train [CONFIG] [--set section.key=value ...] [--out DIR] [--dump F.h5]
// Under `mpirun -np N` (or srun) this process is one rank of the layout: rank 0 prints progress
// and writes the run file and the dump; the other ranks are quiet.
#include "app/commands.h"
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/comm/mpi.h"
#include "core/io/output_paths.h"
#include "core/io/runfile.h"
#include "core/io/state.h"
#include "core/model/data.h"
#include "core/train/job.h"
#include "core/train/memory.h"
#include "core/train/runner.h"
#include "core/train/session.h"
#include "kernels/ops.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <utility>
#include <string>
#include <vector>

namespace px::app {

namespace {

// Why the ranks' states disagree when a dump merges them: an injected fault that nothing re-ran
// (the replica check is off) leaves the replicas apart, which is the fault's doing, not a bug.
[[noreturn]] void disagreement(const Config& cfg, const std::string& where) {
    if (cfg.fault.kind == "flip_grad" || cfg.fault.kind == "flip_weight")
        throw CorruptionError(
            "the ranks' states disagree" + where + ": fault.kind = \"" + cfg.fault.kind +
            "\" flipped a bit on world rank " + std::to_string(cfg.fault.rank) + " at step " +
            std::to_string(cfg.fault.step) +
            " and nothing re-ran it, so the replicas hold different weights and the dump, one "
            "logical state, is not written; set validate.replica_check_every to find and re-run "
            "the fault, or drop --dump");
    throw Error("the ranks' states disagree" + where + "; this is a bug in Parallax");
}

struct TrainOptions {
    std::string config_path;
    std::vector<std::string> sets;
    std::string fault;  // KIND[:key=value,...], shorthand for --set fault.*
    std::string out_dir;
    std::string dump;
    bool quiet = false;
};

// Prints the banner, a one-line progress bar on a terminal (plain log lines, every ~5% of the
// run, otherwise) and the summary. Under a parallel layout it observes rank 0.
class Console : public Observer {
public:
    // Which kernels and hardware path the matmuls take (ops::matmul_path): one line for the
    // activations' dtype, one for fp8's linears.
    static void print_matmul_paths(const Config& c) {
        const Numerics nx = make_numerics(c.numerics);
        const DType act = activation_dtype(c.precision);
        std::string path = ops::matmul_path(nx, Device::cpu, act);
        if (c.layout.tp > 1 && act != DType::f32)  // the tp layers widen to fp32 (tp_model.cpp)
            path = ops::matmul_path(nx, Device::cpu, DType::f32) +
                   " on widened values (tensor-parallel linears)";
        std::printf("%s matmul: %s\n", act == DType::f32 ? "fp32" : dtype_name(act), path.c_str());
        if (c.precision.fp8 != "off") {
            const std::string sums =
                c.precision.fp8_accumulator_promote > 0
                    ? "canonical GEMM, narrow accumulator (13 mantissa bits, truncated) promoted "
                      "to fp32 every " + std::to_string(c.precision.fp8_accumulator_promote) +
                          " products"
                    : ops::matmul_path(nx, Device::cpu, DType::f32);
            std::printf("fp8 matmul: %s casts to e4m3/e5m2 (%s), then %s\n", c.precision.fp8.c_str(),
                        isa_name(nx.isa), sums.c_str());
        }
    }

    Console(bool quiet, std::string run_path)
        : quiet_(quiet), tty_(isatty(fileno(stderr)) != 0), run_path_(std::move(run_path)) {}

    void on_start(const RunView& job) override {
        const Config& c = job.config();
        total_ = c.train.steps;
        t0_ = std::chrono::steady_clock::now();
        std::printf("parallax train: %s | %lld params | L=%lld C=%lld NH=%lld F=%lld V=%lld "
                    "T=%lld | batch %lld | layout dp%d zero%d, %d microbatches | %s/%s | %d "
                    "threads per rank\n",
                    c.source_name.c_str(), static_cast<long long>(job.num_params()),
                    static_cast<long long>(c.model.layers), static_cast<long long>(c.model.hidden),
                    static_cast<long long>(c.model.heads), static_cast<long long>(c.model.ffn),
                    static_cast<long long>(c.model.vocab), static_cast<long long>(c.model.seq_len),
                    static_cast<long long>(c.train.batch_size), job.dp_size(), c.layout.zero,
                    c.layout.microbatches > 0 ? c.layout.microbatches
                                              : static_cast<int>(c.train.microbatches),
                    mode_name(c.numerics.mode == Mode::fast ? Mode::fast : Mode::bitwise),
                    isa_name(make_numerics(c.numerics).isa), omp_get_max_threads());
        if (c.layout.cp > 1)
            std::printf("context parallel: cp%d, %s attention, each rank holds 2 zig-zag chunks of "
                        "%lld tokens of every sequence\n",
                        c.layout.cp, c.layout.cp_method.c_str(),
                        static_cast<long long>(c.model.seq_len / (2 * c.layout.cp)));
        if (c.layout.ep > 1)
            std::printf("expert parallel: ep%d, each group of %d consecutive dp ranks shares out "
                        "the %lld experts of every MoE layer, %lld each (all-to-all dispatch and "
                        "combine)\n",
                        c.layout.ep, c.layout.ep, static_cast<long long>(c.model.moe_experts),
                        static_cast<long long>(c.model.moe_experts / c.layout.ep));
        print_matmul_paths(c);
        if (job.entropy_rate() >= 0)
            std::printf(
                "data: %s of order %lld, entropy rate %.4f nats/token, loss floor "
                "for %lld-token windows %.4f\n",
                c.data.source == "mixture"
                    ? ("mixture of " + std::to_string(c.data.mixture_chains) + " Markov chains")
                          .c_str()
                    : "Markov chain",
                static_cast<long long>(c.data.markov_order), job.entropy_rate(),
                static_cast<long long>(c.model.seq_len), job.loss_floor());
        else if (c.data.source == "copy")
            std::printf(
                "data: copy source (each window repeats itself every %lld tokens), loss "
                "floor for %lld-token windows %.4f; a model that sees fewer than %lld "
                "tokens back cannot go below %.4f\n",
                static_cast<long long>(copy_distance(c)), static_cast<long long>(c.model.seq_len),
                job.loss_floor(), static_cast<long long>(copy_distance(c)),
                CopySource::context_floor(source_vocab(c), copy_distance(c), c.model.seq_len,
                                          copy_distance(c) - 1));
        std::fflush(stdout);
    }

    void on_step(const RunView&, const StepMetrics& m) override {
        if (m.val_loss >= 0) last_val_ = m.val_loss;
        last_loss_ = m.loss;
        tokens_ += m.tokens_per_s * m.step_ms / 1e3;
        if (quiet_) return;
        const double elapsed = seconds();
        const double eta = elapsed / static_cast<double>(m.step) * static_cast<double>(total_ - m.step);
        char val[32] = "";
        if (last_val_ >= 0) std::snprintf(val, sizeof val, " val %.4f", last_val_);
        if (tty_) {
            constexpr int kWidth = 28;
            const int filled = static_cast<int>(kWidth * m.step / total_);
            std::string bar(static_cast<size_t>(filled), '#');
            bar.resize(kWidth, '.');
            std::fprintf(stderr, "\r[%s] %lld/%lld loss %.4f%s | %.0f tok/s | eta %.0fs   ",
                         bar.c_str(), static_cast<long long>(m.step),
                         static_cast<long long>(total_), m.loss, val, m.tokens_per_s, eta);
            if (m.step == total_) std::fprintf(stderr, "\n");
        } else {
            const i64 every = std::max<i64>(1, total_ / 20);
            if (m.step % every == 0 || m.step == total_ || m.step == 1 || m.val_loss >= 0)
                std::fprintf(stderr, "step %lld/%lld loss %.4f%s grad_norm %.3f lr %.2e %.0f tok/s %.1f ms\n",
                             static_cast<long long>(m.step), static_cast<long long>(total_), m.loss,
                             val, m.grad_norm, m.lr, m.tokens_per_s, m.step_ms);
        }
        std::fflush(stderr);
    }

    // Alerts (the FP8 drift monitor's) as they come, one line each.
    void on_event(const RunView&, const RunEvent& e) override {
        if (quiet_ || e.kind != EventKind::alert) return;
        if (tty_) std::fprintf(stderr, "\n");
        std::fprintf(stderr, "alert: %s\n", e.message.c_str());
        std::fflush(stderr);
    }

    void on_end(const RunView& job) override {
        const Config& c = job.config();
        const double secs = seconds();
        std::printf("\nsummary\n");
        std::printf("  steps          %lld\n", static_cast<long long>(job.steps_done()));
        std::printf("  train loss     %.4f\n", last_loss_);
        if (last_val_ >= 0) std::printf("  val loss       %.4f\n", last_val_);
        if (job.entropy_rate() >= 0 && last_val_ >= 0)
            std::printf("  loss floor     %.4f (entropy rate %.4f); val - floor = %+.4f nats/token\n",
                        job.loss_floor(), job.entropy_rate(), last_val_ - job.loss_floor());
        else if (job.loss_floor() >= 0 && last_val_ >= 0)
            std::printf("  loss floor     %.4f; val - floor = %+.4f nats/token\n", job.loss_floor(),
                        last_val_ - job.loss_floor());
        std::printf("  time           %.2f s, %.0f tokens/s, %.2f ms/step\n", secs, tokens_ / secs,
                    secs * 1e3 / static_cast<double>(job.steps_done()));
        if (c.output.run_file) std::printf("  run file       %s\n", run_path_.c_str());
        if (!c.output.export_llmc.empty())
            std::printf("  llm.c weights  %s\n", c.output.export_llmc.c_str());
        std::fflush(stdout);
    }

    double seconds() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    }
    double last_loss() const { return last_loss_; }

private:
    bool quiet_, tty_;
    std::string run_path_;
    i64 total_ = 1;
    double last_val_ = -1, last_loss_ = 0, tokens_ = 0;
    std::chrono::steady_clock::time_point t0_;
};

// --fault KIND[:key=value,...] as --set fault.kind=KIND --set fault.key=value ...
std::vector<std::string> fault_sets(const std::string& spec) {
    std::vector<std::string> sets;
    const size_t colon = spec.find(':');
    std::string kind = "fault.kind=";
    kind += spec.substr(0, colon);
    sets.push_back(kind);
    if (colon == std::string::npos) return sets;
    const std::string rest = spec.substr(colon + 1);
    size_t at = 0;
    while (at <= rest.size()) {
        const size_t comma = std::min(rest.find(',', at), rest.size());
        const std::string item = rest.substr(at, comma - at);
        if (item.find('=') == std::string::npos || item.front() == '=')
            throw ConfigError("--fault " + spec + ": \"" + item + "\" is not key=value; write "
                              "--fault KIND:key=value,... with keys of [fault] (rank, step, tensor, "
                              "element, bit, stall_s, persistent), e.g. --fault flip_weight:rank=1,step=3");
        std::string set = "fault.";
        set += item;
        sets.push_back(set);
        at = comma + 1;
    }
    return sets;
}

int run_train(const TrainOptions& opt, const comm::MpiEnvironment* mpi) {
    std::vector<std::string> sets = opt.sets;
    if (!opt.fault.empty())
        for (std::string& f : fault_sets(opt.fault)) sets.push_back(std::move(f));
    Config cfg = job_config(opt.config_path, sets);
    if (!opt.out_dir.empty()) cfg.output.dir = opt.out_dir;
    // Under mpirun this process is one rank of the layout; rank 0 reports and writes.
    const bool root = !mpi || mpi->rank() == 0;
    Console console(opt.quiet || !cfg.output.progress, run_file_path(cfg));
    LogicalState state;
    bool agree = true;
    double last_loss = 0;
    SessionOptions so;
    if (root) so.observers.push_back(&console);
    so.dump = opt.dump;
    so.writer = root;
    if (mpi) so.ranks_on_node = comm::local_ranks();
    so.hooks.inspect = [&](Job& job) {
        last_loss = job.history().empty() ? 0 : job.history().back().loss;
        if (opt.dump.empty() || absorb(state, job)) return;
        if (!mpi)
            disagreement(cfg, " on a shared tensor or on the metrics (pp rank " +
                                  std::to_string(job.pp_rank()) + ", dp rank " +
                                  std::to_string(job.dp_rank()) + ", tp rank " +
                                  std::to_string(job.tp_rank()) + ")");
        agree = false;  // merged on rank 0, then judged there
    };
    // Outputs checked, folders locked, the run file opened (core/train/session.h).
    RunSession session(cfg, so);
    if (mpi) {
        const std::unique_ptr<comm::Communicator> world = mpi->world(cfg.layout.timeout_s);
        session.run_rank(*world);
        // The dump: every rank's logical part, merged on rank 0 (collective).
        if (!opt.dump.empty()) {
            try {
                agree = gather_state(state, *world, cfg.model) && agree;
            } catch (const std::exception& e) {
                world->abort("rank " + std::to_string(mpi->rank()) + " failed: " + e.what());
                throw;
            }
        }
    } else {
        session.run();
    }
    if (root && !opt.dump.empty()) {
        if (mpi && !state.complete())
            throw Error("the ranks' logical states miss a part when merged on rank 0; this is a "
                        "bug in Parallax");
        if (!agree) disagreement(cfg, " on a shared tensor or on the metrics, merged on rank 0");
        write_dump(opt.dump, state, cfg);
        std::printf("  dump           %s\n", opt.dump.c_str());
    }
    if (!std::isfinite(mpi ? last_loss : console.last_loss())) {
        if (root) std::fprintf(stderr, "parallax: the training loss is not finite\n");
        return kRunFailed;
    }
    return kOk;
}

}  // namespace

std::function<int()> add_train_command(CLI::App& app, const comm::MpiEnvironment* mpi) {
    auto opt = std::make_shared<TrainOptions>();
    CLI::App* sub = app.add_subcommand(
        "train", "Train a GPT on a job config (the embedded default job when CONFIG is omitted).");
    sub->add_option("config", opt->config_path, "TOML job config (every key: docs/config.md, or parallax config)")
        ->check(CLI::ExistingFile);
    sub->add_option("--set", opt->sets, "Override a config key: --set section.key=value (repeatable)")
        ->type_name("KEY=VALUE");
    sub->add_option("--out", opt->out_dir, "Output directory (overrides output.dir)");
    sub->add_option("--dump", opt->dump,
                    "Write the final logical weights, Adam moments and per-step loss and grad "
                    "norm to this HDF5 file, for bit comparison of two runs");
    sub->add_option("--fault", opt->fault,
                    "Inject a fault (shorthand for --set fault.*): KIND[:key=value,...], KIND one "
                    "of kill, stall, flip_grad, flip_weight; e.g. --fault "
                    "flip_weight:rank=1,step=3,tensor=wte,element=5,bit=20")
        ->type_name("SPEC");
    sub->add_flag("--quiet,-q", opt->quiet, "No progress output, only the summary");
    return [opt, mpi] { return run_train(*opt, mpi); };
}

}  // namespace px::app
