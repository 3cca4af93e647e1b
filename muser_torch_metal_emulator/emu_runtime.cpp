// emu_runtime.cpp: runs a Metal dispatch on one CPU thread, each lane a fiber.
//
// Threadgroups run one after another. Within one, simdgroups take turns in
// schedule order (forward, reverse, random); the running simdgroup's lanes
// run one at a time, each to its next collective (simd_*, simdgroup matrix
// op) or its end, and its simd collectives resolve as soon as all its live
// lanes arrive, until every lane waits at a threadgroup barrier or returns.
// Once all simdgroups are there, the barrier is released, or the divergence
// is reported with the call sites involved. Lanes that have returned are
// inactive: simd collectives resolve over the rest. Threadgroup memory is one
// arena, refilled with NaN bytes per group; each declaration site gets one
// allocation. Device buffers come from emu_buffer_alloc: their last byte
// touches a PROT_NONE page, buffers bound only to const parameters are made
// read-only, and the SIGSEGV handler names the buffer.
#include "metal_shim.h"

#include <algorithm>
#include <csetjmp>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

namespace {

constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kThreadgroupLimit = 32 * 1024;  // Metal's threadgroup memory per group
constexpr unsigned kMaxThreads = 1024;

size_t page_size() { static size_t p = size_t(sysconf(_SC_PAGESIZE)); return p; }

// ------------------------------------------------------------ context switch
#if defined(__x86_64__)
extern "C" void muser_emu_swap(void** save_sp, void* new_sp);
asm(R"(
.text
.p2align 4
.hidden muser_emu_swap
.globl muser_emu_swap
.type muser_emu_swap,@function
muser_emu_swap:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size muser_emu_swap, .-muser_emu_swap
)");

void fiber_main();

// Lay out a fresh stack so that muser_emu_swap "returns" into fiber_main with
// the alignment of a function that was just called. MXCSR and the x87 control
// word are not switched: all fibers share the thread's settings.
void* fiber_init(void* stack, size_t bytes) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
  uint64_t* sp = reinterpret_cast<uint64_t*>(top);
  *--sp = 0;                                          // fake return address
  *--sp = reinterpret_cast<uint64_t>(&fiber_main);    // popped by ret
  for (int i = 0; i < 6; ++i) *--sp = 0;              // rbp rbx r12..r15
  return sp;
}
#define MUSER_EMU_SWAP(save, to) muser_emu_swap(save, to)
#else
#error "the Metal emulator's fiber switch is written for x86-64"
#endif

// ------------------------------------------------------------ dispatch state
struct TgAlloc { size_t offset, bytes; const char* name; const char* file; int line; };

struct Buffer { uintptr_t data, end, map; size_t map_bytes; int index; bool read_only; };

struct Dispatch {
  void (*entry)(void**) = nullptr;
  void** bufs = nullptr;
  EmuLane lanes[kMaxThreads];
  unsigned n_lanes = 0;
  std::vector<TgAlloc> allocs;
  size_t tg_used = 0, tg_high = 0;
  const uint64_t* tg_param_bytes = nullptr;   // [[threadgroup(i)]] lengths, n_tg_params of them
  int n_tg_params = 0;
  void* tg_params[32];
  alignas(64) unsigned char arena[kThreadgroupLimit];
  char* err = nullptr;
  int errlen = 0;
  bool failed = false;
  sigjmp_buf fault_jmp;
  const char* kernel_name = "";
};

Dispatch* g_dispatch = nullptr;
EmuLane* g_lane = nullptr;
void* g_main_sp = nullptr;

// One dispatch at a time per library: the driver serializes calls with a lock
// (ctypes releases the GIL), so the state is plain globals.
std::vector<Buffer> g_buffers;      // live guarded buffers
std::vector<void*> g_stacks;        // fiber stacks, each above a guard page

char g_fault_msg[512];
struct sigaction g_old_segv, g_old_bus;
bool g_in_dispatch = false;

void fiber_main() {
  EmuLane* l = g_lane;
  g_dispatch->entry(g_dispatch->bufs);
  l->state = 2;
  MUSER_EMU_SWAP(&l->sp, g_main_sp);
  __builtin_trap();
}

void* stack_for(unsigned i) {
  while (g_stacks.size() <= i) {
    size_t guard = page_size();
    void* m = mmap(nullptr, kStackBytes + guard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    mprotect(m, guard, PROT_NONE);
    g_stacks.push_back(static_cast<char*>(m) + guard);
  }
  return g_stacks[i];
}

// A PROT_NONE page that [[threadgroup(i)]] parameters given 0 bytes point at.
void* zero_length_page() {
  static void* p = nullptr;
  if (!p) {
    p = mmap(nullptr, page_size(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) p = nullptr;
  }
  return p;
}

void describe_lane(char* out, size_t n, const EmuLane* l) {
  snprintf(out, n, "threadgroup (%u,%u,%u) thread %u (simdgroup %u lane %u)", l->tgpig.x, l->tgpig.y,
           l->tgpig.z, l->tid, l->simd_index, l->simd_lane);
}

void on_fault(int sig, siginfo_t* info, void* ctx) {
  uintptr_t a = reinterpret_cast<uintptr_t>(info->si_addr);
  Dispatch* d = g_dispatch;
  if (g_in_dispatch && d) {
    const char* what = nullptr;
    char buf[256] = "";
    for (const Buffer& b : g_buffers) {
      if (b.read_only && a >= b.data && a < b.end) {
        snprintf(buf, sizeof buf, "write to buffer(%d), which is bound only to const or constant parameters "
                 "(byte %lld)", b.index, (long long)(a - b.data));
        what = buf;
      } else if (a >= b.end && a < b.end + page_size()) {
        snprintf(buf, sizeof buf, "out-of-bounds access to buffer(%d): byte %lld of a %lld-byte buffer",
                 b.index, (long long)(a - b.data), (long long)(b.end - b.data));
        what = buf;
      } else if (a >= b.map && a < b.map + page_size()) {
        snprintf(buf, sizeof buf, "out-of-bounds access to buffer(%d): %lld bytes before its start",
                 b.index, (long long)(b.data - a));
        what = buf;
      }
    }
    const uintptr_t z = reinterpret_cast<uintptr_t>(zero_length_page());
    if (z && a >= z && a < z + page_size())
      what = "access to a [[threadgroup(i)]] parameter the dispatch gave 0 bytes";
    for (void* s : g_stacks) {
      uintptr_t lo = reinterpret_cast<uintptr_t>(s) - page_size();
      if (a >= lo && a < lo + page_size()) what = "lane stack overflow (kernel locals too large?)";
    }
    if (what) {
      char lane[160] = "";
      if (g_lane) describe_lane(lane, sizeof lane, g_lane);
      snprintf(g_fault_msg, sizeof g_fault_msg, "%s: %s, in %s", d->kernel_name, what, lane);
      siglongjmp(d->fault_jmp, 1);
    }
  }
  // Not ours: put the previous handler back and let the fault happen again.
  sigaction(sig, sig == SIGSEGV ? &g_old_segv : &g_old_bus, nullptr);
  (void)ctx;
}

void install_fault_handler() {
  static thread_local bool alt = false;  // sigaltstack is per thread
  if (!alt) {
    stack_t ss{};
    ss.ss_size = 64 * 1024;
    ss.ss_sp = malloc(ss.ss_size);
    sigaltstack(&ss, nullptr);
    alt = true;
  }
  struct sigaction sa{};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_old_segv);
  sigaction(SIGBUS, &sa, &g_old_bus);
}

void remove_fault_handler() {
  sigaction(SIGSEGV, &g_old_segv, nullptr);
  sigaction(SIGBUS, &g_old_bus, nullptr);
}

uint64_t g_rng = 1;
uint64_t next_random() {
  g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
  return g_rng;
}

bool same_site(const EmuCollective& a, const EmuCollective& b) {
  return a.resolve == b.resolve && a.line == b.line && std::strcmp(a.file, b.file) == 0;
}

void fail_at(Dispatch* d, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = snprintf(d->err, d->errlen, "%s: ", d->kernel_name);
  if (n >= 0 && n < d->errlen) vsnprintf(d->err + n, d->errlen - n, fmt, ap);
  va_end(ap);
  d->failed = true;
}

// Simdgroup s has run until every live lane is parked or done. Resolve its
// simd collective: 1 if lanes were released, 0 if all its live lanes wait at a
// threadgroup barrier (or are done), -1 (d->failed) on divergence.
int resolve_simd(Dispatch* d, unsigned s) {
  EmuLane* parked[32];
  int n = 0, at_barrier = 0;
  for (unsigned i = 0; i < d->n_lanes; ++i) {
    EmuLane* l = &d->lanes[i];
    if (l->simd_index != s || l->state == 2) continue;   // returned lanes are inactive
    if (l->coll.scope == EMU_THREADGROUP) { ++at_barrier; continue; }
    parked[n++] = l;
  }
  if (n == 0) return 0;
  if (at_barrier) {
    fail_at(d, "divergent collectives in simdgroup %u: some lanes wait at %s (%s:%d), others at a "
               "threadgroup_barrier", s, parked[0]->coll.name, parked[0]->coll.file, parked[0]->coll.line);
    return -1;
  }
  for (int i = 1; i < n; ++i) {
    if (!same_site(parked[i]->coll, parked[0]->coll)) {
      fail_at(d, "divergent collectives in simdgroup %u: lane %u is at %s (%s:%d), lane %u at %s (%s:%d) (the "
                 "emulator needs every live lane of a simdgroup at the same collective)", s,
              parked[0]->simd_lane, parked[0]->coll.name, parked[0]->coll.file, parked[0]->coll.line,
              parked[i]->simd_lane, parked[i]->coll.name, parked[i]->coll.file, parked[i]->coll.line);
      return -1;
    }
    if (parked[0]->coll.uniform && parked[i]->coll.key != parked[0]->coll.key) {
      fail_at(d, "%s at %s:%d needs the same address, stride, delta or lane on every lane (lanes %u and %u "
                 "differ)", parked[0]->coll.name, parked[0]->coll.file, parked[0]->coll.line,
              parked[0]->simd_lane, parked[i]->simd_lane);
      return -1;
    }
  }
  g_lane = nullptr;  // resolvers run on the scheduler's stack
  parked[0]->coll.resolve(parked, n);
  if (d->failed) return -1;
  for (int i = 0; i < n; ++i) parked[i]->state = 0;
  return 1;
}

// Every live lane waits at a threadgroup barrier or is done: release them,
// or report lanes at different barriers or lanes that returned.
bool resolve_barrier(Dispatch* d) {
  EmuLane* first = nullptr;
  for (unsigned i = 0; i < d->n_lanes; ++i) {
    EmuLane* l = &d->lanes[i];
    if (l->state == 2) continue;
    if (!first) { first = l; continue; }
    if (!same_site(l->coll, first->coll)) {
      fail_at(d, "threads %u and %u wait at different barriers (%s:%d and %s:%d)", first->tid, l->tid,
              first->coll.file, first->coll.line, l->coll.file, l->coll.line);
      return false;
    }
  }
  for (unsigned i = 0; i < d->n_lanes; ++i) {
    if (d->lanes[i].state == 2) {
      char who[160];
      describe_lane(who, sizeof who, &d->lanes[i]);
      fail_at(d, "threadgroup_barrier at %s:%d is not reached by %s, which has returned", first->coll.file,
              first->coll.line, who);
      return false;
    }
  }
  for (unsigned i = 0; i < d->n_lanes; ++i) d->lanes[i].state = 0;
  return true;
}

void order_of(unsigned* v, unsigned n, int schedule) {
  if (schedule == 1) {
    std::reverse(v, v + n);
  } else if (schedule == 2) {
    for (unsigned i = n; i > 1; --i) std::swap(v[i - 1], v[next_random() % i]);
  }
}

// Simdgroups take turns in schedule order; each runs alone, its lanes in
// schedule order between its own simd collectives, until all of them reach
// a threadgroup barrier or return. So a simdgroup that reads threadgroup
// memory another simdgroup writes without a barrier between sees NaN or
// stale data under forward or reverse order, and lanes of one simdgroup race
// the same way between collectives.
bool run_group(Dispatch* d, int schedule) {
  const unsigned simds = d->n_lanes ? d->lanes[0].simds : 0;
  unsigned sg_order[kMaxThreads / 32 + 1], order[32];
  for (;;) {
    for (unsigned k = 0; k < simds; ++k) sg_order[k] = k;
    order_of(sg_order, simds, schedule);
    for (unsigned k = 0; k < simds; ++k) {
      const unsigned s = sg_order[k];
      for (;;) {
        unsigned n = 0;
        for (unsigned i = 0; i < d->n_lanes; ++i)
          if (d->lanes[i].simd_index == s && d->lanes[i].state == 0) order[n++] = i;
        order_of(order, n, schedule);
        for (unsigned j = 0; j < n; ++j) {
          EmuLane* l = &d->lanes[order[j]];
          g_lane = l;
          MUSER_EMU_SWAP(&g_main_sp, l->sp);
          g_lane = nullptr;
          if (d->failed) return false;
        }
        const int r = resolve_simd(d, s);
        if (r < 0) return false;
        if (r == 0) break;
      }
    }
    bool all_done = true;
    for (unsigned i = 0; i < d->n_lanes; ++i) all_done &= d->lanes[i].state == 2;
    if (all_done) return true;
    if (!resolve_barrier(d)) return false;
  }
}

}  // namespace

namespace metal { namespace emu_detail {
EmuLane* find_lane(EmuLane** lanes, int n, int64_t simd_lane) {
  for (int i = 0; i < n; ++i)
    if (int64_t(lanes[i]->simd_lane) == simd_lane) return lanes[i];
  return nullptr;
}
void fail_inactive(const EmuLane* reader, int64_t src) {
  emu_fail("%s:%d: %s on lane %u reads lane %lld, which is not active (Metal leaves the result undefined)",
           reader->coll.file, reader->coll.line, reader->coll.name, reader->simd_lane, (long long)src);
}
}}  // namespace metal::emu_detail

// Function constant values of the next dispatches, by index (Metal's indices are 16-bit).
constexpr int64_t kFunctionConstants = 65536;
EmuFcValue g_function_constants[kFunctionConstants];

extern "C" {

EmuLane* emu_current_lane() { return g_lane; }

// n (index, kind, integer, float) entries replace every value set before.
void emu_set_function_constants(const int64_t* index, const char* kind, const int64_t* ival, const double* fval,
                                int n) {
  std::memset(static_cast<void*>(g_function_constants), 0, sizeof g_function_constants);
  for (int k = 0; k < n; ++k)
    if (index[k] >= 0 && index[k] < kFunctionConstants)
      g_function_constants[index[k]] = EmuFcValue{kind[k], ival[k], fval[k]};
}

const EmuFcValue* emu_function_constant_value(int64_t index) {
  return index >= 0 && index < kFunctionConstants ? &g_function_constants[index] : nullptr;
}

void emu_park(EmuCollective* c) {
  EmuLane* l = g_lane;
  l->coll = *c;
  l->state = 1;
  MUSER_EMU_SWAP(&l->sp, g_main_sp);
}

void emu_fail(const char* fmt, ...) {
  Dispatch* d = g_dispatch;
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fail_at(d, "%s", msg);
  if (g_lane) {
    EmuLane* l = g_lane;
    MUSER_EMU_SWAP(&l->sp, g_main_sp);  // never resumed
  }
  // Called by a resolver on the scheduler's stack: unwind to emu_dispatch.
  snprintf(g_fault_msg, sizeof g_fault_msg, "%s", d->err);
  siglongjmp(d->fault_jmp, 1);
}

// One allocation per declaration site (name, file, line, size) and threadgroup:
// every lane that reaches the declaration, however often, gets the same memory.
void* emu_tg_alloc(size_t bytes, size_t align, const char* name, const char* file, int line) {
  Dispatch* d = g_dispatch;
  for (const TgAlloc& a : d->allocs)
    if (a.line == line && a.bytes == bytes && std::strcmp(a.name, name) == 0 && std::strcmp(a.file, file) == 0)
      return d->arena + a.offset;
  size_t off = (d->tg_used + align - 1) / align * align;
  if (off + bytes > kThreadgroupLimit)
    emu_fail("threadgroup memory %zu bytes (array '%s' at %s:%d) exceeds Metal's limit of %zu bytes", off + bytes,
             name, file, line, kThreadgroupLimit);
  std::memset(d->arena + off, 0xFF, bytes);  // NaN as float and as half
  d->allocs.push_back({off, bytes, name, file, line});
  d->tg_used = off + bytes;
  if (d->tg_used > d->tg_high) d->tg_high = d->tg_used;
  return d->arena + off;
}

// [[threadgroup(i)]] parameters: allocated at the start of each threadgroup.
void* emu_tg_param(int index) {
  Dispatch* d = g_dispatch;
  if (index < 0 || index >= d->n_tg_params || !d->tg_params[index])
    emu_fail("[[threadgroup(%d)]] has no memory: torch.mps.compile_shader never sets threadgroup memory lengths; "
             "the emulator takes them as threadgroup_memory={%d: bytes}", index, index);
  return d->tg_params[index];
}

// A zero-filled buffer whose last byte sits against a PROT_NONE page (and one
// more guard page before it). `align` rounds the start down, so up to
// align - 1 bytes past the end are not guarded.
void* emu_buffer_alloc(size_t bytes, size_t align, int index) {
  size_t ps = page_size();
  size_t data_pages = (bytes + align + ps - 1) / ps;
  if (data_pages == 0) data_pages = 1;
  size_t total = (data_pages + 2) * ps;
  void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  uintptr_t map = reinterpret_cast<uintptr_t>(m);
  mprotect(m, ps, PROT_NONE);
  uintptr_t end = map + (data_pages + 1) * ps;
  mprotect(reinterpret_cast<void*>(end), ps, PROT_NONE);
  uintptr_t data = (end - bytes) / align * align;
  g_buffers.push_back({data, end, map, total, index, false});
  return reinterpret_cast<void*>(data);
}

// After the driver has filled it: writes through any parameter then fault.
void emu_buffer_protect(void* p) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (Buffer& b : g_buffers) {
    if (b.data == a) {
      size_t ps = page_size();
      mprotect(reinterpret_cast<void*>(b.map + ps), b.end - b.map - ps, PROT_READ);
      b.read_only = true;
    }
  }
}

void emu_buffer_free(void* p) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (size_t i = 0; i < g_buffers.size(); ++i) {
    if (g_buffers[i].data == a) {
      munmap(reinterpret_cast<void*>(g_buffers[i].map), g_buffers[i].map_bytes);
      g_buffers.erase(g_buffers.begin() + i);
      return;
    }
  }
}

// Runs a whole dispatch. grid and group are in threads (dispatchThreads: an
// edge threadgroup is smaller, with its own shape). schedule: 0 forward, 1
// reverse, 2 random. tg_bytes[i] sizes [[threadgroup(i)]] (0: none given).
// Returns 0, or -1 with a message in err; *tg_high is the most threadgroup
// memory any group declared.
int emu_dispatch(void (*entry)(void**), const char* name, void** bufs, const unsigned* grid,
                 const unsigned* group, int schedule, uint64_t seed, const uint64_t* tg_bytes, int n_tg,
                 uint64_t* tg_high, char* err, int errlen) {
  static Dispatch* disp = nullptr;
  if (!disp) disp = new Dispatch();
  Dispatch* d = disp;
  d->entry = entry; d->bufs = bufs; d->err = err; d->errlen = errlen; d->failed = false;
  d->kernel_name = name;
  d->tg_param_bytes = tg_bytes; d->n_tg_params = n_tg > 32 ? 32 : n_tg; d->tg_high = 0;
  err[0] = 0;
  *tg_high = 0;
  g_rng = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
  if (!g_rng) g_rng = 1;
  const unsigned tg_threads = group[0] * group[1] * group[2];
  if (tg_threads == 0 || tg_threads > kMaxThreads) {
    snprintf(err, errlen, "%s: threadgroup of %u threads (Metal allows 1..%u)", name, tg_threads, kMaxThreads);
    return -1;
  }
  unsigned ng[3];
  for (int k = 0; k < 3; ++k) ng[k] = (grid[k] + group[k] - 1) / group[k];
  for (unsigned i = 0; i < tg_threads; ++i)
    if (!stack_for(i)) { snprintf(err, errlen, "%s: cannot map fiber stacks", name); return -1; }
  g_dispatch = d;
  g_in_dispatch = true;
  install_fault_handler();
  int rc = 0;
  if (sigsetjmp(d->fault_jmp, 1)) {
    snprintf(err, errlen, "%s", g_fault_msg);
    rc = -1;
    goto out;
  }
  for (unsigned gz = 0; gz < ng[2]; ++gz)
    for (unsigned gy = 0; gy < ng[1]; ++gy)
      for (unsigned gx = 0; gx < ng[0]; ++gx) {
        const unsigned g[3] = {gx, gy, gz};
        unsigned dims[3];
        for (int k = 0; k < 3; ++k) dims[k] = std::min(group[k], grid[k] - g[k] * group[k]);
        const unsigned n = dims[0] * dims[1] * dims[2];
        d->n_lanes = n;
        d->allocs.clear();
        d->tg_used = 0;
        for (int t = 0; t < d->n_tg_params; ++t) {
          d->tg_params[t] = nullptr;
          if (!tg_bytes[t]) {           // a length of 0, as setThreadgroupMemoryLength:0 gives: any access faults
            d->tg_params[t] = zero_length_page();
            continue;
          }
          size_t off = (d->tg_used + 15) / 16 * 16;
          if (off + tg_bytes[t] > kThreadgroupLimit) {
            snprintf(err, errlen, "%s: threadgroup memory %zu bytes ([[threadgroup(%d)]]) exceeds Metal's limit "
                     "of %zu bytes", name, size_t(off + tg_bytes[t]), t, kThreadgroupLimit);
            rc = -1;
            goto out;
          }
          std::memset(d->arena + off, 0xFF, tg_bytes[t]);
          d->tg_params[t] = d->arena + off;
          d->tg_used = off + tg_bytes[t];
        }
        d->tg_high = std::max(d->tg_high, d->tg_used);
        for (unsigned lz = 0, tid = 0; lz < dims[2]; ++lz)
          for (unsigned ly = 0; ly < dims[1]; ++ly)
            for (unsigned lx = 0; lx < dims[0]; ++lx, ++tid) {
              EmuLane* l = &d->lanes[tid];
              std::memset(l, 0, sizeof *l);
              l->tpig = metal::uint3(gx * group[0] + lx, gy * group[1] + ly, gz * group[2] + lz);
              l->tgpig = metal::uint3(gx, gy, gz);
              l->tptg = metal::uint3(lx, ly, lz);
              l->tptg_dims = metal::uint3(dims[0], dims[1], dims[2]);
              l->dispatch_dims = metal::uint3(group[0], group[1], group[2]);
              l->groups = metal::uint3(ng[0], ng[1], ng[2]);
              l->grid = metal::uint3(grid[0], grid[1], grid[2]);
              l->tid = tid;
              l->simd_lane = tid % 32;
              l->simd_index = tid / 32;
              l->simds = (n + 31) / 32;
              l->dispatch_simds = (tg_threads + 31) / 32;
              l->quad_lane = tid % 4;
              l->quad_index = tid / 4;
              l->quads = (n + 3) / 4;
              l->stack = g_stacks[tid];
              l->sp = fiber_init(l->stack, kStackBytes);
            }
        if (!run_group(d, schedule)) { rc = -1; goto out; }
        d->tg_high = std::max(d->tg_high, d->tg_used);
      }
out:
  *tg_high = d->tg_high;
  remove_fault_handler();
  g_in_dispatch = false;
  g_dispatch = nullptr;
  g_lane = nullptr;
  return rc;
}

}  // extern "C"
