// read_run_records: a run file (core/io/runfile.h) opened read-only, everything read at once.
#include "core/io/hdf5_util.h"
#include "core/io/runfile.h"

#include <algorithm>
#include <cstdint>

namespace px {

namespace {

using H = H5Handle;

struct Reader {
    std::string path;
    hid_t file = -1;

    [[noreturn]] void fail(const std::string& what) const {
        throw Error("run file " + path + ": " + what + hdf5_detail() +
                    "; is it a run file written by parallax train (<output.dir>/run.h5)?");
    }

    std::vector<std::int64_t> int64s(const std::string& name) const {
        H d(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
        if (!d.ok()) fail("cannot open " + name);
        H space(H5Dget_space(d.get()), H5Sclose);
        const hssize_t n = H5Sget_simple_extent_npoints(space.get());
        std::vector<std::int64_t> v(static_cast<size_t>(std::max<hssize_t>(n, 0)));
        if (n > 0 && H5Dread(d.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
            fail("cannot read " + name);
        return v;
    }

    std::vector<double> doubles(const std::string& name) const {
        H d(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
        if (!d.ok()) fail("cannot open " + name);
        H space(H5Dget_space(d.get()), H5Sclose);
        const hssize_t n = H5Sget_simple_extent_npoints(space.get());
        std::vector<double> v(static_cast<size_t>(std::max<hssize_t>(n, 0)));
        if (n > 0 && H5Dread(d.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0)
            fail("cannot read " + name);
        return v;
    }

    // A dataset of variable-length strings (the events' kinds and messages).
    std::vector<std::string> strings(const std::string& name) const {
        H d(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
        if (!d.ok()) fail("cannot open " + name);
        H space(H5Dget_space(d.get()), H5Sclose);
        const hssize_t n = H5Sget_simple_extent_npoints(space.get());
        H type = h5::string_type();
        std::vector<char*> raw(static_cast<size_t>(std::max<hssize_t>(n, 0)), nullptr);
        if (n > 0 && H5Dread(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()) < 0)
            fail("cannot read " + name);
        std::vector<std::string> out;
        for (char* s : raw) out.emplace_back(s ? s : "");
        if (n > 0) H5Dvlen_reclaim(type.get(), space.get(), H5P_DEFAULT, raw.data());
        return out;
    }

    std::string string_attr(const char* key) const {
        H a(H5Aopen(file, key, H5P_DEFAULT), H5Aclose);
        if (!a.ok()) fail(std::string("no attribute ") + key);
        H type(H5Aget_type(a.get()), H5Tclose);
        if (H5Tis_variable_str(type.get()) > 0) {
            H mem = h5::string_type();
            char* s = nullptr;
            if (H5Aread(a.get(), mem.get(), &s) < 0) fail(std::string("cannot read ") + key);
            std::string out = s ? s : "";
            H5free_memory(s);
            return out;
        }
        std::string out(H5Tget_size(type.get()), '\0');
        if (H5Aread(a.get(), type.get(), out.data()) < 0) fail(std::string("cannot read ") + key);
        return out.substr(0, out.find('\0'));
    }
};

}  // namespace

RunRecords read_run_records(const std::string& path) {
    QuietHdf5 quiet;
    Reader r{path};
    H file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!file.ok()) r.fail("cannot open it");
    r.file = file.get();
    RunRecords rec;
    rec.config_toml = r.string_attr("config");
    // The numeric summaries set_attr wrote (num_params, memory_*_bytes, entropy_rate, ...).
    H5Aiterate2(
        r.file, H5_INDEX_NAME, H5_ITER_INC, nullptr,
        [](hid_t loc, const char* name, const H5A_info_t*, void* out) -> herr_t {
            H a(H5Aopen(loc, name, H5P_DEFAULT), H5Aclose);
            if (!a.ok()) return 0;
            H type(H5Aget_type(a.get()), H5Tclose);
            H space(H5Aget_space(a.get()), H5Sclose);
            if (H5Tget_class(type.get()) != H5T_FLOAT ||
                H5Sget_simple_extent_npoints(space.get()) != 1)
                return 0;
            double v = 0;
            if (H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v) >= 0)
                static_cast<std::vector<std::pair<std::string, double>>*>(out)->emplace_back(name,
                                                                                             v);
            return 0;
        },
        &rec.numbers);
    if (H5Lexists(r.file, "metrics", H5P_DEFAULT) <= 0) r.fail("no /metrics group");
    std::vector<std::string> names;
    H metrics(H5Gopen2(r.file, "metrics", H5P_DEFAULT), H5Gclose);
    H5Literate(
        metrics.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr,
        [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
            static_cast<std::vector<std::string>*>(out)->push_back(name);
            return 0;
        },
        &names);
    std::sort(names.begin(), names.end());
    for (const std::string& n : names) {
        RunRecords::Rows rows;
        for (const std::int64_t s : r.int64s("metrics/" + n + "/step")) rows.steps.push_back(s);
        rows.values = r.doubles("metrics/" + n + "/value");
        if (rows.values.size() != rows.steps.size())
            r.fail("/metrics/" + n + " has " + std::to_string(rows.steps.size()) + " steps but " +
                   std::to_string(rows.values.size()) + " values");
        rec.metrics.emplace_back(n, std::move(rows));
    }
    if (H5Lexists(r.file, "events", H5P_DEFAULT) > 0) {
        const std::vector<std::int64_t> steps = r.int64s("events/step");
        const std::vector<std::string> kinds = r.strings("events/kind");
        const std::vector<std::string> messages = r.strings("events/message");
        const size_t n = std::min({steps.size(), kinds.size(), messages.size()});
        std::vector<std::string> evidence;
        if (H5Lexists(r.file, "events/evidence", H5P_DEFAULT) > 0)
            evidence = r.strings("events/evidence");
        for (size_t i = 0; i < n; i++)
            rec.events.push_back({steps[i], kinds[i], messages[i],
                                  i < evidence.size() ? evidence[i] : std::string()});
    }
    if (H5Lexists(r.file, "fp8", H5P_DEFAULT) > 0) {
        const std::vector<Fp8Column>& cols = fp8_columns();
        size_t n = SIZE_MAX;
        std::vector<std::vector<std::int64_t>> ints(cols.size());
        std::vector<std::vector<double>> reals(cols.size());
        std::vector<std::vector<std::string>> texts(cols.size());
        for (size_t c = 0; c < cols.size(); c++) {
            const std::string name = std::string("fp8/") + cols[c].name;
            if (cols[c].kind == 'i') n = std::min(n, (ints[c] = r.int64s(name)).size());
            if (cols[c].kind == 'f') n = std::min(n, (reals[c] = r.doubles(name)).size());
            if (cols[c].kind == 's') n = std::min(n, (texts[c] = r.strings(name)).size());
        }
        rec.fp8.resize(n);
        for (size_t c = 0; c < cols.size(); c++)
            for (size_t k = 0; k < n; k++) {
                Fp8Stat& row = rec.fp8[k];
                if (cols[c].kind == 'i') row.*cols[c].i = ints[c][k];
                if (cols[c].kind == 'f') row.*cols[c].f = reals[c][k];
                if (cols[c].kind == 's') row.*cols[c].s = texts[c][k];
            }
    }
    return rec;
}

const std::vector<Fp8Column>& fp8_columns() {
    static const std::vector<Fp8Column> cols = [] {
        std::vector<Fp8Column> v;
        for (const Fp8IntField& f : kFp8Ints) v.push_back({f.name, 'i', f.field, nullptr, nullptr});
        v.push_back({"tensor", 's', nullptr, nullptr, &Fp8Stat::tensor});
        v.push_back({"recipe", 's', nullptr, nullptr, &Fp8Stat::recipe});
        for (const Fp8RealField& f : kFp8Reals)
            v.push_back({f.name, 'f', nullptr, f.field, nullptr});
        return v;
    }();
    return cols;
}

}  // namespace px
