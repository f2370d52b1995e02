// Every rank's pieces are compared: a fault planted on any world rank of a layout — a flipped bit
// of its reduced gradient, of its weights, or of a message it receives — is named by parallax
// validate at the step it was planted, on that rank, with the tensor it struck, whichever
// pipeline stage, ZeRO shard, tp piece, cp chunk or expert the rank holds. And the harness does
// not pass a rank whose pieces go missing from the comparison: it says which ones.
#include "core/parallel/mesh.h"
#include "core/train/job.h"
#include "tests/support/test_util.h"
#include "core/train/probe_recorder.h"
#include "validators/validate.h"
#include "validators/validate_steps.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

using namespace px;
using namespace px::test;

namespace {

constexpr i64 kStep = 2;   // every fault strikes step 2 of 3
constexpr i64 kSteps = 3;

// Shapes whose tp and cp shares are whole blocks of 16 (C = 64, F = 128, V = 64, T = 64), four
// layers (pp4 gives each stage one).
Config dense_job() {
    Config c = with_tp_shapes(small_job());
    c.model.layers = 4;
    c.model.seq_len = 64;
    c.train.steps = kSteps;
    c.train.threads = 1;
    return c;
}

// Four experts, MoE in layer 1 only (of two): under pp2 only the last stage holds experts.
Config moe_job() {
    Config c = small_moe_job(48);
    c.model.moe_every = 2;
    c.train.steps = kSteps;
    c.train.eval_every = 0;
    return c;
}

// What world rank r of a layout holds, read from its own job.
struct Held {
    int zero = 0;
    Range mine;  // the elements of the flat table it updates
    std::vector<TableEntry> entries;
};

std::vector<Held> holdings(const Config& c) {
    const Mesh mesh(make_layout(c));
    std::vector<Held> out(static_cast<size_t>(mesh.world_size()));
    std::mutex mu;
    Config one = c;
    one.train.steps = 1;
    RunHooks h;  // before the first step (after it, Job::unshard has made every rank whole)
    h.setup = [&](Job& job) {
        std::lock_guard lock(mu);
        out[static_cast<size_t>(world_rank(mesh, job))] = {
            job.data().zero_stage(), job.data().update_range(), job.model().table().entries};
    };
    run_layout(one, {}, h);
    return out;
}

// A tensor of rank h's and an element of its piece that the fault can strike: under ZeRO-2/3 in
// its shard of the gradient, under ZeRO-3 of the weights. An expert tensor where the rank holds
// one, else the tensor with most elements in reach (ties: the later one, deeper in the model).
struct Target {
    TableEntry entry;
    i64 element = 0;  // flat, in the rank's piece
};

Target target_on(const Held& h, bool grad) {
    const bool sharded = h.zero >= (grad ? 2 : 3);
    const i64 lo = sharded ? h.mine.lo : 0, hi = sharded ? h.mine.hi : INT64_MAX;
    const TableEntry* best = nullptr;
    i64 best_n = 0, best_first = 0;
    for (const TableEntry& e : h.entries) {
        const i64 a = std::max(lo, e.offset), b = std::min(hi, e.offset + e.numel());
        if (b <= a) continue;
        const bool expert = e.name.find("moe.experts") != std::string::npos;
        const bool best_expert = best && best->name.find("moe.experts") != std::string::npos;
        if (!best || (expert && !best_expert) || (expert == best_expert && b - a >= best_n)) {
            best = &e;
            best_n = b - a;
            best_first = a - e.offset;
        }
    }
    REQUIRE(best != nullptr);
    return {*best, best_first + best_n / 2};
}

std::string layer_of(const TableEntry& e) { return e.layer < 0 ? "-" : std::to_string(e.layer); }
std::string grad_probe(const TableEntry& e) {
    return "grad/" + layer_of(e) + "/param/" + e.short_name;
}

LayoutResult validate_one(const Config& c, const LayoutSpec& l, const RunHooks& plant = {}) {
    const ValidationReport rep = validate_layouts(c, {l}, kSteps, nullptr, plant);
    REQUIRE(rep.layouts.size() == 1);
    return rep.layouts[0];
}

// The layouts of the matrix, on the job each needs.
struct Case {
    const char* layout;
    bool moe;
};
const Case kCases[] = {{"pp2", false},         {"pp4", false},  {"dp2xz1", false},
                       {"dp2xz2", false},      {"dp2xz3", false}, {"tp2", false},
                       {"tp2xsp", false},      {"dp2xtp2xpp2", false}, {"cp2", false},
                       {"ep2", true},          {"ep2xpp2", true}};

// flip_grad and flip_weight through the config's fault.* keys, as a user plants them.
void check_config_fault(const Case& k, const char* kind) {
    const Config base = k.moe ? moe_job() : dense_job();
    const LayoutSpec spec = parse_layout(k.layout);
    const std::vector<Held> held = holdings(with_layout(base, spec));
    const bool grad = std::strcmp(kind, "flip_grad") == 0;
    for (int r = 0; r < static_cast<int>(held.size()); r++) {
        const Target t = target_on(held[static_cast<size_t>(r)], grad);
        Config c = base;
        c.fault.kind = kind;
        c.fault.rank = r;
        c.fault.step = kStep;
        c.fault.tensor = t.entry.name;
        c.fault.element = t.element;
        c.fault.bit = 22;
        const LayoutResult res = validate_one(c, spec);
        const std::string want = grad ? grad_probe(t.entry) : "params/" + t.entry.name;
        const std::string op = std::to_string(kStep) + "/" +
                               (grad ? grad_probe(t.entry)
                                     : "optim/" + layer_of(t.entry) + "/param/" +
                                           t.entry.short_name);
        INFO(k.layout << " " << kind << " on world rank " << r << ": " << t.entry.name << "["
                      << t.element << "] -> " << res.verdict << " " << res.error << " step "
                      << res.first_step << " " << res.first.name << " rank " << res.first_rank
                      << "; first op " << res.first_op.name << " rank " << res.first_op_rank
                      << " " << res.first_op_note);
        CHECK(res.verdict == "diverged");
        CHECK(res.first_step == kStep);
        CHECK(res.first.name == want);
        CHECK(res.first_rank == r);
        CHECK(res.first_ranks == std::vector<int>{r});
        CHECK(res.first_op.name == op);
        CHECK(res.first_op_rank == r);
    }
}

// The element of req's output that the rank receives from another rank, in the middle of the
// part it reads: the rank's own chunk of a whole-buffer result (under sp a rank keeps only its
// chunk of an all-reduce), of a reduce-scatter's its shard, of an all-gather the next rank's
// chunk, of an all-to-all the first rows from another rank. -1: none.
i64 received_element(const comm::Request& req, int rank, int size) {
    switch (req.op) {
        case comm::Op::all_reduce:
        case comm::Op::broadcast:
        case comm::Op::recv: {
            const i64 lo = comm::chunk_lo(req.n, size, rank), hi = comm::chunk_lo(req.n, size, rank + 1);
            return hi > lo ? lo + (hi - lo) / 2 : -1;
        }
        case comm::Op::reduce_scatter: return req.n > 0 ? req.n / 2 : -1;
        case comm::Op::all_gather: return req.n > 0 ? ((rank + 1) % size) * req.n + req.n / 2 : -1;
        case comm::Op::all_to_all_v: {
            i64 at = 0;
            for (int src = 0; src < static_cast<int>(req.out_counts.size()); src++) {
                const i64 k = req.out_counts[static_cast<size_t>(src)];
                if (src != rank && k > 0) return at + k / 2;
                at += k;
            }
            return -1;
        }
        default: return -1;
    }
}

// A group decorator whose rank, while armed, receives the first message `hits` accepts with bit 20
// of one received element flipped (received_element). Armed for one step on one world rank
// (wrap_group runs on the rank's thread just before its job is made, setup right after).
class StrikeReceived : public comm::Decorator {
public:
    StrikeReceived(std::unique_ptr<comm::Communicator> inner, bool (*hits)(const comm::Request&),
                   int skip)
        : comm::Decorator(std::move(inner)), hits_(hits), skip_(skip) {}
    void arm(bool on) {
        armed = on;
        passed_ = 0;
    }
    std::atomic<bool> armed{false};
    std::atomic<int> struck{0};

protected:
    void run(comm::Request& req) override {
        comm::Decorator::run(req);
        if (!armed || !hits_(req)) return;
        const i64 at = received_element(req, rank(), size());
        if (at < 0 || passed_++ < skip_) return;
        armed = false;
        struck++;
        float* x = static_cast<float*>(req.out) + at;
        std::uint32_t bits;
        std::memcpy(&bits, x, sizeof bits);
        bits ^= 1u << 20;
        std::memcpy(x, &bits, sizeof bits);
    }

private:
    bool (*hits_)(const comm::Request&);
    int skip_;       // messages `hits` accepts that pass unharmed first
    int passed_ = 0;
};

thread_local StrikeReceived* t_strike = nullptr;

struct Strikes {
    std::mutex mu;
    int count = 0;  // messages struck, over every run the harness made
};

// The RunHooks that plant StrikeReceived in the `dim` group (ep: the ep group) of world rank
// `target`, armed in step kStep, striking the message after the first `skip` it accepts.
RunHooks strike(const Config& c, const std::string& dim, int target,
                bool (*hits)(const comm::Request&), int skip, std::shared_ptr<Strikes> log) {
    RunHooks h;
    auto make = [hits, skip](std::unique_ptr<comm::Communicator> g)
        -> std::unique_ptr<comm::Communicator> {
        auto s = std::make_unique<StrikeReceived>(std::move(g), hits, skip);
        t_strike = s.get();
        return s;
    };
    if (dim == "ep") {
        h.wrap_ep_group = make;
    } else {
        h.wrap_group = [make, dim](MeshDim d, std::unique_ptr<comm::Communicator> g) {
            return dim_name(d) == dim ? make(std::move(g)) : std::move(g);
        };
    }
    const auto mesh = std::make_shared<Mesh>(make_layout(c));
    h.setup = [mesh, target, log](Job& job) {
        StrikeReceived* s = std::exchange(t_strike, nullptr);
        if (!s || world_rank(*mesh, job) != target) return;
        StepHooks hooks;
        hooks.before = [s](i64 step) { s->arm(step == kStep); };
        hooks.updated = [s, log](i64 step) {
            if (step != kStep) return;
            std::lock_guard lock(log->mu);
            log->count += s->struck.exchange(0);
        };
        job.add_step_hooks(std::move(hooks));
    };
    return h;
}

bool is_f32(const comm::Request& r) { return r.dtype == comm::Dtype::f32 && r.n >= 16; }
// The gradient's reduction over dp: ZeRO-0/1's all-reduce, ZeRO-2/3's exchange of the partials
// of each rank's shard (core/parallel/tree_exchange.h).
bool grad_reduction(const comm::Request& r) {
    return r.dtype == comm::Dtype::f32 &&
           ((r.op == comm::Op::all_reduce && r.n >= 16) || r.op == comm::Op::all_to_all_v);
}
// An activation (forward) or its gradient (backward) from the neighbouring stage.
bool stage_message(const comm::Request& r) { return is_f32(r) && r.op == comm::Op::recv; }
// tp's first collective of the step: an all-reduce of a row-parallel linear's partial output,
// under sp the all-gather of the sequence shards.
bool tp_collective(const comm::Request& r) {
    return is_f32(r) && (r.op == comm::Op::all_reduce || r.op == comm::Op::all_gather);
}
// A K/V block of the ring, or any cp exchange.
bool cp_message(const comm::Request& r) {
    return is_f32(r) && r.op != comm::Op::all_reduce && r.op != comm::Op::all_reduce_max;
}
// The dispatch of rows to the experts (or their return).
bool ep_rows(const comm::Request& r) {
    return r.dtype == comm::Dtype::f32 && r.op == comm::Op::all_to_all_v;
}

struct CommCase {
    const char* layout;
    bool moe;
    const char* group;
    bool (*hits)(const comm::Request&);
    int skip = 0;
};
// ep: the second exchange of rows in the step, which brings back to a rank the experts' outputs
// for its own tokens (the first takes them to the experts: CommCase kDispatch).
const CommCase kCommCases[] = {
    {"pp2", false, "pp", stage_message},        {"pp4", false, "pp", stage_message},
    {"dp2xz1", false, "dp", grad_reduction},    {"dp2xz2", false, "dp", grad_reduction},
    {"dp2xz3", false, "dp", grad_reduction},    {"tp2", false, "tp", tp_collective},
    {"tp2xsp", false, "tp", tp_collective},     {"dp2xtp2xpp2", false, "dp", grad_reduction},
    {"cp2", false, "cp", cp_message},           {"ep2", true, "ep", ep_rows, 1},
    {"ep2xpp2", true, "ep", ep_rows, 1}};

// Every world rank of k's layout that takes part in its group's messages (ep: the ranks that
// hold experts), each with the result of validating k with a message to it struck.
template <class F>
void for_each_struck_rank(const CommCase& k, F&& check) {
    const Config base = k.moe ? moe_job() : dense_job();
    const LayoutSpec spec = parse_layout(k.layout);
    const Config lc = with_layout(base, spec);
    const std::vector<Held> held = holdings(lc);
    for (int r = 0; r < static_cast<int>(held.size()); r++) {
        const auto& entries = held[static_cast<size_t>(r)].entries;
        const bool experts = std::any_of(entries.begin(), entries.end(), [](const TableEntry& e) {
            return e.name.find("moe.experts") != std::string::npos;
        });
        if (std::strcmp(k.group, "ep") == 0 && !experts) continue;  // a stage without MoE layers
        auto log = std::make_shared<Strikes>();
        const LayoutResult res =
            validate_one(base, spec, strike(lc, k.group, r, k.hits, k.skip, log));
        INFO(k.layout << " " << k.group << " message to world rank " << r << ": " << res.verdict
                      << " " << res.error << " step " << res.first_step << " " << res.first.name
                      << " on rank " << res.first_rank << "; first op " << res.first_op.name
                      << " on rank " << res.first_op_rank << " (" << res.first_op_where << ") "
                      << res.first_op_note);
        REQUIRE(log->count > 0);  // the rank received such a message in step kStep
        CHECK(res.verdict == "diverged");
        CHECK(res.first_step == kStep);
        check(r, res);
    }
}

}  // namespace

TEST_CASE("A flipped bit of any rank's reduced gradient is named at its step, rank and tensor",
          "[every_rank]") {
    for (const Case& k : kCases) check_config_fault(k, "flip_grad");
}

TEST_CASE("A flipped bit of any rank's weights is named at its step, rank and tensor",
          "[every_rank]") {
    for (const Case& k : kCases) check_config_fault(k, "flip_weight");
}

TEST_CASE("A flipped bit in a message any rank receives is named at its step and rank",
          "[every_rank]") {
    for (const CommCase& k : kCommCases) {
        for_each_struck_rank(k, [](int r, const LayoutResult& res) {
            CHECK(res.first_op_rank == r);
            CHECK(res.first_op.name.rfind(std::to_string(kStep) + "/", 0) == 0);
        });
    }
}

TEST_CASE("A flipped bit in the rows an expert receives is named where they are combined",
          "[every_rank]") {
    // The experts' own matmuls are not probed: a row struck on its way to rank r's expert first
    // shows in the combine of the rank whose token it is (the other ep rank of two), and in rank
    // r's gradient of its experts.
    for (const char* layout : {"ep2", "ep2xpp2"}) {
        const CommCase k{layout, true, "ep", ep_rows, 0};
        for_each_struck_rank(k, [](int r, const LayoutResult& res) {
            CHECK(res.first_op.name == std::to_string(kStep) + "/fwd/1/moe.combine/out");
            CHECK(res.first_op_rank != r);
            CHECK(res.first_op_rank >= 0);
        });
    }
}

// A sink over a rank's probes that lets every capture through but those of one tensor.
class DropOne : public ProbeSink {
public:
    DropOne(ProbeSink* inner, std::string tensor) : inner_(inner), tensor_(std::move(tensor)) {}
    bool wants(const ProbeKey& key) const override { return inner_->wants(key); }
    void capture(const ProbeKey& key, const float* local, const ShardSpec& spec) override {
        if (key.name().find(tensor_) != std::string::npos) return;
        inner_->capture(key, local, spec);
    }

private:
    ProbeSink* inner_;
    std::string tensor_;
};

TEST_CASE("A rank whose pieces are left out of the comparison fails it, named", "[every_rank]") {
    // World rank 1 of pp2 (the last stage) offers no pieces of layer 3's c_fc weight gradient:
    // the harness must say so, not pass the layout on the others' pieces.
    const Config c = dense_job();
    const LayoutSpec spec = parse_layout("pp2");
    const auto mesh = std::make_shared<Mesh>(make_layout(with_layout(c, spec)));
    for (const char* probe : {"grad/3/param/mlp.c_fc.weight", "optim/3/adam.v/mlp.c_fc.weight"}) {
        auto sinks = std::make_shared<std::vector<std::unique_ptr<DropOne>>>();
        auto mu = std::make_shared<std::mutex>();
        RunHooks leave_out;
        leave_out.setup = [mesh, sinks, mu, probe](Job& job) {
            if (world_rank(*mesh, job) != 1) return;
            StepHooks hooks;
            Job* j = &job;
            hooks.before = [j, sinks, mu, probe](i64) {  // the harness's sink is set by now
                if (dynamic_cast<DropOne*>(j->probes()) || !j->probes()) return;
                std::lock_guard lock(*mu);
                sinks->push_back(std::make_unique<DropOne>(j->probes(), probe));
                j->set_probes(sinks->back().get());
            };
            job.add_step_hooks(std::move(hooks));
        };
        const LayoutResult res = validate_one(c, spec, leave_out);
        INFO(probe << ": " << res.verdict << " " << res.error);
        CHECK(res.verdict == "error");
        CHECK_THAT(res.error, Catch::Contains("world rank 1") && Catch::Contains(probe) &&
                                  Catch::Contains("left out"));
    }
    // Unplanted, the same layout matches: the failure is the missing pieces'.
    CHECK(validate_one(c, spec).verdict == "match");
}

TEST_CASE("A flip outside the rank's ZeRO shard is refused, naming the shard", "[every_rank]") {
    // Under ZeRO-2 rank 0 reduces only its shard of the gradient: an element of rank 1's shard
    // would flip a value nothing reads.
    const Config base = dense_job();
    const LayoutSpec spec = parse_layout("dp2xz2");
    const std::vector<Held> held = holdings(with_layout(base, spec));
    const Target theirs = target_on(held[1], true);  // in rank 1's shard, so outside rank 0's
    Config c = base;
    c.fault.kind = "flip_grad";
    c.fault.rank = 0;
    c.fault.step = kStep;
    c.fault.tensor = theirs.entry.name;
    c.fault.element = theirs.element;
    const LayoutResult res = validate_one(c, spec);
    INFO(res.error);
    CHECK(res.verdict == "error");
    CHECK_THAT(res.error, Catch::Contains("fault.element = " + std::to_string(theirs.element)) &&
                              Catch::Contains("outside world rank 0's ZeRO-2 shard") &&
                              Catch::Contains("choose an element inside it"));
}
