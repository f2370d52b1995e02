// Validation from Python: parallax.validate runs the single-device reference and parallel
// layouts step by step and returns the report `parallax validate` prints (validators/validate.h);
// golden traces are recorded and read (validators/trace.h). The report's objects are the
// library's own structs, read-only.
#include "bindings/common.h"

#include "core/base/error.h"
#include "validators/trace.h"
#include "validators/trace_compare.h"
#include "validators/validate.h"

#include <memory>

namespace px::py_bind {

namespace {

std::vector<LayoutSpec> layouts_of(const py::object& layouts) {
    if (py::isinstance<py::str>(layouts)) return parse_layouts(layouts.cast<std::string>());
    std::vector<LayoutSpec> out;
    for (const py::handle& l : layouts) out.push_back(parse_layout(py::str(l)));
    return out;
}

py::dict per_tensor(const std::vector<Comparison>& cs) {
    const auto n = static_cast<py::ssize_t>(cs.size());
    py::list names;
    py::array_t<std::int64_t> max_ulp(n), differing(n), count(n);
    py::array_t<double> max_abs(n), max_rel(n);
    for (py::ssize_t i = 0; i < n; i++) {
        const Comparison& c = cs[static_cast<size_t>(i)];
        names.append(c.name);
        max_ulp.mutable_at(i) = c.max_ulp;
        differing.mutable_at(i) = c.differing;
        count.mutable_at(i) = c.count;
        max_abs.mutable_at(i) = c.max_abs;
        max_rel.mutable_at(i) = c.max_rel;
    }
    py::dict d;
    d["name"] = names;
    d["count"] = count;
    d["differing"] = differing;
    d["max_ulp"] = max_ulp;
    d["max_abs"] = max_abs;
    d["max_rel"] = max_rel;
    return d;
}

}  // namespace

void bind_validate(py::module_& m) {
    py::class_<Comparison>(m, "Comparison", "One tensor compared with its reference.")
        .def_readonly("name", &Comparison::name, "\"params/wte\", or a probe \"3/bwd/1/mlp.fc/dinp\"")
        .def_readonly("shape", &Comparison::shape)
        .def_readonly("count", &Comparison::count, "elements compared")
        .def_readonly("differing", &Comparison::differing, "elements whose bits differ")
        .def_readonly("max_ulp", &Comparison::max_ulp)
        .def_property_readonly(
            "ulp_histogram",
            [](const Comparison& c) {
                py::array_t<std::int64_t> a(static_cast<py::ssize_t>(c.ulp_histogram.size()));
                std::copy(c.ulp_histogram.begin(), c.ulp_histogram.end(), a.mutable_data());
                return a;
            },
            "differing elements by ULP distance bucket (validators/compare.h)")
        .def_readonly("max_abs", &Comparison::max_abs)
        .def_readonly("max_rel", &Comparison::max_rel)
        .def_readonly("first", &Comparison::first, "flat index of the first differing element; -1: none")
        .def_readonly("first_index", &Comparison::first_index)
        .def_readonly("first_reference", &Comparison::first_reference)
        .def_readonly("first_candidate", &Comparison::first_candidate)
        .def_property_readonly("equal", &Comparison::equal, "bit-identical")
        .def("text", &Comparison::text)
        .def("__repr__", [](const Comparison& c) { return "<parallax.Comparison " + c.text() + ">"; });

    py::class_<LayoutResult::Axis>(m, "AxisResult", "A single-axis part of a diverged layout, run alone.")
        .def_readonly("layout", &LayoutResult::Axis::layout)
        .def_readonly("verdict", &LayoutResult::Axis::verdict)
        .def_readonly("first_step", &LayoutResult::Axis::first_step)
        .def_readonly("error", &LayoutResult::Axis::error);

    py::class_<LayoutResult>(m, "LayoutResult", "One layout's outcome against the reference.")
        .def_readonly("layout", &LayoutResult::layout)
        .def_readonly("verdict", &LayoutResult::verdict,
                      "\"match\", \"diverged\", \"within budget\", \"over budget\" or \"error\"")
        .def_readonly("steps", &LayoutResult::steps)
        .def_readonly("max_ulp", &LayoutResult::max_ulp)
        .def_readonly("first_step", &LayoutResult::first_step, "first step that differs; -1: none")
        .def_readonly("first_rank", &LayoutResult::first_rank,
                      "the lowest world rank whose pieces of `first` differ; -1: none")
        .def_readonly("first", &LayoutResult::first, "the first differing tensor of first_step")
        .def_readonly("first_ranks", &LayoutResult::first_ranks,
                      "every world rank whose pieces of `first` differ")
        .def_readonly("replica_step", &LayoutResult::replica_step,
                      "the first step a replica's copy of a piece differed from its twins'; -1: none")
        .def_readonly("replica_tensor", &LayoutResult::replica_tensor)
        .def_readonly("replica_ranks", &LayoutResult::replica_ranks,
                      "the world ranks whose copy differs from their twins'")
        .def_readonly("replica_twin", &LayoutResult::replica_twin)
        .def_readonly("differing", &LayoutResult::differing)
        .def_readonly("final_step", &LayoutResult::final_step,
                      "every tensor's comparison after the last step")
        .def_readonly("first_op_rank", &LayoutResult::first_op_rank)
        .def_readonly("first_op_ranks", &LayoutResult::first_op_ranks)
        .def_readonly("first_op_where", &LayoutResult::first_op_where)
        .def_readonly("first_op", &LayoutResult::first_op,
                      "the first probe (op output) where a rank's piece differs")
        .def_readonly("first_op_note", &LayoutResult::first_op_note)
        .def_readonly("axes", &LayoutResult::axes)
        .def_readonly("budget_ratio", &LayoutResult::budget_ratio)
        .def_readonly("budget_worst", &LayoutResult::budget_worst)
        .def_readonly("error", &LayoutResult::error)
        .def_readonly("seconds", &LayoutResult::seconds)
        .def_property_readonly("ok", &LayoutResult::ok)
        .def(
            "per_tensor", [](const LayoutResult& r) { return per_tensor(r.final_step); },
            "The final step's comparisons as columns: name (list), count, differing, max_ulp "
            "(int64 arrays), max_abs, max_rel (float64 arrays).")
        .def("__repr__", [](const LayoutResult& r) {
            return "<parallax.LayoutResult " + r.layout + ": " + r.verdict + ">";
        });

    py::class_<ValidationReport>(m, "ValidationReport", "Every layout's result (parallax.validate).")
        .def_readonly("job", &ValidationReport::job)
        .def_readonly("mode", &ValidationReport::mode)
        .def_readonly("steps", &ValidationReport::steps)
        .def_readonly("reference_seconds", &ValidationReport::reference_seconds)
        .def_readonly("layouts", &ValidationReport::layouts)
        .def_property_readonly("all_ok", &ValidationReport::all_ok)
        .def_property_readonly("any_error", &ValidationReport::any_error)
        .def("table", &ValidationReport::table, "The table `parallax validate` prints.")
        .def("to_json", &ValidationReport::to_json, "The JSON report (validators/README.md).")
        .def("to_markdown", &ValidationReport::to_markdown)
        .def(
            "rows",
            [](const ValidationReport& rep) {
                py::list rows;
                for (const LayoutResult& r : rep.layouts) {
                    py::dict d;
                    d["layout"] = r.layout;
                    d["steps"] = r.steps;
                    d["verdict"] = r.verdict;
                    d["max_ulp"] = r.max_ulp;
                    d["first_step"] = r.first_step;
                    d["first_tensor"] = r.first_step >= 0 ? py::object(py::str(r.first.name))
                                                          : py::object(py::none());
                    d["first_rank"] = r.first_rank;
                    d["first_op"] = r.first_op_rank >= 0 ? py::object(py::str(r.first_op.name))
                                                         : py::object(py::none());
                    d["first_op_rank"] = r.first_op_rank;
                    d["seconds"] = r.seconds;
                    rows.append(d);
                }
                return rows;
            },
            "The table as one dict per layout.")
        .def("__repr__", [](const ValidationReport& r) { return r.table(); });

    m.def(
        "validate",
        [](const py::object& config, const py::object& layouts, i64 steps, const py::object& mode,
           const py::object& golden, const py::kwargs& sections) {
            Config cfg = make_config(config, sections);
            if (!mode.is_none()) apply_override(cfg, "numerics.mode=" + py::str(mode).cast<std::string>());
            cfg.output.run_file = false;
            const std::vector<LayoutSpec> specs = layouts_of(layouts);
            if (steps < 1) throw ConfigError("steps = " + std::to_string(steps) + ": validate at least one step");
            for (const LayoutSpec& l : specs) {
                try {
                    Config c = cfg;
                    c.train.steps = steps;
                    with_layout(c, l);
                } catch (const ConfigError& e) {
                    throw ConfigError("layout " + l.name + ": " + e.what());
                }
            }
            ValidationReport report;
            if (!golden.is_none()) {
                const std::string path = py::str(py::module_::import("os").attr("fspath")(golden));
                with_files({path}, [&] {
                    run_interruptibly([&](const Cancel& cancel) {
                        const TraceReader trace(path);
                        report = validate_golden(cfg, specs, trace, nullptr, cancel);
                    });
                });
                return report;
            }
            run_interruptibly([&](const Cancel& cancel) {
                report = validate_layouts(cfg, specs, steps, nullptr, {}, {}, cancel);
            });
            return report;
        },
        py::arg("config") = py::none(), py::kw_only(),
        py::arg("layouts") = "dp2,tp2,pp2,dp2xtp2xpp2", py::arg("steps") = 20,
        py::arg("mode") = py::none(), py::arg("golden") = py::none(), R"doc(
Runs the single-device reference of a job and then each layout on in-process ranks, comparing
every gradient, weight, Adam moment, loss and grad norm after every step, as `parallax validate`
does; returns a ValidationReport (table(), rows(), layouts: LayoutResult with the first
divergence, the first op and per-tensor comparisons).

  layouts   a list or a comma-separated string: parts joined by 'x', dpN, tpN, ppN, zN (ZeRO
            stage), mbN (microbatches per replica), sp (sequence parallelism): "dp2xtp2xpp2"
  steps     steps to run and compare
  mode      "bitwise" (every bit equal) or "fast" (fast kernels, judged by the error budget)
  golden    a trace from record_trace(): the layouts are checked against it, no reference runs

A layout that cannot take the job raises ConfigError naming it before anything runs. The config's
[fault] strikes the layouts only (never the reference): how to plant a divergence and watch the
harness name it. It runs with the GIL released; Ctrl-C (KeyboardInterrupt) stops it after the step
in progress of whichever run is going (reference or layout) and returns nothing; the interpreter
stays usable.)doc");

    m.def(
        "record_trace",
        [](const py::object& path, const py::object& config, i64 steps,
           const std::vector<std::string>& probes, i64 stride, const py::kwargs& sections) {
            Config cfg = make_config(config, sections);
            if (steps < 1 || steps > cfg.train.steps)
                throw ConfigError("steps = " + std::to_string(steps) + " must be in 1..train.steps (" +
                                  std::to_string(cfg.train.steps) + ")");
            if (stride < 1) throw ConfigError("stride = " + std::to_string(stride) + " must be at least 1");
            cfg.layout = LayoutConfig{.timeout_s = cfg.layout.timeout_s};
            cfg.fault = FaultConfig{};
            cfg.validate = ValidateConfig{};
            cfg.output.run_file = false;
            const std::string out = py::str(py::module_::import("os").attr("fspath")(path));
            i64 bytes = 0;
            run_interruptibly([&](const Cancel& cancel) {
                bytes = record_trace(cfg, probes, stride, steps, out, cancel);
            });
            return bytes;
        },
        py::arg("path"), py::arg("config") = py::none(), py::kw_only(), py::arg("steps") = 20,
        py::arg("probes") = std::vector<std::string>{"**"}, py::arg("stride") = 1, R"doc(
Runs the single-device reference of a job (its layout and [fault] ignored) with probes and writes
a golden trace to `path`, as `parallax record`: probes are globs over step/phase/layer/op/tensor
names (* within a part, ** across parts). Returns the bytes of tensors written. Check layouts
against it with validate(..., golden=path). Ctrl-C (KeyboardInterrupt) stops it after the step in
progress, before anything is written.)doc");

    m.def(
        "compare",
        [](const py::object& ref, const py::object& run) {
            auto os = py::module_::import("os");
            const std::string a = py::str(os.attr("fspath")(ref));
            const std::string b = py::str(os.attr("fspath")(run));
            std::string text;
            {
                py::gil_scoped_release release;
                text = with_files({a, b}, [&] {
                    const TraceReader r(a), c(b);
                    return compare_traces(r, c).json();
                });
            }
            return py::module_::import("json").attr("loads")(text);
        },
        py::arg("reference"), py::arg("run"), R"doc(
Compares a run's trace with a reference trace op by op under the error budget, as `parallax
compare`: a dict with the verdict ("consistent with rounding" or the first op over budget),
within (bool), first_over (probe, step, op, rank, ratio, or None), split (the first over-budget
probe's ratio on each of the run's ranks), max_ratio and worst, unit and layers (the budget's u
and L), kappa, every probe's row (probe, rank, step, op, elements, error, scale, rel, depth,
budget, ratio, worst_at, worst_ref, worst_run) and the probes only one trace holds.)doc");

    py::class_<TraceReader>(m, "Trace", R"doc(
A golden trace, opened and checked (DataError naming the file otherwise).
Trace(path): info (dict: config, patterns, stride, steps, data_hash, source, precision, layout),
names() (the probes
in the reference's order of execution), read(name) (a probe's logical tensor, its checksum
verified: a numpy array that owns the data read).)doc")
        .def(py::init([](const py::object& path) {
                 const std::string p = py::str(py::module_::import("os").attr("fspath")(path));
                 return with_files({p}, [&] { return std::make_unique<TraceReader>(p); });
             }),
             py::arg("path"))
        .def_property_readonly("path", &TraceReader::path)
        .def_property_readonly("info",
                               [](const TraceReader& t) {
                                   const TraceInfo& i = t.info();
                                   py::dict d;
                                   d["config"] = i.config_toml;
                                   d["patterns"] = i.patterns;
                                   d["stride"] = i.stride;
                                   d["steps"] = i.steps;
                                   d["data_hash"] = i.data_hash;
                                   d["source"] = i.source;
                                   d["precision"] = i.precision;
                                   d["layout"] = i.layout_json;
                                   return d;
                               })
        .def("names", [](const TraceReader& t) { return t.info().order; })
        .def(
            "read",
            [](const TraceReader& t, const std::string& name) {
                std::vector<i64> shape;
                std::vector<float> v = t.read(name, &shape);
                return adopt(std::move(v), shape);
            },
            py::arg("name"));
}

}  // namespace px::py_bind
