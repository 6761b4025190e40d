#!/usr/bin/env python3
"""The GPT-2 124M forward of tessel's bench (BM_Gpt2Forward, bench/cuda/bench_cuda.cpp) in
PyTorch, eager and torch.compile, on the same GPU: the figure tessel's CUDA backend is to beat.

The model is tessel's (src/models/gpt.cpp), layer for layer: token + position embeddings;
per block pre-LN attention with separate q, k, v projections [d, h, k] and an output
projection [h, k, d], all without biases, scores scaled by 1/sqrt(k), causal mask, softmax;
pre-LN MLP d -> 4d (bias, tanh-approximation GELU as tessel's gelu) -> d (bias); residuals;
final layer norm; the LM head tied to the token embedding; mean cross-entropy. Batch 8 x 1024
tokens, 12 layers, d 768, 12 heads, vocab 50257; weights and activations bf16, the loss in f32.

Attention is written out (einsum, mask, softmax, einsum) as tessel runs it; --sdpa uses
torch's fused scaled_dot_product_attention instead (flash attention), reported separately.

Prints one JSON object: device, torch version, and per mode (eager, compile) the best and
median step time, tokens/s and model FLOP/s (2*params*tokens for the matmuls plus attention's
4*layers*batch*seq^2*d, the count tessel's program gives up to the elementwise ops).
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F


class Gpt2(torch.nn.Module):
    def __init__(self, vocab, seq, d, heads, layers, dtype, sdpa):
        super().__init__()
        k = d // heads
        self.heads, self.k, self.sdpa = heads, k, sdpa
        p = lambda *shape: torch.nn.Parameter(torch.randn(*shape, dtype=dtype) * 0.02)
        self.wte, self.wpe = p(vocab, d), p(seq, d)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            b = torch.nn.Module()
            b.ln1 = torch.nn.LayerNorm(d, eps=1e-5, dtype=dtype)
            b.wq, b.wk, b.wv = p(d, heads, k), p(d, heads, k), p(d, heads, k)
            b.wo = p(heads, k, d)
            b.ln2 = torch.nn.LayerNorm(d, eps=1e-5, dtype=dtype)
            b.w1, b.b1 = p(d, 4 * d), torch.nn.Parameter(torch.zeros(4 * d, dtype=dtype))
            b.w2, b.b2 = p(4 * d, d), torch.nn.Parameter(torch.zeros(d, dtype=dtype))
            self.blocks.append(b)
        self.lnf = torch.nn.LayerNorm(d, eps=1e-5, dtype=dtype)

    def forward(self, tokens, labels):
        B, S = tokens.shape
        x = self.wte[tokens] + self.wpe[:S]
        mask = torch.ones(S, S, dtype=torch.bool, device=tokens.device).tril()
        for b in self.blocks:
            h = b.ln1(x)
            q = torch.einsum("bsd,dhk->bshk", h, b.wq)
            k = torch.einsum("bsd,dhk->bshk", h, b.wk)
            v = torch.einsum("bsd,dhk->bshk", h, b.wv)
            if self.sdpa:
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=True).transpose(1, 2)
            else:
                s = torch.einsum("bqhk,bshk->bhqs", q, k) * (1.0 / math.sqrt(self.k))
                s = s.masked_fill(~mask, float("-inf"))
                o = torch.einsum("bhqs,bshk->bqhk", torch.softmax(s, dim=-1), v)
            x = x + torch.einsum("bqhk,hkd->bqd", o, b.wo)
            h2 = b.ln2(x)
            u = F.gelu(h2 @ b.w1 + b.b1, approximate="tanh")
            x = x + (u @ b.w2 + b.b2)
        logits = self.lnf(x) @ self.wte.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


def time_steps(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--sdpa", action="store_true", help="fused attention (not tessel's formulation)")
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpt2_forward.py: no CUDA GPU visible to torch")
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = Gpt2(a.vocab, a.seq, a.d_model, a.heads, a.layers, torch.bfloat16, a.sdpa).to(dev).eval()
    params = sum(p.numel() for p in model.parameters())
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    labels = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    ntok = a.batch * a.seq
    d, L, S = a.d_model, a.layers, a.seq
    matmul_params = L * 12 * d * d + a.vocab * d  # q, k, v, o (4 d^2) + MLP (8 d^2) per layer, LM head
    flops = 2 * matmul_params * ntok + 4 * L * a.batch * S * S * d
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "params": params,
           "batch": a.batch, "seq": a.seq, "tokens_per_step": ntok, "model_flops_per_step": flops,
           "attention": "sdpa" if a.sdpa else "einsum+mask+softmax", "modes": {}}
    modes = [("eager", model)]
    if not a.no_compile:
        modes.append(("compile", torch.compile(model)))
    with torch.inference_mode():
        for name, m in modes:
            loss = m(tokens, labels)
            best, median = time_steps(lambda: m(tokens, labels), a.iters, warmup=3)
            out["modes"][name] = {"best_s": best, "median_s": median, "tokens_per_s": ntok / best,
                                  "flops_per_s": flops / best, "loss": float(loss)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
