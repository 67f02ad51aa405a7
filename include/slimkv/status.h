// Errors that cross a boundary (files, user input, network): a Status says what failed, naming the
// file/tensor/field and what was expected; Expected<T> is a value or such a Status.
// Inside hot loops invariants are debug assertions instead (see util/check.h).
#pragma once

#include <sstream>
#include <string>
#include <utility>
#include <variant>

namespace slimkv {

class Status {
 public:
  Status() = default;  // ok
  static Status ok() { return Status(); }
  static Status error(std::string message) { return Status(std::move(message), true); }

  bool is_ok() const { return !failed_; }
  explicit operator bool() const { return is_ok(); }
  const std::string& message() const { return message_; }

  // Prefixes context ("loading model.safetensors: ") to an error; ok stays ok.
  Status with_context(const std::string& context) const {
    return failed_ ? Status::error(context + ": " + message_) : *this;
  }

 private:
  Status(std::string message, bool failed) : message_(std::move(message)), failed_(failed) {}
  std::string message_;
  bool failed_ = false;
};

// Joins any streamable values into one string: str_cat("tensor ", name, " has ", n, " dims").
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

template <typename... Args>
Status error(const Args&... args) {
  return Status::error(str_cat(args...));
}

template <typename T>
class Expected {
 public:
  Expected(T value) : value_(std::move(value)) {}
  Expected(Status status) : value_(std::move(status)) {}

  bool has_value() const { return std::holds_alternative<T>(value_); }
  explicit operator bool() const { return has_value(); }
  Status status() const { return has_value() ? Status::ok() : std::get<Status>(value_); }

  T& operator*() { return std::get<T>(value_); }
  const T& operator*() const { return std::get<T>(value_); }
  T* operator->() { return &std::get<T>(value_); }
  const T* operator->() const { return &std::get<T>(value_); }
  T take() { return std::move(std::get<T>(value_)); }

 private:
  std::variant<T, Status> value_;
};

}  // namespace slimkv

#define SLIMKV_CONCAT_INNER(a, b) a##b
#define SLIMKV_CONCAT(a, b) SLIMKV_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` (a Status) failed.
#define SLIMKV_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    ::slimkv::Status slimkv_status_ = (expr);         \
    if (!slimkv_status_.is_ok()) return slimkv_status_; \
  } while (0)

// `SLIMKV_ASSIGN_OR_RETURN(auto x, f());` declares x from an Expected, or returns its error.
#define SLIMKV_ASSIGN_OR_RETURN(lhs, expr) \
  SLIMKV_ASSIGN_OR_RETURN_IMPL(SLIMKV_CONCAT(slimkv_expected_, __LINE__), lhs, expr)
#define SLIMKV_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.has_value()) return tmp.status();         \
  lhs = tmp.take()
