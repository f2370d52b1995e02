// What one optimizer step reports: the trainer (core/train/job.h) fills it, observers, run files
// and checkpoints (core/io) keep it.
#pragma once
#include "core/base/shapes.h"

namespace px {

struct StepMetrics {
    i64 step = 0;          // 1-based
    double loss = 0;       // mean training loss of the step's batch, nats/token
    double val_loss = -1;  // validation loss when evaluated this step, else -1
    double grad_norm = 0;  // before clipping
    double lr = 0;
    double tokens_per_s = 0;
    double step_ms = 0;
    double comm_bytes = 0;  // bytes this rank sent in collectives during the step, all groups
};

}  // namespace px
