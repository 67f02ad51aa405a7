// The parsed form of a chat template: statements (Node) holding expressions (Expr). Each carries
// its template line and column so a runtime error can say where it happened.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/chat/value.h"

namespace slimkv::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,      // literal
    kName,         // name
    kList,         // children: items
    kTuple,        // children: items (a tuple evaluates to a list)
    kDict,         // children: key, value, key, value, ...
    kAttribute,    // children[0].name
    kSubscript,    // children[0][children[1]]
    kSlice,        // children[0][children[1]:children[2]:children[3]], absent parts null
    kCall,         // children[0](children[1..], keyword_args)
    kFilter,       // children[0] | name(children[1..], keyword_args)
    kTest,         // children[0] is [not] name(children[1..])
    kUnary,        // name ("-", "+", "not") children[0]
    kBinary,       // children[0] name children[1]: + - * / // % ** ~ == != < > <= >= in "not in"
    kAnd,          // children[0] and children[1]
    kOr,           // children[0] or children[1]
    kConditional,  // children[1] if children[0] else children[2] (children[2] may be null)
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  int column = 0;
  Value literal;
  std::string name;
  bool negated = false;  // kTest: `is not`
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> keyword_args;
};

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // conditions[i] -> bodies[i]; a last body without a condition is the else
    kFor,       // for targets in expr [if filter]: bodies[0]; bodies[1] (optional) is the else
    kSet,       // set targets = expr, or set targets[0].attribute = expr
    kSetBlock,  // set targets[0] %} bodies[0] {% endset
    kMacro,     // macro name(params = defaults): bodies[0]
    kFilterBlock,  // filter expr %} bodies[0] {% endfilter: expr is a kFilter whose input is the body
    kBreak,
    kContinue,
  };
  Kind kind = Kind::kText;
  int line = 0;
  int column = 0;
  std::string text;
  std::string name;       // kMacro: its name
  std::string attribute;  // kSet on a namespace: the attribute
  std::vector<std::string> targets;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<ExprPtr> conditions;
  std::vector<std::vector<Node>> bodies;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param, null where none
};

}  // namespace slimkv::chat
