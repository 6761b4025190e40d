// tessel/core/common.hpp — basic value types shared by every concept: shapes, dtypes, errors.
//
// Every user mistake surfaces as a tessel::Error subclass whose message names the op, the
// value, the shape and the sharding involved and what to do about it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tessel {

using Shape = std::vector<int64_t>;

enum class DType { f32, bf16, f16, i32 };

const char* dtype_name(DType t);
// Parses "f32", "bf16", "f16", "i32"; throws ParseError otherwise.
DType parse_dtype(std::string_view s);
std::size_t dtype_size(DType t);

// Element count of a shape; throws ShapeError when it overflows int64 (never wraps).
int64_t num_elements(const Shape& s);
// Row-major strides (in elements) of a dense tensor of shape s.
std::vector<int64_t> contiguous_strides(const Shape& s);
// Bytes of a value of shape `s` and dtype `t`; throws ShapeError when they overflow int64.
int64_t num_bytes(const Shape& s, DType t);
// The most bytes one value may hold (global or per device): 2^50 (1 PiB). Every place a value
// is declared — Graph::add_input and add_op, the Program text — refuses more, so sums of
// value sizes (a memory plan's peak: arena + inputs + outputs) stay far inside int64.
inline constexpr int64_t kMaxValueBytes = int64_t{1} << 50;
// num_bytes(s, t), or a ShapeError naming `what`, the type and the bytes when it is over
// kMaxValueBytes (or overflows).
int64_t checked_value_bytes(const Shape& s, DType t, const std::string& what);
// The middle of `values` (the mean of the two middle ones for an even count): what timings are
// summarised by. Throws Error for no values.
double median(std::vector<double> values);
// "[8,16,32]"
std::string shape_str(const Shape& s);
// "f32[8,16,32]"
std::string type_str(DType t, const Shape& s);

// How a collective combines contributions (all-reduce, reduce-scatter).
enum class ReduceOp { Sum, Max };

// Base of every error the library throws for a user mistake or a backend failure.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class MeshError : public Error { public: using Error::Error; };
class ShapeError : public Error { public: using Error::Error; };
class ShardingError : public Error { public: using Error::Error; };
class ParseError : public Error { public: using Error::Error; };
class PartitionError : public Error { public: using Error::Error; };
class PlanError : public Error { public: using Error::Error; };  // the multi-job planner (planner/)
class RuntimeError : public Error { public: using Error::Error; };

// RunOptions::check_finite found NaN or infinity: `instruction` is the index of the program
// instruction that wrote it (-1: an input held it), so the earliest of several devices' finds
// is the one reported.
class NonFiniteError : public RuntimeError {
 public:
  NonFiniteError(const std::string& what, int64_t instruction) : RuntimeError(what), instruction_(instruction) {}
  int64_t instruction() const { return instruction_; }

 private:
  int64_t instruction_;
};

// Memory could not be had: a backend buffer, or host memory for a HostTensor. The message gives
// the bytes; the callers that know what the memory is for (the arena, an input, an output) rethrow
// it naming the value or arena, the bytes and the device, and what would make it fit.
class OutOfMemoryError : public RuntimeError {
 public:
  OutOfMemoryError(const std::string& what, std::size_t bytes) : RuntimeError(what), bytes_(bytes) {}
  std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_ = 0;
};

// A double-quoted string with \" \\ \n \t \r and \xNN escapes (the text forms' string syntax).
std::string quote_text(std::string_view s);

// For every reader of a path the user gave (a graph or program file, a link figures file, a
// corpus): an Error naming `what` and the path when it is a directory, where a file is
// expected. (A stream opened on a directory reads nothing, or throws
// "basic_filebuf::underflow", which names neither.)
void check_not_directory(const std::string& path, const std::string& what);

// Joins items with a separator using operator<< style to_string conversions.
std::string join(const std::vector<std::string>& items, std::string_view sep);
// FNV-1a, 64 bits: a checksum or a cache key of a text (not a defence against an adversary).
uint64_t fnv1a_64(std::string_view text);

}  // namespace tessel
