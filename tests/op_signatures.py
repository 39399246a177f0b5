"""A recorder of the library calls a decode issues, to compare ours with a peer's on any CPU.

A CPU bit test passes only where our arithmetic and the peer's take the same library kernels. Those are
chosen at run time by the op, the shapes, the strides, the dtype, the thread count and, for MKL's
vector math and GEMM paths, the alignment of the arrays (MKL's AVX-512 kernels peel a misaligned head;
its AVX2 kernels, which AMD CPUs and ``MKL_ENABLE_INSTRUCTIONS=AVX2`` get, may not). A machine whose MKL
runs its AVX2 kernels cannot show an AVX-512 difference, so the bit tests alone prove nothing there.
:class:`OpRecorder` logs, per call of a shape-dependent library op, a *signature*: the op, and for every
tensor argument its shape, strides, dtype and address modulo 64 bytes (not for an argument only multiplied
element by element inside the op: :data:`ADDRESS_BLIND`), plus the other arguments. Two
decodes whose signature multisets are equal hand each library kernel exactly the same problems, so
they get the same bits from any CPU's kernels; a test asserting that fails on every machine.

Ops arrive at the recorder as the dispatcher hands them over: with autograd on (``no_grad`` included)
composite ops such as ``conv1d``, ``linear`` and ``matmul`` arrive decomposed into the kernels that run
(``convolution``, ``addmm``, ``mm``, ``bmm``); under ``inference_mode`` they arrive whole. Record both
sides in the same mode (re-decomposing them here would not be faithful: ``matmul``'s choice between
``mm`` and ``bmm`` then differs from the real run's).

Recorded (:data:`FAMILIES`): matrix products, convolutions, FFTs, MKL's vector-math unary functions,
ATen's vectorized transcendental activations and reductions (the lane a value lands in depends on the
shape). Not recorded: plain elementwise arithmetic (+, -, *, /, pow(x, 2) == x * x: one rounding per element
whatever the layout), copies, views, and ATen's scalar loops (``col2im``/fold: a fixed summation order per element).
"""
from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Callable, Iterator, List, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: the recorded ops (aten overload packet names), by family
FAMILIES = {
    "gemm": {"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "matmul", "linear",
             "_addmm_activation", "_int_mm", "_weight_int8pack_mm", "scaled_dot_product_attention",
             "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math"},
    "conv": {"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
             "conv_transpose3d", "mkldnn_convolution", "_slow_conv2d_forward", "slow_conv_transpose2d",
             "slow_conv3d_forward", "_nnpack_spatial_convolution", "thnn_conv2d", "convolution_overrideable",
             "_convolution_mode", "conv_tbc"},
    "fft": {"_fft_r2c", "_fft_c2r", "_fft_c2c", "fft_fft", "fft_ifft", "fft_rfft", "fft_irfft", "stft", "istft"},
    # at::vml: MKL's VML where torch is built with MKL (acos ... trunc), SLEEF otherwise
    "vml": {"acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp", "log", "log10", "log2", "sin", "sqrt",
            "tan", "tanh", "trunc", "expm1", "log1p", "rsqrt", "reciprocal", "exp2", "sinh", "cosh", "atanh"},
    "activation": {"gelu", "silu", "elu", "softplus", "sigmoid", "_softmax", "_log_softmax", "softmax",
                   "log_softmax", "native_layer_norm", "native_group_norm", "native_batch_norm", "rms_norm",
                   "layer_norm", "group_norm",
                   "_fused_rms_norm", "hardtanh", "leaky_relu", "mish", "logit", "glu"},
    "reduction": {"mean", "sum", "var", "std", "var_mean", "std_mean", "norm", "linalg_vector_norm", "prod",
                  "cumsum", "logsumexp"},
}
RECORDED = frozenset().union(*FAMILIES.values())
ALIGN = 64          # bytes: the widest vector (AVX-512) and a cache line
#: arguments (op: positions, keywords) whose address is not recorded: a window that ``stft`` / ``istft`` only
#: multiply element by element (one rounding per element wherever it lies; a stock that builds it from numpy
#: gets a 16-byte aligned array whose offset from 64 depends on the heap)
ADDRESS_BLIND = {"stft": ((4,), ("window",)), "istft": ((4,), ("window",))}


def tensor_signature(t: torch.Tensor) -> Tuple[Any, ...]:
    """Shape, strides, dtype, device type and address modulo :data:`ALIGN` of one argument."""
    align = t.data_ptr() % ALIGN if t.device.type != "meta" and t.numel() else 0
    return (tuple(t.shape), tuple(t.stride()), str(t.dtype).replace("torch.", ""), t.device.type, align)


def _arg_signature(a: Any, address: bool = True) -> Any:
    if isinstance(a, torch.Tensor):
        sig = tensor_signature(a)
        return sig if address else sig[:-1] + (None,)
    if isinstance(a, (list, tuple)):
        return tuple(_arg_signature(x, address) for x in a)
    if isinstance(a, (int, float, bool, str, type(None))):
        return a
    return repr(a)


def call_signature(name: str, args: tuple, kwargs: dict) -> Tuple[Any, ...]:
    """(op, its arguments' signatures, its keywords'), without the addresses :data:`ADDRESS_BLIND` names."""
    positions, keywords = ADDRESS_BLIND.get(name, ((), ()))
    return (name, tuple(_arg_signature(a, i not in positions) for i, a in enumerate(args)),
            tuple(sorted((k, _arg_signature(v, k not in keywords)) for k, v in kwargs.items())))


class OpRecorder(TorchDispatchMode):
    """Logs the signature of every recorded op called while active (``with OpRecorder() as rec:``)."""

    def __init__(self, ops: frozenset = RECORDED):
        super().__init__()
        self.ops, self.calls = ops, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in self.ops:
            self.calls.append(call_signature(name, tuple(args), kwargs))
        return func(*args, **kwargs)

    def counts(self) -> Counter:
        return Counter(self.calls)


@contextlib.contextmanager
def recording() -> Iterator[OpRecorder]:
    """``with recording() as rec:`` — an :class:`OpRecorder` over the block."""
    with OpRecorder() as rec:
        yield rec


def record(fn: Callable[[], Any]) -> Tuple[Any, Counter]:
    """``fn()``'s result and the multiset of its library-call signatures."""
    with recording() as rec:
        out = fn()
    return out, rec.counts()


def differences(ours: Counter, peer: Counter, limit: int = 12) -> List[str]:
    """Readable lines for the signatures whose counts differ (empty: the same library calls)."""
    lines = []
    for sig in sorted(set(ours) | set(peer), key=repr):
        if ours[sig] != peer[sig]:
            lines.append(f"ours {ours[sig]:4d} x, peer {peer[sig]:4d} x: {sig}")
    return lines[:limit] + ([f"... {len(lines) - limit} more"] if len(lines) > limit else [])


def assert_same_calls(ours: Counter, peer: Counter, counts: bool = True) -> None:
    """Fails naming the first differing signatures unless both issued the same library calls; ``counts``
    False: the same set of distinct calls (a value the peer recomputes per layer, ours computes once)."""
    if not counts:
        ours, peer = Counter(set(ours)), Counter(set(peer))
    diff = differences(ours, peer)
    assert not diff, "library calls differ from the peer's:\n" + "\n".join(diff)
    assert sum(peer.values()) > 0, "nothing recorded: the recorder saw no library call"
