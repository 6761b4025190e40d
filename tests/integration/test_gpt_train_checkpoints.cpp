// tests/integration/test_gpt_train_checkpoints.cpp — gpt_train's checkpoints (--save-dir,
// --save-every, --keep, --resume) driven as a user types the commands, each in a fresh folder:
// docs/training.md's commands exactly as written there, a resumed run's losses against the
// uninterrupted run's (within gpt_train's step tolerance, 1e-4 relative) on other meshes and
// ZeRO stages, the lines a resume prints, the errors, and what --keep leaves.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "run_binary.hpp"
#include "tessel/checkpoint/checkpoint.hpp"

using tessel_test::BinaryResult;
using tessel_test::run_binary_in;
namespace fs = std::filesystem;

namespace {

constexpr double kTolerance = 1e-4;  // gpt_train's --tolerance: a step against one device
constexpr int kTimeout = 280;

// A fresh empty folder under the temp directory, removed with its contents at the end.
struct Folder {
  std::string path;
  explicit Folder(const std::string& what) {
    path = (fs::temp_directory_path() / ("tessel-gpt-train-ckpt-" + what + "-" + std::to_string(::getpid()))).string();
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Folder() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// A run of gpt_train in the folder, and the loss and learning rate of each step it ran, from
// the loss curve it wrote there (gpt_train.csv: 9 significant digits; the progress lines print 6
// decimals), checked against the progress lines' step numbers.
struct Run {
  BinaryResult r;
  std::map<int, double> loss, lr;
};

Run gpt_train(const Folder& in, const std::vector<std::string>& args) {
  const std::string csv = in.path + "/gpt_train.csv";
  fs::remove(csv);
  Run run{run_binary_in(in.path, "gpt_train", args, kTimeout), {}, {}};
  std::ifstream f(csv);
  std::string line;
  while (std::getline(f, line)) {
    int t = 0;
    double loss = 0, norm = 0, lr = 0;
    if (std::sscanf(line.c_str(), "%d,%lf,%lf,%lf", &t, &loss, &norm, &lr) == 4) {
      run.loss[t] = loss;
      run.lr[t] = lr;
    }
  }
  std::istringstream out(run.r.out);
  std::size_t printed = 0;
  while (std::getline(out, line)) {
    int t = 0, n = 0;
    double loss = 0;
    if (std::sscanf(line.c_str(), "step %d/%d loss %lf", &t, &n, &loss) == 3) {
      ++printed;
      INFO(line);
      CHECK(run.loss.count(t));
    }
  }
  CHECK(printed == run.loss.size());
  return run;
}

// The seed the run printed on its mesh line ("..., seed 1234").
std::string seed_of(const std::string& out) {
  const std::size_t at = out.find(", seed ");
  REQUIRE(at != std::string::npos);
  std::size_t end = at + 7;
  while (end < out.size() && std::isdigit(static_cast<unsigned char>(out[end]))) ++end;
  return out.substr(at + 7, end - at - 7);
}

// Steps first..last of `resumed` against `uninterrupted`, each within kTolerance relative;
// returns the largest relative difference.
double check_losses(const std::map<int, double>& resumed, const std::map<int, double>& uninterrupted, int first,
                    int last) {
  double worst = 0;
  for (int t = first; t <= last; ++t) {
    INFO("step " << t);
    REQUIRE(resumed.count(t));
    REQUIRE(uninterrupted.count(t));
    const double rel = std::fabs(resumed.at(t) - uninterrupted.at(t)) / std::fabs(uninterrupted.at(t));
    INFO("resumed " << resumed.at(t) << ", uninterrupted " << uninterrupted.at(t) << ", relative difference " << rel);
    CHECK(rel <= kTolerance);
    worst = std::max(worst, rel);
  }
  CHECK(resumed.size() == static_cast<std::size_t>(last - first + 1));  // only the steps after the saved one
  return worst;
}

std::vector<int64_t> committed(const Folder& in, const std::string& dir) {
  return tessel::CheckpointDir(in.path + "/" + dir).steps();
}

}  // namespace

TEST_CASE("gpt_train: the documented save and resume on data=4 model=1 continue the uninterrupted run",
          "[integration][gpt_train][checkpoint]") {
  Folder f("doc");
  // docs/training.md, "Checkpoints and resuming", as written there.
  const Run a = gpt_train(f, {"--save-dir", "d", "--save-every", "5", "--steps", "10"});
  INFO("--- first run ---\n" << a.r.out);
  REQUIRE(a.r.status == 0);
  CHECK_THAT(a.r.out, Catch::Contains("saved step 5 to d/step_5"));
  CHECK_THAT(a.r.out, Catch::Contains("saved step 10 to d/step_10"));
  CHECK(committed(f, "d") == std::vector<int64_t>{5, 10});
  const Run b = gpt_train(f, {"--save-dir", "d", "--resume", "--mesh", "data=4,model=1", "--zero", "0", "--steps", "20"});
  INFO("--- resumed run ---\n" << b.r.out);
  REQUIRE(b.r.status == 0);
  CHECK_THAT(b.r.out, Catch::Contains("\nresumed from step 10 (saved on data=2,model=2, zero 0)\n"));
  CHECK_THAT(b.r.out, Catch::Contains(", seed " + seed_of(a.r.out) + "\n"));  // the saved run's seed
  CHECK(committed(f, "d") == std::vector<int64_t>{5, 10, 20});
  // The uninterrupted run, with the seed the first one printed.
  const Run u = gpt_train(f, {"--seed", seed_of(a.r.out), "--steps", "20"});
  INFO("--- uninterrupted run ---\n" << u.r.out);
  REQUIRE(u.r.status == 0);
  const double before = check_losses(a.loss, u.loss, 1, 10);
  const double after = check_losses(b.loss, u.loss, 11, 20);
  WARN("largest relative difference from the uninterrupted run: steps 1-10 " << before << "; resumed steps 11-20 on "
       "data=4,model=1 zero 0: " << after);
}

TEST_CASE("gpt_train: a ZeRO 0 checkpoint resumes at ZeRO 3 and on one device and on model=4",
          "[integration][gpt_train][checkpoint]") {
  Folder f("meshes");
  const Run a = gpt_train(f, {"--seed", "11", "--save-dir", "d", "--save-every", "5", "--steps", "10"});
  INFO("--- first run ---\n" << a.r.out);
  REQUIRE(a.r.status == 0);
  const Run u = gpt_train(f, {"--seed", "11", "--steps", "14"});
  INFO("--- uninterrupted run ---\n" << u.r.out);
  REQUIRE(u.r.status == 0);
  // Each resume saves step 14 into its folder: a copy of d each (cp -r).
  for (const char* copy : {"d1", "d2", "d3"}) fs::copy(f.path + "/d", f.path + "/" + copy, fs::copy_options::recursive);
  struct Resume {
    std::vector<std::string> args;
    const char* layout;
  };
  const std::vector<Resume> resumes = {
      {{"--save-dir", "d", "--resume", "--zero", "3", "--steps", "14"}, "data=2,model=2 zero 3"},
      {{"--save-dir", "d1", "--resume", "--mesh", "data=1,model=1", "--steps", "14"}, "data=1,model=1 zero 0"},
      {{"--save-dir", "d2", "--resume", "--mesh", "data=1,model=4", "--zero", "2", "--steps", "14"},
       "data=1,model=4 zero 2"},
      {{"--save-dir", "d3", "--resume", "--zero", "1", "--accumulate", "2", "--steps", "14"},
       "data=2,model=2 zero 1 accumulate 2"},
  };
  for (const Resume& r : resumes) {
    const Run b = gpt_train(f, r.args);
    INFO("--- resumed on " << r.layout << " ---\n" << b.r.out);
    REQUIRE(b.r.status == 0);
    CHECK_THAT(b.r.out, Catch::Contains("\nresumed from step 10 (saved on data=2,model=2, zero 0)\n"));
    const double worst = check_losses(b.loss, u.loss, 11, 14);
    WARN("resumed on " << r.layout << ": largest relative difference from the uninterrupted run " << worst);
  }
}

TEST_CASE("gpt_train: a ZeRO 3 checkpoint keeps its layouts and resumes on one device",
          "[integration][gpt_train][checkpoint]") {
  Folder f("zero3");
  const Run a = gpt_train(f, {"--seed", "12", "--mesh", "data=4,model=1", "--zero", "3", "--save-dir", "d",
                              "--save-every", "3", "--steps", "6"});
  INFO("--- first run ---\n" << a.r.out);
  REQUIRE(a.r.status == 0);
  // The saving layouts are the ZeRO-3 step's: every parameter and moment split over data.
  const tessel::CheckpointDir ck(f.path + "/d");
  const tessel::Manifest m = ck.manifest(6);
  CHECK(m.mesh == "{data=4, model=1}");
  CHECK(m.arrays.size() > 3);
  for (const tessel::CheckpointArray& arr : m.arrays) {
    INFO(arr.name << " " << arr.sharding.to_string());
    if (arr.shape.size() >= 1 && arr.shape[0] % 4 == 0) CHECK_THAT(arr.sharding.to_string(), Catch::Contains("data"));
  }
  CHECK_THAT(m.metadata_json, Catch::Contains("\"data_position\":6"));
  CHECK_THAT(m.metadata_json, Catch::Contains("\"seed\":12"));
  CHECK_THAT(m.metadata_json, Catch::Contains("\"zero\":3"));
  const Run b = gpt_train(f, {"--save-dir", "d", "--resume", "--mesh", "data=1,model=1", "--steps", "9"});
  INFO("--- resumed run ---\n" << b.r.out);
  REQUIRE(b.r.status == 0);
  CHECK_THAT(b.r.out, Catch::Contains("\nresumed from step 6 (saved on data=4,model=1, zero 3)\n"));
  const Run u = gpt_train(f, {"--seed", "12", "--mesh", "data=4,model=1", "--zero", "3", "--steps", "9"});
  INFO("--- uninterrupted run ---\n" << u.r.out);
  REQUIRE(u.r.status == 0);
  const double worst = check_losses(b.loss, u.loss, 7, 9);
  WARN("saved on data=4,model=1 zero 3, resumed on data=1,model=1: largest relative difference " << worst);
}

TEST_CASE("gpt_train: a resumed warmup and cosine schedule continues at the saved step",
          "[integration][gpt_train][checkpoint]") {
  Folder f("schedule");
  const Run a = gpt_train(f, {"--seed", "4", "--layers", "1", "--warmup", "4", "--save-dir", "w", "--save-every", "3",
                              "--steps", "8"});
  INFO("--- first run ---\n" << a.r.out);
  REQUIRE(a.r.status == 0);
  // Interrupted after step 3: only that step in the folder.
  fs::create_directories(f.path + "/w3");
  fs::copy(f.path + "/w/step_3", f.path + "/w3/step_3", fs::copy_options::recursive);
  const Run b = gpt_train(f, {"--layers", "1", "--warmup", "4", "--save-dir", "w3", "--resume", "--steps", "8"});
  INFO("--- resumed run ---\n" << b.r.out);
  REQUIRE(b.r.status == 0);
  CHECK_THAT(b.r.out, Catch::Contains("\nresumed from step 3 (saved on data=2,model=2, zero 0)\n"));
  for (int t = 4; t <= 8; ++t) {
    INFO("step " << t);
    REQUIRE(b.lr.count(t));
    CHECK(b.lr.at(t) == a.lr.at(t));  // the schedule at the Trainer's t
  }
  check_losses(b.loss, a.loss, 4, 8);
  // Another --warmup is another schedule: an error naming it.
  const Run c = gpt_train(f, {"--layers", "1", "--warmup", "2", "--save-dir", "w3", "--resume", "3", "--steps", "8"});
  CHECK(c.r.status == 1);
  CHECK_THAT(c.r.out, Catch::Contains("was saved with other settings than this run's flags: warmup = 4 (--warmup gives 2)"));
}

TEST_CASE("gpt_train: --keep keeps the last saved steps and --resume STEP resumes from one of them",
          "[integration][gpt_train][checkpoint]") {
  Folder f("keep");
  const Run a =
      gpt_train(f, {"--seed", "3", "--layers", "1", "--save-dir", "k", "--save-every", "2", "--keep", "2", "--steps", "7"});
  INFO("--- first run ---\n" << a.r.out);
  REQUIRE(a.r.status == 0);
  CHECK_THAT(a.r.out, Catch::Contains("saved step 2 to k/step_2"));
  CHECK_THAT(a.r.out, Catch::Contains("saved step 6 to k/step_6"));
  CHECK_THAT(a.r.out, Catch::Contains("saved step 7 to k/step_7"));  // the last step too
  CHECK_THAT(a.r.out, Catch::Contains("kept 6, 7"));
  CHECK(committed(f, "k") == std::vector<int64_t>{6, 7});
  CHECK_FALSE(fs::exists(f.path + "/k/step_2"));
  CHECK_FALSE(fs::exists(f.path + "/k/step_4"));
  // --resume STEP below the latest: an error while this run would write a step the folder holds.
  Run b = gpt_train(f, {"--layers", "1", "--save-dir", "k", "--resume", "6", "--steps", "7"});
  INFO("--- resume 6 with step 7 there ---\n" << b.r.out);
  CHECK(b.r.status == 1);
  CHECK_THAT(b.r.out, Catch::Contains("--resume 6: this run would save step 7, which k already holds"));
  fs::remove_all(f.path + "/k/step_7");
  b = gpt_train(f, {"--layers", "1", "--save-dir", "k", "--resume", "6", "--steps", "7"});
  INFO("--- resumed run ---\n" << b.r.out);
  REQUIRE(b.r.status == 0);
  CHECK_THAT(b.r.out, Catch::Contains("\nresumed from step 6 (saved on data=2,model=2, zero 0)\n"));
  CHECK(b.loss.size() == 1);
  check_losses(b.loss, a.loss, 7, 7);
  // At --steps already: nothing to do.
  const Run c = gpt_train(f, {"--layers", "1", "--save-dir", "k", "--resume", "--steps", "7"});
  INFO("--- at --steps ---\n" << c.r.out);
  CHECK(c.r.status == 0);
  CHECK_THAT(c.r.out, Catch::Contains("step 7 in k is already at --steps 7: nothing to train"));
}

TEST_CASE("gpt_train: checkpoint flags that cannot work are errors naming what is wrong",
          "[integration][gpt_train][checkpoint]") {
  Folder f("errors");
  // A folder that does not exist, or holds no step: --resume is an error (a mistyped folder
  // must not silently start a new run), and creates nothing.
  const Run missing = gpt_train(f, {"--seed", "5", "--layers", "1", "--save-dir", "e", "--resume", "--steps", "2"});
  INFO(missing.r.out);
  CHECK(missing.r.status == 1);
  CHECK_THAT(missing.r.out, Catch::Contains("--resume: the folder e does not exist, so there is no step to resume from"));
  CHECK_FALSE(fs::exists(f.path + "/e"));
  fs::create_directories(f.path + "/e");
  const Run empty = gpt_train(f, {"--seed", "5", "--layers", "1", "--save-dir", "e", "--resume", "--steps", "2"});
  INFO(empty.r.out);
  CHECK(empty.r.status == 1);
  CHECK_THAT(empty.r.out, Catch::Contains("--resume: e holds no committed step to resume from"));
  fs::remove_all(f.path + "/e");
  // --resume-or-start on a new folder starts from scratch and says so.
  const Run r = gpt_train(f, {"--seed", "5", "--layers", "1", "--save-dir", "e", "--resume-or-start", "--steps", "2"});
  INFO(r.r.out);
  REQUIRE(r.r.status == 0);
  CHECK_THAT(r.r.out, Catch::Contains("\nno committed step in e: starting from scratch\n"));
  CHECK_THAT(r.r.out, Catch::Contains("saved step 2 to e/step_2"));
  CHECK(committed(f, "e") == std::vector<int64_t>{2});
  struct Case {
    std::vector<std::string> args;
    int status;  // 2: a usage error, 1: an error
    const char* says;
  };
  const std::vector<Case> cases = {
      // Nothing to resume from or save to.
      {{"--resume", "--steps", "2"}, 2, "--resume needs --save-dir DIR"},
      {{"--save-every", "5", "--steps", "2"}, 2, "--save-every needs --save-dir DIR"},
      // A step that is not committed: the committed ones are listed.
      {{"--layers", "1", "--save-dir", "e", "--resume", "7", "--steps", "9"}, 1,
       "--resume 7: step 7 is not committed in e (committed steps: 2)"},
      // A fresh run into a folder that holds steps.
      {{"--layers", "1", "--save-dir", "e", "--steps", "3"}, 1,
       "--save-dir e already holds committed steps (2): add --resume"},
      // Another model, batch, seed or precision given: the differing field and its flag are named.
      {{"--layers", "2", "--save-dir", "e", "--resume", "--steps", "3"}, 1,
       "--resume: step 2 in e was saved with other settings than this run's flags: layers = 1 (--layers gives 2)"},
      {{"--layers", "1", "--batch", "4", "--save-dir", "e", "--resume", "--steps", "3"}, 1,
       "flags: batch = 8 (--batch gives 4)"},
      {{"--layers", "1", "--seed", "6", "--save-dir", "e", "--resume", "--steps", "3"}, 1,
       "flags: seed = 5 (--seed gives 6)"},
      {{"--mixed", "--save-dir", "e", "--resume", "--steps", "3"}, 1, "flags: mixed = false (--mixed gives true)"},
      // Every difference in one error.
      {{"--layers", "3", "--heads", "2", "--lr", "0.01", "--save-dir", "e", "--resume-or-start", "--steps", "3"}, 1,
       "--resume-or-start: step 2 in e was saved with other settings than this run's flags: layers = 1 (--layers gives "
       "3); heads = 4 (--heads gives 2); lr = 0.0015 (--lr gives 0.01)."},
  };
  for (const Case& c : cases) {
    const Run e = gpt_train(f, c.args);
    INFO(e.r.out);
    CHECK(e.r.status == c.status);
    CHECK_THAT(e.r.out, Catch::Contains(c.says));
  }
  CHECK(committed(f, "e") == std::vector<int64_t>{2});  // the failed runs wrote nothing
  // Issue 36 item 6: without the model flags, --resume takes them from the checkpoint (the
  // folder was saved with --layers 1 and seed 5; the defaults are 2 layers and a random seed).
  const Run taken = gpt_train(f, {"--save-dir", "e", "--resume", "--steps", "3"});
  INFO(taken.r.out);
  CHECK(taken.r.status == 0);
  CHECK_THAT(taken.r.out, Catch::Contains("\nresumed from step 2 (saved on data=2,model=2, zero 0)\n"));
  CHECK_THAT(taken.r.out, Catch::Contains(" layers=1 "));
  CHECK(committed(f, "e") == std::vector<int64_t>{2, 3});
  // --help lists the flags.
  const Run h = gpt_train(f, {"--help"});
  CHECK(h.r.status == 0);
  for (const char* flag : {"--save-dir DIR", "--save-every N", "--keep N", "--resume [STEP]"}) {
    INFO(flag << "\n" << h.r.out);
    CHECK_THAT(h.r.out, Catch::Contains(flag));
  }
}

#ifdef TESSEL_TEST_MPIRUN
// docs/checkpoints.md, "Many processes", as written there (the mpirun flags of
// docs/runtime-mpi.md for root on a machine with fewer cores than processes): saved by 2
// processes on data=2,model=2 at ZeRO-2, each writing its share of the blocks, resumed by 4
// processes on data=4 at ZeRO-0, each reading the blocks of its devices.
TEST_CASE("gpt_train: the documented mpirun save on 2 processes resumes on 4 processes with the same losses",
          "[integration][gpt_train][checkpoint][mpi]") {
  Folder f("mpi");
  const std::string bin = std::string(TESSEL_BINARY_DIR) + "/bin/gpt_train";
  const std::vector<std::string> mpirun = {"--allow-run-as-root", "--oversubscribe"};
  auto launch = [&](int np, std::vector<std::string> args) {
    std::vector<std::string> all = mpirun;
    all.push_back("-np");
    all.push_back(std::to_string(np));
    all.push_back(bin);
    all.insert(all.end(), args.begin(), args.end());
    const std::string csv = f.path + "/gpt_train.csv";
    fs::remove(csv);
    Run run{tessel_test::run_program_in(f.path, TESSEL_TEST_MPIRUN, all, kTimeout), {}, {}};
    std::ifstream in(csv);
    std::string line;
    while (std::getline(in, line)) {
      int t = 0;
      double loss = 0, norm = 0, lr = 0;
      if (std::sscanf(line.c_str(), "%d,%lf,%lf,%lf", &t, &loss, &norm, &lr) == 4) run.loss[t] = loss;
    }
    return run;
  };
  const Run a = launch(2, {"--mesh", "data=2,model=2", "--zero", "2", "--save-dir", "d", "--save-every", "5", "--steps", "10"});
  INFO("--- saved by 2 processes ---\n" << a.r.out);
  REQUIRE(a.r.status == 0);
  CHECK_THAT(a.r.out, Catch::Contains("saved step 5 to d/step_5") && Catch::Contains("2 processes, bytes per process max/mean"));
  CHECK(committed(f, "d") == std::vector<int64_t>{5, 10});
  const Run b = launch(4, {"--save-dir", "d", "--resume", "--mesh", "data=4,model=1", "--zero", "0", "--steps", "20"});
  INFO("--- resumed by 4 processes ---\n" << b.r.out);
  REQUIRE(b.r.status == 0);
  CHECK_THAT(b.r.out, Catch::Contains("\nresumed from step 10 (saved on data=2,model=2, zero 2)\n"));
  const Run u = gpt_train(f, {"--seed", seed_of(a.r.out), "--steps", "20", "--mesh", "data=2,model=2", "--zero", "2"});
  INFO("--- uninterrupted, one process ---\n" << u.r.out);
  REQUIRE(u.r.status == 0);
  const double before = check_losses(a.loss, u.loss, 1, 10);
  const double after = check_losses(b.loss, u.loss, 11, 20);
  WARN("mpirun: largest relative difference from the uninterrupted run: saved by 2 processes " << before
       << "; resumed by 4 processes on data=4,model=1 zero 0: " << after);
}
#endif
