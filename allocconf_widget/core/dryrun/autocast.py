"""What ``torch.autocast("cuda")`` does to each op's dtype: the CUDA cast policy, as data.

The CPU stand-in (``adapters/dryrun/standin``) runs a step on fake CPU tensors, where
``autocast("cuda")`` has no effect and CPU autocast casts a different list of ops (CPU casts
``cat`` and ``stack`` and keeps ``softmax`` and ``layer_norm`` in the input's dtype; CUDA
computes ``softmax`` in float32 and casts ``layer_norm`` up). For the stand-in's tensors to have
the dtypes, and so the sizes, they would have on the GPU, it applies this policy instead.
Copied from torch's ``aten/src/ATen/autocast_mode.h`` (``AT_FORALL_LOWER_PRECISION_FP``,
``AT_FORALL_FP32``, ``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_PROMOTE``) and
``autocast_mode.cpp``'s CUDA registrations, torch 2.13; an op a newer torch adds to CUDA's
autocast is left uncast and named in the dry run's notes.

Standard library only.
"""

from __future__ import annotations

#: cast floating inputs to the autocast dtype (float16 unless the user chose bfloat16)
LOWER_PRECISION = "lower_precision_fp"
#: cast floating inputs to float32
FP32 = "fp32"
#: run in float32 (``dtype=torch.float32``) when the input is of lower precision; no copy
FP32_SET_OPT_DTYPE = "fp32_set_opt_dtype"
#: cast floating inputs to the widest floating dtype among them
PROMOTE = "promote"
#: refused under autocast (torch raises)
BANNED = "banned"

_LOWER = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr",
    "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
    "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
    "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    "cudnn_convolution", "cudnn_convolution_transpose",
)
_FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
    "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
    "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
    # fp32_append_dtype in torch (norm with an explicit float32 dtype): its output is float32 too
    "norm.Scalar", "norm.ScalarOpt_dim", "norm.names_ScalarOpt_dim",
)
_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "prod.dim_Dimname", "softmax.int", "softmax.Dimname", "log_softmax.int",
    "log_softmax.Dimname", "cumprod", "cumprod.dimname", "cumsum", "cumsum.dimname", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList", "sum.dim_DimnameList",
)
_PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
            "tensordot", "scatter_add")

#: ``aten::`` overload name (``softmax.int``; ``mm`` for the default overload) → policy
CUDA_POLICY: dict[str, str] = {
    **dict.fromkeys(_LOWER, LOWER_PRECISION), **dict.fromkeys(_FP32, FP32),
    **dict.fromkeys(_SET_OPT_DTYPE, FP32_SET_OPT_DTYPE), **dict.fromkeys(_PROMOTE, PROMOTE),
    "binary_cross_entropy": BANNED,
}
