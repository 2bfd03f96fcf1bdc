"""Trains a small transformer with its attention offloaded to attnserve, next to the same model
with local attention, and checks that both follow the same trajectory.

    python examples/train_offloaded.py --target localhost:8001 [--steps 5] [--dtype bf16]

The model is a 2-layer pre-norm causal transformer over packed variable-length sequences of
random tokens (FlashAttention's varlen layout: tokens of all sequences concatenated, cu_seqlens
offsets). One copy calls attnserve.flash_attn_varlen_func, the drop-in for FlashAttention's;
the other runs torch's scaled_dot_product_attention one sequence at a time. Both start from
the same weights and see the same batches; each step compares their losses and gradients.
Exits 1 if they differ by more than the dtype's tolerance.
"""
import argparse
import copy
import sys
from dataclasses import dataclass
from typing import Callable, List

import torch
import torch.nn.functional as F
from torch import nn

import attnserve

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Relative differences allowed between the two runs: rounding of the attention output in the
# model's dtype, compounded over a few steps.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


def offloaded_attention(client) -> Attention:
    def attention(q, k, v, cu_seqlens, max_seqlen):
        return attnserve.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen,
                                                max_seqlen, causal=True, client=client)
    return attention


def local_attention(q, k, v, cu_seqlens, max_seqlen):
    """Causal attention per sequence with torch's own kernel, as code without FlashAttention
    does it."""
    outs = []
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        # [tokens, heads, dim] -> [heads, tokens, dim], SDPA's layout.
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1))
    return torch.cat(outs)


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, attention: Attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))

    def forward(self, x, cu_seqlens, max_seqlen):
        tokens, d_model = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(tokens, 3, self.heads, -1).unbind(1)
        x = x + self.proj(self.attention(q, k, v, cu_seqlens, max_seqlen).reshape(tokens, d_model))
        return x + self.mlp(self.norm2(x))


class PackedTransformer(nn.Module):
    def __init__(self, vocab: int = 97, d_model: int = 64, heads: int = 4, layers: int = 2,
                 max_len: int = 64, attention: Attention = local_attention):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, attention) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def set_attention(self, attention: Attention) -> None:
        for block in self.blocks:
            block.attention = attention

    def forward(self, tokens, positions, cu_seqlens, max_seqlen):
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x, cu_seqlens, max_seqlen)
        return self.head(self.norm(x))


@dataclass
class Batch:
    tokens: torch.Tensor     # [total] int64, sequences concatenated
    positions: torch.Tensor  # [total] position of each token within its sequence
    targets: torch.Tensor    # [total] the next token, -100 after each sequence's last
    cu_seqlens: torch.Tensor  # [batch + 1] int32
    max_seqlen: int


def random_batch(generator: torch.Generator, vocab: int, max_len: int, device) -> Batch:
    lengths = torch.randint(2, max_len + 1, (int(torch.randint(2, 5, (1,),
                                                                generator=generator)),),
                            generator=generator).tolist()
    tokens = torch.randint(0, vocab, (sum(lengths),), generator=generator)
    positions = torch.cat([torch.arange(n) for n in lengths])
    targets = torch.roll(tokens, -1)
    cu_seqlens = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    targets[cu_seqlens[1:].long() - 1] = -100  # no next token across a sequence boundary
    return Batch(tokens.to(device), positions.to(device), targets.to(device),
                 cu_seqlens.to(device), max(lengths))


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@dataclass
class StepReport:
    step: int
    loss_offloaded: float
    loss_local: float
    loss_error: float
    grad_error: float  # worst relative error of any parameter's gradient


def train_and_compare(client, steps: int = 3, dtype=torch.float32, device="cpu",
                      seed: int = 0) -> List[StepReport]:
    """Trains the offloaded and the local model side by side for `steps` SGD steps."""
    torch.manual_seed(seed)
    local = PackedTransformer().to(device=device, dtype=dtype)
    offloaded = copy.deepcopy(local)
    offloaded.set_attention(offloaded_attention(client))
    # Plain SGD: Adam's per-entry normalisation would blow rounding-level differences in
    # near-zero gradient entries up to full-size updates, measuring Adam rather than attention.
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (offloaded, local)]
    generator = torch.Generator().manual_seed(seed)
    reports = []
    for step in range(steps):
        batch = random_batch(generator, local.head.out_features, local.position.num_embeddings,
                             device)
        losses = []
        for model, optimizer in zip((offloaded, local), optimizers):
            optimizer.zero_grad()
            logits = model(batch.tokens, batch.positions, batch.cu_seqlens, batch.max_seqlen)
            loss = F.cross_entropy(logits.float(), batch.targets)
            loss.backward()
            losses.append(loss.detach())
        grad_error = max(_relative(a.grad, b.grad)
                         for a, b in zip(offloaded.parameters(), local.parameters()))
        reports.append(StepReport(step, float(losses[0]), float(losses[1]),
                                  _relative(losses[0], losses[1]), grad_error))
        for optimizer in optimizers:
            optimizer.step()
    return reports


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="localhost:8001", help="attnserve gRPC target")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dtype", choices=DTYPES, default="fp32")
    parser.add_argument("--device", default="cpu", help="where the model lives: cpu, cuda, ...")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per call")
    args = parser.parse_args(argv)
    dtype = DTYPES[args.dtype]
    with attnserve.Client(args.target, timeout=args.timeout) as client:
        reports = train_and_compare(client, args.steps, dtype, args.device)
    tolerance = TOLERANCE[dtype]
    print(f"{'step':>4} {'loss (attnserve)':>17} {'loss (local)':>13} {'loss rel err':>13} "
          f"{'grad rel err':>13}")
    for r in reports:
        print(f"{r.step:>4} {r.loss_offloaded:>17.6f} {r.loss_local:>13.6f} "
              f"{r.loss_error:>13.2e} {r.grad_error:>13.2e}")
    worst = max(max(r.loss_error, r.grad_error) for r in reports)
    verdict = "match" if worst <= tolerance else "DIFFER"
    print(f"attnserve and local attention {verdict}: worst relative error {worst:.2e} "
          f"(tolerance {tolerance:.0e} for {args.dtype})")
    return 0 if worst <= tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
