// Ring attention (include/clattn/seq_parallel.h): full softmax attention with the sequence split
// across ranks. Each rank keeps its queries; the K/V blocks of every rank pass around the ring
// (rank r sends to r + 1 and receives from r − 1, the next block arriving while the tiled kernel
// works on the one at hand), and each block's partial result merges into the running one by its
// row max and log2 sum — the online softmax of FlashAttention, across ranks.
//
// A block pair is one call of full's kernels: a query piece of this rank against a key piece of
// the block's owner. Non-causal: one piece each. Causal (zig-zag split, 2R chunks, rank r holding
// chunks r and 2R−1−r): a key chunk before the query chunk is attended whole, the same chunk with
// the causal mask, a later one not at all — so every rank does the same work.
//
// Backward: the blocks go round again carrying their dK and dV accumulators; each rank adds its
// queries' share (full's backward with the merged row max and sum and the final output, so P and
// D_i are the global ones), and after R steps one more hop returns each block's gradients to its
// owner.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention/full/full.h"
#include "attention/tile/tile_ops.h"
#include "clattn/error.h"
#include "clattn/threads.h"
#include "sequence_split/sp_internal.h"

namespace clattn::sp {
namespace {

using tile::kInf;

constexpr int kTagBlock = 7101, kTagGrad = 7102;

// One rank's block as it travels: K (B, Hkv, n, Dk) then V (B, Hkv, n, Dv) in one buffer (in
// the backward also their gradients, in a buffer of the same layout).
struct BlockLayout {
  int64_t B, Hkv, n, Dk, Dv;
  int64_t floats() const { return B * Hkv * n * (Dk + Dv); }
  View part(float* base, int which) const {  // 0 K, 1 V
    const int64_t off = which == 0 ? 0 : B * Hkv * n * Dk;
    const int64_t D = which == 0 ? Dk : Dv;
    View v{base + off, Shape{B, Hkv, n, D}, {}};
    v.strides = {Hkv * n * D, n * D, D, 1};
    return v;
  }
};

// Rows [r0, r0 + n) of a (B, H, rows, D) view.
template <class V>
V rows_of(V v, int64_t r0, int64_t n) {
  v.data += r0 * v.stride(2);
  v.shape = Shape{v.dim(0), v.dim(1), n, v.dim(3)};
  return v;
}

void copy_rows(ConstView src, View dst) {
  for (int64_t b = 0; b < src.dim(0); ++b)
    for (int64_t h = 0; h < src.dim(1); ++h)
      for (int64_t i = 0; i < src.dim(2); ++i)
        std::memcpy(dst.ptr(b, h, i), src.ptr(b, h, i), sizeof(float) * static_cast<size_t>(src.dim(3)));
}

void add_rows(ConstView src, View dst) {
  for (int64_t b = 0; b < src.dim(0); ++b)
    for (int64_t h = 0; h < src.dim(1); ++h)
      for (int64_t i = 0; i < src.dim(2); ++i) {
        const float* s = src.ptr(b, h, i);
        float* d = dst.ptr(b, h, i);
        for (int64_t e = 0; e < src.dim(3); ++e) d[e] += s[e];
      }
}

// Relation of a key piece to a query piece under the causal mask of a zig-zag split.
enum class Pair { all, causal, none };
Pair relation(bool causal, int64_t qa, int64_t qlen, int64_t ka, int64_t klen) {
  if (!causal || ka + klen <= qa) return Pair::all;
  if (ka >= qa + qlen) return Pair::none;
  check(ka == qa && klen == qlen, "sequence parallel: internal: causal pieces must be equal chunks or disjoint");
  return Pair::causal;
}

// Open MPI moves a large message (rendezvous protocol) only inside MPI calls: a transfer posted
// before the kernel and waited for after it would not overlap it at all. A query piece that sees
// its keys whole is therefore computed in sub-pieces of this many rows, with the pending
// transfers tested between them. Query rows are independent in the forward (the same bits); the
// backward adds the sub-pieces' dK and dV one after the other (a different rounding of the same
// sum). 8 sub-pieces of at least 256 rows keep the kernel's tiles full.
int64_t progress_rows(Pair rel, int64_t qlen) {
  return rel == Pair::causal ? std::max<int64_t>(qlen, 1) : std::max<int64_t>(256, (qlen + 7) / 8);
}

// One call of full's kernels: a query sub-piece of this rank (local rows [qlo, qlo + d.N)) against
// a key piece of the block at hand (its rows [klo, klo + d.M)), with the inputs set up.
struct Piece {
  AttentionInputs in;
  AttentionDims d;
  int64_t qlo = 0, klo = 0;
  std::vector<int32_t> ql, kl;  // (B) valid query and key rows of the piece
};

// Calls f(piece) for every pair of this rank's query sub-pieces and block src's key pieces that
// attends, in order, and poll() after each so the pending transfers progress.
template <class F, class P>
void for_each_piece(const SeqSplit& split, int src, int r, const AttentionInputs& in, ConstView kb, ConstView vb,
                    F&& f, P&& poll) {
  const int64_t B = in.q.dim(0), H = in.q.dim(1), Hkv = in.k.dim(1), Dk = in.q.dim(3), Dv = in.v.dim(3);
  int64_t klo = 0;
  for (const auto& seg_ka : split.segments[static_cast<size_t>(src)]) {
    const int64_t ka = seg_ka.first, klen = seg_ka.second;
    int64_t qlo0 = 0;  // local row of the query segment
    for (const auto& seg_qa : split.segments[static_cast<size_t>(r)]) {
      const Pair rel = relation(in.causal, seg_qa.first, seg_qa.second, ka, klen);
      const int64_t step = progress_rows(rel, seg_qa.second);
      for (int64_t c0 = 0; rel != Pair::none && klen > 0 && c0 < seg_qa.second; c0 += step) {
        const int64_t qa = seg_qa.first + c0, qlen = std::min(step, seg_qa.second - c0);
        Piece p;
        p.qlo = qlo0 + c0;
        p.klo = klo;
        p.ql = piece_lengths(in.query_lengths, B, qa, qlen);
        p.kl = piece_lengths(in.key_lengths, B, ka, klen);
        p.in.q = rows_of(in.q, p.qlo, qlen);
        p.in.k = rows_of(kb, klo, klen);
        p.in.v = rows_of(vb, klo, klen);
        p.in.query_lengths = p.ql;
        p.in.key_lengths = p.kl;
        p.in.causal = rel == Pair::causal;
        p.d = AttentionDims{B, H, Hkv, qlen, klen, Dk, Dv};
        f(static_cast<const Piece&>(p));
        poll();
      }
      qlo0 += seg_qa.second;
    }
    klo += klen;
  }
}

}  // namespace

void ring_forward(Communicator& comm, const SeqSplit& split, float scale, const AttentionInputs& in, View out,
                  RingState& st, Scratch& scratch) {
  const int R = comm.size(), r = comm.rank();
  const int64_t B = in.q.dim(0), H = in.q.dim(1), n = in.q.dim(2), Hkv = in.k.dim(1), Dk = in.q.dim(3),
                Dv = in.v.dim(3);
  FullWorkspace& ws = full_workspace(scratch);
  st.parts.resize(Shape{2, B, H, n});
  float* pm = st.parts.data();          // (B, H, n) merged row max, log2 units; -inf: nothing yet
  float* pl = st.parts.data() + B * H * n;  // (B, H, n) merged row sum (linear, relative to pm)
  std::fill(pm, pm + B * H * n, -kInf);
  std::fill(pl, pl + B * H * n, 0.f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < n; ++i) std::memset(out.ptr(b, h, i), 0, sizeof(float) * static_cast<size_t>(Dv));
  int64_t nmax = 0;
  for (int j = 0; j < R; ++j) nmax = std::max(nmax, split.local_rows(j));
  // Two block buffers: the one at hand and the one arriving.
  const BlockLayout own{B, Hkv, n, Dk, Dv};
  std::vector<float> buf[2];
  buf[0].resize(static_cast<size_t>(BlockLayout{B, Hkv, nmax, Dk, Dv}.floats()));
  buf[1].resize(buf[0].size());
  copy_rows(in.k, own.part(buf[0].data(), 0));
  copy_rows(in.v, own.part(buf[0].data(), 1));
  std::vector<float> o_pair, parts_pair, lse_pair;
  for (int s = 0; s < R; ++s) {
    const int src = (r - s + R) % R;
    const BlockLayout bl{B, Hkv, split.local_rows(src), Dk, Dv};
    float* cur = buf[s % 2].data();
    std::unique_ptr<CommRequest> send, recv;
    if (s + 1 < R) {  // the next block: from r − 1, which holds the block of r − s − 1
      const int nxt = (r - s - 1 + 2 * R) % R;
      const BlockLayout nb{B, Hkv, split.local_rows(nxt), Dk, Dv};
      recv = comm.irecv(buf[(s + 1) % 2].data(), sizeof(float) * static_cast<size_t>(nb.floats()), (r - 1 + R) % R,
                   kTagBlock);
      send = comm.isend(cur, sizeof(float) * static_cast<size_t>(bl.floats()), (r + 1) % R, kTagBlock);
    }
    const View kb = bl.part(cur, 0), vb = bl.part(cur, 1);
    auto run = [&](const Piece& p) {
      const int64_t qlen = p.d.N, qlo = p.qlo;
      o_pair.resize(static_cast<size_t>(B * H * qlen * Dv));
      lse_pair.resize(static_cast<size_t>(B * H * qlen));
      parts_pair.resize(static_cast<size_t>(2 * B * H * qlen));
      View op{o_pair.data(), Shape{B, H, qlen, Dv}, {}};  // (B, H, qlen, Dv)
      op.strides = {H * qlen * Dv, qlen * Dv, Dv, 1};
      attn_full_fwd(p.in, p.d, scale, op, lse_pair.data(), ws, {}, parts_pair.data());
      // Merge the piece into the running rows (log2 units): the block's weight 2^(m + log2 l).
      parallel_for(B * H, [&](int64_t t) {
        const int64_t b = t / H, h = t % H;
        for (int64_t i = 0; i < p.ql[static_cast<size_t>(b)]; ++i) {
          const int64_t at = (b * H + h) * qlen + i, row = (b * H + h) * n + qlo + i;
          const float ms = parts_pair[static_cast<size_t>(at)], ls = parts_pair[static_cast<size_t>(B * H * qlen + at)];
          if (ms == kInf) continue;  // no visible key in this piece
          const float m0 = pm[row], mnew = std::max(m0, ms);
          const float w0 = m0 == -kInf ? 0.f : pl[row] * std::exp2(m0 - mnew);
          const float w1 = std::exp2(ms + ls - mnew);
          const float tot = w0 + w1, a = w0 / tot, c = w1 / tot;
          float* o = out.ptr(b, h, qlo + i);
          const float* os = op.ptr(b, h, i);
          for (int64_t e = 0; e < Dv; ++e) o[e] = a * o[e] + c * os[e];
          pm[row] = mnew;
          pl[row] = tot;
        }
      });
    };
    for_each_piece(split, src, r, in, kb, vb, run, [&] {
      if (recv) (void)recv->test();
      if (send) (void)send->test();
    });
    if (recv) recv->wait();
    if (send) send->wait();
  }
  // The merged (m, log2 l) in full's convention: padded rows 0 and 0, rows that saw nothing +inf.
  int64_t qlo = 0;
  for (const auto& seg_qa : split.segments[static_cast<size_t>(r)]) {
    const int64_t qa = seg_qa.first, qlen = seg_qa.second;
    const std::vector<int32_t> ql = piece_lengths(in.query_lengths, B, qa, qlen);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < qlen; ++i) {
          const int64_t row = (b * H + h) * n + qlo + i;
          if (i >= ql[static_cast<size_t>(b)]) {
            pm[row] = pl[row] = 0.f;
          } else if (pm[row] == -kInf) {
            pm[row] = kInf;
            pl[row] = 0.f;
          } else {
            pl[row] = std::log2(pl[row]);
          }
        }
    qlo += qlen;
  }
}

void ring_backward(Communicator& comm, const SeqSplit& split, float scale, const AttentionInputs& in, ConstView out,
                   const RingState& st, ConstView dout, View dq, View dk, View dv, Scratch& scratch) {
  const int R = comm.size(), r = comm.rank();
  const int64_t B = in.q.dim(0), H = in.q.dim(1), n = in.q.dim(2), Hkv = in.k.dim(1), Dk = in.q.dim(3),
                Dv = in.v.dim(3);
  FullWorkspace& ws = full_workspace(scratch);
  int64_t nmax = 0;
  for (int j = 0; j < R; ++j) nmax = std::max(nmax, split.local_rows(j));
  const int64_t cap = BlockLayout{B, Hkv, nmax, Dk, Dv}.floats();
  // K/V blocks travel a step ahead of the compute, as in the forward. Their gradients travel a
  // step behind: at step s this rank adds its queries' share of block src into a fresh buffer,
  // then the share of the ranks before it (which r − 1 sends while this rank computes), and sends
  // the sum to r + 1 while the next block is computed. After R steps each block's gradient has
  // every rank's share and reaches its owner, r + 1 of the last rank to add to it.
  std::vector<float> kv[2], g[2], gin(static_cast<size_t>(cap));
  for (int x = 0; x < 2; ++x) {
    kv[x].resize(static_cast<size_t>(cap));
    g[x].resize(static_cast<size_t>(cap));
  }
  const BlockLayout own{B, Hkv, n, Dk, Dv};
  copy_rows(in.k, own.part(kv[0].data(), 0));
  copy_rows(in.v, own.part(kv[0].data(), 1));
  std::vector<float> parts_pair;
  std::unique_ptr<CommRequest> gsend;  // the gradient sent at the step before
  for (int s = 0; s < R; ++s) {
    const int src = (r - s + R) % R;
    const BlockLayout bl{B, Hkv, split.local_rows(src), Dk, Dv};
    float* cur = kv[s % 2].data();
    std::unique_ptr<CommRequest> send, recv, grecv;
    if (s + 1 < R) {
      const int nxt = (r - s - 1 + 2 * R) % R;
      const BlockLayout nb{B, Hkv, split.local_rows(nxt), Dk, Dv};
      recv = comm.irecv(kv[(s + 1) % 2].data(), sizeof(float) * static_cast<size_t>(nb.floats()), (r - 1 + R) % R,
                   kTagBlock);
      send = comm.isend(cur, sizeof(float) * static_cast<size_t>(bl.floats()), (r + 1) % R, kTagBlock);
    }
    if (s > 0)  // block src's gradient so far, from the rank that had it at step s − 1
      grecv = comm.irecv(gin.data(), sizeof(float) * static_cast<size_t>(bl.floats()), (r - 1 + R) % R, kTagGrad);
    float* gcur = g[s % 2].data();
    std::fill(gcur, gcur + bl.floats(), 0.f);
    const View kb = bl.part(cur, 0), vb = bl.part(cur, 1), dkb = bl.part(gcur, 0), dvb = bl.part(gcur, 1);
    auto run = [&](const Piece& p) {
      const int64_t qlen = p.d.N, qlo = p.qlo;
      parts_pair.resize(static_cast<size_t>(2 * B * H * qlen));  // (2, B, H, qlen) the merged rows' (m, log2 l)
      for (int64_t t = 0; t < B * H; ++t)
        for (int x = 0; x < 2; ++x)
          std::memcpy(parts_pair.data() + x * B * H * qlen + t * qlen, st.parts.data() + x * B * H * n + t * n + qlo,
                      sizeof(float) * static_cast<size_t>(qlen));
      attn_full_bwd(p.in, p.d, scale, rows_of(out, qlo, qlen), parts_pair.data(), rows_of(dout, qlo, qlen),
                    rows_of(dq, qlo, qlen), rows_of(dkb, p.klo, p.d.M), rows_of(dvb, p.klo, p.d.M), ws);
    };
    for_each_piece(split, src, r, in, kb, vb, run, [&] {
      if (recv) (void)recv->test();
      if (send) (void)send->test();
      if (grecv) (void)grecv->test();
      if (gsend) (void)gsend->test();
    });
    if (grecv) {
      grecv->wait();
      const int64_t nf = bl.floats();
      for (int64_t x = 0; x < nf; ++x) gcur[x] += gin[static_cast<size_t>(x)];
    }
    if (gsend) gsend->wait();  // g[(s + 1) % 2] is free again for the next step
    gsend = comm.isend(gcur, sizeof(float) * static_cast<size_t>(bl.floats()), (r + 1) % R, kTagGrad);
    if (recv) recv->wait();
    if (send) send->wait();
  }
  // This rank's own block, with every rank's share, from r − 1.
  std::unique_ptr<CommRequest> home = comm.irecv(gin.data(), sizeof(float) * static_cast<size_t>(own.floats()),
                                            (r - 1 + R) % R, kTagGrad);
  home->wait();
  gsend->wait();
  add_rows(own.part(gin.data(), 0), dk);
  add_rows(own.part(gin.data(), 1), dv);
}

}  // namespace clattn::sp
