"""The zoo's bugs: each a known, published mistake of a parallel training loop, silent (the run
trains and its loss looks plausible), switched on by `train.py --bug NAME`. The layout that
exposes each one and the probe that first differs are in test_zoo.py's EXPECTED and README.md.

name -> (what it does, where it is published)
"""
BUGS = {
    "row_fwd_no_allreduce": (
        "the MLP's row-parallel down_proj returns its rank's partial sum: no forward all-reduce "
        "(g is the identity)",
        "https://github.com/FlashML-org/FreeToken/pull/429; "
        "https://github.com/sgl-project/sglang/pull/14811"),
    "col_bwd_no_allreduce": (
        "the attention's column-parallel q/k/v projections return their rank's partial input "
        "gradient: no backward all-reduce (f is the identity)",
        "https://github.com/pytorch/pytorch/issues/157606; Megatron-LM paper "
        "(arXiv:1909.08053) section 3, the f operator"),
    "sp_norm_grad_no_allreduce": (
        "under sequence parallelism the RMSNorm weights' gradients (each tp rank saw only its "
        "rows) are not all-reduced over tp",
        "https://github.com/NVIDIA/Megatron-LM/issues/1446; "
        "https://github.com/NVIDIA/TransformerEngine/issues/435"),
    "norm_grad_double_reduce": (
        "without sequence parallelism the replicated RMSNorm weights' gradients, already whole, "
        "are all-reduced over tp anyway (tp times too large)",
        "https://github.com/inclusionAI/AReno/pull/496"),
    "ga_loss_per_microbatch": (
        "each microbatch's loss is the mean over its own trained tokens, then divided by the "
        "number of microbatches and averaged over dp, instead of the sum over the step's tokens "
        "divided by their count",
        "https://huggingface.co/blog/gradient_accumulation; "
        "https://github.com/meta-pytorch/torchtune/pull/1875"),
    "clip_norm_tp_replicated": (
        "the global gradient norm for clipping sums the tp-replicated parameters' (norms') "
        "squares on every tp rank instead of once",
        "https://github.com/NVIDIA-NeMo/RL/pull/3788; "
        "https://github.com/ROCm/TransformerEngine/pull/715"),
    "tied_embed_grad_no_allreduce": (
        "the embedding on the first pipeline stage and its tied copy in the LM head on the last "
        "stage are updated with their own gradients only (no all-reduce over the embedding group)",
        "https://github.com/NVIDIA/Megatron-LM/issues/299; "
        "https://github.com/cornstarch-org/Cornstarch/pull/16"),
    "vocab_pad_unmasked": (
        "the vocab-parallel cross-entropy lets the padded vocabulary columns (93 tokens padded "
        "to 96 for tp) into the softmax",
        "https://github.com/NVIDIA/Megatron-LM/issues/1754; "
        "https://github.com/NVIDIA/TensorRT-LLM/issues/98"),
    "moe_aux_per_microbatch": (
        "the MoE load-balancing loss E·Σ f_e·P_e is computed per microbatch and rank and "
        "averaged, instead of over the step's tokens",
        "Qiu et al. 2025, arXiv:2501.11873; https://github.com/NVIDIA/Megatron-LM/issues/1498"),
    "dropout_rng_not_forked": (
        "attention dropout on the tp ranks' heads uses one RNG stream: every rank drops what "
        "rank 0 drops for its heads, instead of a forked stream per rank",
        "https://github.com/awslabs/slapo/issues/21; "
        "https://github.com/PaddlePaddle/PaddleFleetX/pull/1005; Megatron-LM's "
        "CudaRNGStatesTracker"),
    "dp_same_data": (
        "every dp rank draws the rows of dp rank 0 (no DistributedSampler / no rank offset)",
        "https://github.com/karpathy/llama2.c/issues/522; "
        "https://github.com/openspeech-team/openspeech/issues/149"),
}
