// A test harness that has never heard of mnemosyne: it allocates the ways
// Windows programs do and prints every block's address, so the runner can
// check where each landed (tests/windows/run_windows.py). It checks its own
// data, so a block that moved or was damaged fails the run.
//
//   harness.exe              every case below, then three children: one with
//                            this environment, one with a copy given
//                            explicitly, one with a fresh environment
//   harness.exe child LABEL  a few blocks, printed with the prefix LABEL
#include <malloc.h>
#include <windows.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "early.h"

namespace {

int g_failures = 0;

void show(const char* what, const void* p, std::size_t size) {
  std::printf("block %s %p %zu\n", what, p, size);
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAILED %s\n", what);
    ++g_failures;
  }
}

void fill(void* p, std::size_t n, unsigned seed) {
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(seed + i * 7);
}

bool same(const void* p, std::size_t n, unsigned seed) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    if (b[i] != static_cast<unsigned char>(seed + i * 7)) return false;
  }
  return true;
}

void c_heap() {
  void* m = std::malloc(100);
  show("malloc", m, 100);
  fill(m, 100, 1);
  void* c = std::calloc(10, 50);
  show("calloc", c, 500);
  bool zero = true;
  for (int i = 0; i < 500; ++i) zero = zero && static_cast<char*>(c)[i] == 0;
  check(zero, "calloc zeroes");
  check(_msize(m) >= 100, "_msize of a malloc block");
  // A realloc chain: grows across size classes, keeps the data.
  void* r = std::malloc(16);
  fill(r, 16, 3);
  std::size_t last = 16;  // the chain ends at 512 KiB
  for (std::size_t n = 32; n <= (std::size_t{1} << 20); n *= 4) {
    r = std::realloc(r, n);
    check(r != nullptr && same(r, 16, 3), "realloc keeps the data");
    last = n;
  }
  show("realloc", r, last);
  check(same(m, 100, 1), "malloc block intact");
  std::free(m);
  std::free(c);
  std::free(r);
#ifdef _UCRT
  void* z = _recalloc(nullptr, 10, 10);
  fill(z, 100, 5);
  z = _recalloc(z, 100, 10);
  bool tail_zero = same(z, 100, 5);
  for (int i = 100; i < 1000; ++i) tail_zero = tail_zero && static_cast<char*>(z)[i] == 0;
  check(tail_zero, "_recalloc keeps and zeroes");
  show("recalloc", z, 1000);
  std::free(z);
#endif
  void* a = _aligned_malloc(1000, 256);
  show("aligned_malloc", a, 1000);
  check((reinterpret_cast<std::uintptr_t>(a) & 255) == 0, "_aligned_malloc aligns");
  a = _aligned_realloc(a, 5000, 256);
  check((reinterpret_cast<std::uintptr_t>(a) & 255) == 0, "_aligned_realloc aligns");
  _aligned_free(a);
  void* o = _aligned_offset_malloc(200, 64, 8);
  show("aligned_offset_malloc", o, 200);
  check(((reinterpret_cast<std::uintptr_t>(o) + 8) & 63) == 0, "_aligned_offset_malloc aligns");
  fill(o, 200, 9);
  o = _aligned_offset_realloc(o, 3000, 64, 8);
  check(((reinterpret_cast<std::uintptr_t>(o) + 8) & 63) == 0 && same(o, 200, 9),
        "_aligned_offset_realloc aligns and keeps");
  show("aligned_offset_realloc", o, 3000);
  _aligned_free(o);
  // _expand: in place or not at all.
  void* e = std::malloc(100);
  void* grown = _expand(e, 90);
  check(grown == nullptr || grown == e, "_expand stays in place");
  show("expand", e, 100);
  std::free(e);
  char* s = _strdup("a string the harness duplicates");
  show("strdup", s, std::strlen(s) + 1);
  check(std::strcmp(s, "a string the harness duplicates") == 0, "_strdup copies");
  std::free(s);
  wchar_t* w = _wcsdup(L"wide");
  show("wcsdup", w, 10);
  check(std::wcscmp(w, L"wide") == 0, "_wcsdup copies");
  std::free(w);
  void* big = std::malloc(std::size_t{48} << 20);  // larger than an arena block
  show("malloc_large", big, std::size_t{48} << 20);
  std::memset(big, 1, std::size_t{48} << 20);
  std::free(big);
}

void cxx_heap() {
  auto* v = new std::vector<int>(1000, 7);
  show("new", v, sizeof *v);
  show("vector", v->data(), v->size() * sizeof(int));
  std::string text(300, 'x');
  show("string", text.data(), text.size());
  delete v;
  struct alignas(64) Wide {
    char bytes[64];
  };
  auto* wide = new Wide;
  show("new_aligned", wide, sizeof *wide);
  check((reinterpret_cast<std::uintptr_t>(wide) & 63) == 0, "aligned new aligns");
  delete wide;
}

// Threads allocate; the main thread frees what they allocated. Win32
// threads, as Windows programs start them (and the ucrt build has no
// winpthreads).
constexpr int kThreads = 4, kBlocks = 2000;
std::vector<void*> g_made[kThreads];

DWORD WINAPI allocate_some(void* arg) {
  const auto t = static_cast<int>(reinterpret_cast<std::intptr_t>(arg));
  for (int i = 0; i < kBlocks; ++i) {
    const std::size_t n = 8 + (i * 37) % 2000;
    void* p = std::malloc(n);
    fill(p, n < 16 ? n : 16, static_cast<unsigned>(t + i));
    g_made[t].push_back(p);
    if (i % 3 == 0) {
      std::free(g_made[t].back());
      g_made[t].pop_back();
    }
  }
  return 0;
}

void threads() {
  HANDLE pool[kThreads];
  for (int t = 0; t < kThreads; ++t) {
    pool[t] = CreateThread(nullptr, 0, &allocate_some, reinterpret_cast<void*>(std::intptr_t{t}), 0,
                           nullptr);
  }
  WaitForMultipleObjects(kThreads, pool, TRUE, INFINITE);
  for (int t = 0; t < kThreads; ++t) {
    CloseHandle(pool[t]);
    show("thread", g_made[t].front(), 8);
    bool intact = true;
    for (std::size_t i = 0; i < g_made[t].size(); ++i) {
      intact = intact && g_made[t][i] != nullptr;
      std::free(g_made[t][i]);  // cross-thread frees
    }
    check(intact, "thread blocks");
  }
}

// A DLL loaded now allocates through its own imports.
void late_dll() {
  HMODULE late = LoadLibraryA("late.dll");
  check(late != nullptr, "late.dll loads");
  if (late == nullptr) return;
  using Fn = void* (*)(std::size_t);
  auto alloc = reinterpret_cast<Fn>(reinterpret_cast<void*>(GetProcAddress(late, "late_alloc")));
  void* p = alloc(4096);
  show("late_dll", p, 4096);
  std::free(p);  // across modules: the harness's free, the DLL's malloc
  // A heap function found by name, as plugin loaders and language runtimes do.
  using Malloc = void* (*)(std::size_t);
  auto by_name = reinterpret_cast<Malloc>(
      reinterpret_cast<void*>(GetProcAddress(GetModuleHandleA("msvcrt.dll"), "malloc")));
  if (by_name == nullptr) {
    by_name = reinterpret_cast<Malloc>(
        reinterpret_cast<void*>(GetProcAddress(GetModuleHandleA("ucrtbase.dll"), "malloc")));
  }
  void* q = by_name(777);
  show("getprocaddress", q, 777);
  std::free(q);
}

// Blocks allocated before injection (by early.dll's DllMain) are freed and
// resized now.
void early_blocks() {
  void* e = early_block(0);
  check(e != nullptr && std::strcmp(static_cast<char*>(e), "early") == 0, "early block intact");
  std::free(e);
  void* g = early_block(1);
  g = std::realloc(g, 100000);
  check(g != nullptr && std::strcmp(static_cast<char*>(g), "early") == 0, "early realloc keeps");
  show("early_realloc", g, 100000);
  std::free(g);
  std::printf("early_msize %zu\n", _msize(early_block(2)));
  std::free(early_block(2));
}

// The program's own import table, as tools that inspect it see it: the same
// with and without injection (an injector that rewrote it puts it back).
void own_imports() {
  auto* base = reinterpret_cast<unsigned char*>(GetModuleHandleA(nullptr));
  const auto* dos = reinterpret_cast<const IMAGE_DOS_HEADER*>(base);
  const auto* nt = reinterpret_cast<const IMAGE_NT_HEADERS*>(base + dos->e_lfanew);
  const IMAGE_DATA_DIRECTORY& dir = nt->OptionalHeader.DataDirectory[IMAGE_DIRECTORY_ENTRY_IMPORT];
  std::string names;
  for (auto* d = reinterpret_cast<const IMAGE_IMPORT_DESCRIPTOR*>(base + dir.VirtualAddress);
       d->Name != 0; ++d) {
    names += " ";
    names += reinterpret_cast<const char*>(base + d->Name);
  }
  std::printf("imports%s\n", names.c_str());
}

// Frees at exit: from a static destructor, an atexit handler, and early.dll's
// DLL_PROCESS_DETACH (after every DLL loaded later has detached).
struct Leftovers {
  void* block = nullptr;
  ~Leftovers() { std::free(block); }
} g_leftovers;
void* g_at_exit = nullptr;

void exit_frees() {
  g_leftovers.block = std::malloc(1000);
  g_at_exit = std::malloc(2000);
  std::atexit([] { std::free(g_at_exit); });
  for (int i = 0; i < 16; ++i) early_keep(std::malloc(100 + i * 1000));
  early_keep(std::malloc(std::size_t{40} << 20));
}

// Starts "harness.exe child LABEL": with this process's environment, or
// with the block `env` (an explicit environment, as env -i would give).
int run_child(const char* self, const char* label, const char* env) {
  STARTUPINFOA si{};
  si.cb = sizeof si;
  PROCESS_INFORMATION pi{};
  std::string cmd = std::string("\"") + self + "\" child " + label;
  if (!CreateProcessA(nullptr, cmd.data(), nullptr, nullptr, TRUE, 0, const_cast<char*>(env),
                      nullptr, &si, &pi)) {
    std::printf("FAILED CreateProcessA %lu\n", GetLastError());
    return 1;
  }
  WaitForSingleObject(pi.hProcess, INFINITE);
  DWORD code = 1;
  GetExitCodeProcess(pi.hProcess, &code);
  CloseHandle(pi.hThread);
  CloseHandle(pi.hProcess);
  return static_cast<int>(code);
}

int children(const char* self) {
  int failures = run_child(self, "child", nullptr);
  // A copy of this environment, given explicitly.
  std::string copy;
  char* block = GetEnvironmentStringsA();
  for (const char* e = block; *e != '\0'; e += std::strlen(e) + 1) copy.append(e).push_back('\0');
  FreeEnvironmentStringsA(block);
  copy.push_back('\0');
  failures += run_child(self, "envchild", copy.data());
  // A fresh one with nothing but what Windows needs.
  char system_root[MAX_PATH] = {};
  GetEnvironmentVariableA("SystemRoot", system_root, sizeof system_root);
  std::string fresh = std::string("SystemRoot=") + system_root;
  fresh.push_back('\0');
  fresh.push_back('\0');
  failures += run_child(self, "cleanchild", fresh.data());
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);  // the child's lines interleave whole
  if (argc > 2 && std::strcmp(argv[1], "child") == 0) {
    const std::string label = argv[2];
    void* p = std::malloc(321);
    show((label + "_malloc").c_str(), p, 321);
    std::free(p);
    auto* v = new int[100];
    show((label + "_new").c_str(), v, 400);
    delete[] v;
    return 0;
  }
  c_heap();
  cxx_heap();
  threads();
  late_dll();
  early_blocks();
  own_imports();
  exit_frees();
  check(children(argv[0]) == 0, "children exit 0");
  std::printf("%s %d\n", g_failures == 0 ? "harness: ok" : "harness: failures", g_failures);
  return g_failures == 0 ? 0 : 1;
}
