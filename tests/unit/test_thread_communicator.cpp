// Tests of the in-process thread communicator: every collective, on every axis group (every
// non-empty ordered subset of the axes) of 2-D and 3-D meshes, one std::thread per device,
// against a direct computation from the same seeded data; abort, mismatch and timeout
// behaviour; a 64-device smoke test. The same suite checks the virtual-device protocol of the
// CUDA backend's one-process world on CPU streams (make_cpu_virtual_world, the last tests).
//
// Catch2 assertions are not thread-safe, so device threads only record failures as strings
// and the test thread asserts on them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tessel/core/mesh.hpp"
#include "tessel/runtime/backend.hpp"
#include "tessel/runtime/tensor.hpp"
#include "tessel/runtime/cpu/thread_communicator.hpp"

using namespace tessel;

namespace {

// The calling thread's eager CPU stream: collectives enqueued on it run at once on this
// thread, so these tests drive the blocking protocol directly (the async streams are tested
// below and by the executor suites).
Stream& eager() {
  thread_local std::unique_ptr<Stream> s =
      make_cpu_backend({StreamMode::Eager, 1})->create_stream("test thread");
  return *s;
}

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// TESSEL_SEED, else Catch's --rng-seed, else a fixed seed (these tests check exact bits
// of fixed-size collectives; they are not in the soak).
uint64_t test_seed() {
  if (const char* e = std::getenv("TESSEL_SEED")) return std::strtoull(e, nullptr, 10);
  const unsigned s = Catch::rngSeed();
  return s != 0 ? s : 20240611u;
}

// Element k of the tensor that device `dev` contributes to call `tag`.
uint64_t key(uint64_t seed, int64_t dev, int tag, std::size_t k) {
  return splitmix(seed ^ splitmix(static_cast<uint64_t>(dev) * 1000003u +
                                  static_cast<uint64_t>(tag) * 7919u) ^
                  splitmix(static_cast<uint64_t>(k) + 0x1234567u));
}
float gen_f32(uint64_t seed, int64_t dev, int tag, std::size_t k) {
  return static_cast<float>(key(seed, dev, tag, k) >> 40) / 8388608.0f - 1.0f;  // [-1, 1)
}
int32_t gen_i32(uint64_t seed, int64_t dev, int tag, std::size_t k) {
  return static_cast<int32_t>(key(seed, dev, tag, k) % 2001u) - 1000;
}
uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// The bits of the element (f32, i32: 32 bits; bf16: 16 bits).
uint32_t gen_bits(DType dt, uint64_t seed, int64_t dev, int tag, std::size_t k) {
  switch (dt) {
    case DType::f32: return f32_bits(gen_f32(seed, dev, tag, k));
    case DType::i32: return static_cast<uint32_t>(gen_i32(seed, dev, tag, k));
    case DType::bf16: return f32_to_bf16(gen_f32(seed, dev, tag, k));
    case DType::f16: return f32_to_f16(gen_f32(seed, dev, tag, k));
  }
  return 0;
}
std::size_t esize(DType dt) { return dt == DType::f32 || dt == DType::i32 ? 4 : 2; }
void put_bits(DType dt, void* p, std::size_t i, uint32_t bits) {
  if (esize(dt) == 4) {
    std::memcpy(static_cast<char*>(p) + 4 * i, &bits, 4);
  } else {
    const uint16_t h = static_cast<uint16_t>(bits);
    std::memcpy(static_cast<char*>(p) + 2 * i, &h, 2);
  }
}
uint32_t get_bits(DType dt, const void* p, std::size_t i) {
  if (esize(dt) == 4) {
    uint32_t u;
    std::memcpy(&u, static_cast<const char*>(p) + 4 * i, 4);
    return u;
  }
  uint16_t h;
  std::memcpy(&h, static_cast<const char*>(p) + 2 * i, 2);
  return h;
}
void fill(DType dt, void* p, std::size_t count, uint64_t seed, int64_t dev, int tag,
          std::size_t k0 = 0) {
  for (std::size_t k = 0; k < count; ++k) put_bits(dt, p, k, gen_bits(dt, seed, dev, tag, k0 + k));
}

// The reduction the communicator must compute: member order, f32 accumulation for bf16/f16.
uint32_t expected_reduce(DType dt, ReduceOp op, uint64_t seed, const std::vector<int64_t>& devs,
                         int tag, std::size_t k) {
  if (dt == DType::i32) {
    int32_t acc = gen_i32(seed, devs[0], tag, k);
    for (std::size_t i = 1; i < devs.size(); ++i) {
      const int32_t v = gen_i32(seed, devs[i], tag, k);
      acc = op == ReduceOp::Sum ? acc + v : std::max(acc, v);
    }
    return static_cast<uint32_t>(acc);
  }
  auto load = [&](int64_t dev) {
    const float f = gen_f32(seed, dev, tag, k);
    if (dt == DType::bf16) return bf16_to_f32(f32_to_bf16(f));
    if (dt == DType::f16) return f16_to_f32(f32_to_f16(f));
    return f;
  };
  float acc = load(devs[0]);
  for (std::size_t i = 1; i < devs.size(); ++i) {
    const float v = load(devs[i]);
    acc = op == ReduceOp::Sum ? acc + v : (v > acc ? v : acc);
  }
  if (dt == DType::bf16) return f32_to_bf16(acc);
  if (dt == DType::f16) return f32_to_f16(acc);
  return f32_bits(acc);
}

constexpr unsigned char kPoison = 0xA5;

// memset(nullptr, c, 0) is undefined behaviour (UBSan: nonnull argument), and an empty
// vector's data() may be null: count-0 collectives are part of the test.
template <class T>
void poison_fill(std::vector<T>& v) {
  if (!v.empty()) std::memset(v.data(), kPoison, v.size() * sizeof(T));
}
uint32_t poison_bits(DType dt) { return esize(dt) == 4 ? 0xA5A5A5A5u : 0xA5A5u; }

std::string axes_str(const std::vector<std::string>& axes) {
  std::string s = "{";
  for (std::size_t i = 0; i < axes.size(); ++i) s += (i ? "," : "") + axes[i];
  return s + "}";
}

// Every non-empty subset of `names`, in every order.
std::vector<std::vector<std::string>> ordered_subsets(const std::vector<std::string>& names) {
  std::vector<std::vector<std::string>> out;
  const std::size_t n = names.size();
  for (unsigned mask = 1; mask < (1u << n); ++mask) {
    std::vector<std::string> sub;
    for (std::size_t i = 0; i < n; ++i)
      if (mask & (1u << i)) sub.push_back(names[i]);
    std::sort(sub.begin(), sub.end());
    do out.push_back(sub);
    while (std::next_permutation(sub.begin(), sub.end()));
  }
  return out;
}

// Runs body(position, errors) on one thread per device. A device that throws aborts the
// world (so the others do not hang) and its exception is recorded.
std::vector<std::string> run_devices(
    CollectiveWorld& world, int64_t n,
    const std::function<void(int64_t, std::vector<std::string>&)>& body) {
  std::vector<std::vector<std::string>> errs(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int64_t p = 0; p < n; ++p) {
    threads.emplace_back([&, p] {
      try {
        body(p, errs[p]);
      } catch (const std::exception& e) {
        errs[p].push_back("device " + std::to_string(p) + " threw: " + e.what());
        world.abort(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::string> all;
  for (auto& e : errs) all.insert(all.end(), e.begin(), e.end());
  return all;
}

std::vector<std::string> run_devices(
    ThreadWorld& world,
    const std::function<void(int64_t, std::vector<std::string>&)>& body) {
  return run_devices(world, world.mesh().num_devices(), body);
}

std::string first_errors(const std::vector<std::string>& errs) {
  std::string s;
  for (std::size_t i = 0; i < errs.size() && i < 10; ++i) s += errs[i] + "\n";
  if (errs.size() > 10) s += "... and " + std::to_string(errs.size() - 10) + " more\n";
  return s;
}

// Runs fn on a detached thread; false when it has not finished within `seconds` (a hang).
// The state is shared so that a hung thread never touches a dead stack frame.
bool finishes_within(std::function<void()> fn, double seconds) {
  auto done = std::make_shared<std::promise<void>>();
  auto fut = done->get_future();
  std::thread([fn = std::move(fn), done] {
    fn();
    done->set_value();
  }).detach();
  return fut.wait_for(std::chrono::duration<double>(seconds)) == std::future_status::ready;
}

// All collectives of one communicator, each checked against the direct computation. Every
// member of the group runs the same sequence of calls (it depends only on the group size).
struct Suite {
  uint64_t seed;
  std::vector<int64_t> members;  // rank -> device position
  Communicator& c;
  std::string where;
  std::vector<std::string>& errs;
  int tag = 0;
  // The stream the calls are enqueued on (null: the thread's eager stream); each call is
  // followed by its synchronize, so the checks read finished results.
  Stream* stream = nullptr;

  Stream& st() const { return stream ? *stream : eager(); }

  int r() const { return c.rank(); }
  int n() const { return c.size(); }

  // Records the first mismatching element of `got` against expect(i).
  template <class F>
  void check(const std::string& what, DType dt, const void* got, std::size_t count, F expect) {
    for (std::size_t i = 0; i < count; ++i) {
      const uint32_t g = get_bits(dt, got, i), e = expect(i);
      if (g != e) {
        std::ostringstream os;
        os << where << " rank " << r() << "/" << n() << " " << what << " (tag " << tag
           << "): element " << i << " of " << count << " is 0x" << std::hex << g
           << ", expected 0x" << e;
        errs.push_back(os.str());
        return;
      }
    }
  }

  void all_gather(std::size_t cnt, bool in_place) {
    const DType dt = DType::i32;
    const std::size_t n_ = static_cast<std::size_t>(n());
    std::vector<int32_t> recv(n_ * cnt + 1);
    poison_fill(recv);
    std::vector<int32_t> send(cnt + 1);
    int32_t* sp = send.data();
    if (in_place) sp = recv.data() + r() * cnt;
    fill(dt, sp, cnt, seed, members[r()], tag);
    c.all_gather(sp, recv.data(), cnt * 4, st());
    st().synchronize();
    check(std::string("all_gather") + (in_place ? " in place" : ""), dt, recv.data(), n_ * cnt,
          [&](std::size_t i) { return gen_bits(dt, seed, members[i / cnt], tag, i % cnt); });
    check("all_gather guard", dt, recv.data() + n_ * cnt, 1, [](std::size_t) { return 0xA5A5A5A5u; });
    if (!in_place)
      check("all_gather send", dt, sp, cnt,
            [&](std::size_t i) { return gen_bits(dt, seed, members[r()], tag, i); });
    ++tag;
  }

  void reduce_scatter(DType dt, ReduceOp op, std::size_t cnt, bool in_place) {
    const std::size_t es = esize(dt), n_ = static_cast<std::size_t>(n());
    std::vector<char> send(n_ * cnt * es), recv_buf((cnt + 1) * es);
    poison_fill(recv_buf);
    fill(dt, send.data(), n_ * cnt, seed, members[r()], tag);
    char* rp = in_place ? send.data() + r() * cnt * es : recv_buf.data();
    c.reduce_scatter(send.data(), rp, cnt, dt, op, st());
    st().synchronize();
    check(std::string("reduce_scatter ") + dtype_name(dt) + (op == ReduceOp::Sum ? " sum" : " max") +
              (in_place ? " in place" : ""),
          dt, rp, cnt,
          [&](std::size_t k) { return expected_reduce(dt, op, seed, members, tag, r() * cnt + k); });
    if (!in_place) {
      check("reduce_scatter send", dt, send.data(), n_ * cnt,
            [&](std::size_t i) { return gen_bits(dt, seed, members[r()], tag, i); });
      check("reduce_scatter guard", dt, recv_buf.data() + cnt * es, 1,
            [&](std::size_t) { return poison_bits(dt); });
    }
    ++tag;
  }

  void all_reduce(DType dt, ReduceOp op, std::size_t cnt, bool in_place) {
    const std::size_t es = esize(dt);
    std::vector<char> send(cnt * es + 1), recv_buf((cnt + 1) * es);
    poison_fill(recv_buf);
    fill(dt, send.data(), cnt, seed, members[r()], tag);
    char* rp = in_place ? send.data() : recv_buf.data();
    c.all_reduce(send.data(), rp, cnt, dt, op, st());
    st().synchronize();
    check(std::string("all_reduce ") + dtype_name(dt) + (op == ReduceOp::Sum ? " sum" : " max") +
              (in_place ? " in place" : ""),
          dt, rp, cnt,
          [&](std::size_t k) { return expected_reduce(dt, op, seed, members, tag, k); });
    if (!in_place) {
      check("all_reduce send", dt, send.data(), cnt,
            [&](std::size_t i) { return gen_bits(dt, seed, members[r()], tag, i); });
      check("all_reduce guard", dt, recv_buf.data() + cnt * es, 1,
            [&](std::size_t) { return poison_bits(dt); });
    }
    ++tag;
  }

  void all_to_all(std::size_t cnt, bool in_place) {
    const DType dt = DType::i32;
    const std::size_t n_ = static_cast<std::size_t>(n());
    std::vector<int32_t> send(n_ * cnt), recv_buf(n_ * cnt);
    poison_fill(recv_buf);
    fill(dt, send.data(), n_ * cnt, seed, members[r()], tag);
    int32_t* rp = in_place ? send.data() : recv_buf.data();
    c.all_to_all(send.data(), rp, cnt * 4, st());
    st().synchronize();
    check(std::string("all_to_all") + (in_place ? " in place" : ""), dt, rp, n_ * cnt,
          [&](std::size_t i) {
            return gen_bits(dt, seed, members[i / cnt], tag, r() * cnt + i % cnt);
          });
    ++tag;
  }

  void permute(int shift, bool partial, std::size_t cnt, bool in_place) {
    const DType dt = DType::i32;
    const int n_ = n(), rk = r();
    int to = (rk + shift) % n_, from = (rk - shift + n_) % n_;
    if (partial) {
      to = rk + shift < n_ ? rk + shift : -1;
      from = rk - shift >= 0 ? rk - shift : -1;
    }
    std::vector<int32_t> send(cnt), recv_buf(cnt);
    poison_fill(recv_buf);
    fill(dt, send.data(), cnt, seed, members[rk], tag);
    int32_t* rp = in_place ? send.data() : recv_buf.data();
    c.collective_permute(send.data(), to, rp, from, cnt * 4, st());
    st().synchronize();
    check("collective_permute shift " + std::to_string(shift) + (partial ? " partial" : "") +
              (in_place ? " in place" : ""),
          dt, rp, cnt, [&](std::size_t k) {
            if (from >= 0) return gen_bits(dt, seed, members[from], tag, k);
            return in_place ? gen_bits(dt, seed, members[rk], tag, k) : 0xA5A5A5A5u;
          });
    ++tag;
  }

  void broadcast(int root, std::size_t cnt) {
    const DType dt = DType::f32;
    std::vector<float> buf(cnt);
    poison_fill(buf);
    if (r() == root) fill(dt, buf.data(), cnt, seed, members[root], tag);
    c.broadcast(buf.data(), cnt * 4, root, st());
    st().synchronize();
    check("broadcast root " + std::to_string(root), dt, buf.data(), cnt,
          [&](std::size_t k) { return gen_bits(dt, seed, members[root], tag, k); });
    ++tag;
  }

  // Pairs (2j, 2j+1): even sends to odd, then odd answers; an odd group's last rank idles.
  void send_recv(std::size_t cnt) {
    const DType dt = DType::i32;
    const int rk = r();
    const int peer = rk % 2 == 0 ? rk + 1 : rk - 1;
    if (peer < n()) {
      std::vector<int32_t> out(cnt), in(cnt);
      for (int dir = 0; dir < 2; ++dir) {
        poison_fill(in);
        const bool sender = (rk % 2 == 0) == (dir == 0);
        if (sender) {
          fill(dt, out.data(), cnt, seed, members[rk], tag + dir);
          c.send(out.data(), cnt * 4, peer, st());
    st().synchronize();
        } else {
          c.recv(in.data(), cnt * 4, peer, st());
    st().synchronize();
          check("recv dir " + std::to_string(dir), dt, in.data(), cnt,
                [&](std::size_t k) { return gen_bits(dt, seed, members[peer], tag + dir, k); });
        }
      }
    }
    tag += 2;
  }

  void run_all() {
    const bool flags[] = {false, true};
    for (std::size_t cnt : {std::size_t{0}, std::size_t{3}, std::size_t{2500}}) {
      for (bool ip : flags) all_gather(cnt, ip);
      for (DType dt : {DType::f32, DType::i32})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max})
          for (bool ip : flags) reduce_scatter(dt, op, cnt, ip);
      for (DType dt : {DType::f32, DType::i32, DType::bf16})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max})
          for (bool ip : flags) all_reduce(dt, op, cnt, ip);
      for (bool ip : flags) all_to_all(cnt, ip);
    }
    all_reduce(DType::f16, ReduceOp::Sum, 1001, false);
    for (std::size_t cnt : {std::size_t{3}, std::size_t{1500}})
      for (int shift : {0, 1, n() - 1})
        for (bool partial : flags)
          for (bool ip : flags) permute(shift, partial, cnt, ip);
    broadcast(0, 700);
    broadcast(n() - 1, 700);
    send_recv(500);
    c.barrier(st());
    st().synchronize();
  }
};

ThreadWorldOptions test_options() {
  ThreadWorldOptions o;
  o.timeout_seconds = 240;  // a hang fails the test instead of blocking the suite
  return o;
}

}  // namespace

TEST_CASE("thread communicator: every collective on every axis group", "[runtime][comm]") {
  const uint64_t seed = test_seed();
  INFO("seed " << seed << " (rerun with TESSEL_SEED=" << seed << ")");
  for (const char* spec : {"a=2,b=4", "a=4,b=2", "x=2,y=2,z=2", "x=2,y=3,z=2"}) {
    DYNAMIC_SECTION("mesh " << spec) {
      const Mesh mesh = Mesh::parse(spec);
      std::vector<std::string> names;
      for (const auto& a : mesh.axes()) names.push_back(a.name);
      const auto axes_lists = ordered_subsets(names);
      CHECK(axes_lists.size() == (names.size() == 2 ? 4u : 15u));
      ThreadWorld world(mesh, test_options());
      const auto errs = run_devices(world, [&](int64_t pos, std::vector<std::string>& e) {
        for (const auto& axes : axes_lists) {
          auto comm = world.communicator(pos, axes);
          const auto members = mesh.group(pos, axes);
          const std::string where = std::string(spec) + " axes " + axes_str(axes);
          if (comm->size() != static_cast<int>(members.size()) ||
              comm->rank() != mesh.index_in_group(pos, axes) ||
              members[static_cast<std::size_t>(comm->rank())] != pos) {
            e.push_back(where + ": wrong rank/size for device " + std::to_string(pos));
            continue;
          }
          Suite s{seed, members, *comm, where, e};
          s.run_all();
        }
      });
      INFO(first_errors(errs));
      CHECK(errs.empty());
      CHECK_FALSE(world.aborted());
    }
  }
}

TEST_CASE("thread communicator: groups of several axis sets used interleaved", "[runtime][comm]") {
  // Each device holds communicators for {a}, {b} and {a,b} and alternates between them many
  // times with tiny messages: exercises the slot double-buffering and barrier reuse.
  const uint64_t seed = test_seed();
  INFO("seed " << seed);
  const Mesh mesh = Mesh::parse("a=2,b=4");
  ThreadWorld world(mesh, test_options());
  const std::vector<std::vector<std::string>> sets = {{"a"}, {"b"}, {"a", "b"}, {"b", "a"}};
  const auto errs = run_devices(world, [&](int64_t pos, std::vector<std::string>& e) {
    std::vector<std::unique_ptr<Communicator>> comms;
    std::vector<std::vector<int64_t>> members;
    for (const auto& s : sets) {
      comms.push_back(world.communicator(pos, s));
      members.push_back(mesh.group(pos, s));
    }
    for (int it = 0; it < 300; ++it) {
      const std::size_t which = static_cast<std::size_t>(it) % sets.size();
      Suite s{seed, members[which], *comms[which], "interleaved " + axes_str(sets[which]), e,
              it * 10};
      if (it % 3 == 0) s.all_reduce(DType::i32, ReduceOp::Sum, 1, it % 2 == 0);
      if (it % 3 == 1) s.all_gather(2, false);
      if (it % 3 == 2) comms[which]->barrier(eager());
      if (!e.empty()) return;
    }
  });
  INFO(first_errors(errs));
  CHECK(errs.empty());
}

TEST_CASE("thread communicator: abort wakes every blocked device", "[runtime][comm]") {
  const Mesh mesh = Mesh::parse("a=2,b=4");
  auto world = std::make_shared<ThreadWorld>(mesh);  // no timeout: abort alone must unblock
  const int64_t n = mesh.num_devices();
  auto outcome = std::make_shared<std::vector<std::string>>(static_cast<std::size_t>(n));
  const bool finished = finishes_within(
      [world, outcome, n] {
        std::vector<std::thread> threads;
        for (int64_t p = 0; p < n; ++p) {
          threads.emplace_back([world, outcome, p] {
            std::string& out = (*outcome)[static_cast<std::size_t>(p)];
            try {
              auto all = world->communicator(p, {"a", "b"});
              auto along_a = world->communicator(p, {"a"});
              auto along_b = world->communicator(p, {"b"});
              if (p == 3) {
                // The "kernel" of device 3 fails before its first collective.
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
                throw std::runtime_error("kernel exploded on device 3");
              }
              std::vector<float> buf(64, 1.0f), big(4 * 64);
              if (p == 2) {
                // Blocked in a point-to-point receive from device 3 (rank 3 of {b}).
                along_b->recv(buf.data(), buf.size() * 4, 3, eager());
              } else if (p == 7) {
                // Blocked in a collective along {a} that device 3 never joins.
                along_a->all_gather(buf.data(), big.data(), buf.size() * 4, eager());
              } else {
                // Groups {a} without device 3 complete; then block on the whole mesh.
                along_a->all_reduce(buf.data(), buf.data(), buf.size(), DType::f32,
                                    ReduceOp::Sum, eager());
                all->all_reduce(buf.data(), buf.data(), buf.size(), DType::f32, ReduceOp::Sum, eager());
              }
              out = "returned normally";
            } catch (const RuntimeError& e) {
              out = std::string("RuntimeError: ") + e.what();
            } catch (const std::exception& e) {
              out = std::string("exception: ") + e.what();
              world->abort(e.what());
            }
          });
        }
        for (auto& t : threads) t.join();
      },
      30.0);
  REQUIRE(finished);  // a hang here means abort did not wake a blocked device
  CHECK(world->aborted());
  CHECK_THAT(world->abort_reason(), Catch::Contains("kernel exploded on device 3"));
  for (int64_t p = 0; p < n; ++p) {
    const std::string& out = (*outcome)[static_cast<std::size_t>(p)];
    INFO("device " << p << ": " << out);
    if (p == 3) {
      CHECK_THAT(out, Catch::StartsWith("exception: kernel exploded"));
    } else {
      CHECK_THAT(out, Catch::StartsWith("RuntimeError:"));
      CHECK_THAT(out, Catch::Contains("kernel exploded on device 3"));
    }
  }
  // Any later call throws too.
  CHECK_THROWS_AS(world->communicator(0, {"a"}), RuntimeError);
}

TEST_CASE("thread communicator: calls after abort throw", "[runtime][comm]") {
  const Mesh mesh = Mesh::parse("a=2");
  ThreadWorld world(mesh);
  auto c0 = world.communicator(0, {"a"});
  world.abort("stop now");
  world.abort("second reason is ignored");
  CHECK(world.abort_reason() == "stop now");
  std::vector<int32_t> buf(4);
  CHECK_THROWS_WITH(c0->barrier(eager()), Catch::Contains("stop now"));
  CHECK_THROWS_AS(c0->all_reduce(buf.data(), buf.data(), 4, DType::i32, ReduceOp::Sum, eager()),
                  RuntimeError);
  CHECK_THROWS_AS(c0->send(buf.data(), 16, 1, eager()), RuntimeError);
  CHECK_THROWS_AS(c0->recv(buf.data(), 16, 1, eager()), RuntimeError);
}

TEST_CASE("thread communicator: mismatched calls abort instead of corrupting", "[runtime][comm]") {
  const Mesh mesh = Mesh::parse("a=2");
  SECTION("different sizes") {
    ThreadWorld world(mesh, test_options());
    std::vector<std::string> what(2);
    std::vector<std::thread> ts;
    for (int p = 0; p < 2; ++p) {
      ts.emplace_back([&, p] {
        auto c = world.communicator(p, {"a"});
        std::vector<int32_t> send(4), recv(8);
        try {
          c->all_gather(send.data(), recv.data(), p == 0 ? 8 : 16, eager());
        } catch (const RuntimeError& e) {
          what[p] = e.what();
        }
      });
    }
    for (auto& t : ts) t.join();
    CHECK_THAT(what[0], Catch::Contains("mismatch"));
    CHECK_THAT(what[1], Catch::Contains("mismatch"));
    CHECK(world.aborted());
  }
  SECTION("different kinds") {
    ThreadWorld world(mesh, test_options());
    std::vector<std::string> what(2);
    std::vector<std::thread> ts;
    for (int p = 0; p < 2; ++p) {
      ts.emplace_back([&, p] {
        auto c = world.communicator(p, {"a"});
        std::vector<float> buf(4);
        try {
          if (p == 0)
            c->barrier(eager());
          else
            c->all_reduce(buf.data(), buf.data(), 4, DType::f32, ReduceOp::Max, eager());
        } catch (const RuntimeError& e) {
          what[p] = e.what();
        }
      });
    }
    for (auto& t : ts) t.join();
    CHECK_THAT(what[0], Catch::Contains("barrier") && Catch::Contains("all_reduce"));
    CHECK_THAT(what[1], Catch::Contains("mismatch"));
  }
  SECTION("bad peer") {
    ThreadWorld world(mesh, test_options());
    auto c = world.communicator(0, {"a"});
    std::vector<int32_t> buf(4);
    CHECK_THROWS_AS(c->send(buf.data(), 16, 0, eager()), RuntimeError);  // to itself
    CHECK(world.aborted());
  }
}

TEST_CASE("thread communicator: timeout names the collective and the missing ranks",
          "[runtime][comm]") {
  const Mesh mesh = Mesh::parse("a=2,b=2");
  ThreadWorldOptions o;
  o.timeout_seconds = 0.2;
  ThreadWorld world(mesh, o);
  // Device 0 enters a barrier over {b} (devices 0, 1); device 1 never comes.
  auto c = world.communicator(0, {"b"});
  try {
    c->barrier(eager());
    FAIL("barrier returned without its peer");
  } catch (const RuntimeError& e) {
    const std::string w = e.what();
    CHECK_THAT(w, Catch::Contains("barrier"));
    CHECK_THAT(w, Catch::Contains("timed out"));
    CHECK_THAT(w, Catch::Contains("not arrived: [1 (device 1)]"));
    CHECK_THAT(w, Catch::Contains("{b}"));
  }
  CHECK(world.aborted());
}

TEST_CASE("thread communicator: bad arguments", "[runtime][comm]") {
  const Mesh mesh = Mesh::parse("a=2,b=2");
  ThreadWorld world(mesh);
  CHECK_THROWS_AS(world.communicator(4, {"a"}), MeshError);
  CHECK_THROWS_AS(world.communicator(0, {"c"}), MeshError);
  auto whole = world.communicator(3, {});  // empty axes: a group of one
  CHECK(whole->size() == 1);
  CHECK(whole->rank() == 0);
  std::vector<float> a{1, 2, 3}, b(3);
  whole->all_reduce(a.data(), b.data(), 3, DType::f32, ReduceOp::Sum, eager());
  CHECK(b == a);
  CHECK_FALSE(world.aborted());
}

TEST_CASE("thread communicator: 64-device world", "[runtime][comm]") {
  const uint64_t seed = test_seed();
  INFO("seed " << seed);
  const Mesh mesh = Mesh::parse("x=4,y=4,z=4");
  ThreadWorld world(mesh, test_options());
  const std::vector<std::string> axes = {"x", "y", "z"};
  const auto errs = run_devices(world, [&](int64_t pos, std::vector<std::string>& e) {
    auto comm = world.communicator(pos, axes);
    Suite s{seed, mesh.group(pos, axes), *comm, "64 devices", e};
    s.all_reduce(DType::f32, ReduceOp::Sum, 1000, true);
    s.all_reduce(DType::i32, ReduceOp::Max, 1000, false);
    s.all_reduce(DType::bf16, ReduceOp::Sum, 333, true);
    s.all_gather(3, true);
    s.reduce_scatter(DType::f32, ReduceOp::Sum, 17, false);
    comm->barrier(eager());
  });
  INFO(first_errors(errs));
  CHECK(errs.empty());
}

TEST_CASE("thread communicator: collectives on async streams complete at synchronize",
          "[runtime][comm]") {
  // Every device enqueues two all-reduces and a barrier on its own async stream and returns
  // at once; the results are only read after synchronize.
  const Mesh mesh = Mesh::parse("a=2,b=2");
  ThreadWorld world(mesh, test_options());
  auto backend = make_cpu_backend({StreamMode::Async, 1});
  const int64_t n = mesh.num_devices();
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::vector<float>> bufs(static_cast<std::size_t>(n), std::vector<float>(1000));
  for (int64_t p = 0; p < n; ++p) {
    streams.push_back(backend->create_stream("comm"));
    comms.push_back(world.communicator(p, {"a", "b"}));
    for (std::size_t i = 0; i < 1000; ++i) bufs[p][i] = static_cast<float>(p + 1);
  }
  for (int64_t p = 0; p < n; ++p) {  // one host thread enqueues for every device
    float* b = bufs[p].data();
    comms[p]->all_reduce(b, b, 1000, DType::f32, ReduceOp::Sum, *streams[p]);
    comms[p]->all_reduce(b, b, 1000, DType::f32, ReduceOp::Max, *streams[p]);
    comms[p]->barrier(*streams[p]);
  }
  for (auto& s : streams) s->synchronize();
  for (int64_t p = 0; p < n; ++p) CHECK(bufs[p][999] == 10.0f);
}

TEST_CASE("thread communicator: a group of sends and receives in both directions completes",
          "[runtime][comm]") {
  // Each rank sends to its neighbour before receiving: one by one this deadlocks (send
  // waits for the matching receive); as a group every send is posted first.
  const Mesh mesh = Mesh::parse("a=4");
  ThreadWorld world(mesh, test_options());
  auto backend = make_cpu_backend({StreamMode::Async, 1});
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::vector<int32_t>> out(4, std::vector<int32_t>(64)), in(4, std::vector<int32_t>(64, -1));
  for (int p = 0; p < 4; ++p) {
    streams.push_back(backend->create_stream("comm"));
    comms.push_back(world.communicator(p, {"a"}));
    for (auto& v : out[p]) v = 100 + p;
  }
  const bool finished = finishes_within(
      [&] {
        for (int p = 0; p < 4; ++p) {
          Communicator& c = *comms[p];
          c.group_start();
          c.send(out[p].data(), 64 * 4, (p + 1) % 4, *streams[p]);
          c.recv(in[p].data(), 64 * 4, (p + 3) % 4, *streams[p]);
          c.group_end();
        }
        for (auto& s : streams) s->synchronize();
      },
      60.0);
  REQUIRE(finished);
  for (int p = 0; p < 4; ++p) CHECK(in[p][63] == 100 + (p + 3) % 4);
  CHECK_THROWS_AS(comms[0]->group_end(), RuntimeError);
  comms[0]->group_start();
  CHECK_THROWS_AS(comms[0]->group_start(), RuntimeError);
}

TEST_CASE("thread communicator: an aborted collective fails its async stream and not the process",
          "[runtime][comm]") {
  const Mesh mesh = Mesh::parse("a=2");
  ThreadWorld world(mesh);  // no timeout: abort alone must unblock
  auto backend = make_cpu_backend({StreamMode::Async, 1});
  auto s0 = backend->create_stream("comm 0");
  auto c0 = world.communicator(0, {"a"});
  std::vector<float> buf(16, 1.0f);
  c0->all_reduce(buf.data(), buf.data(), 16, DType::f32, ReduceOp::Sum, *s0);  // peer never comes
  auto ev = backend->create_event();
  ev->record(*s0);
  c0->abort("cancelled by the test");
  CHECK_THROWS_WITH(s0->synchronize(), Catch::Contains("cancelled by the test"));
  CHECK_THROWS_WITH(ev->synchronize(), Catch::Contains("failed"));
  s0->synchronize();  // the error was reported once
}

TEST_CASE("thread communicator: the link model holds each transfer for alpha + bytes / bandwidth", "[runtime][comm]") {
  CHECK(LinkModel::parse("alpha_us=5,gbps=10").alpha_s == Approx(5e-6));
  CHECK(LinkModel::parse("alpha_us=5,gbps=10").bandwidth == Approx(10e9));
  CHECK_FALSE(LinkModel::parse("").on());
  CHECK_THROWS_WITH(LinkModel::parse("alpha_us=5"), Catch::Contains("gbps= is missing"));
  CHECK_THROWS_WITH(LinkModel::parse("gbps=0"), Catch::Contains("gbps must be > 0"));
  CHECK_THROWS_WITH(LinkModel::parse("gbps=x"), Catch::Contains("bad entry 'gbps=x'"));
  CHECK_THROWS_WITH(LinkModel::parse("speed=3"), Catch::Contains("bad entry 'speed=3'"));

  // 64 KiB at 1.31 MB/s: 50 ms per transfer. Lower bounds only (the model sleeps at least
  // that long; an upper bound would test the machine's load).
  const Mesh mesh = Mesh::parse("x=4");
  ThreadWorldOptions o = test_options();
  o.link_model.bandwidth = 65536 / 0.05;
  ThreadWorld world(mesh, o);
  const std::size_t bytes = 65536;
  std::vector<double> single(4), same_peer(4);
  const auto errs = run_devices(world, [&](int64_t pos, std::vector<std::string>& e) {
    auto comm = world.communicator(pos, {"x"});
    std::vector<char> a(bytes, 1), b(bytes), c(bytes);
    const int r = comm->rank(), next = (r + 1) % 4, prev = (r + 3) % 4;
    auto t0 = std::chrono::steady_clock::now();
    comm->collective_permute(a.data(), next, b.data(), prev, bytes, eager());
    single[static_cast<std::size_t>(pos)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Two halves to the same neighbour in one group share its link: 2 x 25 ms.
    t0 = std::chrono::steady_clock::now();
    comm->group_start();
    comm->collective_permute(a.data(), next, b.data(), prev, bytes / 2, eager());
    comm->collective_permute(a.data() + bytes / 2, next, c.data(), prev, bytes / 2, eager());
    comm->group_end();
    same_peer[static_cast<std::size_t>(pos)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (b[0] != 1 || c[0] != 1) e.push_back("the permutes did not move the data");
  });
  INFO(first_errors(errs));
  CHECK(errs.empty());
  for (int d = 0; d < 4; ++d) {
    CHECK(single[static_cast<std::size_t>(d)] >= 0.049);
    CHECK(same_peer[static_cast<std::size_t>(d)] >= 0.049);
  }
}

// ---- The virtual-device protocol (make_cpu_virtual_world: make_cuda_virtual_world's code, on
// CPU streams). Each device enqueues on a stream of its own; the suite synchronizes after each
// call. On async streams the members' pulls run on the stream workers, ordered only by the
// protocol's events, so a missing wait is a wrong element here and a race under TSan.

namespace {

std::unique_ptr<Stream> device_stream(StreamMode mode, int64_t pos) {
  // The backend may go: a CPU stream owns its worker.
  return make_cpu_backend({mode, 1})->create_stream("device " + std::to_string(pos));
}

}  // namespace

TEST_CASE("virtual communicator: every collective on every axis group on CPU streams", "[runtime][comm][virtual]") {
  const uint64_t seed = test_seed();
  INFO("seed " << seed << " (rerun with TESSEL_SEED=" << seed << ")");
  for (const char* spec : {"a=2,b=4", "x=2,y=3,z=2"}) {
    for (StreamMode mode : {StreamMode::Async, StreamMode::Eager}) {
      DYNAMIC_SECTION("mesh " << spec << " streams " << stream_mode_name(mode)) {
        const Mesh mesh = Mesh::parse(spec);
        std::vector<std::string> names;
        for (const auto& a : mesh.axes()) names.push_back(a.name);
        const auto axes_lists = ordered_subsets(names);
        auto world = make_cpu_virtual_world(mesh, 240);
        const auto errs = run_devices(*world, mesh.num_devices(), [&](int64_t pos, std::vector<std::string>& e) {
          auto stream = device_stream(mode, pos);
          for (const auto& axes : axes_lists) {
            auto comm = world->communicator(pos, axes);
            const auto members = mesh.group(pos, axes);
            const std::string where = std::string(spec) + " axes " + axes_str(axes);
            if (comm->size() != static_cast<int>(members.size()) || comm->rank() != mesh.index_in_group(pos, axes)) {
              e.push_back(where + ": wrong rank/size for device " + std::to_string(pos));
              continue;
            }
            Suite s{seed, members, *comm, where, e};
            s.stream = stream.get();
            s.run_all();
          }
        });
        INFO(first_errors(errs));
        CHECK(errs.empty());
        CHECK_FALSE(world->aborted());
      }
    }
  }
}

TEST_CASE("virtual communicator: groups of several axis sets used interleaved without synchronizing",
          "[runtime][comm][virtual]") {
  // Many small collectives on three groups, enqueued back to back on one async stream per
  // device and synchronized only at the end: the channels' events are re-recorded while
  // earlier pulls may still be queued.
  const Mesh mesh = Mesh::parse("a=2,b=4");
  auto world = make_cpu_virtual_world(mesh, 240);
  const std::vector<std::vector<std::string>> sets = {{"a"}, {"b"}, {"a", "b"}};
  constexpr int kRounds = 200;
  const auto errs = run_devices(*world, mesh.num_devices(), [&](int64_t pos, std::vector<std::string>& e) {
    auto stream = device_stream(StreamMode::Async, pos);
    std::vector<std::unique_ptr<Communicator>> comms;
    for (const auto& s : sets) comms.push_back(world->communicator(pos, s));
    // Round k: an all-reduce (sum, i32) of the value pos + k on group k % 3, into out[k].
    std::vector<int32_t> in(kRounds), out(kRounds, -1);
    for (int k = 0; k < kRounds; ++k) {
      in[static_cast<std::size_t>(k)] = static_cast<int32_t>(pos + k);
      comms[static_cast<std::size_t>(k) % sets.size()]->all_reduce(&in[static_cast<std::size_t>(k)],
                                                                   &out[static_cast<std::size_t>(k)], 1, DType::i32,
                                                                   ReduceOp::Sum, *stream);
    }
    stream->synchronize();
    for (int k = 0; k < kRounds; ++k) {
      int32_t expect = 0;
      for (int64_t m : mesh.group(pos, sets[static_cast<std::size_t>(k) % sets.size()]))
        expect += static_cast<int32_t>(m + k);
      if (out[static_cast<std::size_t>(k)] != expect) {
        e.push_back("device " + std::to_string(pos) + " round " + std::to_string(k) + ": " +
                    std::to_string(out[static_cast<std::size_t>(k)]) + ", expected " + std::to_string(expect));
        return;
      }
    }
  });
  INFO(first_errors(errs));
  CHECK(errs.empty());
}

TEST_CASE("virtual communicator: abort wakes every blocked device and later calls throw", "[runtime][comm][virtual]") {
  const Mesh mesh = Mesh::parse("a=4");
  std::shared_ptr<CollectiveWorld> world = make_cpu_virtual_world(mesh);  // no timeout: abort alone must unblock
  auto outcome = std::make_shared<std::vector<std::string>>(4);
  const bool finished = finishes_within(
      [world, outcome] {
        std::vector<std::thread> threads;
        for (int64_t p = 0; p < 3; ++p)  // device 3 never joins
          threads.emplace_back([world, outcome, p] {
            try {
              auto stream = device_stream(StreamMode::Async, p);
              auto c = world->communicator(p, {"a"});
              std::vector<float> buf(16, 1.0f);
              c->all_reduce(buf.data(), buf.data(), buf.size(), DType::f32, ReduceOp::Sum, *stream);
              stream->synchronize();
              (*outcome)[static_cast<std::size_t>(p)] = "returned normally";
            } catch (const RuntimeError& e) {
              (*outcome)[static_cast<std::size_t>(p)] = e.what();
            }
          });
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        world->abort("device 3 failed");
        for (auto& t : threads) t.join();
      },
      30.0);
  REQUIRE(finished);  // a hang here means abort did not wake a blocked device
  for (int p = 0; p < 3; ++p) {
    INFO("device " << p);
    CHECK_THAT((*outcome)[static_cast<std::size_t>(p)],
               Catch::Contains("all_reduce of device " + std::to_string(p)) && Catch::Contains("device 3 failed"));
  }
  CHECK_THROWS_WITH(world->communicator(0, {"a"}), Catch::Contains("device 3 failed"));
}

TEST_CASE("virtual communicator: members that disagree abort the world naming the collective",
          "[runtime][comm][virtual]") {
  const Mesh mesh = Mesh::parse("a=2");
  auto world = make_cpu_virtual_world(mesh, 60);
  const auto errs = run_devices(*world, 2, [&](int64_t pos, std::vector<std::string>&) {
    auto stream = device_stream(StreamMode::Async, pos);
    auto c = world->communicator(pos, {"a"});
    std::vector<int32_t> send(8, 1), recv(16, 0);
    c->all_gather(send.data(), recv.data(), pos == 0 ? 16 : 32, *stream);  // 4 against 8 elements
    stream->synchronize();
  });
  REQUIRE(errs.size() == 2);
  for (const std::string& e : errs) CHECK_THAT(e, Catch::Contains("all_gather") && Catch::Contains("disagree"));
  CHECK(world->aborted());
}

TEST_CASE("virtual communicator: a timeout names the collective and aborts the world", "[runtime][comm][virtual]") {
  const Mesh mesh = Mesh::parse("a=2");
  auto world = make_cpu_virtual_world(mesh, 0.3);
  auto stream = device_stream(StreamMode::Async, 0);
  auto c = world->communicator(0, {"a"});  // device 1 never comes
  CHECK_THROWS_WITH(c->barrier(*stream), Catch::Contains("barrier of device 0") && Catch::Contains("timed out"));
  CHECK(world->aborted());
  CHECK_THROWS_AS(make_cpu_virtual_world(mesh, -1), RuntimeError);
}

TEST_CASE("virtual communicator: pulls wait for the peers' stream work before and after the collective",
          "[runtime][comm][virtual]") {
  // Each member's input is written by its own stream (after a sleep of a few ms that differs by
  // device and round) and overwritten on its stream right after the collective. A member that
  // pulled before a peer's `ready` would read the previous round's garbage; a member that
  // reused its buffer before its peers' `done` would hand them the garbage of this round.
  const Mesh mesh = Mesh::parse("a=4");
  auto world = make_cpu_virtual_world(mesh, 240);
  constexpr int kRounds = 24;
  constexpr std::size_t kCount = 4096;
  const auto errs = run_devices(*world, 4, [&](int64_t pos, std::vector<std::string>& e) {
    auto backend = make_cpu_backend({StreamMode::Async, 1});
    auto stream = backend->create_stream("device " + std::to_string(pos));
    auto comm = world->communicator(pos, {"a"});
    std::shared_ptr<Buffer> send = backend->allocate(kCount * 4), recv = backend->allocate(4 * kCount * 4);
    std::vector<int32_t> value(kCount), garbage(kCount, -7), got(4 * kCount);
    for (int k = 0; k < kRounds; ++k) {
      for (std::size_t i = 0; i < kCount; ++i) value[i] = static_cast<int32_t>(pos * 1000003 + k * 7919 + i);
      const int sleep_ms = static_cast<int>((pos * 7 + k * 3) % 11);
      backend->launch_host_func(*stream, [sleep_ms] { std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms)); });
      backend->copy_from_host(*send, value.data(), kCount * 4, *stream);
      comm->all_gather(send->data(), recv->data(), kCount * 4, *stream);
      backend->copy_from_host(*send, garbage.data(), kCount * 4, *stream);
      backend->copy_to_host(got.data(), *recv, 4 * kCount * 4, *stream);
      stream->synchronize();
      for (std::size_t i = 0; i < 4 * kCount; ++i) {
        const int32_t expect = static_cast<int32_t>(static_cast<int64_t>(i / kCount) * 1000003 + k * 7919 + i % kCount);
        if (got[i] != expect) {
          e.push_back("device " + std::to_string(pos) + " round " + std::to_string(k) + ": element " +
                      std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " + std::to_string(expect));
          return;
        }
      }
    }
  });
  INFO(first_errors(errs));
  CHECK(errs.empty());
}
