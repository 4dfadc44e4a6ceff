// The launcher's JSON reader and writer (src/cli/json.hpp): exact 64-bit
// numbers, escapes, strictness, error positions, and writer round trips.
#include <cstdint>
#include <cstdio>
#include <string>

#include "cli/json.hpp"

namespace json = mnemosyne::cli::json;

namespace {

int failures = 0;

void check(bool ok, const char* what, int line) {
  if (!ok) {
    std::fprintf(stderr, "json_test.cpp:%d: FAILED: %s\n", line, what);
    ++failures;
  }
}
#define CHECK(expr) check((expr), #expr, __LINE__)

bool rejects(const std::string& text) {
  return !json::parse(text, nullptr);
}

void numbers() {
  auto v = json::parse("18446744073709551615", nullptr);
  CHECK(v && v->as_u64() && *v->as_u64() == UINT64_MAX);
  v = json::parse("18446744073709551616", nullptr);
  CHECK(v && !v->as_u64() && v->as_double());  // too big for u64, still a number
  v = json::parse("-9223372036854775808", nullptr);
  CHECK(v && v->as_i64() && *v->as_i64() == INT64_MIN && !v->as_u64());
  v = json::parse("0.21", nullptr);
  CHECK(v && !v->as_u64() && v->as_double() && *v->as_double() == 0.21);
  v = json::parse("1e3", nullptr);
  CHECK(v && !v->as_u64() && *v->as_double() == 1000.0);
  CHECK(rejects("01"));
  CHECK(rejects("1."));
  CHECK(rejects(".5"));
  CHECK(rejects("-"));
  CHECK(rejects("1e"));
  CHECK(rejects("+1"));
  CHECK(rejects("NaN"));
}

void strings() {
  auto v = json::parse(R"("a\"b\\c\/d\n\t\u00e9\ud83d\ude00")", nullptr);
  CHECK(v && v->is_string() && v->text() == "a\"b\\c/d\n\t\xc3\xa9\xf0\x9f\x98\x80");
  CHECK(rejects(R"("\ud83d")"));  // lone high surrogate
  CHECK(rejects(R"("\ude00")"));  // lone low surrogate
  CHECK(rejects("\"a\nb\""));     // raw control character
  CHECK(rejects(R"("\x")"));      // unknown escape
  CHECK(rejects(R"("abc)"));      // unterminated
  CHECK(json::quote("a\"\\\n\x01") == R"("a\"\\\n\u0001")");
  CHECK(json::quote("\xff") == R"("\ufffd")");  // invalid UTF-8 stays valid JSON
  CHECK(json::quote("\xc3\xa9") == "\"\xc3\xa9\"");
}

void structure() {
  auto v = json::parse(" {\"a\": [1, true, null, {}], \"b\": {\"c\": \"d\"}, \"a\": 2} ", nullptr);
  CHECK(v && v->is_object() && v->size() == 2);
  const json::Value* a = v ? v->find("a") : nullptr;
  CHECK(a && a->is_array() && a->items().size() == 4);  // the first "a" counts
  CHECK(a && a->items()[1].is_bool() && a->items()[1].boolean());
  CHECK(a && a->items()[2].is_null() && a->items()[3].is_object());
  CHECK(v && v->find("b") && v->find("b")->find("c")->text() == "d");
  CHECK(v && v->find("z") == nullptr);
  CHECK(rejects("{\"a\": 1,}"));
  CHECK(rejects("[1, 2,]"));
  CHECK(rejects("{a: 1}"));
  CHECK(rejects("[1] [2]"));
  CHECK(rejects(""));
  CHECK(rejects("tru"));
  CHECK(rejects(std::string(300, '[') + std::string(300, ']')));  // deeper than 256
  CHECK(!rejects(std::string(200, '[') + std::string(200, ']')));
}

void error_positions() {
  json::ParseError e;
  CHECK(!json::parse("{\n  \"a\": 1,\n  x\n}", &e));
  CHECK(e.line == 3 && e.column == 3);
  CHECK(e.message.find("key") != std::string::npos);
  CHECK(!json::parse("[1, 2", &e));
  CHECK(e.line == 1 && e.message.find("end of input") != std::string::npos);
}

void writer() {
  json::Writer w(false);
  w.begin_object();
  w.key("n").value(std::uint64_t{UINT64_MAX});
  w.key("i").value(-3);
  w.key("d").value(0.5);
  w.key("s").value("x\"y");
  w.key("b").value(false);
  w.key("z").null();
  w.key("a").begin_array().value(1).begin_object().end_object().begin_array().end_array();
  w.end_array();
  w.end_object();
  CHECK(w.str() ==
        R"({"n":18446744073709551615,"i":-3,"d":0.5,"s":"x\"y","b":false,"z":null,"a":[1,{},[]]})");
  auto v = json::parse(w.str(), nullptr);
  CHECK(v && json::serialize(*v, false) == w.str());
  // Pretty output parses back to the same value.
  CHECK(v && json::parse(json::serialize(*v, true), nullptr) &&
        json::serialize(*json::parse(json::serialize(*v, true), nullptr), false) == w.str());
}

}  // namespace

int main() {
  numbers();
  strings();
  structure();
  error_positions();
  writer();
  if (failures != 0) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("json_test: all checks passed\n");
  return 0;
}
