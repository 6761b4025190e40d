// The documentation links only files inside the repository: every relative Markdown link
// in README.md and docs/*.md names a file that exists in the source tree, and no path
// climbs out of it ("../" from the repository root), which a fresh clone would not have.
// Every repository path the docs quote in backquotes (`src/ir/graph.cpp`, `tests/unit/`)
// exists too, so a file that moves or splits takes its docs along.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// README.md and every docs/*.md.
std::vector<fs::path> doc_files(const fs::path& root) {
  std::vector<fs::path> files = {root / "README.md"};
  for (const auto& e : fs::directory_iterator(root / "docs"))
    if (e.path().extension() == ".md") files.push_back(e.path());
  return files;
}

}  // namespace

TEST_CASE("docs: README and docs link only files inside the repository", "[docs]") {
  const fs::path root = TESSEL_SOURCE_DIR;
  const std::vector<fs::path> files = doc_files(root);
  const std::regex link(R"(\]\(([^)#\s]+)(#[^)]*)?\))");
  for (const fs::path& f : files) {
    const std::string text = read_text(f);
    INFO(f.string());
    // A path that leaves the repository, in a link or in backquotes.
    CHECK(text.find("(../") == std::string::npos);
    if (f.filename() == "README.md") CHECK(text.find("`../") == std::string::npos);
    for (std::sregex_iterator it(text.begin(), text.end(), link), end; it != end; ++it) {
      const std::string target = (*it)[1].str();
      if (target.rfind("http://", 0) == 0 || target.rfind("https://", 0) == 0 ||
          target.rfind("mailto:", 0) == 0)
        continue;
      INFO("link " << target);
      const fs::path resolved = fs::weakly_canonical(f.parent_path() / target);
      const std::string rel = fs::relative(resolved, fs::weakly_canonical(root)).string();
      CHECK(rel.rfind("..", 0) != 0);
      CHECK(fs::exists(resolved));
    }
  }
}

TEST_CASE("docs: every repository path quoted in README and docs exists", "[docs]") {
  const fs::path root = TESSEL_SOURCE_DIR;
  const std::vector<fs::path> files = doc_files(root);
  const std::regex quoted(R"(`((?:src|include|tests|bench|scripts|kernels|examples|cmake|fuzz|docs)/[^`\s]*)`)");
  // Patterns and placeholders are not paths: globs, <...>, {...}, $VARS, an ALLCAPS segment
  // such as NAME or X.
  const std::regex pattern(R"([*<>{}$|]|\.\.\.|(^|/)[A-Z]+(/|\.|$))");
  const std::regex line_suffix(R"(:\d+(-\d+)?$)");
  int checked = 0;
  for (const fs::path& f : files) {
    const std::string text = read_text(f);
    for (std::sregex_iterator it(text.begin(), text.end(), quoted), end; it != end; ++it) {
      std::string p = (*it)[1].str();
      if (std::regex_search(p, pattern)) continue;
      p = std::regex_replace(p, line_suffix, "");
      while (!p.empty() && (p.back() == '/' || p.back() == ':' || p.back() == ',' || p.back() == '.'))
        p.pop_back();
      INFO(f.filename().string() << " quotes `" << (*it)[1].str() << "`");
      CHECK(fs::exists(root / p));
      ++checked;
    }
  }
  CHECK(checked > 50);  // the docs quote many paths: zero would mean the pattern broke
}

// A code block marked `<!-- examples/FILE -->` in the docs is that file, verbatim: the example
// is built and run by CTest, so the docs show code that compiles and passes.
TEST_CASE("docs: every code block marked with an example file is that file", "[docs]") {
  const fs::path root = TESSEL_SOURCE_DIR;
  const std::regex marker("<!-- (examples/[A-Za-z0-9_./-]+) -->\n```[a-z]*\n");
  int blocks = 0;
  for (const fs::path& doc : doc_files(root)) {
    const std::string text = read_text(doc);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), marker); it != std::sregex_iterator(); ++it) {
      const std::size_t begin = static_cast<std::size_t>(it->position(0) + it->length(0));
      const std::size_t end = text.find("```\n", begin);
      INFO(doc.filename().string() << ": the block of " << (*it)[1]);
      REQUIRE(end != std::string::npos);
      CHECK(text.substr(begin, end - begin) == read_text(root / (*it)[1].str()));
      ++blocks;
    }
  }
  CHECK(blocks >= 1);  // docs/training.md's custom loop
}
