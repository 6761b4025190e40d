// The documentation links only files inside the repository: every relative Markdown link
// in README.md and docs/*.md names a file that exists in the source tree, and no path
// climbs out of it ("../" from the repository root), which a fresh clone would not have.
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

}  // namespace

TEST_CASE("docs: README and docs link only files inside the repository", "[docs]") {
  const fs::path root = TESSEL_SOURCE_DIR;
  std::vector<fs::path> files = {root / "README.md"};
  for (const auto& e : fs::directory_iterator(root / "docs"))
    if (e.path().extension() == ".md") files.push_back(e.path());
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
