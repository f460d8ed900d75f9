import numpy as np, clattn
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 8, 2048, 64), dtype=np.float32) for _ in range(3))  # (B, H, N, D)

att = clattn.Attention("improved-clustered:clusters=100")
o = att.forward(q, k, v, causal=True)                  # (B, H, N, D) float32
do = rng.standard_normal(o.shape, dtype=np.float32)
dq, dk, dv = att.backward(do)                          # gradients of the last forward
print(att.spec, o.shape, float(np.abs(dq).mean()))
