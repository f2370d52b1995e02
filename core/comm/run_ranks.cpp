// The rank runner (core/comm/run_ranks.h): one thread per rank on an in-process world, and the
// sorting of the ranks' errors into the cause and its consequences.
#include "core/comm/run_ranks.h"

#include "core/comm/backend.h"  // what_of

#include <memory>
#include <mutex>
#include <thread>

namespace px::comm {

void RankErrors::rethrow_first() const {
    if (first >= 0) std::rethrow_exception(error[first]);
}

int cause_of(const RankErrors& errors) {
    const int n = static_cast<int>(errors.error.size());
    const auto is_comm = [&](int r) {
        try {
            std::rethrow_exception(errors.error[static_cast<size_t>(r)]);
        } catch (const CommError&) {
            return true;
        } catch (...) {
            return false;
        }
    };
    const auto consequence = [&](int r) {
        return errors.message[static_cast<size_t>(r)].find(
                   " was abandoned because the job failed: ") != std::string::npos;
    };
    const auto has = [&](int r) { return errors.error[static_cast<size_t>(r)] != nullptr; };
    for (int r = 0; r < n; r++)
        if (has(r) && !is_comm(r)) return r;
    if (errors.first >= 0 && errors.first < n && has(errors.first) && !consequence(errors.first))
        return errors.first;
    for (int r = 0; r < n; r++)
        if (has(r) && !consequence(r)) return r;
    return -1;
}

RankErrors run_ranks_collect(InProcWorld& world, const std::function<void(Communicator&)>& fn) {
    const int n = world.size();
    RankErrors res;
    res.error.resize(n);
    res.message.resize(n);
    std::mutex mu;
    auto body = [&](int r) {
        std::unique_ptr<Communicator> c;
        try {
            c = world.comm(r);
            fn(*c);
        } catch (...) {
            const auto e = std::current_exception();
            const std::string msg = backend::what_of(e);
            {
                std::lock_guard lk(mu);
                res.error[r] = e;
                res.message[r] = msg;
                if (res.first < 0) res.first = r;
            }
            // Fail the job before this rank leaves its groups, so that the others hear why.
            // (When the error is itself the job's failure, this changes nothing.)
            world.abort("rank " + std::to_string(r) + " failed: " + msg);
        }
        c.reset();  // leaves its groups: whoever still waits for it fails at once
    };
    std::vector<std::thread> threads;
    threads.reserve(n);
    for (int r = 0; r < n; r++) threads.emplace_back(body, r);
    for (auto& t : threads) t.join();
    const int cause = cause_of(res);
    if (cause >= 0) res.first = cause;
    return res;
}

RankErrors run_ranks_collect(int n, double timeout_s,
                             const std::function<void(Communicator&)>& fn) {
    InProcWorld world(n, timeout_s);
    return run_ranks_collect(world, fn);
}

void run_ranks(InProcWorld& world, const std::function<void(Communicator&)>& fn) {
    run_ranks_collect(world, fn).rethrow_first();
}

void run_ranks(int n, double timeout_s, const std::function<void(Communicator&)>& fn) {
    run_ranks_collect(n, timeout_s, fn).rethrow_first();
}

}  // namespace px::comm
