// parallax.Config: a job config from a TOML file, a dict or keyword sections, built the way the
// CLI's --set builds one (every value is TOML text given to apply_overrides), so a bad value gets
// the library's own sentence naming the key.
#include "bindings/common.h"
#include "core/base/error.h"
#include "core/parallel/mesh.h"

#include <cmath>
#include <cstdio>

namespace px::py_bind {

namespace {

// A TOML basic string: quotes, backslashes and control characters escaped.
std::string toml_string(const std::string& s) {
    std::string out = "\"";
    for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += ch;
        } else if (c < 0x20 || c == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        } else {
            out += ch;
        }
    }
    return out + "\"";
}

// The TOML text of a Python value, as --set would be given it.
std::string toml_value(const py::handle& v, const std::string& key) {
    if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "true" : "false";
    if (py::isinstance<py::str>(v)) return toml_string(v.cast<std::string>());
    if (py::hasattr(v, "__index__") && !py::isinstance<py::float_>(v))  // int, numpy integers
        return py::str(py::int_(py::reinterpret_borrow<py::object>(v)));
    if (py::isinstance<py::float_>(v) || py::hasattr(v, "__float__")) {
        const double d = py::float_(py::reinterpret_borrow<py::object>(v));
        if (std::isnan(d)) return "nan";
        if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
        return py::repr(py::float_(d));  // shortest round trip: "0.001", "1e-05", "3.0"
    }
    throw ConfigError(key + ": a Python " +
                      std::string(py::str(py::type::handle_of(v).attr("__name__"))) +
                      " is not a config value; give a bool, int, float or str");
}

// "section.key=value" assignments of a dict: {"train": {"lr": 1e-3}} or {"train.lr": 1e-3}.
void assignments(const py::handle& d, const std::string& section, std::vector<std::string>& out) {
    for (const auto& [k, v] : py::reinterpret_borrow<py::dict>(d)) {
        if (!py::isinstance<py::str>(k))
            throw ConfigError("config keys are strings (\"train\", \"lr\" or \"train.lr\"), not " +
                              std::string(py::repr(k)));
        const std::string name = section.empty() ? k.cast<std::string>()
                                                 : section + "." + k.cast<std::string>();
        if (py::isinstance<py::dict>(v)) {
            if (!section.empty())
                throw ConfigError(name + ": sections do not nest; give " + section +
                                  "={\"key\": value}");
            assignments(v, name, out);
        } else if (section.empty() && name.find('.') == std::string::npos) {
            throw ConfigError(name + " is a section: give it a dict of keys, e.g. " + name +
                              "={\"key\": value}, or write \"" + name + ".key\"");
        } else {
            out.push_back(name + "=" + toml_value(v, name));
        }
    }
}

std::string describe(const Config& c) {
    return "<parallax.Config from " + c.source_name + ": L=" + std::to_string(c.model.layers) +
           " C=" + std::to_string(c.model.hidden) + " NH=" + std::to_string(c.model.heads) +
           " V=" + std::to_string(c.model.vocab) + " T=" + std::to_string(c.model.seq_len) +
           ", " + std::to_string(c.train.steps) + " steps of " +
           std::to_string(c.train.batch_size) + ", layout dp" + std::to_string(c.layout.dp) +
           " tp" + std::to_string(c.layout.tp) + " pp" + std::to_string(c.layout.pp) + " zero" +
           std::to_string(c.layout.zero) + ", " + mode_name(c.numerics.mode) + ">";
}

py::object to_dict(const Config& c) {
    return py::module_::import("tomllib").attr("loads")(config_to_toml(c));
}

}  // namespace

Config make_config(const py::object& source, const py::dict& sections) {
    Config cfg;
    std::vector<std::string> sets;
    if (source.is_none() || py::isinstance<py::dict>(source)) {
        cfg = job_config("");
        if (!source.is_none()) {
            assignments(source, "", sets);
            cfg.source_name = "<dict>";
        }
    } else if (py::isinstance<PyConfig>(source)) {
        cfg = source.cast<const PyConfig&>().cfg;
    } else if (py::isinstance<py::str>(source) || py::hasattr(source, "__fspath__")) {
        const std::string path = py::str(py::module_::import("os").attr("fspath")(source));
        cfg = with_files({path}, [&] { return load_config(path); });
    } else {
        throw ConfigError("a config is a TOML file's path, a dict of sections or a parallax.Config, "
                          "not a Python " +
                          std::string(py::str(py::type::handle_of(source).attr("__name__"))));
    }
    assignments(sections, "", sets);
    apply_overrides(cfg, sets);
    return cfg;
}

void bind_config(py::module_& m) {
    py::class_<PyConfig>(m, "Config", R"doc(
A job config: the sections [model] [layout] [train] [data] [numerics] [precision] [output]
[checkpoint] [validate] [fault] [spikes] [fp8_monitor] of docs/config.md.

Config(source=None, **sections)
    source    None: the embedded default job (examples/tiny.toml); a path to a TOML file; a dict
              of sections ({"train": {"lr": 1e-3}}) or of dotted keys ({"train.lr": 1e-3}) over
              the default job; or another Config.
    sections  keyword sections applied last, e.g. train={"lr": 1e-3}, layout={"tp": 2}.

Values are applied the way `parallax train --set section.key=value` applies them, all at once,
then the config is checked: an unknown key, a wrong type or a value out of range raises
parallax.ConfigError naming the key. The layout is checked against the model and the batch when a
job or a validation starts (or with `layout()`).

>>> cfg = parallax.Config("examples/tiny.toml", train={"steps": 10}, layout={"dp": 2})
>>> cfg["train.steps"]
10
)doc")
        .def(py::init([](const py::object& source, const py::kwargs& sections) {
                 return PyConfig{make_config(source, sections)};
             }),
             py::arg("source") = py::none())
        .def_property_readonly(
            "toml", [](const PyConfig& c) { return config_to_toml(c.cfg); },
            "The config as complete TOML text (what run files and checkpoints store).")
        .def_property_readonly(
            "source", [](const PyConfig& c) { return c.cfg.source_name; },
            "Where it came from: a file's path, \"<embedded default>\" or \"<dict>\".")
        .def("to_dict", [](const PyConfig& c) { return to_dict(c.cfg); },
             "Every section and key as nested dicts of Python values.")
        .def(
            "__getitem__",
            [](const PyConfig& c, const std::string& key) -> py::object {
                const py::dict d = to_dict(c.cfg);
                const size_t dot = key.find('.');
                const std::string section = key.substr(0, dot);
                if (!d.contains(section))
                    throw KeyLookupError("no config section \"" + section + "\"");
                py::dict s = d[section.c_str()];
                if (dot == std::string::npos) return s;
                const std::string k = key.substr(dot + 1);
                if (!s.contains(k)) throw KeyLookupError("no config key \"" + key + "\"");
                return s[k.c_str()];
            },
            py::arg("key"), "A key's value (\"train.lr\") or a section's dict (\"train\").")
        .def(
            "override",
            [](const PyConfig& c, const py::kwargs& sections) {
                return PyConfig{make_config(py::cast(c), sections)};
            },
            "A copy with keyword sections applied: cfg.override(layout={\"tp\": 2}).")
        .def(
            "layout",
            [](const PyConfig& c) { return Mesh(make_layout(c.cfg)).describe(); },
            "Checks the [layout] against the model, the batch and the numerics (ConfigError "
            "naming the keys when it does not fit) and describes the mesh: the ranks, their "
            "coordinates and layers.")
        .def("__eq__", [](const PyConfig& a, const PyConfig& b) { return a.cfg == b.cfg; })
        .def("__repr__", [](const PyConfig& c) { return describe(c.cfg); });

    m.def("config_keys", &config_keys, "Every config key as \"section.key\", in file order.");
    m.def("default_config_toml", [] { return std::string(default_config_toml()); },
          "The embedded default job as TOML text, one comment line per key.");
}

}  // namespace px::py_bind
