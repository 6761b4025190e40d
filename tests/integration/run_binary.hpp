// tests/integration/run_binary.hpp — runs one of the built binaries (build/bin/) with popen,
// stdout and stderr together, under coreutils `timeout` so a hang fails instead of blocking
// the suite, and reports how it ended (exit status or signal). Used by the reliability tests
// of the example binaries (test_cli_reliability.cpp) and gpt_train's checkpoint tests
// (test_gpt_train_checkpoints.cpp).
#pragma once

#include <catch2/catch.hpp>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace tessel_test {

struct BinaryResult {
  int status = -1;      // exit status when the process exited normally
  int signal = 0;       // the signal that ended it, 0 if none
  bool exited = false;  // exited normally (not by a signal)
  std::string out;      // stdout and stderr
};

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') q += "'\\''";
    else q += c;
  }
  return q + "'";
}

// Runs TESSEL_BINARY_DIR/bin/<name> with the given arguments; in folder `cwd` when it is not
// empty (run_binary_in), so relative paths in the arguments are as a user in that folder types them.
// run_program_in: any program by its path (e.g. mpirun).
inline BinaryResult run_program_in(const std::string& cwd, const std::string& program,
                                   const std::vector<std::string>& args, int timeout_s = 120) {
  std::string cmd = (cwd.empty() ? std::string() : "cd " + shell_quote(cwd) + " && ") + "timeout -s KILL " +
                    std::to_string(timeout_s) + " " + shell_quote(program);
  for (const auto& a : args) cmd += " " + shell_quote(a);
  cmd += " 2>&1";
  BinaryResult r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  REQUIRE(st != -1);
  // The shell reports a child killed by a signal as 128 + signal.
  if (WIFEXITED(st)) {
    r.exited = true;
    r.status = WEXITSTATUS(st);
    if (r.status > 128) {
      r.exited = false;
      r.signal = r.status - 128;
    }
  } else if (WIFSIGNALED(st)) {
    r.signal = WTERMSIG(st);
  }
  return r;
}

inline BinaryResult run_binary_in(const std::string& cwd, const std::string& name,
                                  const std::vector<std::string>& args, int timeout_s = 120) {
  return run_program_in(cwd, std::string(TESSEL_BINARY_DIR) + "/bin/" + name, args, timeout_s);
}

inline BinaryResult run_binary(const std::string& name, const std::vector<std::string>& args,
                               int timeout_s = 120) {
  return run_binary_in("", name, args, timeout_s);
}

// Writes `text` to a file of that name in the system temp directory, unique per test
// process; returns its path.
inline std::string temp_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("tessel_rel_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

}  // namespace tessel_test
