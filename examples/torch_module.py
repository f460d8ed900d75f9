import torch, clattn.torch

class TinyLM(torch.nn.Module):
    """One pre-norm transformer block whose attention is clattn's, where torch's would stand."""
    def __init__(self, vocab=64, dim=64, heads=4, spec="improved-clustered:clusters=16,block=32"):
        super().__init__()
        self.embed, self.norm = torch.nn.Embedding(vocab, dim), torch.nn.LayerNorm(dim)
        self.attn = clattn.torch.MultiheadAttention(dim, heads, batch_first=True, spec=spec)
        self.out = torch.nn.Linear(dim, vocab)

    def forward(self, ids):                                   # ids (B, T)
        x = self.embed(ids)
        h = self.norm(x)
        a, _ = self.attn(h, h, h, is_causal=True, need_weights=False)
        return self.out(x + a)                                # (B, T, vocab) logits

torch.manual_seed(0)
model = TinyLM()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
data = torch.arange(129).remainder(64).repeat(4, 1)          # predict the next of a counting sequence
for step in range(30):                                        # model.attn.step advances each step
    logits = model(data[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), data[:, 1:].reshape(-1))
    opt.zero_grad(); loss.backward(); opt.step()
print(f"loss after {step + 1} steps: {loss.item():.3f}, attention step {model.attn.step}")
