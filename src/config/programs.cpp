// MNEMOSYNE_PROGRAMS: which processes of a tree move their heap. A list of
// names or globs, matched against the names a process was started by.
//
// Written by hand, not with fnmatch(3): it runs in the preloaded library's
// constructor, where nothing may allocate, and it must behave the same on
// Windows, which has no fnmatch.
#include "config/internal.hpp"
#include "config/options.hpp"

namespace mnemosyne::config {
namespace {

using detail::ascii_lower;

char fold(char c, bool fold_case) noexcept {
  return fold_case ? ascii_lower(c) : c;
}

// Matches the bracket expression starting at p[0] == '[' against c; *end is
// set to the character after its ']'. Well-formed (parse_program_list
// checked): "[abc]", "[a-z]", "[!x]" or "[^x]", a ']' first is literal.
bool bracket(const char* p, const char* p_end, char c, bool fold_case, const char** end) noexcept {
  const char* q = p + 1;
  bool negate = false;
  if (q < p_end && (*q == '!' || *q == '^')) {
    negate = true;
    ++q;
  }
  bool hit = false;
  const char* first = q;
  while (q < p_end && (*q != ']' || q == first)) {
    char lo = fold(*q, fold_case);
    char hi = lo;
    if (q + 2 < p_end && q[1] == '-' && q[2] != ']') {
      hi = fold(q[2], fold_case);
      q += 2;
    }
    if (lo <= c && c <= hi) hit = true;
    ++q;
  }
  *end = q < p_end ? q + 1 : q;
  return hit != negate;
}

// True when text[0, t_len) matches pattern[0, p_len): '*' any run of
// characters (separators included), '?' any one, '[...]' one of a set.
// Iterative: a failed '*' only ever backtracks to the latest '*'.
bool glob(const char* p, std::size_t p_len, const char* t, std::size_t t_len,
          bool fold_case) noexcept {
  const char* p_end = p + p_len;
  const char* t_end = t + t_len;
  const char* star = nullptr;       // the latest '*' seen
  const char* star_text = nullptr;  // where the text stood when it was seen
  while (t < t_end) {
    const char c = fold(*t, fold_case);
    if (p < p_end && *p == '*') {
      star = ++p;
      star_text = t;
      continue;
    }
    if (p < p_end && *p == '[') {
      const char* next = nullptr;
      if (bracket(p, p_end, c, fold_case, &next)) {
        p = next;
        ++t;
        continue;
      }
    } else if (p < p_end && (*p == '?' || fold(*p, fold_case) == c)) {
      ++p;
      ++t;
      continue;
    }
    if (star == nullptr) return false;
    p = star;  // let the '*' take one more character
    t = ++star_text;
  }
  while (p < p_end && *p == '*') ++p;
  return p == p_end;
}

bool is_separator(char c, bool windows) noexcept {
  return c == '/' || (windows && c == '\\');
}

// One item of the list, [begin, end).
struct Item {
  const char* begin;
  std::size_t len;
};

// Calls fn(item) for each comma-separated item of `list`; stops and returns
// false when fn does.
template <typename Fn>
bool each_item(const char* list, Fn fn) noexcept {
  const char* p = list;
  for (;;) {
    const char* end = p;
    while (*end != '\0' && *end != ',') ++end;
    if (!fn(Item{p, static_cast<std::size_t>(end - p)})) return false;
    if (*end == '\0') return true;
    p = end + 1;
  }
}

bool well_formed(const Item& item) noexcept {
  if (item.len == 0) return false;
  for (std::size_t i = 0; i < item.len; ++i) {
    const char c = item.begin[i];
    if (c == ' ' || c == '\t') return false;
    if (c != '[') continue;
    std::size_t j = i + 1;
    if (j < item.len && (item.begin[j] == '!' || item.begin[j] == '^')) ++j;
    if (j < item.len && item.begin[j] == ']') ++j;  // a literal ']' first
    while (j < item.len && item.begin[j] != ']') ++j;
    if (j >= item.len) return false;  // '[' never closed
    i = j;
  }
  return true;
}

}  // namespace

bool parse_program_list(const char* text) noexcept {
  if (text == nullptr || *text == '\0') return false;
  return each_item(text, [](const Item& item) { return well_formed(item); });
}

bool program_matches(const char* list, const char* name, bool windows) noexcept {
  if (list == nullptr || name == nullptr || *name == '\0') return false;
  const std::size_t name_len = detail::length(name);
  std::size_t base = name_len;
  while (base > 0 && !is_separator(name[base - 1], windows)) --base;
  bool hit = false;
  each_item(list, [&](const Item& item) {
    bool has_separator = false;
    for (std::size_t i = 0; i < item.len; ++i)
      has_separator |= is_separator(item.begin[i], windows);
    const char* text = has_separator ? name : name + base;
    const std::size_t text_len = has_separator ? name_len : name_len - base;
    hit = glob(item.begin, item.len, text, text_len, windows);
    return !hit;
  });
  return hit;
}

Selection select_process(const Options& o, const char* const* names, std::size_t count,
                         bool windows) noexcept {
  const auto any = [&](const char* list) {
    for (std::size_t i = 0; i < count; ++i) {
      if (program_matches(list, names[i], windows)) return true;
    }
    return false;
  };
  if (o.exclude[0] != '\0' && any(o.exclude)) return Selection::excluded;
  if (o.programs[0] != '\0' && !any(o.programs)) return Selection::not_named;
  return Selection::moves;
}

}  // namespace mnemosyne::config
