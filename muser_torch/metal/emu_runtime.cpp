// emu_runtime.cpp: runs a Metal dispatch on one CPU thread, each lane a fiber.
//
// Threadgroups run one after another. Within one, simdgroups take turns in
// schedule order (forward, reverse, random); the running simdgroup's lanes
// run one at a time, each to its next collective (simd_*, simdgroup matrix
// op) or its end, and its simd collectives resolve as soon as all its live
// lanes arrive, until every lane waits at a threadgroup barrier or returns.
// Once all simdgroups are there, the barrier is released, or the divergence
// is reported with the call sites involved. Threadgroup memory is one arena,
// refilled with NaN bytes per group. Device buffers come from
// emu_buffer_alloc: their last byte touches a PROT_NONE page, and the SIGSEGV
// handler names the buffer.
#define MUSER_EMU_NO_KEYWORDS
#include "metal_shim.h"

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
struct TgAlloc { size_t offset, bytes; const char* file; int line; };

struct Buffer { uintptr_t data, end, map; size_t map_bytes; int index; };

struct Dispatch {
  void (*entry)(void**) = nullptr;
  void** bufs = nullptr;
  EmuLane lanes[kMaxThreads];
  unsigned n_lanes = 0;
  std::vector<TgAlloc> allocs;
  size_t tg_used = 0;
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
      if (a >= b.end && a < b.end + page_size()) {
        snprintf(buf, sizeof buf, "out-of-bounds access to buffer(%d): byte %lld of a %lld-byte buffer",
                 b.index, (long long)(a - b.data), (long long)(b.end - b.data));
        what = buf;
      } else if (a >= b.map && a < b.map + page_size()) {
        snprintf(buf, sizeof buf, "out-of-bounds access to buffer(%d): %lld bytes before its start",
                 b.index, (long long)(b.data - a));
        what = buf;
      }
    }
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
  int n = 0, done = 0, at_barrier = 0;
  EmuLane* first_done = nullptr;
  for (unsigned i = 0; i < d->n_lanes; ++i) {
    EmuLane* l = &d->lanes[i];
    if (l->simd_index != s) continue;
    if (l->state == 2) { ++done; if (!first_done) first_done = l; continue; }
    if (l->coll.scope == EMU_THREADGROUP) { ++at_barrier; continue; }
    parked[n++] = l;
  }
  if (n == 0) return 0;
  char who[160];
  if (at_barrier) {
    fail_at(d, "divergent collectives in simdgroup %u: some lanes wait at %s (%s:%d), others at a "
               "threadgroup_barrier", s, parked[0]->coll.name, parked[0]->coll.file, parked[0]->coll.line);
    return -1;
  }
  if (done) {
    describe_lane(who, sizeof who, first_done);
    fail_at(d, "divergent %s at %s:%d: %s has already returned while %d lanes wait", parked[0]->coll.name,
            parked[0]->coll.file, parked[0]->coll.line, who, n);
    return -1;
  }
  for (int i = 1; i < n; ++i) {
    if (!same_site(parked[i]->coll, parked[0]->coll)) {
      fail_at(d, "divergent collectives in simdgroup %u: lane %u is at %s (%s:%d), lane %u at %s (%s:%d)", s,
              parked[0]->simd_lane, parked[0]->coll.name, parked[0]->coll.file, parked[0]->coll.line,
              parked[i]->simd_lane, parked[i]->coll.name, parked[i]->coll.file, parked[i]->coll.line);
      return -1;
    }
    if (parked[0]->coll.uniform && parked[i]->coll.key != parked[0]->coll.key) {
      fail_at(d, "%s at %s:%d needs the same address and stride on every lane (lanes %u and %u differ)",
              parked[0]->coll.name, parked[0]->coll.file, parked[0]->coll.line, parked[0]->simd_lane,
              parked[i]->simd_lane);
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
}}  // namespace metal::emu_detail

extern "C" {

EmuLane* emu_current_lane() { return g_lane; }

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

void* emu_tg_alloc(size_t bytes, size_t align, const char* file, int line) {
  Dispatch* d = g_dispatch;
  EmuLane* l = g_lane;
  unsigned k = l->tg_allocs++;
  if (k < d->allocs.size()) {
    const TgAlloc& a = d->allocs[k];
    if (a.bytes != bytes || a.line != line)
      emu_fail("threadgroup array #%u declared differently by thread %u (%s:%d) than by another thread "
               "(%s:%d)", k, l->tid, file, line, a.file, a.line);
    return d->arena + a.offset;
  }
  size_t off = (d->tg_used + align - 1) / align * align;
  if (off + bytes > kThreadgroupLimit)
    emu_fail("threadgroup memory %zu bytes (array at %s:%d) exceeds Metal's limit of %zu bytes", off + bytes,
             file, line, kThreadgroupLimit);
  std::memset(d->arena + off, 0xFF, bytes);  // NaN as float and as half
  d->allocs.push_back({off, bytes, file, line});
  d->tg_used = off + bytes;
  return d->arena + off;
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
  g_buffers.push_back({data, end, map, total, index});
  return reinterpret_cast<void*>(data);
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

// Runs a whole dispatch. grid and group are in threads (dispatchThreads:
// edge groups may be partial). schedule: 0 forward, 1 reverse, 2 random.
// Returns 0, or -1 with a message in err.
int emu_dispatch(void (*entry)(void**), const char* name, void** bufs, const unsigned* grid,
                 const unsigned* group, int schedule, uint64_t seed, char* err, int errlen) {
  static Dispatch* disp = nullptr;
  if (!disp) disp = new Dispatch();
  Dispatch* d = disp;
  d->entry = entry; d->bufs = bufs; d->err = err; d->errlen = errlen; d->failed = false;
  d->kernel_name = name;
  err[0] = 0;
  g_rng = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
  if (!g_rng) g_rng = 1;
  unsigned tg_threads = group[0] * group[1] * group[2];
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
        d->n_lanes = 0;
        d->allocs.clear();
        d->tg_used = 0;
        unsigned tid = 0;
        for (unsigned lz = 0; lz < group[2]; ++lz)
          for (unsigned ly = 0; ly < group[1]; ++ly)
            for (unsigned lx = 0; lx < group[0]; ++lx, ++tid) {
              metal::uint3 pos(gx * group[0] + lx, gy * group[1] + ly, gz * group[2] + lz);
              if (pos.x >= grid[0] || pos.y >= grid[1] || pos.z >= grid[2]) continue;  // partial edge group
              EmuLane* l = &d->lanes[d->n_lanes];
              std::memset(l, 0, sizeof *l);
              l->tpig = pos;
              l->tgpig = metal::uint3(gx, gy, gz);
              l->tptg = metal::uint3(lx, ly, lz);
              l->tptg_dims = metal::uint3(group[0], group[1], group[2]);
              l->groups = metal::uint3(ng[0], ng[1], ng[2]);
              l->grid = metal::uint3(grid[0], grid[1], grid[2]);
              l->tid = tid;
              l->simd_lane = tid % 32;
              l->simd_index = tid / 32;
              l->simds = (tg_threads + 31) / 32;
              l->stack = g_stacks[d->n_lanes];
              l->sp = fiber_init(l->stack, kStackBytes);
              ++d->n_lanes;
            }
        // Lanes are packed in thread-index order, so the simdgroup of lane i is
        // i / 32 only when no lane is skipped before it; the grid check above
        // skips only trailing lanes of each row, which Metal also leaves out.
        if (!run_group(d, schedule)) { rc = -1; goto out; }
      }
out:
  remove_fault_handler();
  g_in_dispatch = false;
  g_dispatch = nullptr;
  g_lane = nullptr;
  return rc;
}

}  // extern "C"
