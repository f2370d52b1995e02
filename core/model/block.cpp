#include "core/model/block.h"

#include "core/model/gpt2_block.h"
#include "core/model/llama_block.h"

namespace px {

std::unique_ptr<Block> make_block(const LayerOps& ops, const MoeLayer& moe, float* logit_max) {
    if (ops.config().llama()) return std::make_unique<LlamaBlock>(ops, moe, logit_max);
    return std::make_unique<Gpt2Block>(ops, moe, logit_max);
}

}  // namespace px
