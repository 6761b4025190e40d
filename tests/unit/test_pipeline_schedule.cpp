// Pipeline schedules (tessel/pipeline/schedule.hpp): each kind built for several stage and
// micro-batch counts is valid (every op once, each after what it needs), its simulated step
// time and bubble are the closed forms (GPipe and 1F1B: (M + P - 1)(tf + tb), bubble
// (P - 1)/(M + P - 1); interleaved with v chunks: the bubble shrinks v-fold, (P - 1)/v per
// (tf + tb)), 1F1B holds at most P - s micro-batches in flight on stage s where GPipe holds M,
// and the text form round-trips; bad schedules and text are errors naming what is wrong.
#include <catch2/catch.hpp>

#include "tessel/core/common.hpp"
#include "tessel/pipeline/schedule.hpp"

using namespace tessel;

TEST_CASE("pipeline schedules: GPipe and 1F1B take (M + P - 1)(tf + tb) and 1F1B holds P - s in flight",
          "[pipeline]") {
  for (int64_t P : {1, 2, 4, 8})
    for (int64_t M : {1, 3, 8, 16}) {
      INFO("stages " << P << ", micro-batches " << M);
      const double tf = 1, tb = 2;
      const Schedule g = make_schedule(ScheduleKind::GPipe, P, M);
      const Schedule o = make_schedule(ScheduleKind::OneFOneB, P, M);
      const ScheduleTiming gt = simulate(g, tf, tb), ot = simulate(o, tf, tb);
      CHECK(gt.step_s == Approx(static_cast<double>(M + P - 1) * (tf + tb)));
      CHECK(ot.step_s == Approx(static_cast<double>(M + P - 1) * (tf + tb)));
      CHECK(gt.bubble == Approx(static_cast<double>(P - 1) / static_cast<double>(M + P - 1)).margin(1e-12));
      CHECK(ot.bubble == Approx(gt.bubble).margin(1e-12));
      for (int64_t s = 0; s < P; ++s) {
        CHECK(gt.peak_in_flight[static_cast<std::size_t>(s)] == M);
        CHECK(ot.peak_in_flight[static_cast<std::size_t>(s)] == std::min(M, P - s));
      }
    }
}

TEST_CASE("pipeline schedules: interleaved 1F1B shrinks the bubble by its chunks", "[pipeline]") {
  // Narayanan et al. 2021: with v chunks per stage the bubble is (P - 1)/v of a micro-batch's
  // forward and backward, against 1F1B's P - 1.
  for (int64_t P : {2, 4})
    for (int64_t v : {2, 3})
      for (int64_t M : {P, 2 * P, 4 * P}) {
        INFO("stages " << P << ", chunks " << v << ", micro-batches " << M);
        const Schedule s = make_schedule(ScheduleKind::Interleaved, P, M, v);
        const ScheduleTiming t = simulate(s, 1, 1);
        const double work = static_cast<double>(M) * 2;  // per stage: M forwards and backwards of one unit
        CHECK(t.step_s == Approx(work + static_cast<double>(P - 1) * 2 / static_cast<double>(v)));
        const ScheduleTiming one = simulate(make_schedule(ScheduleKind::OneFOneB, P, M), 1, 1);
        CHECK(t.step_s < one.step_s);
      }
}

TEST_CASE("pipeline schedules print and parse back and bad ones are refused naming the stage and op", "[pipeline]") {
  for (auto [k, P, M, v] : std::vector<std::tuple<ScheduleKind, int64_t, int64_t, int64_t>>{
           {ScheduleKind::GPipe, 3, 4, 1}, {ScheduleKind::OneFOneB, 4, 8, 1}, {ScheduleKind::Interleaved, 2, 4, 2},
           {ScheduleKind::ZeroBubbleH1, 4, 8, 1}}) {
    const Schedule s = make_schedule(k, P, M, v);
    const Schedule back = parse_schedule(s.to_string());
    CHECK(back.to_string() == s.to_string());
    CHECK(back.order == s.order);
  }
  const Schedule o = make_schedule(ScheduleKind::OneFOneB, 2, 3);
  CHECK(o.to_string() == "schedule 1f1b stages=2 micro=3 chunks=1\nstage 0: F0 F1 B0 F2 B1 B2\nstage 1: F0 B0 F1 B1 F2 B2\n");
  CHECK(o.to_timeline() == "stage 0: F0 F1 .  B0 F2 B1 .  B2\nstage 1: .  F0 B0 F1 B1 F2 B2 .\n");
  CHECK_THROWS_WITH(parse_schedule("schedule 1f1b stages=2 micro=1 chunks=1\nstage 0: F0 B0\nstage 1: B0 F0\n"),
                    Catch::Contains("stage 0 cannot run B0") && Catch::Contains("a cycle"));
  CHECK_THROWS_WITH(parse_schedule("schedule gpipe stages=1 micro=2 chunks=1\nstage 0: F0 F1 B1 B1\n"),
                    Catch::Contains("stage 0 runs B1 twice"));
  CHECK_THROWS_WITH(parse_schedule("schedule gpipe stages=1 micro=2 chunks=1\nstage 0: F0 F1 B1\n"),
                    Catch::Contains("stage 0 never runs B0"));
  CHECK_THROWS_WITH(parse_schedule("schedule zb stages=1 micro=1 chunks=1\n"),
                    Catch::Contains("unknown pipeline schedule 'zb' (gpipe, 1f1b, interleaved or zb-h1)"));
  CHECK_THROWS_WITH(parse_schedule("schedule gpipe stages=1 micro=1 chunks=1\nstage 0: F0 X0\n"),
                    Catch::Contains("line 2") && Catch::Contains("'X0' is not F<micro>[.chunk]"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::Interleaved, 4, 6, 2), Catch::Contains("give a multiple of 4"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::OneFOneB, 2, 4, 2), Catch::Contains("only the interleaved schedule"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::GPipe, 0, 4), Catch::Contains("stages 0"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::ZeroBubbleH1, 2, 4, 2), Catch::Contains("only the interleaved schedule"));
  // W ops: only in a split schedule, each after its own B, none missing.
  CHECK_THROWS_WITH(parse_schedule("schedule 1f1b stages=1 micro=1 chunks=1\nstage 0: F0 B0 W0\n"),
                    Catch::Contains("stage 0 runs W0, a weight backward (W), which only a split schedule"));
  CHECK_THROWS_WITH(parse_schedule("schedule zb-h1 stages=1 micro=1 chunks=1\nstage 0: F0 B0\n"),
                    Catch::Contains("stage 0 never runs W0"));
  CHECK_THROWS_WITH(parse_schedule("schedule zb-h1 stages=1 micro=1 chunks=1\nstage 0: F0 W0 B0\n"),
                    Catch::Contains("stage 0 cannot run W0"));
}

TEST_CASE("pipeline schedules: zero bubble (ZB-H1) splits the backward and leaves a third of 1F1B's idle time",
          "[pipeline]") {
  // Qi et al. 2024: with equal F, B and W times ZB-H1's bubble is (P - 1) of them per stage where
  // 1F1B's (whose backward is B and W) is 3 (P - 1); its activations in flight are 1F1B's.
  const Schedule z = make_schedule(ScheduleKind::ZeroBubbleH1, 2, 3);
  CHECK(z.split_backward());
  CHECK(z.to_string() ==
        "schedule zb-h1 stages=2 micro=3 chunks=1\nstage 0: F0 F1 B0 W0 F2 B1 W1 B2 W2\nstage 1: F0 B0 F1 B1 W0 F2 B2 W1 W2\n");
  for (int64_t P : {1, 2, 4, 8})
    for (int64_t M : {1, 3, 8, 16}) {
      INFO("stages " << P << ", micro-batches " << M);
      const Schedule s = make_schedule(ScheduleKind::ZeroBubbleH1, P, M);
      const ScheduleTiming t = simulate(s, 1, 1, 1);
      const ScheduleTiming one = simulate(make_schedule(ScheduleKind::OneFOneB, P, M), 1, 2);
      const double busy = 3.0 * static_cast<double>(M);  // per stage
      if (M >= P) {  // (with fewer micro-batches than stages the warm-up is cut short)
        CHECK(t.step_s == Approx(busy + static_cast<double>(P - 1)));
        CHECK(one.step_s - busy == Approx(3.0 * static_cast<double>(P - 1)));
      }
      CHECK(t.step_s <= one.step_s);
      CHECK(t.bubble == Approx(1 - busy / t.step_s).margin(1e-12));
      for (int64_t st = 0; st < P; ++st)
        CHECK(t.peak_in_flight[static_cast<std::size_t>(st)] == std::min(M, P - st));
      // The two-argument form splits the backward time evenly between B and W.
      CHECK(simulate(s, 1, 2).step_s == Approx(t.step_s));
    }
}
