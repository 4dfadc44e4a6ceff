// The launcher's JSON reader and writer (see json.hpp).
#include "cli/json.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <system_error>
#include <utility>

namespace mnemosyne::cli::json {

Value Value::make_bool(bool b) {
  Value v;
  v.kind_ = Kind::boolean;
  v.bool_ = b;
  return v;
}

Value Value::make_number(std::string text) {
  Value v;
  v.kind_ = Kind::number;
  v.text_ = std::move(text);
  return v;
}

Value Value::make_string(std::string text) {
  Value v;
  v.kind_ = Kind::string;
  v.text_ = std::move(text);
  return v;
}

Value Value::make_array() {
  Value v;
  v.kind_ = Kind::array;
  return v;
}

Value Value::make_object() {
  Value v;
  v.kind_ = Kind::object;
  return v;
}

std::optional<std::uint64_t> Value::as_u64() const {
  if (kind_ != Kind::number) return std::nullopt;
  std::uint64_t n = 0;
  const char* first = text_.data();
  const char* last = first + text_.size();
  const auto [end, ec] = std::from_chars(first, last, n);
  if (ec != std::errc() || end != last) return std::nullopt;
  return n;
}

std::optional<std::int64_t> Value::as_i64() const {
  if (kind_ != Kind::number) return std::nullopt;
  std::int64_t n = 0;
  const char* first = text_.data();
  const char* last = first + text_.size();
  const auto [end, ec] = std::from_chars(first, last, n);
  if (ec != std::errc() || end != last) return std::nullopt;
  return n;
}

std::optional<double> Value::as_double() const {
  if (kind_ != Kind::number) return std::nullopt;
  double d = 0;
  const char* first = text_.data();
  const char* last = first + text_.size();
  const auto [end, ec] = std::from_chars(first, last, d);
  if (ec == std::errc::result_out_of_range) return text_[0] == '-' ? -HUGE_VAL : HUGE_VAL;
  if (ec != std::errc() || end != last) return std::nullopt;
  return d;
}

const Value* Value::find(std::string_view key) const {
  if (kind_ != Kind::object) return nullptr;
  for (std::size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i] == key) return &items_[i];
  }
  return nullptr;
}

void Value::set(std::string key, Value v) {
  for (std::size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i] == key) {
      items_[i] = std::move(v);
      return;
    }
  }
  keys_.push_back(std::move(key));
  items_.push_back(std::move(v));
}

// ---------------------------------------------------------------------------
// Reader

namespace {

constexpr int kMaxDepth = 256;

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  std::optional<Value> document(ParseError* error) {
    skip_space();
    std::optional<Value> v = value(0);
    if (v) {
      skip_space();
      if (pos_ != s_.size()) {
        fail("unexpected text after the JSON value");
        v.reset();
      }
    }
    if (!v && error != nullptr) {
      error->line = 1;
      error->column = 1;
      for (std::size_t i = 0; i < err_pos_ && i < s_.size(); ++i) {
        if (s_[i] == '\n') {
          ++error->line;
          error->column = 1;
        } else {
          ++error->column;
        }
      }
      error->message = err_;
    }
    return v;
  }

 private:
  void fail(std::string message) {
    if (err_.empty()) {
      err_ = std::move(message);
      err_pos_ = pos_;
    }
  }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }

  void skip_space() {
    while (!at_end()) {
      const char c = s_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  bool literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) {
      fail("invalid literal (expected " + std::string(word) + ")");
      return false;
    }
    pos_ += word.size();
    return true;
  }

  std::optional<Value> value(int depth) {
    if (depth > kMaxDepth) {
      fail("nesting deeper than 256 levels");
      return std::nullopt;
    }
    if (at_end()) {
      fail("unexpected end of input, expected a value");
      return std::nullopt;
    }
    switch (peek()) {
      case '{':
        return object(depth);
      case '[':
        return array(depth);
      case '"': {
        std::string text;
        if (!string(&text)) return std::nullopt;
        return Value::make_string(std::move(text));
      }
      case 't':
        if (!literal("true")) return std::nullopt;
        return Value::make_bool(true);
      case 'f':
        if (!literal("false")) return std::nullopt;
        return Value::make_bool(false);
      case 'n':
        if (!literal("null")) return std::nullopt;
        return Value::make_null();
      default:
        break;
    }
    if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return number();
    fail(std::string("unexpected character '") + peek() + "', expected a value");
    return std::nullopt;
  }

  bool digits() {
    const std::size_t start = pos_;
    while (!at_end() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    return pos_ > start;
  }

  std::optional<Value> number() {
    const std::size_t start = pos_;
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
      if (peek() >= '0' && peek() <= '9') {
        fail("a number may not have a leading zero");
        return std::nullopt;
      }
    } else if (!digits()) {
      fail("expected a digit");
      return std::nullopt;
    }
    if (peek() == '.') {
      ++pos_;
      if (!digits()) {
        fail("expected a digit after the decimal point");
        return std::nullopt;
      }
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!digits()) {
        fail("expected a digit in the exponent");
        return std::nullopt;
      }
    }
    return Value::make_number(std::string(s_.substr(start, pos_ - start)));
  }

  bool hex4(unsigned* out) {
    if (pos_ + 4 > s_.size()) {
      fail("incomplete \\u escape");
      return false;
    }
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<unsigned>(c - 'A' + 10);
      } else {
        --pos_;
        fail("invalid hex digit in \\u escape");
        return false;
      }
    }
    *out = v;
    return true;
  }

  static void append_utf8(std::string* out, unsigned cp) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  bool string(std::string* out) {
    ++pos_;  // the opening quote
    for (;;) {
      if (at_end()) {
        fail("unterminated string");
        return false;
      }
      const char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) {
        fail("control character in a string (write it as an escape)");
        return false;
      }
      if (c != '\\') {
        out->push_back(c);
        ++pos_;
        continue;
      }
      ++pos_;
      if (at_end()) {
        fail("unterminated escape");
        return false;
      }
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          unsigned cp = 0;
          if (!hex4(&cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            unsigned low = 0;
            if (s_.substr(pos_, 2) != "\\u") {
              fail("high surrogate without a low surrogate");
              return false;
            }
            pos_ += 2;
            if (!hex4(&low)) return false;
            if (low < 0xDC00 || low > 0xDFFF) {
              fail("high surrogate without a low surrogate");
              return false;
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("low surrogate without a high surrogate");
            return false;
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --pos_;
          fail(std::string("invalid escape '\\") + e + "'");
          return false;
      }
    }
  }

  std::optional<Value> array(int depth) {
    ++pos_;  // [
    Value v = Value::make_array();
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return v;
    }
    for (;;) {
      skip_space();
      std::optional<Value> item = value(depth + 1);
      if (!item) return std::nullopt;
      v.push(std::move(*item));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return v;
      }
      fail(at_end() ? "unexpected end of input in an array" : "expected ',' or ']' in an array");
      return std::nullopt;
    }
  }

  std::optional<Value> object(int depth) {
    ++pos_;  // {
    Value v = Value::make_object();
    skip_space();
    if (peek() == '}') {
      ++pos_;
      return v;
    }
    for (;;) {
      skip_space();
      if (peek() != '"') {
        fail(at_end() ? "unexpected end of input in an object" : "expected a key (a string)");
        return std::nullopt;
      }
      std::string key;
      if (!string(&key)) return std::nullopt;
      skip_space();
      if (peek() != ':') {
        fail("expected ':' after a key");
        return std::nullopt;
      }
      ++pos_;
      skip_space();
      std::optional<Value> item = value(depth + 1);
      if (!item) return std::nullopt;
      if (v.find(key) == nullptr) v.set(std::move(key), std::move(*item));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return v;
      }
      fail(at_end() ? "unexpected end of input in an object" : "expected ',' or '}' in an object");
      return std::nullopt;
    }
  }

  std::string_view s_;
  std::size_t pos_ = 0;
  std::string err_;
  std::size_t err_pos_ = 0;
};

// Length of the valid UTF-8 sequence at s[i], or 0 when it is not one.
std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  std::size_t n = 0;
  unsigned cp = 0;
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) {
    n = 2;
    cp = b & 0x1F;
  } else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    cp = b & 0x0F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    cp = b & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3F);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
  if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
  return n;
}

}  // namespace

std::optional<Value> parse(std::string_view text, ParseError* error) {
  return Parser(text).document(error);
}

// ---------------------------------------------------------------------------
// Writer

std::string quote(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out.push_back('"');
  for (std::size_t i = 0; i < text.size();) {
    const char c = text[i];
    switch (c) {
      case '"':
        out += "\\\"";
        ++i;
        continue;
      case '\\':
        out += "\\\\";
        ++i;
        continue;
      case '\n':
        out += "\\n";
        ++i;
        continue;
      case '\r':
        out += "\\r";
        ++i;
        continue;
      case '\t':
        out += "\\t";
        ++i;
        continue;
      case '\b':
        out += "\\b";
        ++i;
        continue;
      case '\f':
        out += "\\f";
        ++i;
        continue;
      default:
        break;
    }
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
      ++i;
      continue;
    }
    const std::size_t n = utf8_length(text, i);
    if (n == 0) {
      out += "\\ufffd";
      ++i;
      continue;
    }
    out.append(text.substr(i, n));
    i += n;
  }
  out.push_back('"');
  return out;
}

void Writer::newline() {
  if (!pretty_) return;
  out_.push_back('\n');
  out_.append(2 * stack_.size(), ' ');
}

void Writer::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (stack_.empty()) return;
  Level& top = stack_.back();
  if (!top.empty) out_.push_back(',');
  top.empty = false;
  newline();
}

Writer& Writer::begin_object() {
  before_value();
  out_.push_back('{');
  stack_.push_back({true, true});
  return *this;
}

Writer& Writer::end_object() {
  const bool empty = stack_.back().empty;
  stack_.pop_back();
  if (!empty) newline();
  out_.push_back('}');
  if (stack_.empty() && pretty_) out_.push_back('\n');
  return *this;
}

Writer& Writer::begin_array() {
  before_value();
  out_.push_back('[');
  stack_.push_back({false, true});
  return *this;
}

Writer& Writer::end_array() {
  const bool empty = stack_.back().empty;
  stack_.pop_back();
  if (!empty) newline();
  out_.push_back(']');
  if (stack_.empty() && pretty_) out_.push_back('\n');
  return *this;
}

Writer& Writer::key(std::string_view k) {
  before_value();
  out_ += quote(k);
  out_ += pretty_ ? ": " : ":";
  after_key_ = true;
  return *this;
}

Writer& Writer::value(std::string_view s) {
  before_value();
  out_ += quote(s);
  return *this;
}

Writer& Writer::value(bool b) {
  before_value();
  out_ += b ? "true" : "false";
  return *this;
}

Writer& Writer::value(std::int64_t n) {
  before_value();
  out_ += std::to_string(n);
  return *this;
}

Writer& Writer::value(std::uint64_t n) {
  before_value();
  out_ += std::to_string(n);
  return *this;
}

Writer& Writer::value(double d) {
  before_value();
  if (!std::isfinite(d)) {
    out_ += "null";
    return *this;
  }
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d);
  out_.append(buf, ec == std::errc() ? end : buf);
  return *this;
}

Writer& Writer::null() {
  before_value();
  out_ += "null";
  return *this;
}

Writer& Writer::raw(const Value& v) {
  switch (v.kind()) {
    case Kind::null:
      return null();
    case Kind::boolean:
      return value(v.boolean());
    case Kind::number:
      before_value();
      out_ += v.text();
      return *this;
    case Kind::string:
      return value(std::string_view(v.text()));
    case Kind::array:
      begin_array();
      for (const Value& item : v.items()) raw(item);
      return end_array();
    case Kind::object:
      begin_object();
      for (std::size_t i = 0; i < v.size(); ++i) {
        key(v.key_at(i));
        raw(v.value_at(i));
      }
      return end_object();
  }
  return *this;
}

std::string serialize(const Value& v, bool pretty) {
  Writer w(pretty);
  w.raw(v);
  return w.str();
}

}  // namespace mnemosyne::cli::json
