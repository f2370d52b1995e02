// What a command throws, as an exit code and one line on stderr (app/commands.h lists the codes).
#include "app/commands.h"
#include "core/base/error.h"
#include "core/comm/comm.h"

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>

namespace px::app {

int run_reporting(const std::string& who, const std::function<int()>& run) {
    const char* w = who.c_str();
    try {
        return run();
    } catch (const ConfigError& e) {
        std::fprintf(stderr, "%s: config error: %s\n", w, e.what());
        return kBadInput;
    } catch (const DataError& e) {
        std::fprintf(stderr, "%s: data error: %s\n", w, e.what());
        return kBadInput;
    } catch (const comm::CommError& e) {
        std::fprintf(stderr, "%s: communication failed, restart the job: %s\n", w, e.what());
        return kRestart;
    } catch (const StorageError& e) {
        std::fprintf(stderr, "%s: cannot write: %s\n", w, e.what());
        return kStorage;
    } catch (const CorruptionError& e) {
        std::fprintf(stderr, "%s: %s\n", w, e.what());
        return kCorruption;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: error: %s\n", w, e.what());
        return kInternal;
    }
}

void write_report(const std::string& path, const std::string& text) {
    const std::string tmp = path + ".tmp";
    {
        std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
        f << text;
        f.close();
        if (!f) throw StorageError("cannot write the report " + path);
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) throw StorageError("cannot write the report " + path + ": " + ec.message());
}

}  // namespace px::app
