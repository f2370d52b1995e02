// Shape letters, defined once for the whole tree.
//
//   B   sequences in a (micro)batch          T   tokens per sequence (<= model.seq_len)
//   C   hidden size (channels)               OC  output channels of a linear layer
//   NH  attention heads                      HS  head size, C / NH
//   V   vocabulary size                      F   MLP inner size (model.ffn, 4*C in GPT-2)
//   L   transformer blocks                   BT  B*T, the token (row) count of a matrix
//
// Every kernel comment writes shapes with these letters: `// inp (B,T,C), weight (OC,C)`.
#pragma once
#include <cstdint>

namespace px {
using i64 = std::int64_t;
}  // namespace px
