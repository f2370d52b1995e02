// Converting GPT-2 weights between llm.c's checkpoint format and Parallax checkpoints
// (docs/files.md), in either direction: the work of `parallax convert` and `parallax.convert`.
#pragma once
#include <string>

namespace px {

// OUT's extension says the direction: ".h5": IN is an llm.c GPT-2 checkpoint (fp32, version 1 or
// 3) and OUT becomes a Parallax checkpoint of its weights (zero Adam moments, step 0, meant for
// model.init_from); ".bin": IN is a Parallax checkpoint (every checksum verified) of a
// GPT-2-shaped model and OUT becomes llm.c's fp32 version-3 file. Both are written atomically.
// Returns what was written, in two or three lines. DataError naming the file on bad input.
std::string convert_weights(const std::string& in, const std::string& out);

}  // namespace px
