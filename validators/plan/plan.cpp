// The layouts of N devices (plan.h): enumerated, validated by the runtime's own rules
// (make_layout), predicted one by one, ranked.
#include "validators/plan/plan.h"

#include "core/base/error.h"
#include "core/parallel/mesh.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace px::plan {

namespace {

std::vector<int> divisors(i64 n) {
    std::vector<int> d;
    for (i64 k = 1; k * k <= n; k++)
        if (n % k == 0) {
            d.push_back(static_cast<int>(k));
            if (k * k != n) d.push_back(static_cast<int>(n / k));
        }
    std::sort(d.begin(), d.end());
    return d;
}

bool allowed(const std::vector<int>& only, int x) {
    return only.empty() || std::find(only.begin(), only.end(), x) != only.end();
}

bool power_of_two(i64 x) { return x > 0 && (x & (x - 1)) == 0; }

// Microbatch counts worth trying for a replica's local batch: powers of two, multiples of pp by
// powers of two (interleaved needs a multiple of pp; 1F1B's bubble shrinks as m grows) and the
// whole local batch (one sequence per microbatch); at most a dozen.
std::vector<int> microbatch_counts(i64 local_B, int pp) {
    std::set<int> m;
    for (int d : divisors(local_B))
        if (power_of_two(d) || (d % pp == 0 && power_of_two(d / pp)) || d == local_B) m.insert(d);
    std::vector<int> out(m.begin(), m.end());
    while (out.size() > 12) out.erase(out.begin() + 1);  // keep 1 and the larger counts
    return out;
}

// Every kind the schedule module offers: a new kind appears here by itself.
std::vector<ScheduleKind> schedule_kinds() {
    return {std::begin(kScheduleKinds), std::end(kScheduleKinds)};
}

double time_of(const Candidate& c) { return c.time.step; }

}  // namespace

std::string format_seconds(double s) {
    char buf[32];
    if (s >= 1)
        std::snprintf(buf, sizeof buf, "%.3g s", s);
    else if (s >= 1e-3)
        std::snprintf(buf, sizeof buf, "%.3g ms", s * 1e3);
    else
        std::snprintf(buf, sizeof buf, "%.3g us", s * 1e6);
    return buf;
}

std::string Candidate::label() const {
    std::string s = "dp" + std::to_string(dp);
    if (tp > 1) s += " tp" + std::to_string(tp);
    if (pp > 1) s += " pp" + std::to_string(pp);
    if (cp > 1) s += " cp" + std::to_string(cp);
    if (ep > 1) s += " ep" + std::to_string(ep);
    if (zero > 0) s += " zero" + std::to_string(zero);
    if (pp > 1) s += " " + schedule + (virtual_stages > 1 ? " v" + std::to_string(virtual_stages) : "");
    s += " m" + std::to_string(microbatches);
    if (recompute != "none") s += " recompute";
    return s;
}

Plan plan_layouts(const Config& base, const ClusterSpec& cl, const PlanOptions& opt) {
    if (opt.gpus < 1)
        throw ConfigError("--gpus " + std::to_string(opt.gpus) + ": give the number of devices, >= 1");
    Plan plan;
    plan.config = base.source_name;
    plan.cluster = cl.name;
    plan.gpus = opt.gpus;
    plan.usable_bytes = cl.usable_bytes();
    const ModelConfig& mc = base.model;
    const i64 B = base.train.batch_size;
    std::string first_refusal;
    const auto refuse = [&](const std::exception& e) {
        plan.rejected++;
        if (first_refusal.empty()) first_refusal = e.what();
    };
    const std::vector<ScheduleKind> kinds = schedule_kinds();
    const ModelFlops flops = model_flops(mc);
    for (int tp : divisors(opt.gpus)) {
        // Tensor parallelism talks every layer: inside a node.
        if (tp > cl.gpus_per_node || cl.gpus_per_node % tp != 0 || !allowed(opt.only_tp, tp)) continue;
        for (int cp : divisors(opt.gpus / tp)) {
            if (!allowed(opt.only_cp, cp) || (cp > 1 && !power_of_two(cp))) continue;
            for (int pp : divisors(opt.gpus / tp / cp)) {
                if (pp > mc.layers || !allowed(opt.only_pp, pp)) continue;
                const int dp = opt.gpus / tp / cp / pp;
                if (B % dp != 0) continue;
                std::vector<int> eps{1};
                if (mc.is_moe()) {
                    eps.clear();
                    for (int ep : divisors(dp))
                        if (mc.moe_experts % ep == 0) eps.push_back(ep);
                }
                for (int ep : eps)
                    for (int zero = 0; zero <= 3; zero++) {
                        if (zero > 0 && dp / ep <= 1) break;  // one replica: ZeRO is trivial
                        for (int m : microbatch_counts(B / dp, pp))
                            for (ScheduleKind kind : kinds) {
                                if (pp == 1 && kind != kinds.front()) break;  // no pipeline
                                std::vector<int> vs{1};
                                // interleaved: several chunks; zbv sets its two itself
                                for (int v : divisors(mc.layers / pp))
                                    if (v >= 2 && v <= 8 && pp > 1 &&
                                        kind == ScheduleKind::interleaved)
                                        vs.push_back(v);
                                for (int v : vs)
                                    for (const char* rc : {"none", "full"}) {
                                        Config c = base;
                                        LayoutConfig& lc = c.layout;
                                        lc.dp = dp, lc.tp = tp, lc.pp = pp, lc.cp = cp, lc.ep = ep;
                                        lc.zero = zero, lc.microbatches = m;
                                        lc.schedule = schedule_name(kind);
                                        lc.virtual_stages = v;
                                        lc.recompute = rc;
                                        try {
                                            (void)make_layout(c);
                                        } catch (const ConfigError& e) {
                                            if (v == 1 || kind == ScheduleKind::interleaved) refuse(e);
                                            continue;
                                        }
                                        try {
                                            plan.candidates.push_back(predict(c, cl, flops));
                                        } catch (const ConfigError& e) {
                                            refuse(e);
                                        }
                                    }
                            }
                    }
            }
        }
    }
    if (plan.candidates.empty())
        throw ConfigError(base.source_name + ": no layout of " + std::to_string(opt.gpus) +
                          " devices passes the runtime's rules" +
                          (first_refusal.empty() ? std::string(" (no mesh of the model and batch)")
                                                 : "; the first refusal: " + first_refusal));
    std::stable_sort(plan.candidates.begin(), plan.candidates.end(),
                     [](const Candidate& a, const Candidate& b) {
                         if (a.fits != b.fits) return a.fits;
                         if (!a.fits) return a.memory_bytes < b.memory_bytes;
                         // A tie (communication that a longer backward hides as much as it
                         // adds): the one that computes less, then the one that holds less.
                         const double ta = time_of(a), tb = time_of(b);
                         if (std::abs(ta - tb) > 1e-6 * std::max(ta, tb)) return ta < tb;
                         if (a.time.compute != b.time.compute)
                             return a.time.compute < b.time.compute;
                         return a.memory_bytes < b.memory_bytes;
                     });
    for (const Candidate& c : plan.candidates) plan.fitting += c.fits ? 1 : 0;
    return plan;
}

std::string plan_json(const Plan& p) {
    nlohmann::json j;
    j["schema"] = "parallax-plan";
    j["version"] = 1;
    j["config"] = p.config;
    j["cluster"] = p.cluster;
    j["gpus"] = p.gpus;
    j["usable_bytes"] = p.usable_bytes;
    j["fitting"] = p.fitting;
    j["rejected"] = p.rejected;
    j["candidates"] = nlohmann::json::array();
    for (const Candidate& c : p.candidates) {
        nlohmann::json x;
        x["label"] = c.label();
        x["dp"] = c.dp, x["tp"] = c.tp, x["pp"] = c.pp, x["cp"] = c.cp, x["ep"] = c.ep;
        x["zero"] = c.zero, x["microbatches"] = c.microbatches;
        x["schedule"] = c.schedule, x["virtual_stages"] = c.virtual_stages;
        x["recompute"] = c.recompute;
        x["fits"] = c.fits;
        x["memory_bytes"] = c.memory_bytes;
        nlohmann::json mem = nlohmann::json::object();
        for (const MemoryItem& i : c.memory) mem[i.what] = i.bytes;
        x["memory"] = mem;
        const TimeTerms& t = c.time;
        x["time_s"] = {{"step", t.step},           {"compute", t.compute},
                       {"tp_comm", t.tp_comm},     {"pp_comm", t.pp_comm},
                       {"bubble", t.bubble},       {"dp_comm", t.dp_comm},
                       {"dp_exposed", t.dp_exposed}, {"gather", t.gather},
                       {"gather_exposed", t.gather_exposed}, {"update", t.update},
                       {"other", t.other}};
        x["schedule_bubble"] = c.schedule_bubble;
        x["model_flops"] = c.model_flops;
        x["mfu"] = c.mfu;
        x["tokens_per_s"] = c.tokens_per_s;
        x["comm_bytes_sent"] = c.comm_bytes;
        j["candidates"].push_back(x);
    }
    return j.dump(1);
}

}  // namespace px::plan
