// Shared by tessel's sides of the JAX comparisons (bench_side_by_side.cpp: the forward;
// bench_train.cpp: the training step): the two model configurations and the process CPU clock.
#pragma once

#include <sys/resource.h>

#include <cstdint>

#include "tessel/models/gpt.hpp"

namespace tessel_bench {

// CPU seconds of the whole process so far (every thread: device threads, stream workers). On a
// shared machine wall time includes waiting for a core; CPU time does not.
inline double process_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// config 0: the gpt example's defaults (batch 8, seq 64, d_model 128, 4 heads, 2 layers, vocab
// 512); 1: a GPT-2-small-sized block (batch 4, seq 256, d_model 768, 12 heads, 2 layers, vocab
// 8192). bench/jax/gpt_jax.py's CONFIGS "example" and "gpt2".
inline tessel::GptConfig side_config(int64_t c) {
  tessel::GptConfig cfg;
  if (c == 1) {
    cfg.batch = 4;
    cfg.seq = 256;
    cfg.d_model = 768;
    cfg.heads = 12;
    cfg.layers = 2;
    cfg.vocab = 8192;
  }
  return cfg;
}

}  // namespace tessel_bench
