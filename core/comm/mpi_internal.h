// The two halves of the MPI backend (core/comm/mpi.h describes how a collective runs):
// core/comm/mpi.cpp moves messages and turns every failure into an error on every rank (MPI
// errors, the failure channel, polled waits, the communicator); core/comm/mpi_collectives.cpp
// says what the ranks of a collective agree on and what each collective moves. Not for users
// of a Communicator.
//
// Index
//   kTagData            the tag of the collectives' data messages
//   Pending             requests in flight with their peers: posted in pieces, waited on together
//   Header, header_for  what a rank tells each peer about its k-th collective
//   check_match         the verdict on the ranks' headers: "" when they agree
//   Group               what the data phase of a collective needs of its communicator
//   move_data           the data phase of a collective (after the header exchange)
#pragma once
#include "core/comm/mpi.h"

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace px::comm::mpi {

constexpr int kTagData = 2;

// Requests in flight, with what each one is (a send or a recv, and the peer), so that a wait that
// gives up can name who is missing and cancel what it posted.
struct Pending {
    std::vector<MPI_Request> reqs;
    std::vector<int> peer;
    std::vector<char> is_recv;
    std::vector<i64> bytes;      // posted length of each piece
    std::shared_ptr<void> keep;  // buffers of the sends (headers) to keep if abandoned

    void add(MPI_Request r, int p, bool recv, i64 len);
    // sync: MPI_Issend, which completes only when the receiver has matched it.
    void post_send(const void* buf, i64 bytes, int p, int tag, MPI_Comm c, int me,
                   bool sync = false);
    void post_recv(void* buf, i64 bytes, int p, int tag, MPI_Comm c, int me);
    // Peers of the requests not yet complete, each once, sorted.
    std::vector<int> missing() const;
    // Gives up: receives are cancelled (so nothing writes into the caller's buffers later),
    // sends released to complete on their own.
    void cancel();
};

// What a rank tells each peer about its #k. Fields 7 and 8 are per destination (all_to_all_v).
enum Field {
    kSeq,
    kOp,
    kDtype,
    kAlgo,
    kN,
    kRoot,
    kCounts,
    kPairIn,
    kPairOut,
    kColor,
    kName,
    kFields
};
using Header = std::array<i64, kFields>;

Header header_for(const Request& q, i64 seq, int dst);
// h[k]: rank k's header (h[rank]: this rank's, as a peer reads it); me: this rank's request.
std::string check_match(const std::vector<Header>& h, const Request& me, int rank,
                        const std::string& group, const std::string& what);

struct Group {
    int size = 1, rank = 0;
    int world_rank = 0;                  // for MPI errors
    MPI_Comm comm = MPI_COMM_NULL;       // the collectives' duplicate
    std::function<void(Pending&)> wait;  // or fails the job naming who did not deliver
};
void move_data(const Group& g, const Request& q);

}  // namespace px::comm::mpi
