// A small JSON reader and writer for the launcher: `mnemosyne stats` reads
// statistics files, `mnemosyne info --json` and `stats --plot` write JSON.
//
// The reader is strict (RFC 8259: no comments, no trailing commas, no
// leading zeros) and keeps numbers as their text, so 64-bit counters are
// read exactly. Of duplicate keys in an object the first one counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mnemosyne::cli::json {

enum class Kind { null, boolean, number, string, array, object };

class Value {
 public:
  Value() = default;
  static Value make_null() { return Value(); }
  static Value make_bool(bool b);
  static Value make_number(std::string text);  // text must be a valid JSON number
  static Value make_string(std::string text);
  static Value make_array();
  static Value make_object();

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::null; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  bool is_number() const { return kind_ == Kind::number; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_array() const { return kind_ == Kind::array; }
  bool is_object() const { return kind_ == Kind::object; }

  bool boolean() const { return bool_; }
  // A string's contents (UTF-8), or a number's text as written.
  const std::string& text() const { return text_; }

  // A number without fraction or exponent that fits; nullopt otherwise.
  std::optional<std::uint64_t> as_u64() const;
  std::optional<std::int64_t> as_i64() const;
  // Any number; nullopt for other kinds.
  std::optional<double> as_double() const;

  // Arrays.
  const std::vector<Value>& items() const { return items_; }
  void push(Value v) { items_.push_back(std::move(v)); }

  // Objects, in document order.
  std::size_t size() const { return kind_ == Kind::object ? keys_.size() : items_.size(); }
  const std::string& key_at(std::size_t i) const { return keys_[i]; }
  const Value& value_at(std::size_t i) const { return items_[i]; }
  const Value* find(std::string_view key) const;
  void set(std::string key, Value v);

 private:
  Kind kind_ = Kind::null;
  bool bool_ = false;
  std::string text_;
  std::vector<std::string> keys_;  // objects: keys_[i] names items_[i]
  std::vector<Value> items_;
};

struct ParseError {
  std::size_t line = 0;    // 1-based
  std::size_t column = 0;  // 1-based, in bytes
  std::string message;
};

// Parses one JSON text (surrounding white space allowed). nullopt on error,
// with *error filled when error is not null.
std::optional<Value> parse(std::string_view text, ParseError* error);

// `text` as a JSON string literal, quotes included. Invalid UTF-8 bytes are
// written as U+FFFD so the output is always valid JSON.
std::string quote(std::string_view text);

// Writes a Value: compact (one line) or indented by two spaces.
std::string serialize(const Value& v, bool pretty);

// Builds JSON text as it goes, for writers that do not need a Value tree.
class Writer {
 public:
  explicit Writer(bool pretty) : pretty_(pretty) {}
  Writer& begin_object();
  Writer& end_object();
  Writer& begin_array();
  Writer& end_array();
  Writer& key(std::string_view k);
  Writer& value(std::string_view s);
  Writer& value(const char* s) { return value(std::string_view(s)); }
  Writer& value(bool b);
  Writer& value(std::int64_t n);
  Writer& value(std::uint64_t n);
  Writer& value(int n) { return value(static_cast<std::int64_t>(n)); }
  Writer& value(double d);
  Writer& null();
  Writer& raw(const Value& v);  // a whole Value, in this writer's layout
  const std::string& str() const { return out_; }

 private:
  void before_value();
  void newline();

  bool pretty_;
  std::string out_;
  struct Level {
    bool object;
    bool empty;
  };
  std::vector<Level> stack_;
  bool after_key_ = false;
};

}  // namespace mnemosyne::cli::json
