"""clattn from PyTorch: an autograd Function and an nn.Module on (B, H, N, D) tensors.

    import clattn.torch
    att = clattn.torch.Attention("improved-clustered:clusters=100")
    o = att(q, k, v, causal=True)         # q (B, H, N, D), k, v (B, Hkv, M, D)
    o.sum().backward()

Memory: float32 tensors whose last dim has stride 1 (contiguous, or views such as
``x.transpose(1, 2)`` of a (B, N, H, D) buffer) are read in place through NumPy, and the output
and gradients are written straight into tensors PyTorch allocated. Other floating dtypes are
computed in float32 and cast back to the input's dtype (so a float64 model works, at float32
precision). Each forward that needs a gradient gets its own clattn Call (Context and saved
inputs), kept by autograd until its backward: a module may run several times per step.

Discrete choices (clusters, hashes, top-k sets) are constants of the backward, as in the C++
library. The backward is differentiable once: a gradient taken with ``create_graph=True`` raises
instead of silently missing its second-order term. Changing the output in place before backward
raises too (the backward reads it), as for torch's own ops. Stochastic variants draw from the spec's ``seed=`` and ``Attention.step`` (set it to
your training step; it is never advanced behind your back). Stateful variants (routing with
EMA centroids) update their state in training mode (``module.train()``).

Tensors on another device (CUDA, ...) run ``full``, ``clustered`` and ``improved-clustered`` as
PyTorch tensor operations there (_device.py), with the C++ kernels' clusters; ``backend="torch"``
forces that path on CPU tensors too.

Importing this module needs PyTorch; ``import clattn`` alone does not.
"""

from ._torch_ops import Attention, AttentionFunction, attention
from ._torch_nn import MultiheadAttention, scaled_dot_product_attention, set_step

__all__ = ["Attention", "AttentionFunction", "MultiheadAttention", "attention", "scaled_dot_product_attention",
           "set_step"]
