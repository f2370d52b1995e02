// A rank's setup, checked against its layout (part.h).
#include "core/parallel/part.h"

#include "core/base/error.h"

#include <string>

namespace px {

namespace {

int size_of(const comm::Communicator* c) {
    return c ? c->size() : 1;
}
int rank_in(const comm::Communicator* c) {
    return c ? c->rank() : 0;
}

}  // namespace

RankSetup make_rank_setup(const Config& cfg, const Layout& layout, const RankGroups& groups) {
    const std::pair<const char*, comm::Communicator*> given[] = {
        {"pp", groups.pp}, {"dp", groups.dp}, {"tp", groups.tp}, {"cp", groups.cp}};
    const int want[] = {layout.pp, layout.dp, layout.tp, layout.cp};
    for (int d = 0; d < 4; d++)
        if (size_of(given[d].second) != want[d])
            throw ConfigError("the " + std::string(given[d].first) + " group has " +
                              std::to_string(size_of(given[d].second)) + " ranks but layout." +
                              given[d].first + " = " + std::to_string(want[d]));
    if (layout.ep > 1 && (size_of(groups.ep) != layout.ep ||
                          size_of(groups.expert_data) != layout.dp / layout.ep))
        throw ConfigError("the ep group has " + std::to_string(size_of(groups.ep)) +
                          " ranks and the expert-data group " +
                          std::to_string(size_of(groups.expert_data)) + " but layout.ep = " +
                          std::to_string(layout.ep) + " of layout.dp = " +
                          std::to_string(layout.dp));
    if (layout.cp > 1 && size_of(groups.data) != layout.dp * layout.cp)
        throw ConfigError("the data group has " + std::to_string(size_of(groups.data)) +
                          " ranks but layout.dp × layout.cp = " +
                          std::to_string(layout.dp * layout.cp));
    RankSetup r{cfg, layout, make_numerics(cfg.numerics), Mesh(layout, Mesh::Validated{}), groups,
                Coord{}};
    r.at.pp = rank_in(groups.pp);
    r.at.dp = rank_in(groups.dp);
    r.at.tp = rank_in(groups.tp);
    r.at.cp = rank_in(groups.cp);
    r.ep_rank = r.at.dp % layout.ep;
    r.T = cfg.model.seq_len;
    r.Tl = layout.local_seq_len();
    r.micro_B = layout.microbatch_size();
    r.local_B = r.micro_B * layout.microbatches;
    return r;
}

}  // namespace px
