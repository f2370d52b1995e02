// parallax train [CONFIG] [--set section.key=value ...] [--out DIR]
#include "app/commands.h"
#include "core/config.h"
#include "core/job.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace px::app {

namespace {

struct TrainOptions {
    std::string config_path;
    std::vector<std::string> sets;
    std::string out_dir;
    bool quiet = false;
};

// A one-line progress bar on a terminal; plain log lines (every ~5% of the run) otherwise.
class Progress : public Observer {
public:
    explicit Progress(bool quiet) : quiet_(quiet), tty_(isatty(fileno(stderr)) != 0) {}

    void on_start(const Job& job) override {
        total_ = job.config().train.steps;
        t0_ = std::chrono::steady_clock::now();
    }

    void on_step(const Job&, const StepMetrics& m) override {
        if (m.val_loss >= 0) last_val_ = m.val_loss;
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

    double seconds() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    }
    double tokens() const { return tokens_; }
    double last_val() const { return last_val_; }

private:
    bool quiet_, tty_;
    i64 total_ = 1;
    double last_val_ = -1, tokens_ = 0;
    std::chrono::steady_clock::time_point t0_;
};

int run_train(const TrainOptions& opt) {
    Config cfg = opt.config_path.empty() ? parse_config(default_config_toml(), "<embedded default>")
                                         : load_config(opt.config_path);
    apply_overrides(cfg, opt.sets);
    if (!opt.out_dir.empty()) cfg.output.dir = opt.out_dir;

    Job job(cfg);
    const Config& c = job.config();
    std::printf("parallax train: %s | %lld params | L=%lld C=%lld NH=%lld F=%lld V=%lld T=%lld | "
                "batch %lld x %lld microbatches | %s/%s | %d threads\n",
                cfg.source_name.c_str(), static_cast<long long>(job.model().num_params()),
                static_cast<long long>(c.model.layers), static_cast<long long>(c.model.hidden),
                static_cast<long long>(c.model.heads), static_cast<long long>(c.model.ffn),
                static_cast<long long>(c.model.vocab), static_cast<long long>(c.model.seq_len),
                static_cast<long long>(c.train.batch_size), static_cast<long long>(c.train.microbatches),
                mode_name(job.model().numerics().mode), isa_name(job.model().numerics().isa),
                omp_get_max_threads());
    if (job.entropy_rate() >= 0)
        std::printf("data: order-%lld Markov source, entropy rate %.4f nats/token, loss floor for "
                    "%lld-token windows %.4f\n",
                    static_cast<long long>(c.data.markov_order), job.entropy_rate(),
                    static_cast<long long>(c.model.seq_len), job.loss_floor());
    std::fflush(stdout);

    Progress progress(opt.quiet);
    job.add_observer(&progress);
    std::unique_ptr<RunFileObserver> run_file;
    const std::string run_path = (std::filesystem::path(c.output.dir) / "run.h5").string();
    if (c.output.run_file) {
        run_file = std::make_unique<RunFileObserver>(run_path, c);
        job.add_observer(run_file.get());
    }
    job.run();

    const StepMetrics& last = job.history().back();
    const double secs = progress.seconds();
    std::printf("\nsummary\n");
    std::printf("  steps          %lld\n", static_cast<long long>(job.steps_done()));
    std::printf("  train loss     %.4f\n", last.loss);
    if (progress.last_val() >= 0) std::printf("  val loss       %.4f\n", progress.last_val());
    if (job.entropy_rate() >= 0 && progress.last_val() >= 0)
        std::printf("  loss floor     %.4f (entropy rate %.4f); val - floor = %+.4f nats/token\n",
                    job.loss_floor(), job.entropy_rate(), progress.last_val() - job.loss_floor());
    std::printf("  time           %.2f s, %.0f tokens/s, %.2f ms/step\n", secs,
                progress.tokens() / secs, secs * 1e3 / static_cast<double>(job.steps_done()));
    if (run_file) std::printf("  run file       %s\n", run_path.c_str());
    if (!c.output.export_llmc.empty())
        std::printf("  llm.c weights  %s\n", c.output.export_llmc.c_str());
    if (!std::isfinite(last.loss)) {
        std::fprintf(stderr, "parallax: the training loss is not finite at step %lld\n",
                     static_cast<long long>(last.step));
        return kRunFailed;
    }
    return kOk;
}

}  // namespace

std::function<int()> add_train_command(CLI::App& app) {
    auto opt = std::make_shared<TrainOptions>();
    CLI::App* sub = app.add_subcommand(
        "train", "Train a GPT on a job config (the embedded default job when CONFIG is omitted).");
    sub->add_option("config", opt->config_path, "TOML job config (see README: Config keys)")
        ->check(CLI::ExistingFile);
    sub->add_option("--set", opt->sets, "Override a config key: --set section.key=value (repeatable)")
        ->type_name("KEY=VALUE");
    sub->add_option("--out", opt->out_dir, "Output directory (overrides output.dir)");
    sub->add_flag("--quiet,-q", opt->quiet, "No progress output, only the summary");
    return [opt] { return run_train(*opt); };
}

}  // namespace px::app
