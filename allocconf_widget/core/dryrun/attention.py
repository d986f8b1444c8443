"""Which kernel ``scaled_dot_product_attention`` runs on a GPU profile, and what it allocates.

SDPA chooses its kernel per call from the GPU's compute capability, the dtype, the head size,
the mask and whether gradients are needed (torch's ``aten/src/ATen/native/transformers/cuda/
sdp_utils.cpp``, ``select_sdp_backend``). The kernels allocate very differently: flash and
memory-efficient attention keep an output and one float32 statistic per query row, while the
math fallback materialises the whole attention matrix, orders of magnitude more at long
sequences. A dry run must record the kernel the *profiled* GPU would run, not the one this
machine's torch picks (a CPU build picks math; another GPU picks its own): this module decides
it, the dry run dispatches that kernel's own op. docs/dryrun.md ("Dispatch per GPU profile")
says which rules were read from the source and which were measured.

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from allocconf_widget.core.dryrun.profiles import attention_backward_workspace_bytes

#: the kernels, by the names torch's ``SDPBackend`` gives them
CUDNN, FLASH, EFFICIENT, MATH = "cudnn", "flash", "efficient", "math"
#: what each is called where a user reads it
BACKEND_NAMES = {CUDNN: "cuDNN attention", FLASH: "flash attention", EFFICIENT: "memory-efficient attention",
                 MATH: "the math fallback"}

#: dtypes by the names torch prints after ``torch.``
HALF, BF16, FLOAT, DOUBLE = "float16", "bfloat16", "float32", "float64"
_ELEMENT = {HALF: 2, BF16: 2, FLOAT: 4, DOUBLE: 8}


@dataclass(frozen=True)
class AttentionCall:
    """What the kernel choice reads of one ``scaled_dot_product_attention`` call (4-D inputs,
    ``(batch, heads, sequence, head_dim)``)."""

    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int  # the query's and key's
    value_dim: int
    dtype: str
    has_mask: bool = False
    is_causal: bool = False
    dropout: float = 0.0
    requires_grad: bool = False
    last_dim_contiguous: bool = True

    @property
    def element_size(self) -> int:
        return _ELEMENT.get(self.dtype, 4)

    @property
    def grouped(self) -> bool:
        return self.kv_heads != self.heads


@dataclass(frozen=True)
class Choice:
    """The kernel one call runs on one GPU, and why the faster ones were not taken."""

    backend: str
    passed_over: tuple[tuple[str, str], ...] = ()  # (backend, reason) in priority order

    def describe(self) -> str:
        words = BACKEND_NAMES[self.backend]
        if not self.passed_over:
            return words
        reasons = "; ".join(f"{BACKEND_NAMES[b]}: {why}" for b, why in self.passed_over)
        return f"{words} ({reasons})"


def cudnn_first(capability: tuple[int, int], cudnn_version: int | None, cuda_major: int | None) -> bool:
    """Whether SDPA tries cuDNN attention first (``check_prefer_cudnn_attention``): on compute
    capability 9.x/10.x with a cuDNN newer than 9.15.0; builds for a CUDA before 13 only on x.0
    and x.3. Otherwise the order is flash, memory-efficient, math (and cuDNN never runs)."""
    major, minor = capability
    if cudnn_version is None or cudnn_version <= 91500 or major not in (9, 10):
        return False
    return cuda_major is not None and (cuda_major >= 13 or minor in (0, 3))


def _flash(cap: tuple[int, int], call: AttentionCall) -> str | None:
    """Why flash attention cannot run this call (None: it can)."""
    if not (8, 0) <= cap <= (12, 1):
        return f"needs compute capability 8.0 or newer (this GPU: {cap[0]}.{cap[1]})"
    if call.has_mask:
        return "no explicit attention mask"
    if call.dtype not in (HALF, BF16):
        return "float16 or bfloat16 only"
    if not (call.head_dim == call.value_dim and call.head_dim <= 256):
        return "equal head sizes of at most 256"
    if call.is_causal and call.seq_q != call.seq_k:
        return "causal only with equal query and key lengths"
    sm86_to_89 = (8, 6) <= cap <= (8, 9) or (12, 0) <= cap <= (12, 1)
    if call.requires_grad and sm86_to_89 and not (
            call.head_dim <= 192 or (call.dropout == 0 and call.head_dim > 224)):
        return "training with this head size fails on this GPU"
    if call.heads % call.kv_heads:
        return "query heads a multiple of key/value heads"
    if min(call.seq_q, call.seq_k, call.batch, call.heads) <= 0 or not call.last_dim_contiguous:
        return "non-empty inputs with a contiguous last dimension"
    return None


def _gemm_alignment(cap: tuple[int, int], call: AttentionCall) -> int:
    """``minimum_gemm_alignment``: the head size must be a multiple of this."""
    half = call.dtype in (HALF, BF16)
    tensor_cores = cap[0] >= 8 or (cap[0] >= 7 and half)
    alignment = 4 if cap[0] >= 8 else 1
    if tensor_cores:
        alignment = max(alignment, 128 // (16 if half else 32))
    return alignment


def _efficient(cap: tuple[int, int], call: AttentionCall) -> str | None:
    """Why memory-efficient attention cannot run this call (None: it can)."""
    if not (5, 0) <= cap <= (12, 1):
        return "needs compute capability 5.0 or newer"
    alignment = _gemm_alignment(cap, call)
    if call.head_dim % alignment or call.value_dim % alignment or call.head_dim <= 0:
        return f"head sizes that are multiples of {alignment}"
    allowed = (HALF, FLOAT, BF16) if cap[0] >= 8 else (HALF, FLOAT)
    if call.dtype not in allowed:
        return ("bfloat16 needs compute capability 8.0 (this GPU has no native bfloat16)"
                if call.dtype == BF16 else "float16, bfloat16 or float32 only")
    if call.heads % call.kv_heads:
        return "query heads a multiple of key/value heads"
    if min(call.seq_q, call.seq_k, call.batch, call.heads) <= 0 or not call.last_dim_contiguous:
        return "non-empty inputs with a contiguous last dimension"
    return None


def _cudnn(cap: tuple[int, int], call: AttentionCall) -> str | None:
    """Why cuDNN attention cannot run this call (None: it can), for a cuDNN past 9.15."""
    if not (8, 0) <= cap <= (12, 1):
        return "needs compute capability 8.0 or newer"
    if call.dtype not in (HALF, BF16):
        return "float16 or bfloat16 only"
    if call.dropout * 16 != int(call.dropout * 16):
        return "dropout in sixteenths"
    limit = 256 if cap[0] in (9, 10) else 128
    if call.head_dim > limit or call.value_dim > limit or call.head_dim % 8 or call.value_dim % 8:
        return f"head sizes that are multiples of 8, at most {limit}"
    if call.requires_grad and limit == 256 and not (
            (call.head_dim <= 128 and call.value_dim <= 128) or (call.head_dim, call.value_dim) in
            ((192, 128), (256, 256))):
        return "a backward for this head size"
    if call.seq_k == 1 or (call.dropout and call.seq_q == 1):
        return "key length above 1"
    return None


def choose(capability: tuple[int, int], call: AttentionCall, *, cudnn_preferred: bool = False,
           disabled: frozenset[str] = frozenset()) -> Choice:
    """The kernel SDPA would run for ``call`` on a GPU of ``capability``. ``cudnn_preferred``:
    :func:`cudnn_first` of the build; ``disabled``: backends the program turned off
    (``torch.backends.cuda.enable_flash_sdp(False)``, ``sdpa_kernel``)."""
    order = (CUDNN, FLASH, EFFICIENT, MATH) if cudnn_preferred else (FLASH, EFFICIENT, MATH)
    checks = {CUDNN: _cudnn, FLASH: _flash, EFFICIENT: _efficient}
    passed: list[tuple[str, str]] = []
    for backend in order:
        if backend in disabled:
            passed.append((backend, "turned off by the program"))
            continue
        if backend == MATH:
            return Choice(MATH, tuple(passed))
        why = checks[backend](capability, call)
        if why is None:
            return Choice(backend, tuple(passed))
        passed.append((backend, why))
    return Choice(MATH, tuple(passed))  # every backend turned off: torch raises; math records the most


def backward_workspace_bytes(backend: str, call: AttentionCall) -> int:
    """What the kernel's backward borrows beyond its outputs (taken once its last gradient
    exists, freed before the next allocation).

    * cuDNN: a float32 accumulator for the query's gradient and a float32 row statistic, with
      grouped-query attention two more query-sized buffers (measured: docs/dryrun.md);
    * flash: ``dq_accum``, float32, the query's rows rounded up to 128 and its head size to 32
      (256 above 192), and ``softmax_d``, one float32 per rounded row (read from the kernel's
      source, not measured);
    * memory-efficient: a float32 accumulator for the query's gradient in 16-bit types and
      ``delta``, one float32 per row (read from the source, not measured);
    * math: nothing beyond the ops it is made of, which the dry run sees.
    """
    rows = call.batch * call.heads * call.seq_q
    query_elements = rows * call.head_dim
    if backend == CUDNN:
        return attention_backward_workspace_bytes(query_elements, query_elements * call.element_size,
                                                  rows * 4, call.grouped)
    if backend == FLASH:
        padded_rows = call.batch * call.heads * -(-call.seq_q // 128) * 128
        head = -(-call.head_dim // 32) * 32 if call.head_dim <= 192 else 256
        return padded_rows * head * 4 + padded_rows * 4
    if backend == EFFICIENT:
        accumulator = query_elements * 4 if call.element_size == 2 else 0
        return accumulator + rows * 4
    return 0

