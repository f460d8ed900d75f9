"""clattn's attention in PyTorch tensor operations, on whatever device the tensors live on.

The C++ kernels read CPU memory only. This module runs ``full``, ``clustered`` and
``improved-clustered`` as tensor operations (matmul, comparisons, argmax, index_add, topk, gather,
softmax), so a CUDA (or any other device's) tensor gets the same algorithm, and autograd gives
the backward. The discrete choices are the C++ kernels' own: the LSH planes and the positions
the Hamming k-means seeds from come from clattn's generator (``_clattn._lsh_planes``,
``_clattn._kmeans_picks``, the kernels' rng streams), and every later rule — first minimum wins,
a tied vote keeps the old bit, an empty cluster takes the farthest member's code not yet held,
fewer distinct codes than clusters makes each code a cluster — is reproduced, so the same spec,
seed and step give the same clusters as the C++ kernels on the same inputs.

Memory is O(N·(D + C)) per head, never N × M: the centroid attention runs over blocks of
centroid rows, checkpointed when a gradient is wanted (recomputed in the backward, so autograd
keeps one block's intermediates at a time), and the improved variant's member stage over blocks
of queries with a backward of its own that keeps only each query's log-sum-exp (the per-query
gather of the top-k keys is the large temporary; it exists one block at a time).
Softmax statistics (logits, log-sum-exp, the mass m_j) are float32 whatever the input dtype.

Not here: causal clustered attention (its block and segment design is sequential over the
prefix; the tensor-op version refuses it), the other variants, and an additive bias for the
clustered variants (as in C++).
"""
import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from . import _clattn

# The variants with a tensor-op form: the registry's torch_ops capability (clattn variants shows it).
SUPPORTED = tuple(v["name"] for v in _clattn.variants() if v["capabilities"]["torch_ops"])
BACKENDS = ("auto", "cpp", "torch")

# Raised by every backward of clattn that is not itself differentiable, when autograd runs it to
# build a graph (create_graph=True): its gradient would be taken as a constant, silently dropping
# the second-order term.
DIFFERENTIABLE_ONCE = ("clattn.torch: clattn's attention is differentiable once; a gradient with "
                       "create_graph=True (double backward, gradient penalties through attention) is "
                       "not supported")

# Elements of the largest per-block temporary (scores, gathered keys); the blocks loop in Python.
_budget = {"cpu": 1 << 23, "other": 1 << 27}


def set_block_budget(elements, device_type="other"):
    """Sets the element count of the largest per-block temporary ("cpu" or "other" devices);
    returns the previous value. Smaller blocks lower peak memory at the cost of more launches."""
    old = _budget[device_type]
    _budget[device_type] = max(1, int(elements))
    return old


def _rows_per_block(per_row, device):
    return max(1, _budget["cpu" if device.type == "cpu" else "other"] // max(1, per_row))


def check_backend(backend):
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")


def wants_torch(backend, *tensors):
    """True when the tensor-op path runs: backend="torch", or "auto" with a tensor off the CPU."""
    check_backend(backend)
    if backend == "torch":
        return True
    if backend == "cpp":
        return False
    return any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in tensors)


class Params:
    """The parameters of a canonical spec string as the C++ registry resolved them: the spec of a
    clattn.Attention spells out every parameter that applies (defaults included), so nothing is
    restated here. Left out there, by the canonical form's rules: scale when it is 1/sqrt(Dk),
    clustering when it is lsh, and the LSH parameters of positional clustering."""

    def __init__(self, spec):
        name, _, rest = spec.partition(":")
        kv = dict(p.split("=", 1) for p in rest.split(",") if "=" in p) if rest else {}
        if name not in SUPPORTED:
            raise ValueError(f"clattn.torch: '{name}' runs in the C++ kernels on CPU tensors only; the tensor-op "
                             f"path (tensors on another device, or backend='torch') has {', '.join(SUPPORTED)} "
                             f"(the torch_ops capability of `clattn variants`)")
        self.spec, self.name = spec, name
        self.scale = float(kv["scale"]) if "scale" in kv else None
        clustered = name != "full"
        self.positional = kv.get("clustering") == "positional"
        lsh = clustered and not self.positional
        self.clusters = int(kv["clusters"]) if clustered else 0
        self.bits = int(kv["bits"]) if lsh else 0
        self.iterations = int(kv["iterations"]) if lsh else 0
        self.hash_bias = kv["hash_bias"] == "true" if lsh else False
        self.topk = int(kv["topk"]) if "topk" in kv else 0
        self.seed = int(kv["seed"]) if clustered else 0


_planes_cache = {}


def lsh_planes(p, step, D, device):
    """(planes (bits, D), thresholds (bits,)) float32 on `device`: clattn's draw for (seed, step)."""
    key = (p.seed, step, p.bits, D, p.hash_bias, str(device))
    got = _planes_cache.get(key)
    if got is None:
        if len(_planes_cache) > 32:
            _planes_cache.clear()
        a, t = _clattn._lsh_planes(p.seed, step, p.bits, D, p.hash_bias)
        got = _planes_cache[key] = (torch.from_numpy(a).to(device), torch.from_numpy(t).to(device))
    return got


_INT64_MIN = -(1 << 63)


def _pack(bits):
    """(..., nb) bool -> (...) int64 code, bit b at 1 << b (bit 63 wraps to the sign, as uint64)."""
    w = torch.ones(bits.shape[-1], dtype=torch.int64, device=bits.device) << torch.arange(
        bits.shape[-1], device=bits.device)
    return (bits.to(torch.int64) * w).sum(-1)


def _unpack(codes, nb):
    """(...) int64 -> (..., nb) bool."""
    return ((codes.unsqueeze(-1) >> torch.arange(nb, device=codes.device)) & 1).bool()


def _hash(q, planes, thresholds, sign_dtype):
    """LSH codes of q (G, N, D): (codes (G, N) int64, signs (G, N, nb) ±1 in sign_dtype).
    The projection is float32, as the kernels' (a bit flips only where x·a_b ties t_b to rounding)."""
    G, N, D = q.shape
    nb = planes.shape[0]
    codes = torch.empty(G, N, dtype=torch.int64, device=q.device)
    signs = torch.empty(G, N, nb, dtype=sign_dtype, device=q.device)
    rows = _rows_per_block(G * nb * 8, q.device)
    # TF32 (10-bit mantissa products) would flip the bits of many near-threshold projections.
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for i0 in range(0, N, rows):
            i1 = min(N, i0 + rows)
            bits = torch.matmul(q[:, i0:i1].float(), planes.t()) > thresholds  # (G, n, nb)
            codes[:, i0:i1] = _pack(bits)
            signs[:, i0:i1] = bits.to(sign_dtype) * 2 - 1
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return codes, signs


def _nearest(signs, csigns):
    """Nearest centroid by Hamming distance, first minimum wins: (assign (G, N) int64, dist (G, N)
    float32). signs (G, N, nb), csigns (G, C, nb) ±1: distance = (nb − signs·csigns) / 2, exact."""
    G, N, nb = signs.shape
    C = csigns.shape[1]
    assign = torch.empty(G, N, dtype=torch.int64, device=signs.device)
    dist = torch.empty(G, N, dtype=torch.float32, device=signs.device)
    ct = csigns.transpose(1, 2)  # (G, nb, C)
    rows = _rows_per_block(G * C, signs.device)
    for i0 in range(0, N, rows):
        i1 = min(N, i0 + rows)
        dots = torch.matmul(signs[:, i0:i1], ct).float()  # (G, n, C)
        best, arg = dots.max(dim=2)  # first maximum on ties (documented for max(dim) and argmax)
        assign[:, i0:i1] = arg
        dist[:, i0:i1] = (nb - best) * 0.5
    return assign, dist


def _first_occurrence(vals, elig):
    """(G, L) bool: elig entries whose value no earlier elig entry of the row holds."""
    sv, si = torch.sort(vals, dim=1, stable=True)  # (G, L): equal values keep list order
    es = elig.gather(1, si)
    L = vals.shape[1]
    new = torch.ones_like(es)
    new[:, 1:] = sv[:, 1:] != sv[:, :-1]
    start = torch.cummax(torch.where(new, torch.arange(L, device=vals.device).expand_as(new),
                                     torch.zeros_like(si)), dim=1).values  # (G, L) first index of the group
    excl = es.long().cumsum(1) - es.long()  # eligible entries before, in sorted order
    first_sorted = es & (excl == excl.gather(1, start))
    return torch.zeros_like(elig).scatter(1, si, first_sorted)


def _isin_rows(vals, table, table_ok):
    """(G, L) bool: vals[g, i] equals some table[g, c] with table_ok[g, c]. vals (G, L), table (G, C)."""
    G, L = vals.shape
    out = torch.empty(G, L, dtype=torch.bool, device=vals.device)
    rows = _rows_per_block(G * table.shape[1], vals.device)
    for i0 in range(0, L, rows):
        i1 = min(L, i0 + rows)
        out[:, i0:i1] = ((vals[:, i0:i1, None] == table[:, None, :]) & table_ok[:, None, :]).any(2)
    return out


def _reseed_empty(codes, valid, dist, cent, empty):
    """Empty clusters take the codes of the members farthest from their centroids (farthest first,
    lower index on ties), skipping codes some centroid holds at that moment: the kernels' walk.
    codes, dist (G, N); valid (G, N) bool; cent (G, C) int64 after the vote; empty (G, C) bool.
    Returns the new (G, C) centroid codes."""
    G, N = codes.shape
    C = cent.shape[1]
    d = torch.where(valid, dist, torch.full_like(dist, -1.0))
    order = torch.sort(d, dim=1, descending=True, stable=True).indices  # (G, N)
    cc = codes.gather(1, order)  # (G, N) candidate codes, walk order
    cv = valid.gather(1, order)
    in_base = _isin_rows(cc, cent, ~empty)  # held by a non-empty centroid: always skipped
    # An empty cluster's old code is held until that cluster is re-seeded; where such a code is
    # among the candidates the walk's outcome depends on the order, so those heads take the
    # sequential walk below (one step per empty cluster, not per query).
    tricky = (_isin_rows(cc, cent, empty) & ~in_base & cv).any(1)  # (G,)
    elig = cv & ~in_base
    taken = _first_occurrence(cc, elig)  # (G, N)
    rank = taken.long().cumsum(1)  # (G, N) 1-based order of the taken entries
    col = torch.where(taken & (rank <= C), rank - 1, torch.full_like(rank, C))
    table = torch.zeros(G, C + 1, dtype=torch.int64, device=codes.device).scatter(1, col, cc)[:, :C]
    have = torch.zeros(G, C + 1, dtype=torch.bool, device=codes.device).scatter(1, col, taken)[:, :C]
    ordinal = (empty.long().cumsum(1) - 1).clamp(min=0)  # (G, C) which empty cluster this is
    new_code = table.gather(1, ordinal)
    ok = empty & have.gather(1, ordinal)
    out = torch.where(ok, new_code, cent)
    for g in torch.nonzero(tricky).flatten().tolist():
        row = cent[g].clone()
        pos = 0
        for c in torch.nonzero(empty[g]).flatten().tolist():
            free = cv[g, pos:] & ~torch.isin(cc[g, pos:], row)
            if not bool(free.any()):
                break
            x = pos + int(free.to(torch.uint8).argmax())
            row[c] = cc[g, x]
            pos = x + 1
        out[g] = row
    return out


def _kmeans(codes, signs, valid, nv, heads, C, iterations, seed, step):
    """Hamming k-means of the heads whose valid codes hold more than C distinct values.
    codes (G, N), signs (G, N, nb), valid (G, N); nv, heads: lists (valid rows, head index b·H+h).
    Returns assign (G, N) int64."""
    G, N, nb = signs.shape
    dev = codes.device
    # Initial centroids: the first C distinct codes at the positions of the seeded shuffle.
    T = min(max(nv), 2 * C + 64)
    while True:
        picks = torch.from_numpy(_clattn._kmeans_picks(seed, step, heads, nv, T)).to(dev)  # (G, T)
        pv = picks >= 0
        pc = codes.gather(1, picks.clamp(min=0))  # (G, T)
        first = _first_occurrence(pc, pv)
        rank = first.long().cumsum(1)
        if bool((rank[:, -1] >= C).all()) or T >= max(nv):
            break
        T = min(max(nv), 2 * T)
    col = torch.where(first & (rank <= C), rank - 1, torch.full_like(rank, C))
    cent = torch.zeros(G, C + 1, dtype=torch.int64, device=dev).scatter(1, col, pc)[:, :C]  # (G, C)
    vote_rows = _rows_per_block(G * nb, dev)
    flat_base = (torch.arange(G, device=dev) * C).unsqueeze(1)  # (G, 1)
    prev = None
    for _ in range(iterations):
        assign, dist = _nearest(signs, _unpack(cent, nb).to(signs.dtype) * 2 - 1)
        assign = torch.where(valid, assign, torch.zeros_like(assign))
        # An unchanged assignment repeats the same update: later rounds change nothing.
        if prev is not None and torch.equal(assign, prev):
            return assign
        prev = assign
        idx = torch.where(valid, flat_base + assign, torch.full_like(assign, G * C)).flatten()  # (G·N)
        # Votes (G·C, nb), exact integers in float32, a block of rows at a time.
        counts = torch.zeros(G * C + 1, nb, device=dev)
        idx2 = idx.view(G, N)
        for i0 in range(0, N, vote_rows):
            i1 = min(N, i0 + vote_rows)
            counts.index_add_(0, idx2[:, i0:i1].flatten(), (signs[:, i0:i1] > 0).float().reshape(-1, nb))
        sizes = torch.bincount(idx, minlength=G * C + 1)[:G * C].view(G, C)
        twice = counts[:G * C].view(G, C, nb) * 2
        sz = sizes.unsqueeze(2).float()
        old = _unpack(cent, nb)
        cent = _pack(torch.where(twice > sz, torch.ones_like(old), torch.where(twice < sz, torch.zeros_like(old), old)))
        empty = sizes == 0
        if bool(empty.any()):
            cent = _reseed_empty(codes, valid, dist, cent, empty)
    assign, _ = _nearest(signs, _unpack(cent, nb).to(signs.dtype) * 2 - 1)
    return torch.where(valid, assign, torch.zeros_like(assign))


@torch.no_grad()
def clusters(p, q, nv, step, first_head):
    """Cluster ids of the queries of every head: (assign (G, N) int64, 0 on padded rows; ce (G,)
    clusters per head). q (G, N, D); nv (G,) list of valid rows; first_head the head index b·H+h
    of row 0 of q (the rng stream)."""
    G, N, D = q.shape
    dev = q.device
    ar = torch.arange(N, device=dev)
    nvt = torch.tensor(nv, device=dev)
    valid = ar < nvt.unsqueeze(1)  # (G, N)
    assign = torch.zeros(G, N, dtype=torch.int64, device=dev)
    ce = [0] * G
    if p.positional:
        cet = torch.clamp(nvt, max=p.clusters)
        assign = torch.where(valid, ar * cet.unsqueeze(1) // nvt.clamp(min=1).unsqueeze(1), assign)
        return assign, [min(p.clusters, n) for n in nv]
    planes, thr = lsh_planes(p, step, D, dev)
    # ±1 and sums ≤ 64 are exact in bf16; other devices may lack its matmul: float32 there.
    sign_dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    codes, signs = _hash(q, planes, thr, sign_dtype)
    # Distinct valid codes per head, in uint64 order (flip the sign bit for int64 sorting).
    key = torch.where(valid, codes ^ _INT64_MIN, torch.full_like(codes, (1 << 63) - 1))
    sk, si = torch.sort(key, dim=1)
    new = torch.ones_like(valid)
    new[:, 1:] = sk[:, 1:] != sk[:, :-1]
    new &= valid  # the valid codes sort first (the sentinel is the largest key)
    distinct = new.long().sum(1).tolist()
    rank_sorted = new.long().cumsum(1) - 1
    by_code = torch.zeros_like(assign).scatter(1, si, rank_sorted)
    km = []
    for g in range(G):
        if nv[g] == 0:
            continue
        if p.clusters >= nv[g]:  # each query its own cluster: exact attention
            assign[g] = torch.where(valid[g], ar, assign[g])
            ce[g] = nv[g]
        elif distinct[g] <= p.clusters:  # each distinct code its own cluster, ascending code
            assign[g] = torch.where(valid[g], by_code[g], assign[g])
            ce[g] = distinct[g]
        else:
            km.append(g)
            ce[g] = p.clusters
    if km:
        sel = torch.tensor(km, device=dev)
        a = _kmeans(codes[sel], signs[sel], valid[sel], [nv[g] for g in km], [first_head + g for g in km],
                    p.clusters, p.iterations, p.seed, step)
        assign[sel] = a
    return assign, ce


def _ckpt(fn, *args):
    """fn(*args), recomputed in the backward instead of kept, when a gradient is wanted."""
    if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        return checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


def _rows_attention(q, k, v, kbias, scale, extra=None):
    """softmax(scale·q·kᵀ + kbias [+ extra]) · v with float32 statistics: (out (G, n, Dv) float32,
    lse (G, n) float32). q (G, n, D), k (G, M, D), v (G, M, Dv), kbias (G, 1, M) 0/-inf,
    extra (n, M) or None."""
    s = torch.matmul(q, k.transpose(1, 2)).float() * scale + kbias  # (G, n, M)
    dead = None
    if extra is not None:
        s = s + extra
        # A row that sees no key would be NaN, and its NaN would reach every dk, dv through the
        # backward: compute it on zeros and give it 0 (the clattn contract).
        dead = torch.isinf(s.amax(-1, keepdim=True))  # (G, n, 1)
        s = s.masked_fill(dead, 0.0)
    lse = torch.logsumexp(s, -1)  # (G, n)
    a = torch.exp(s - lse.unsqueeze(-1))  # (G, n, M)
    out = torch.matmul(a.to(v.dtype), v).float()  # (G, n, Dv)
    return (out if dead is None else out.masked_fill(dead, 0.0)), lse, a


def _centroid_block(qc, k, v, kbias, tidx, tok, vt, scale):
    """Step 5 for a block of centroids: Vc (G, c, Dv), and for the improved variant
    m_j = Σ_T A_jl (G, c) and R_j = Vc_j − Σ_T A_jl v_l (G, c, Dv); tidx (G, c, kk) T_j, tok its
    valid entries (key padding), vt (G, c, kk, Dv) the rows of V at T_j."""
    vc, lse, a = _rows_attention(qc, k, v, kbias, scale)
    if tidx is None:
        return vc
    at = a.gather(2, tidx) * tok  # (G, c, kk)
    m = at.sum(-1)
    r = vc - torch.matmul(at.unsqueeze(2), vt.float()).squeeze(2)
    return vc, m, r


def _bmv(a, x):
    """(..., k, d) · (..., d) -> (..., k): the CPU's bmm loops over its many tiny products one by
    one, where a broadcast product and a sum stream; other devices take the batched matmul."""
    if a.device.type == "cpu":
        return (a * x.unsqueeze(-2)).sum(-1)
    return torch.matmul(a, x.unsqueeze(-1)).squeeze(-1)


def _bvm(x, a):
    """(..., k) · (..., k, d) -> (..., d)."""
    if a.device.type == "cpu":
        return (x.unsqueeze(-1) * a).sum(-2)
    return torch.matmul(x.unsqueeze(-2), a).squeeze(-2)


class _Members(torch.autograd.Function):
    """The improved variant's member stage: O_i = m_j · softmax_T(s·q_i·K_T) V_T + R_j, j = assign_i,
    over blocks of queries in forward and backward. Only the per-query log-sum-exp is kept: the
    backward gathers each block's K_T, V_T rows again and rebuilds the softmax from it (the
    FlashAttention scheme, D_i = dU_i·U_i), so the (N, k, D) gathers never exist whole.

    apply(q (G, N, D), kt (G, C, k, D), vt (G, C, k, Dv), tbias (G, C, k) 0/-inf, m (G, C),
    r (G, C, Dv), assign (G, N), scale, rows) -> (G, N, Dv) float32."""

    @staticmethod
    def _gather(kt, vt, tbias, flat, G, n):
        C, kk, D = kt.shape[1:]
        Dv = vt.shape[3]
        # index_select on (G·C) rows; its adjoint below is an index_add.
        kq = kt.reshape(G * C, kk, D).index_select(0, flat).view(G, n, kk, D)
        vq = vt.reshape(G * C, kk, Dv).index_select(0, flat).view(G, n, kk, Dv)
        tb = tbias.reshape(G * C, kk).index_select(0, flat).view(G, n, kk)
        return kq, vq, tb

    @staticmethod
    def forward(ctx, q, kt, vt, tbias, m, r, assign, scale, rows):
        G, N, _ = q.shape
        C = kt.shape[1]
        Dv = vt.shape[3]
        base = (torch.arange(G, device=q.device) * C).unsqueeze(1)  # (G, 1)
        out = torch.empty(G, N, Dv, dtype=torch.float32, device=q.device)
        lse = torch.empty(G, N, dtype=torch.float32, device=q.device)
        for i0 in range(0, N, rows):
            i1 = min(N, i0 + rows)
            flat = (assign[:, i0:i1] + base).flatten()  # (G·n)
            kq, vq, tb = _Members._gather(kt, vt, tbias, flat, G, i1 - i0)
            s = _bmv(kq, q[:, i0:i1]).float() * scale + tb  # (G, n, k)
            ls = torch.logsumexp(s, -1)  # (G, n)
            u = _bvm(torch.exp(s - ls.unsqueeze(-1)).to(vt.dtype), vq).float()  # (G, n, Dv)
            out[:, i0:i1] = m.reshape(-1).index_select(0, flat).view(G, -1, 1) * u + \
                r.reshape(G * C, Dv).index_select(0, flat).view(G, -1, Dv)
            lse[:, i0:i1] = ls
        ctx.save_for_backward(q, kt, vt, tbias, m, assign, lse)
        ctx.scale, ctx.rows = scale, rows
        return out

    @staticmethod
    def backward(ctx, do):
        # The saved log-sum-exp is a function of q and K_T that this backward reads as a constant,
        # so a graph of it (create_graph=True) would give wrong second derivatives: refuse.
        if torch.is_grad_enabled():
            raise RuntimeError(DIFFERENTIABLE_ONCE)
        return _Members._backward(ctx, do)

    @staticmethod
    @once_differentiable
    def _backward(ctx, do):
        q, kt, vt, tbias, m, assign, lse = ctx.saved_tensors
        scale, rows = ctx.scale, ctx.rows
        G, N, D = q.shape
        C, kk = kt.shape[1:3]
        Dv = vt.shape[3]
        base = (torch.arange(G, device=q.device) * C).unsqueeze(1)
        dq = torch.empty(G, N, D, dtype=q.dtype, device=q.device)
        dkt = torch.zeros(G * C, kk, D, dtype=torch.float32, device=q.device)
        dvt = torch.zeros(G * C, kk, Dv, dtype=torch.float32, device=q.device)
        dm = torch.zeros(G * C, dtype=torch.float32, device=q.device)
        dr = torch.zeros(G * C, Dv, dtype=torch.float32, device=q.device)
        do = do.float()
        for i0 in range(0, N, rows):
            i1 = min(N, i0 + rows)
            n = i1 - i0
            flat = (assign[:, i0:i1] + base).flatten()
            kq, vq, tb = _Members._gather(kt, vt, tbias, flat, G, n)
            qb, dob = q[:, i0:i1], do[:, i0:i1]  # (G, n, D), (G, n, Dv)
            # P = softmax_T(s·q·K_T) from the saved log-sum-exp; U = P·V_T
            p = torch.exp(_bmv(kq, qb).float() * scale + tb - lse[:, i0:i1].unsqueeze(-1))  # (G, n, k)
            u = _bvm(p.to(vt.dtype), vq).float()  # (G, n, Dv)
            # O = m_j U + R_j -> dR_j += dO, dm_j += dO·U, dU = m_j dO
            dr.index_add_(0, flat, dob.reshape(G * n, Dv))
            dm.index_add_(0, flat, (dob * u).sum(-1).flatten())
            du = dob * m.reshape(-1).index_select(0, flat).view(G, n, 1)  # (G, n, Dv)
            # U = P·V_T -> dV_T += Pᵀ dU, dP = dU·V_Tᵀ; S -> dS = P ∘ (dP − dU·U)
            dvt.index_add_(0, flat, (p.unsqueeze(-1) * du.unsqueeze(-2)).reshape(G * n, kk, Dv))
            dp = _bmv(vq, du.to(vq.dtype)).float()  # (G, n, k)
            ds = p * (dp - (du * u).sum(-1, keepdim=True)) * scale
            # S = s·q·K_Tᵀ -> dq = dS·K_T, dK_T += dSᵀ q
            dq[:, i0:i1] = _bvm(ds.to(kq.dtype), kq).to(q.dtype)
            dkt.index_add_(0, flat, (ds.unsqueeze(-1) * qb.float().unsqueeze(-2)).reshape(G * n, kk, D))
        return (dq, dkt.view(G, C, kk, D).to(kt.dtype), dvt.view(G, C, kk, Dv).to(vt.dtype), None,
                dm.view(G, C), dr.view(G, C, Dv), None, None, None)


def _lengths_arg(x):
    """Lengths as the C++ rules read them: None, or a sequence of integers on the host (a tensor on
    any device is copied once)."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return x


def _facts(t, bias=False):
    """What the C++ rules need of a tensor they do not read (clattn's validate_facts): (shape, its
    largest finite |x|, the index of its first non-finite element or None, that element). One
    reduction on the tensor's device; the index is looked for only when the reduction is not
    finite (NaN propagates through amax). A bias may hold -inf (a mask), never NaN or +inf."""
    x = t.detach()
    shape = tuple(x.shape)
    if x.numel() == 0:
        return shape, 0.0, None, 0.0
    a = x.abs()
    if bias:
        a = a.masked_fill(x == float("-inf"), 0)
    m = float(a.amax())
    if math.isfinite(m):
        return shape, m, None, 0.0
    bad = (torch.isnan(x) | (x == float("inf"))) if bias else ~torch.isfinite(x)
    flat = int(bad.reshape(-1).nonzero()[0])
    idx = []
    for d in reversed(shape):
        idx.append(flat % d)
        flat //= d
    idx.reverse()
    return shape, 0.0, idx, float(x[tuple(idx)])


def _check_inputs(att, q, k, v, bias, query_lengths, key_lengths, causal):
    """The tensor-op path's inputs against the C++ kernels' own rules (shapes, lengths, masks the
    variant cannot honour, NaN/Inf, the overflow bound), with their messages: ValueError. What is
    PyTorch's alone (tensor types, dtypes, one device) is checked here first. Lengths are on the
    host already (_lengths_arg)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("bias", bias)):
        if t is None and name == "bias":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            raise TypeError(f"{name} must be float32, bfloat16, float16 (or float64), got {t.dtype}")
    devices = {t.device for t in (q, k, v, bias) if t is not None}
    if len(devices) > 1:
        raise ValueError(f"q, k, v (and bias) must be on one device, got "
                         f"{', '.join(str(t.device) for t in (q, k, v, bias) if t is not None)}")
    att._check_facts(_facts(q), _facts(k), _facts(v), bias=None if bias is None else _facts(bias, bias=True),
                     query_lengths=query_lengths, key_lengths=key_lengths,
                     causal=bool(causal))


def _valid(lengths, B, limit):
    """Per batch item, the valid count (host lengths, already checked)."""
    if lengths is None:
        return [limit] * B
    return [int(t) for t in lengths]


def attention(spec, q, k, v, *, query_lengths=None, key_lengths=None, causal=False, bias=None, step=0):
    """o (B, H, N, Dv) = spec's attention of q (B, H, N, Dk), k (B, Hkv, M, Dk), v (B, Hkv, M, Dv)
    in tensor operations on their device; differentiable by autograd. Inputs are checked by the C++
    kernels' rules, messages included. Masks as clattn's contract: padded query rows and queries
    with no visible key get 0. k, v and the bias are computed in q's dtype (the output's), as the
    C++ kernels compute all of them in float32 and return q's dtype."""
    if isinstance(spec, _clattn.Attention):
        att = spec
    else:  # a spec string, or an object holding one (clattn.torch.Attention)
        att = _clattn.Attention(spec if isinstance(spec, str) else spec.spec, backward=False)
    p = Params(att.spec)
    if p.name != "full" and causal:
        raise ValueError(f"clattn.torch: causal '{p.name}' runs in the C++ kernels only (CPU tensors): its "
                         f"prefix design is sequential over blocks, which the tensor-op path does not do; "
                         f"use CPU tensors, or causal=False")
    query_lengths, key_lengths = _lengths_arg(query_lengths), _lengths_arg(key_lengths)  # one host copy each
    _check_inputs(att, q, k, v, bias, query_lengths, key_lengths, causal)
    B, H, N, D = q.shape
    Hkv, M, Dv = k.shape[1], k.shape[2], v.shape[3]
    if B * N == 0 or M == 0:
        # Nothing to attend (no queries, or no keys: every output row is 0). Kept on the autograd
        # graph of q, k and v so a backward gives zero gradients, as the kernels do.
        z = sum(t.reshape(-1)[:0].sum() for t in (q, k, v))
        return q.new_zeros(B, H, N, Dv) + z.to(q.dtype)
    nq = _valid(query_lengths, B, N)
    nk = _valid(key_lengths, B, M)
    k, v = k.to(q.dtype), v.to(q.dtype)
    out_dtype = q.dtype
    # float16 matmuls are missing on the CPU of older PyTorch: compute in float32 there.
    if q.device.type == "cpu" and q.dtype in (torch.float16, torch.bfloat16):
        q, k, v = q.float(), k.float(), v.float()
    scale = p.scale if p.scale is not None else 1.0 / math.sqrt(D)
    if p.name == "full":
        o = _full(q, k, v, nq, nk, causal, bias, scale)
    else:
        o = _clustered(p, q, k, v, nq, nk, step, scale)
    return o.to(out_dtype)


def _heads(k, H):
    """(B, Hkv, M, D) -> (B·H, M, D): query head h reads key head h / (H / Hkv)."""
    B, Hkv, M, D = k.shape
    if Hkv == H:
        return k.reshape(B * H, M, D)
    return k.unsqueeze(2).expand(B, Hkv, H // Hkv, M, D).reshape(B * H, M, D)


def _masks(nq, nk, H, N, M, device):
    """Per head (G = B·H): query valid (G, N) bool, key bias (G, 1, M) float 0/-inf, and whether
    any key is visible (G,) bool. A head without keys gets all keys (no NaN) and a zero output."""
    G = len(nq) * H
    nqt = torch.tensor(nq, device=device).repeat_interleave(H)
    nkt = torch.tensor(nk, device=device).repeat_interleave(H)
    qv = torch.arange(N, device=device) < nqt.unsqueeze(1)
    kv = (torch.arange(M, device=device) < nkt.unsqueeze(1)) | (nkt == 0).unsqueeze(1)
    kbias = torch.zeros(G, 1, M, device=device).masked_fill(~kv.unsqueeze(1), float("-inf"))
    return qv, kbias, nkt > 0


def _full(q, k, v, nq, nk, causal, bias, scale):
    B, H, N, D = q.shape
    M, Dv = k.shape[2], v.shape[3]
    G = B * H
    dev = q.device
    qv, kbias, anyk = _masks(nq, nk, H, N, M, dev)
    rowmask = qv & anyk.unsqueeze(1)  # (G, N)
    if causal:  # query i sees keys j <= i + (M − N): rows before N − M see none
        rowmask = rowmask & (torch.arange(N, device=dev) + (M - N) >= 0)
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    padded = any(n < M for n in nk)
    # PyTorch's own kernel (FlashAttention on a GPU) where one call expresses the masks.
    if sdpa is not None and dev.type != "cpu" and bias is None and not (causal and (N != M or padded)):
        kk, vv = _heads(k, H).reshape(B, H, M, D), _heads(v, H).reshape(B, H, M, Dv)
        qs = q if abs(scale * math.sqrt(D) - 1) < 1e-12 else q * (scale * math.sqrt(D))
        if padded:
            o = sdpa(qs, kk, vv, attn_mask=(kbias.view(B, H, 1, M) == 0), is_causal=False)
        else:
            o = sdpa(qs, kk, vv, is_causal=bool(causal))
        o = o.reshape(G, N, Dv).float()
    else:
        qf, kf, vf = q.reshape(G, N, D), _heads(k, H), _heads(v, H)
        rows = _rows_per_block(G * M, dev)
        parts = []
        for i0 in range(0, N, rows):
            i1 = min(N, i0 + rows)
            extra = None
            if bias is not None:
                extra = bias[i0:i1].float()
            if causal:
                j = torch.arange(M, device=dev)
                i = torch.arange(i0, i1, device=dev).unsqueeze(1)
                cm = torch.zeros(i1 - i0, M, device=dev).masked_fill(j > i + (M - N), float("-inf"))
                extra = cm if extra is None else extra + cm
            parts.append(_ckpt(lambda a, b_, c, d, e: _rows_attention(a, b_, c, d, scale, e)[0],
                               qf[:, i0:i1], kf, vf, kbias, extra))
        o = torch.cat(parts, 1)
    o = torch.where(rowmask.unsqueeze(-1), o, torch.zeros((), device=dev))
    return o.view(B, H, N, Dv)


def _clustered(p, q, k, v, nq, nk, step, scale):
    B, H, N, D = q.shape
    M, Dv = k.shape[2], v.shape[3]
    G = B * H
    dev = q.device
    qf = q.reshape(G, N, D)  # (G, N, D)
    kf, vf = _heads(k, H), _heads(v, H)  # (G, M, D), (G, M, Dv)
    qv, kbias, anyk = _masks(nq, nk, H, N, M, dev)
    nv = [n for n in nq for _ in range(H)]
    assign, ce = clusters(p, qf.detach(), nv, step, 0)  # (G, N)
    C = max(1, max(ce))
    # Qc_j = mean of the members (padded rows excluded): (G, C, D), float32 sums.
    flat = torch.where(qv, assign + (torch.arange(G, device=dev) * C).unsqueeze(1),
                       torch.full_like(assign, G * C)).flatten()  # (G·N)
    sizes = torch.bincount(flat, minlength=G * C + 1)[:G * C].view(G, C)
    sums = torch.zeros(G * C + 1, D, device=dev).index_add(0, flat, qf.reshape(G * N, D).float())
    qc = (sums[:G * C].view(G, C, D) / sizes.clamp(min=1).unsqueeze(-1)).to(q.dtype)  # (G, C, D)
    kk = min(p.topk, M) if p.topk > 0 else 0
    rows = _rows_per_block(G * M, dev)
    if kk == 0:
        vc = torch.cat([_ckpt(lambda a, b_, c, d: _centroid_block(a, b_, c, d, None, None, None, scale),
                              qc[:, j0:j0 + rows], kf, vf, kbias) for j0 in range(0, C, rows)], 1)  # (G, C, Dv)
        flat_c = (assign + (torch.arange(G, device=dev) * C).unsqueeze(1)).flatten()  # (G·N)
        o = vc.reshape(G * C, Dv).index_select(0, flat_c).view(G, N, Dv)
    else:
        # T_j: the k = min(topk, valid keys) best centroid scores (constants of the backward).
        with torch.no_grad():
            tidx = torch.cat([torch.topk(torch.matmul(qc[:, j0:j0 + rows], kf.transpose(1, 2)).float() + kbias,
                                         kk, dim=-1).indices for j0 in range(0, C, rows)], 1)  # (G, C, kk)
            # A head without keys computes on all of them (no NaN in the backward) and outputs 0.
            ksel = torch.tensor([n if n > 0 else kk for n in nk], device=dev).clamp(max=kk).repeat_interleave(H)  # (G,)
            tok = (torch.arange(kk, device=dev) < ksel.view(G, 1, 1)).expand(G, C, kk)  # (G, C, kk)
            tbias = torch.zeros(G, C, kk, device=dev).masked_fill(~tok, float("-inf"))
            gi3 = torch.arange(G, device=dev).view(G, 1, 1)
        kt = kf[gi3, tidx]  # (G, C, kk, D)
        vt = vf[gi3, tidx]  # (G, C, kk, Dv)
        tokf = tok.float()
        parts = [_ckpt(lambda a, b_, c, d, e, t, f: _centroid_block(a, b_, c, d, e, t, f, scale)[1:],
                       qc[:, j0:j0 + rows], kf, vf, kbias, tidx[:, j0:j0 + rows], tokf[:, j0:j0 + rows],
                       vt[:, j0:j0 + rows])
                 for j0 in range(0, C, rows)]
        m = torch.cat([x[0] for x in parts], 1)  # (G, C)
        r = torch.cat([x[1] for x in parts], 1)  # (G, C, Dv)
        nrow = _rows_per_block(G * kk * (D + Dv), dev)
        o = _Members.apply(qf, kt, vt, tbias, m, r, assign, scale, nrow)  # (G, N, Dv)
    keep = (qv & anyk.unsqueeze(1)).unsqueeze(-1)
    o = torch.where(keep, o, torch.zeros((), device=dev))
    return o.view(B, H, N, Dv)
