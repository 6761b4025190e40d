#!/usr/bin/env python3
"""The GPT-2 124M forward of tessel's bench (BM_Gpt2Forward, bench/cuda/bench_cuda.cpp) in
PyTorch, eager and torch.compile, on the same GPU: the figure tessel's CUDA backend is to beat;
with --train, the training step of `gpt_train --mixed` (forward, backward, AdamW).

The model is tessel's (src/models/gpt.cpp), layer for layer: token + position embeddings;
per block pre-LN attention with separate q, k, v projections [d, h, k] and an output
projection [h, k, d], all without biases, scores scaled by 1/sqrt(k), causal mask, softmax;
pre-LN MLP d -> 4d (bias, tanh-approximation GELU as tessel's gelu) -> d (bias); residuals;
final layer norm; the LM head tied to the token embedding; mean cross-entropy. Batch 8 x 1024
tokens, 12 layers, d 768, 12 heads, vocab 50257; weights and activations bf16, the loss in f32.

Attention is written out (einsum, mask, softmax, einsum) as tessel runs it; --sdpa uses
torch's fused scaled_dot_product_attention instead (flash attention), reported separately.

Reports:
  default      one JSON object (indented) after both modes: per mode (eager, compile) the best
               and median of --iters single steps, tokens/s and model FLOP/s of the best step
               (2*params*tokens for the matmuls plus attention's 4*layers*batch*seq^2*d, the
               count tessel's program gives up to the elementwise ops). scripts/bench-gpu.
  --median     one JSON line per mode, printed as soon as that mode finishes: the median of
               --repetitions (default 3) repetitions, each the mean of --iters steps, as
               `tessel-bench-gpu --benchmark_repetitions=3` reports BM_Gpt2Forward (the median
               of 3 repetition means).
  --train      the training step instead of the forward: parameters in f32, forward and loss
               under torch.autocast(bfloat16), backward, global gradient-norm clipping at 1.0,
               AdamW (lr 1.5e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01 on parameters of
               rank >= 2: tessel's AdamWConfig; fused on CUDA). One JSON line per mode as soon
               as it finishes: the median of --iters (default 11) single steps after --warmup,
               as gpu-round takes the median of `gpt_train --steps 12`'s steps 2..12.
  Both JSON-line reports give tokens/s = tokens per step / median step time and MFU by
  llm.c's formula (train_gpt2.cu, gpt2_estimate_mfu): 6*N + 6*L*C*T FLOP per token for a
  training step (N parameters, L layers, C = d_model, T = seq), and its forward third,
  2*N + 2*L*C*T, for a forward; against 989 TFLOP/s (H100/H200 dense bf16, --peak-tflops)
  and, given --ceiling-tflops X, against the measured cuBLASLt ceiling X (BM_GemmCeiling).
"""
import argparse
import contextlib
import json
import math
import statistics
import sys
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


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def step_times(fn, iters, warmup, dev):
    """Seconds of each of `iters` single steps (synchronised after each), after `warmup` steps."""
    for _ in range(warmup):
        fn()
    sync(dev)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync(dev)
        times.append(time.perf_counter() - t0)
    return times


def time_steps(fn, iters, warmup, dev):
    times = step_times(fn, iters, warmup, dev)
    return min(times), statistics.median(times)


def device_name(dev):
    return torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"


def llmc_flops_per_token(params, a, train):
    """llm.c's gpt2_estimate_mfu: 6*N + 6*L*C*T per token for a training step; a forward is its third."""
    per_token = 6 * params + 6 * a.layers * a.d_model * a.seq
    return per_token if train else per_token // 3


def report_line(mode, what, dev, params, a, statistic, median_s, best_s, loss, extra):
    ntok = a.batch * a.seq
    fpt = llmc_flops_per_token(params, a, what == "train")
    achieved = fpt * ntok / median_s
    line = {
        "mode": mode, "what": what, "device": device_name(dev), "torch": torch.__version__, "params": params,
        "batch": a.batch, "seq": a.seq, "layers": a.layers, "d_model": a.d_model, "vocab": a.vocab,
        "tokens_per_step": ntok,
        "attention": "sdpa" if a.sdpa else "einsum+mask+softmax",
        "statistic": statistic,
        "median_s": median_s, "median_ms": median_s * 1e3, "best_s": best_s,
        "tokens_per_s": ntok / median_s,
        "mfu_formula": ("llm.c 6*N + 6*L*C*T FLOP per token (training step)" if what == "train"
                        else "llm.c's forward third: 2*N + 2*L*C*T FLOP per token"),
        "flops_per_token": fpt,
        "flops_per_s": achieved,
        "peak_tflops": a.peak_tflops,
        "mfu_vs_peak": achieved / (a.peak_tflops * 1e12),
        "ceiling_tflops": a.ceiling_tflops,
        "mfu_vs_ceiling": achieved / (a.ceiling_tflops * 1e12) if a.ceiling_tflops else None,
        "loss": loss,
    }
    line.update(extra)
    print(json.dumps(line), flush=True)


def run_forward(a, dev, model, modes, params, tokens, labels):
    ntok = a.batch * a.seq
    d, L, S = a.d_model, a.layers, a.seq
    matmul_params = L * 12 * d * d + a.vocab * d  # q, k, v, o (4 d^2) + MLP (8 d^2) per layer, LM head
    flops = 2 * matmul_params * ntok + 4 * L * a.batch * S * S * d
    out = {"device": device_name(dev), "torch": torch.__version__, "params": params,
           "batch": a.batch, "seq": a.seq, "tokens_per_step": ntok, "model_flops_per_step": flops,
           "attention": "sdpa" if a.sdpa else "einsum+mask+softmax", "modes": {}}
    with torch.inference_mode():
        for name, m in modes:
            loss = m(tokens, labels)
            if a.median:
                reps = []
                for r in range(a.repetitions):
                    times = step_times(lambda: m(tokens, labels), a.iters, a.warmup if r == 0 else 0, dev)
                    reps.append(statistics.fmean(times))
                report_line(name, "forward", dev, params, a,
                            f"median of {a.repetitions} repetitions, each the mean of {a.iters} single steps "
                            f"(as tessel-bench-gpu --benchmark_repetitions={a.repetitions})",
                            statistics.median(reps), min(reps), float(loss),
                            {"repetition_means_s": reps, "model_flops_per_step": flops})
            else:
                best, median = time_steps(lambda: m(tokens, labels), a.iters, a.warmup, dev)
                out["modes"][name] = {"best_s": best, "median_s": median, "tokens_per_s": ntok / best,
                                      "flops_per_s": flops / best, "loss": float(loss)}
    if not a.median:
        print(json.dumps(out, indent=2))


def run_train(a, dev, model, modes, params, tokens, labels):
    fused = dev.type == "cuda"
    autocast = (torch.autocast(device_type=dev.type, dtype=torch.bfloat16) if not a.no_autocast
                else contextlib.nullcontext())
    for name, m in modes:
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=a.lr, betas=(0.9, 0.999), eps=1e-8, fused=fused)
        losses = []

        def step():
            opt.zero_grad(set_to_none=True)
            with autocast:
                loss = m(tokens, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.detach())

        t0 = time.perf_counter()
        step()  # the first step (torch.compile compiles forward and backward here)
        sync(dev)
        first_s = time.perf_counter() - t0
        times = step_times(step, a.iters, a.warmup, dev)
        report_line(name, "train", dev, params, a,
                    f"median of {a.iters} single steps after {1 + a.warmup} untimed ones "
                    f"(as gpu-round takes the median of gpt_train --steps {a.iters + 1}'s steps 2..{a.iters + 1})",
                    statistics.median(times), min(times), float(losses[-1]),
                    {"step_times_s": times, "first_step_s": first_s, "first_loss": float(losses[0]),
                     "precision": ("f32 parameters, AdamW moments and gradients; forward and loss under "
                                   "torch.autocast(bfloat16)" if not a.no_autocast else "f32"),
                     "optimizer": f"AdamW lr {a.lr} betas (0.9, 0.999) eps 1e-8 weight decay 0.01 on rank >= 2, "
                                  f"grad-norm clip 1.0, fused={fused}"})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--iters", type=int, default=None,
                    help="timed steps (per repetition with --median); default 20, with --train 11")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before the timed ones (default 3)")
    ap.add_argument("--repetitions", type=int, default=3, help="--median: repetitions of --iters steps (default 3)")
    ap.add_argument("--median", action="store_true", help="one JSON line per mode: median of --repetitions means")
    ap.add_argument("--train", action="store_true", help="the training step (forward, backward, AdamW)")
    ap.add_argument("--lr", type=float, default=1.5e-3, help="--train: AdamW learning rate (gpt_train's default)")
    ap.add_argument("--no-autocast", action="store_true", help="--train: all in f32 (no bf16 autocast)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="MFU denominator (default 989: H100/H200 dense bf16)")
    ap.add_argument("--ceiling-tflops", type=float, default=None,
                    help="also MFU against this measured ceiling (BM_GemmCeiling, TFLOP/s)")
    ap.add_argument("--sdpa", action="store_true", help="fused attention (not tessel's formulation)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke test of tiny shapes only)")
    a = ap.parse_args()
    if a.iters is None:
        a.iters = 11 if a.train else 20
    if min(a.iters, a.repetitions) < 1 or a.warmup < 0:
        ap.error("--iters and --repetitions must be >= 1, --warmup >= 0")
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpt2_forward.py: no CUDA GPU visible to torch")
    torch.manual_seed(0)
    # Training keeps f32 parameters (bf16 compute under autocast); the forward is bf16 throughout.
    dtype = torch.float32 if a.train else torch.bfloat16
    model = Gpt2(a.vocab, a.seq, a.d_model, a.heads, a.layers, dtype, a.sdpa).to(dev)
    model = model.train() if a.train else model.eval()
    params = sum(p.numel() for p in model.parameters())
    tokens = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    labels = torch.randint(0, a.vocab, (a.batch, a.seq), device=dev)
    modes = [("eager", model)]
    if not a.no_compile:
        modes.append(("compile", torch.compile(model)))
    if a.train:
        run_train(a, dev, model, modes, params, tokens, labels)
    else:
        run_forward(a, dev, model, modes, params, tokens, labels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
