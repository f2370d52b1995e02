"""What the Python tests that line Parallax up with transformers share: an llm.c token file
(core/model/data.h: a 256-int32 header, magic 20240520, version 1, the count, then uint16 tokens)
for a Parallax job's data.train_path. A helper module, not a test file."""
import numpy as np

TOKEN_MAGIC = 20240520


def token_file(path, tokens):
    header = np.zeros(256, dtype="<i4")
    header[:3] = [TOKEN_MAGIC, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())
