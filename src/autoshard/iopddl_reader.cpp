// Reader of the IOPDDL contest format (see tessel/autoshard/problem.hpp).
//
// The largest contest instance decompresses to ~250 MB of JSON; a DOM of it would take several
// GB. The file is streamed instead: zlib's gzread (which passes plain files through unchanged)
// feeds a streambuf, and nlohmann::json's SAX interface calls back for every number, which goes
// straight into the problem's arrays. Memory is the problem itself plus a 1 MiB buffer.
#include <zlib.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <istream>
#include <limits>
#include <sstream>
#include <streambuf>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tessel/autoshard/problem.hpp"

namespace tessel::autoshard {

namespace {

// A read-only streambuf over gzread. A read error is recorded (and the stream ends) so that
// the parser stops; the reader then reports zlib's message rather than the parser's.
class GzReadBuf : public std::streambuf {
 public:
  explicit GzReadBuf(const std::string& path) : buf_(1 << 20) {
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) throw ProblemError(fmt::format("{}: cannot open the file", path));
    gzbuffer(file_, 1 << 18);
  }
  ~GzReadBuf() override {
    if (file_ != nullptr) gzclose(file_);
  }
  GzReadBuf(const GzReadBuf&) = delete;
  GzReadBuf& operator=(const GzReadBuf&) = delete;
  const std::string& error() const { return error_; }

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    if (!error_.empty()) return traits_type::eof();
    const int n = gzread(file_, buf_.data(), static_cast<unsigned>(buf_.size()));
    if (n < 0) {
      int code = 0;
      const char* msg = gzerror(file_, &code);
      error_ = msg != nullptr ? msg : "read error";
      return traits_type::eof();
    }
    if (n == 0) return traits_type::eof();
    setg(buf_.data(), buf_.data(), buf_.data() + n);
    return traits_type::to_int_type(*gptr());
  }

 private:
  gzFile file_ = nullptr;
  std::vector<char> buf_;
  std::string error_;
};

// Which array of the "problem" object a number belongs to.
enum class Field { none, intervals, node_costs, node_usages, edge_nodes, edge_costs };

// SAX handler: tracks the path of keys and array indices, and appends every number to the
// list its path names. Unknown keys (anywhere) are skipped with their whole value.
class Handler : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit Handler(std::string where) : where_(std::move(where)) {}

  std::vector<std::array<int64_t, 2>> intervals, edge_nodes;
  std::vector<std::vector<int64_t>> node_costs, node_usages, edge_costs;
  std::optional<int64_t> usage_limit;
  std::string name;
  bool saw_problem = false, saw_nodes = false;
  std::string error;  // set when the handler stops the parse

  bool null() override { return scalar("null"); }
  bool boolean(bool) override { return scalar("a boolean"); }
  bool string(string_t& s) override {
    if (skip_ == 0 && depth_ == 2 && key_ == "name" && in_problem()) {
      name = s;
      return true;
    }
    return scalar("a string");
  }
  bool binary(binary_t&) override { return scalar("binary data"); }
  bool number_float(number_float_t v, const string_t& text) override {
    if (skip_ > 0 || (array_depth_ == 0 && unknown_value())) return true;
    return fail(fmt::format("{} is {}, expected an integer", location(), text.empty() ? std::to_string(v) : text));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (skip_ > 0) return true;
    if (v > static_cast<number_unsigned_t>(std::numeric_limits<int64_t>::max()))
      return fail(fmt::format("{} is {}, more than the int64 the format allows", location(), v));
    return number(static_cast<int64_t>(v));
  }
  bool number_integer(number_integer_t v) override {
    if (skip_ > 0) return true;
    return number(v);
  }

  bool start_object(std::size_t) override {
    if (skip_open()) return true;
    if (array_depth_ > 0) return fail(fmt::format("{} is an object, expected a list of integers", location()));
    if (depth_ == 1 && key_ == "problem") saw_problem = true;
    if (depth_ == 2 && key_ == "nodes") saw_nodes = true;
    object_keys_.push_back(key_);
    key_.clear();
    ++depth_;
    return true;
  }
  bool end_object() override {
    if (skip_close()) return true;
    --depth_;
    key_ = object_keys_.back();
    object_keys_.pop_back();
    return true;
  }
  bool key(string_t& k) override {
    if (skip_ == 0) key_ = k;
    return true;
  }
  bool start_array(std::size_t) override {
    if (skip_open()) return true;
    if (array_depth_ == 0) {
      field_ = field_of_key();
      if (field_ == Field::none) return fail(fmt::format("{} is a list, expected {}", location(), expected()));
    } else if (array_depth_ == 1) {
      index_ = items();
      open_item();
    } else {
      return fail(fmt::format("{} is a nested list, expected integers", location()));
    }
    ++array_depth_;
    return true;
  }
  bool end_array() override {
    if (skip_close()) return true;
    --array_depth_;
    if (array_depth_ == 1 && (field_ == Field::intervals || field_ == Field::edge_nodes)) {
      if (pair_size_ != 2)
        return fail(fmt::format("{} has {} numbers, expected 2", location(), pair_size_));
    }
    if (array_depth_ == 0) field_ = Field::none;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) override {
    return fail(fmt::format("invalid JSON at byte {}: {}", position, ex.what()));
  }

 private:
  // An object or list opening inside a skipped value, or under an unknown key: skipped whole.
  bool skip_open() {
    if (skip_ == 0 && !unknown_value()) return false;
    ++skip_;
    return true;
  }
  bool skip_close() {
    if (skip_ == 0) return false;
    --skip_;
    return true;
  }
  bool in_problem() const { return object_keys_.size() >= 2 && object_keys_[1] == "problem"; }
  // The current value sits under a key this reader does not know: skip it whole.
  bool unknown_value() const {
    if (array_depth_ > 0) return false;
    if (depth_ == 1) return key_ != "problem";
    if (depth_ == 2) return key_ != "nodes" && key_ != "edges" && key_ != "usage_limit" && key_ != "name";
    if (depth_ == 3) {
      if (object_keys_.back() == "nodes") return key_ != "intervals" && key_ != "costs" && key_ != "usages";
      if (object_keys_.back() == "edges") return key_ != "nodes" && key_ != "costs";
    }
    return depth_ > 3;
  }
  Field field_of_key() const {
    if (depth_ != 3 || !in_problem()) return Field::none;
    const std::string& parent = object_keys_.back();
    if (parent == "nodes") {
      if (key_ == "intervals") return Field::intervals;
      if (key_ == "costs") return Field::node_costs;
      if (key_ == "usages") return Field::node_usages;
    } else if (parent == "edges") {
      if (key_ == "nodes") return Field::edge_nodes;
      if (key_ == "costs") return Field::edge_costs;
    }
    return Field::none;
  }
  std::string expected() const {
    if (depth_ == 2 && key_ == "usage_limit") return "an integer";
    if (depth_ == 2 && key_ == "name") return "a string";
    return "an object";
  }
  // Number of items so far in the current field's outer list.
  std::size_t items() const {
    switch (field_) {
      case Field::intervals: return intervals.size();
      case Field::edge_nodes: return edge_nodes.size();
      case Field::node_costs: return node_costs.size();
      case Field::node_usages: return node_usages.size();
      case Field::edge_costs: return edge_costs.size();
      case Field::none: break;
    }
    return 0;
  }
  void open_item() {
    pair_size_ = 0;
    switch (field_) {
      case Field::intervals: intervals.push_back({0, 0}); break;
      case Field::edge_nodes: edge_nodes.push_back({0, 0}); break;
      case Field::node_costs: node_costs.emplace_back(); break;
      case Field::node_usages: node_usages.emplace_back(); break;
      case Field::edge_costs: edge_costs.emplace_back(); break;
      case Field::none: break;
    }
  }
  bool number(int64_t v) {
    if (array_depth_ == 0 && unknown_value()) return true;
    if (array_depth_ == 0) {
      if (depth_ == 2 && key_ == "usage_limit" && in_problem()) {
        usage_limit = v;
        return true;
      }
      return fail(fmt::format("{} is a number, expected {}", location(), expected()));
    }
    if (array_depth_ == 1) return fail(fmt::format("{} is a number, expected a list", location()));
    switch (field_) {
      case Field::intervals:
      case Field::edge_nodes: {
        auto& item = field_ == Field::intervals ? intervals.back() : edge_nodes.back();
        if (pair_size_ >= 2) return fail(fmt::format("{} has more than 2 numbers", location()));
        if (field_ == Field::edge_nodes && (v < 0 || v > std::numeric_limits<int32_t>::max()))
          return fail(fmt::format("{} names node {}, which cannot exist", location(), v));
        item[pair_size_++] = v;
        return true;
      }
      case Field::node_costs: node_costs.back().push_back(v); return true;
      case Field::node_usages: node_usages.back().push_back(v); return true;
      case Field::edge_costs: edge_costs.back().push_back(v); return true;
      case Field::none: break;
    }
    return fail(fmt::format("{}: unexpected number", location()));
  }
  bool scalar(const char* what) {
    if (skip_ > 0 || unknown_value()) return true;
    return fail(fmt::format("{} is {}, expected {}", location(), what,
                            array_depth_ > 0 ? "an integer" : expected()));
  }
  bool fail(std::string msg) {
    error = std::move(msg);
    return false;
  }
  std::string location() const {
    std::string s;
    for (std::size_t i = 1; i < object_keys_.size(); ++i) s += object_keys_[i] + ".";
    s += key_;
    if (array_depth_ >= 2) s += fmt::format("[{}]", index_);
    return s.empty() ? std::string("the top level") : s;
  }

  std::string where_;
  std::vector<std::string> object_keys_;  // the key each open object was opened under
  std::string key_;                       // the last key seen in the innermost object
  int depth_ = 0;                         // open objects
  int array_depth_ = 0;                   // open lists inside the current field
  int skip_ = 0;                          // >0: inside a skipped value
  Field field_ = Field::none;
  std::size_t index_ = 0;                 // index of the current item of the field's list
  int pair_size_ = 0;
};

Problem assemble(Handler& h, const std::string& where) {
  if (!h.saw_problem) throw ProblemError(fmt::format("{}: no \"problem\" object at the top level", where));
  if (!h.saw_nodes) throw ProblemError(fmt::format("{}: problem has no \"nodes\" object", where));
  const std::size_t n = h.intervals.size();
  if (h.node_costs.size() != n || h.node_usages.size() != n)
    throw ProblemError(fmt::format("{}: nodes.intervals has {} entries but nodes.costs has {} and nodes.usages "
                                   "{}; all three need one entry per node",
                                   where, n, h.node_costs.size(), h.node_usages.size()));
  if (h.edge_nodes.size() != h.edge_costs.size())
    throw ProblemError(fmt::format("{}: edges.nodes has {} entries but edges.costs has {}; each edge needs both",
                                   where, h.edge_nodes.size(), h.edge_costs.size()));
  Problem p;
  p.name = h.name;
  p.usage_limit = h.usage_limit;
  p.nodes.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    p.nodes[i].live = {h.intervals[i][0], h.intervals[i][1]};
    p.nodes[i].cost = std::move(h.node_costs[i]);
    p.nodes[i].usage = std::move(h.node_usages[i]);
  }
  p.edges.resize(h.edge_nodes.size());
  for (std::size_t k = 0; k < p.edges.size(); ++k) {
    p.edges[k].a = static_cast<int32_t>(h.edge_nodes[k][0]);
    p.edges[k].b = static_cast<int32_t>(h.edge_nodes[k][1]);
    p.edges[k].cost = std::move(h.edge_costs[k]);
  }
  p.validate(where);
  return p;
}

Problem parse_stream(std::istream& in, const std::string& where, const GzReadBuf* gz) {
  Handler h(where);
  const bool ok = nlohmann::json::sax_parse(in, &h);
  if (gz != nullptr && !gz->error().empty())
    throw ProblemError(fmt::format("{}: cannot decompress: {} (a truncated or corrupt gzip file?)", where,
                                   gz->error()));
  if (!ok) throw ProblemError(fmt::format("{}: {}", where, h.error.empty() ? "invalid JSON" : h.error));
  return assemble(h, where);
}

}  // namespace

Problem read_iopddl(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw ProblemError(fmt::format("{}: no such file (an IOPDDL problem, .json or .json.gz)", path));
  if (std::filesystem::is_directory(path, ec))
    throw ProblemError(fmt::format("{}: is a directory; give an IOPDDL problem file (.json or .json.gz)", path));
  GzReadBuf buf(path);
  std::istream in(&buf);
  return parse_stream(in, path, &buf);
}

Problem parse_iopddl(std::string_view json, const std::string& where) {
  std::istringstream in{std::string(json)};
  return parse_stream(in, where, nullptr);
}

}  // namespace tessel::autoshard
