// Layouts and pipeline schedules as data: parallax.layout(config) describes the mesh a config
// makes (make_layout's checks, every rank's coordinates, layers and token ranges), and
// parallax.schedule(...) gives a schedule's actions per rank and its unit-time simulation
// (core/parallel/pipeline/schedule.h), which is what the runtime executes and what notebooks draw.
#include "bindings/common.h"

#include "views/layout_explorer.h"
#include "core/parallel/mesh.h"
#include "core/parallel/pipeline/schedule.h"

#include <map>

namespace px::py_bind {

namespace {

py::dict layout_of(const Config& cfg) {
    const Layout l = make_layout(cfg);
    const Mesh mesh(l, Mesh::Validated{});
    py::dict d;
    d["dp"] = l.dp;
    d["tp"] = l.tp;
    d["pp"] = l.pp;
    d["cp"] = l.cp;
    d["cp_method"] = cp_method_name(l.cp_method);
    d["ep"] = l.ep;
    d["zero"] = l.zero;
    d["microbatches"] = l.microbatches;
    d["microbatch_size"] = l.microbatch_size();
    d["schedule"] = schedule_name(l.schedule);
    d["virtual_stages"] = l.virtual_stages;
    d["recompute"] = recompute_name(l.recompute);
    d["sequence_parallel"] = cfg.layout.sequence_parallel;
    d["world_size"] = l.world_size();
    d["text"] = mesh.describe();
    py::list ranks;
    for (int r = 0; r < l.world_size(); r++) {
        const Coord c = mesh.coord_of(r);
        py::dict rank;
        rank["rank"] = r;
        rank["pp"] = c.pp;
        rank["dp"] = c.dp;
        rank["tp"] = c.tp;
        rank["cp"] = c.cp;
        py::list layers;
        for (int ch = 0; ch < l.virtual_stages; ch++) {
            const LayerRange lr = mesh.layers(c.pp, ch);
            layers.append(py::make_tuple(lr.lo, lr.hi));
        }
        rank["layers"] = layers;
        rank["dp_group"] = mesh.dp_group(r);
        rank["tp_group"] = mesh.tp_group(r);
        rank["pp_group"] = mesh.pp_group(r);
        rank["cp_group"] = mesh.cp_group(r);
        rank["ep_group"] = mesh.ep_group(r);  // [r] without expert parallelism
        if (l.experts > 0)  // the experts of every MoE layer this rank holds, [lo, hi)
            rank["experts"] = py::make_tuple(c.dp % l.ep * (l.experts / l.ep),
                                             (c.dp % l.ep + 1) * (l.experts / l.ep));
        ranks.append(rank);
    }
    d["ranks"] = ranks;
    py::list tokens;
    for (const TokenRange& t : mesh.token_ranges()) {
        py::dict row;
        row["dp_rank"] = t.dp_rank;
        row["microbatch"] = t.microbatch;
        row["sequences"] = py::make_tuple(t.sample_lo, t.sample_hi);
        row["token_blocks"] = py::make_tuple(t.block_lo, t.block_hi);
        tokens.append(row);
    }
    d["token_ranges"] = tokens;
    // Attention's heads on the tp ranks (views::head_layout, as the layout explorer draws them).
    const views::HeadLayout h = views::head_layout(cfg.model, l.tp);
    py::dict heads;
    heads["kind"] = h.kind();
    heads["heads"] = h.heads;
    heads["kv_heads"] = h.kv_heads;
    heads["head_dim"] = h.head_dim;
    heads["group"] = h.group;
    heads["split"] = h.split;
    heads["text"] = h.summary();
    py::list per_rank;
    for (const views::RankHeads& r : h.ranks) {
        py::dict rd;
        rd["tp_rank"] = r.tp_rank;
        rd["q"] = py::make_tuple(r.q.lo, r.q.hi);
        rd["kv"] = py::make_tuple(r.kv.lo, r.kv.hi);
        rd["kv_read"] = py::make_tuple(r.kv_read.lo, r.kv_read.hi);
        rd["text"] = h.rank_text(r.tp_rank);
        per_rank.append(rd);
    }
    heads["ranks"] = per_rank;
    d["attention_heads"] = heads;
    return d;
}

py::dict action_dict(const Action& a) {
    py::dict d;
    d["kind"] = kActionNames[a.kind];
    d["microbatch"] = a.microbatch;
    d["chunk"] = a.chunk;
    d["peer"] = a.peer;
    return d;
}

std::string range_text(i64 lo, i64 n, i64 whole) {
    if (lo == 0 && n == whole) return ":";
    return std::to_string(lo) + ":" + std::to_string(lo + n);
}

std::string bytes_text(i64 b) {
    char s[32];
    if (b < 1024) return std::to_string(b) + " B";
    if (b < 1024 * 1024)
        std::snprintf(s, sizeof s, "%.1f KiB", static_cast<double>(b) / 1024.0);
    else
        std::snprintf(s, sizeof s, "%.1f MiB", static_cast<double>(b) / (1024.0 * 1024.0));
    return s;
}

// "0-3" or "0,2,5": world ranks, runs joined.
std::string ranks_text(const std::vector<int>& ranks) {
    std::string s;
    for (size_t i = 0; i < ranks.size();) {
        size_t j = i;
        while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) j++;
        if (!s.empty()) s += ",";
        s += std::to_string(ranks[i]);
        if (j > i) {
            s += '-';
            s += std::to_string(ranks[j]);
        }
        i = j + 1;
    }
    return s;
}

std::string layer_text(int layer) { return layer < 0 ? "model" : "layer " + std::to_string(layer); }

// One line per collective of the traced step: "layer 1 fwd attn.c_proj: tp all_reduce, 2 calls ×
// 16.0 KiB on ranks 0-3".
std::vector<std::string> collectives_text(const views::ExplorerResult& r) {
    std::vector<std::string> lines;
    for (const views::CollectiveUse& u : r.collectives)
        lines.push_back(layer_text(u.layer) + " " + u.phase + " " + u.op + ": " + u.group + " " +
                        u.collective + ", " + std::to_string(u.calls) +
                        (u.calls == 1 ? " call × " : " calls × ") + bytes_text(u.bytes) +
                        " on rank" + (u.ranks.size() == 1 ? " " : "s ") + ranks_text(u.ranks));
    return lines;
}

}  // namespace

views::ExplorerResult explore(const Config& cfg) {
    views::ExplorerResult r;
    {
        py::gil_scoped_release nogil;
        r = views::explore_layout(cfg);
    }
    if (!r.error.empty()) throw ConfigError(r.error);
    return r;
}

std::string explored_words(const views::ExplorerResult& r) {
    const py::dict d = explored(r);
    std::string s = "who holds what (weights between steps):\n";
    for (const py::handle& line : d["text"]) s += "  " + line.cast<std::string>() + "\n";
    s += "collectives of one step (per rank that issues them: calls × bytes sent + received):\n";
    for (const std::string& line : collectives_text(r)) s += "  " + line + "\n";
    if (r.collectives.empty()) s += "  none: every group is one rank\n";
    s += "memory per rank after the step (the admission estimate: " +
         bytes_text(r.estimate.total) + " per rank):\n";
    for (size_t k = 0; k < r.memory.size(); k++) {
        const MemoryStats& m = r.memory[k];
        s += "  rank " + std::to_string(k) + ": params " + bytes_text(m.params) + ", grads " +
             bytes_text(m.grads) + ", optimizer " + bytes_text(m.optimizer) + ", activations " +
             bytes_text(m.activations) + ", comm " + bytes_text(m.comm) + "; total " +
             bytes_text(m.total()) + "\n";
    }
    return s;
}

py::dict explored(const views::ExplorerResult& r) {
    py::dict holds, moments, memory_d;
    py::list text, collectives, memory;
    auto pieces = [](const std::vector<views::HeldPiece>& ps) {
        py::list l;
        for (const views::HeldPiece& p : ps) {
            py::dict d;
            d["rank"] = p.rank;
            d["rows"] = py::make_tuple(p.slab.row0, p.slab.row0 + p.slab.rows);
            d["cols"] = py::make_tuple(p.slab.col0, p.slab.col0 + p.slab.cols);
            l.append(d);
        }
        return l;
    };
    for (const views::TensorHolding& t : r.tensors) {
        holds[py::str(t.name)] = pieces(t.weights);
        moments[py::str(t.name)] = pieces(t.moments);
        for (const views::HeldPiece& p : t.weights) {
            const Coord c = r.coords[static_cast<size_t>(p.rank)];
            std::string slice = range_text(p.slab.row0, p.slab.rows, t.rows);
            if (t.rows > 1 || t.cols > 1) slice += ", " + range_text(p.slab.col0, p.slab.cols, t.cols);
            if (t.rows == 1) slice = range_text(p.slab.col0, p.slab.cols, t.cols);
            text.append("rank " + std::to_string(p.rank) + " = dp" + std::to_string(c.dp) +
                        " \u00b7 pp" + std::to_string(c.pp) + " \u00b7 tp" + std::to_string(c.tp) +
                        " holds " + t.name + "[" + slice + "]");
        }
    }
    for (const views::CollectiveUse& u : r.collectives) {
        py::dict d;
        d["phase"] = u.phase;
        d["layer"] = u.layer;
        d["op"] = u.op;
        d["group"] = u.group;
        d["collective"] = u.collective;
        d["bytes"] = u.bytes;
        d["calls"] = u.calls;
        d["ranks"] = u.ranks;
        collectives.append(d);
    }
    for (const MemoryStats& s : r.memory) {
        py::dict d;
        d["params"] = s.params;
        d["grads"] = s.grads;
        d["optimizer"] = s.optimizer;
        d["activations"] = s.activations;
        d["comm"] = s.comm;
        d["total"] = s.total();
        memory.append(d);
    }
    py::dict est;
    for (const MemoryItem& it : r.estimate.items) est[py::str(it.what)] = it.bytes;
    est["total"] = r.estimate.total;
    py::dict out;
    std::map<int, std::vector<std::int64_t>> by_layer;  // bytes of one step, per world rank
    for (const views::CollectiveUse& u : r.collectives) {
        std::vector<std::int64_t>& b = by_layer[u.layer];
        b.resize(r.coords.size());
        for (const int k : u.ranks) b[static_cast<size_t>(k)] += u.bytes * u.calls;
    }
    py::dict per_layer;
    for (const auto& [layer, b] : by_layer) {
        py::array_t<std::int64_t> a(static_cast<py::ssize_t>(b.size()));
        std::copy(b.begin(), b.end(), a.mutable_data());
        per_layer[py::int_(layer)] = a;
    }
    out["holds"] = holds;
    out["moments"] = moments;
    out["text"] = text;
    out["collectives"] = collectives;
    out["collectives_text"] = collectives_text(r);
    out["bytes_per_layer"] = per_layer;
    out["memory"] = memory;
    out["estimate"] = est;
    out["seconds"] = r.seconds;
    return out;
}

void bind_layout(py::module_& m) {
    m.def(
        "layout",
        [](const py::object& config, bool with_explore, const py::kwargs& sections) {
            const Config cfg = make_config(config, sections);
            py::dict d = layout_of(cfg);
            if (!with_explore) return d;
            const views::ExplorerResult r = explore(cfg);
            const py::dict e = explored(r);
            d["holds"] = e["holds"];
            d["moments"] = e["moments"];
            d["holds_text"] = e["text"];
            d["collectives"] = e["collectives"];
            d["collectives_text"] = e["collectives_text"];
            d["bytes_per_layer"] = e["bytes_per_layer"];
            d["memory"] = e["memory"];
            d["estimate"] = e["estimate"];
            d["text"] = d["text"].cast<std::string>() + explored_words(r);
            return d;
        },
        py::arg("config") = py::none(), py::kw_only(), py::arg("explore") = false, R"doc(
The layout a config makes, checked once as a job checks it (ConfigError naming the keys when it
does not fit the model, the batch or the numerics): a dict with dp, tp, pp, cp, cp_method, ep, zero,
microbatches,
microbatch_size, schedule, virtual_stages, recompute, sequence_parallel, world_size, text (the
mesh in words), ranks (per world rank: pp, dp, tp, cp, layers, the world ranks of its dp, tp,
pp, cp and ep groups, and for a MoE model the experts [lo, hi) it holds), token_ranges (per dp rank and microbatch: its sequences and token blocks of
the batch's canonical tree) and attention_heads (how the heads sit on the tp ranks: kind
("multi-head", "grouped-query" or "multi-query"), heads, kv_heads, head_dim, group (query heads
per KV head), split (tp divides kv_heads: each rank holds only its own KV heads; else k_proj and
v_proj whole on every rank), text, and ranks: per tp rank its query heads q, the KV heads kv it
holds and kv_read, those its query heads read, each [lo, hi), and its line of text). Ranks are
numbered tp innermost, then cp, dp and pp:
rank = ((pp·dp + dp_rank)·cp + cp_rank)·tp + tp_rank.

explore=True also runs one step of the layout with a recorder around every group (as
explore_layout, whose keys it adds: holds, moments, holds_text (its "text"), collectives,
collectives_text, bytes_per_layer, memory, estimate), and `text` then goes on in words: who
holds what, every collective of each layer with its calls and bytes, memory per rank.
>>> parallax.layout(layout={"dp": 2, "tp": 2}, numerics={"block": 32})["world_size"]
4
>>> parallax.layout(model={"arch": "llama", "kv_heads": 2}, layout={"tp": 4},
...                 numerics={"block": 16})["attention_heads"]["ranks"][3]["text"]
'tp rank 3: q head 3, kv heads 0-1 (whole on every rank: tp=4 does not divide kv_heads=2), reads kv head 1')doc");

    m.def(
        "explore_layout",
        [](const py::object& config, const py::kwargs& sections) {
            return explored(explore(make_config(config, sections)));
        },
        py::arg("config") = py::none(), R"doc(
Who holds what and who says what to whom under a config's layout, read off the runtime itself:
one step of the layout runs on in-process ranks (no run file, checkpoint or evaluation) with a
recorder around every group (the workbench's layout explorer). A dict with
  holds        {tensor: [{rank, rows: (lo, hi), cols: (lo, hi)}]}: the block of each weight
               matrix (as (rows, cols); a vector is one row) each rank holds between steps
  moments      the same for the Adam moments (ZeRO shards them)
  text         one line per rank and tensor: "rank 5 = dp1 · pp0 · tp1 holds
               h.3.mlp.c_fc.weight[1536:3072, :]"
  collectives  in the order the ops run: {phase ("fwd", "bwd", "grad", ...), layer (-1: the
               embedding, head or whole model), op, group ("dp", "tp", "pp"), collective, bytes
               (per call, one rank's sent + received), calls (per step on one rank), ranks}
  collectives_text  the same in words, one line each: "layer 1 fwd attn.c_proj: tp
               all_reduce, 1 call × 16.0 KiB on ranks 0-3"
  bytes_per_layer   {layer: int64 array, per world rank the bytes its collectives of that layer
               move in one step (calls × bytes)}
  memory       per world rank: params, grads, optimizer, activations, comm bytes after the step
  estimate     one rank's bytes as the job was admitted by (the ZeRO formulas)
>>> e = parallax.explore_layout(layout={"tp": 2}, model={"seq_len": 32}, numerics={"block": 16})
>>> e["holds"]["h.0.mlp.c_fc.weight"][1]["rows"]
(128, 256))doc");

    py::class_<Schedule>(m, "Schedule", R"doc(
A pipeline schedule as data: for every pipeline rank the actions it executes in order (forward,
backward, send_act, recv_act, send_grad, recv_grad of a microbatch and model chunk). The runtime
executes exactly these lists. Make one with parallax.schedule().)doc")
        .def_property_readonly("kind", [](const Schedule& s) { return schedule_name(s.kind); })
        .def_readonly("pp", &Schedule::pp)
        .def_readonly("microbatches", &Schedule::microbatches)
        .def_readonly("virtual_stages", &Schedule::virtual_stages)
        .def_property_readonly(
            "actions",
            [](const Schedule& s) {
                py::list ranks;
                for (const std::vector<Action>& list : s.ranks) {
                    py::list l;
                    for (const Action& a : list) l.append(action_dict(a));
                    ranks.append(l);
                }
                return ranks;
            },
            "Per pp rank, its actions in order: dicts with kind, microbatch, chunk, peer (the "
            "other pp rank of a send or recv; -1 for compute).")
        .def(
            "simulate",
            [](const Schedule& s, int forward_slots, int backward_slots, bool rendezvous,
               int weight_slots) {
                const SimResult r = check_schedule(
                    s, SimOptions{forward_slots, backward_slots, rendezvous, weight_slots});
                py::dict d;
                d["ok"] = r.ok();
                d["problem"] = r.problem;
                d["makespan"] = r.makespan;
                d["bubble"] = r.bubble;
                d["bubble_rate"] = r.bubble_rate;
                d["peak_in_flight"] = r.peak_in_flight;
                d["peak_pending_w"] = r.peak_pending_w;
                d["start"] = r.start;
                return d;
            },
            py::arg("forward_slots") = 1, py::arg("backward_slots") = 1,
            py::arg("rendezvous") = false, py::arg("weight_slots") = 0, R"doc(
Runs the lists in unit time (a forward takes forward_slots; B, the input-gradient part of a
backward, backward_slots; W, its weight-gradient part, weight_slots: a whole backward takes both,
and a zero-bubble schedule's W takes backward_slots when weight_slots is 0; communication none;
rendezvous: blocking sends) and checks completeness, dependencies and deadlock freedom. Returns
ok, problem (a sentence, "" when ok), makespan (slots), bubble (idle fraction of the makespan),
bubble_rate (idle per busy slot, as the papers state bubbles: (pp-1)/m for 1F1B at
forward_slots=1, backward_slots=1, weight_slots=1), peak_in_flight (per rank: most forwards
awaiting their backward, or their W), peak_pending_w (per rank: most Bs awaiting their W) and
start (per rank, per action: the slot it started in, -1 for communication and never-run
actions).)doc")
        .def(
            "text", [](const Schedule& s) { return to_text(s); },
            "The simulated timeline as a grid, one row per rank (F<m>, B<m>, W<m>, '.' idle).")
        .def(
            "actions_text", [](const Schedule& s) { return actions_text(s); },
            "Each rank's list with its communication (>A0:1 sends microbatch 0's activation to "
            "rank 1).")
        .def("__repr__", [](const Schedule& s) {
            return "<parallax.Schedule " + std::string(schedule_name(s.kind)) +
                   ", pp=" + std::to_string(s.pp) + ", microbatches=" +
                   std::to_string(s.microbatches) + ", virtual_stages=" +
                   std::to_string(s.virtual_stages) + ">";
        });

    m.def(
        "schedule",
        [](const std::string& kind, int pp, int microbatches, int virtual_stages) {
            const ScheduleKind k = parse_schedule(kind);
            if (k == ScheduleKind::zbv && virtual_stages == 1) virtual_stages = 2;  // its V
            return make_schedule(k, pp, microbatches, virtual_stages);
        },
        py::arg("kind") = "1f1b", py::arg("pp") = 2, py::arg("microbatches") = 4,
        py::arg("virtual_stages") = 1, R"doc(
A pipeline schedule: kind "gpipe", "1f1b", "interleaved" (virtual_stages >= 2 model chunks per
rank, microbatches a multiple of pp), "zb-h1" or "zbv" (zero bubble: each backward split into B
and W, W deferred; zbv two chunks per rank in a V), over pp ranks and that many microbatches.
ConfigError when the combination is impossible.
>>> parallax.schedule("1f1b", pp=4, microbatches=8).simulate()["bubble"]
0.2727...)doc");
}

}  // namespace px::py_bind
