// The chat-template interpreter on hand-made templates: each expected output is what Jinja2 3.1.6
// configured as transformers configures it renders (checked with python3-jinja2); bad templates
// and runtime errors give the documented messages with their line and column; the loader finds
// templates where transformers saves them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sanitizer.h"
#include "tokenizer/chat/chat_template.h"
#include "source_dir.h"

namespace slimkv {
namespace {

using OrderedJson = nlohmann::ordered_json;

struct TemplateCase {
  const char* name;
  const char* source;
  const char* expected;
};

// Variables every case sees (besides messages): name = "Wörld", n = 7.
const TemplateCase kCases[] = {
    {"text_only",
     R"~~(Hello {{ name }}!)~~",
     R"~~(Hello Wörld!)~~"},
    {"trim_lstrip",
     R"~~(<{% if true %}
    yes
  {% endif %}
>)~~",
     R"~~(<    yes
>)~~"},
    {"dash_control",
     R"~~(a  {{- ' b ' -}}  c
  {%- if true -%}
  d  
{%- endif %})~~",
     R"~~(a b cd)~~"},
    {"plus_keeps",
     R"~~(x
    {%+ if true %}y{% endif %})~~",
     R"~~(x
    y)~~"},
    {"comment_lstrip",
     R"~~(a
    {# note #}
b)~~",
     R"~~(a
b)~~"},
    {"loop_vars",
     R"~~({% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.length }}{{ '^' if loop.first }}{{ '$' if loop.last }}:{{ m.role }}{% if not loop.last %},{% endif %}{% endfor %})~~",
     R"~~(1/0/3/3^:system,2/1/2/3:user,3/2/1/3$:assistant)~~"},
    {"loop_prev_next",
     R"~~({% for x in [1,2,3] %}[{{ loop.previtem is defined }}{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %})~~",
     R"~~([False|2][True1|3][True2|])~~"},
    {"loop_filter_else",
     R"~~({% for m in messages if m.role != 'system' %}{{ m.role }}{{ loop.length }} {% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %})~~",
     R"~~(user2 assistant2 |empty)~~"},
    {"break_continue",
     R"~~({% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}{{ x }}{% endfor %})~~",
     R"~~(0134)~~"},
    {"scoping_namespace",
     R"~~({% set count = 0 %}{% set ns = namespace(count=0, seen=[]) %}{% for x in [1,2,3] %}{% set count = count + x %}{% set ns.count = ns.count + x %}{% endfor %}{{ count }} {{ ns.count }})~~",
     R"~~(0 6)~~"},
    {"macro",
     R"~~({% macro greet(who, punct='!') %}Hi {{ who }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(who='c', punct='.') }})~~",
     R"~~(Hi a! Hi b? Hi c.)~~"},
    {"macro_recursion",
     R"~~({% macro render(v) %}{% if v is mapping %}{{ '{' }}{% for k, x in v|items %}{{ k }}={{ render(x) }};{% endfor %}{{ '}' }}{% elif v is string %}'{{ v }}'{% elif v is iterable %}[{% for x in v %}{{ render(x) }}{% endfor %}]{% else %}{{ v }}{% endif %}{% endmacro %}{{ render(messages[2].tool_calls[0].function) }})~~",
     R"~~({name='f';arguments={b=1;a=[12.5NoneTrue];};})~~"},
    {"set_block",
     R"~~({% set body %}[{{ name | upper }}]{% endset %}{{ body ~ body | length }})~~",
     R"~~([WÖRLD]7)~~"},
    {"python_repr",
     R"~~({{ [1, 'a', "it's", none, true, 2.0, 1e20, 0.1, {'k': [False]}] }} {{ none }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1.5 * 2 }})~~",
     R"~~([1, 'a', "it's", None, True, 2.0, 1e+20, 0.1, {'k': [False]}] None 3.5 3 -4 2 1024 3.0)~~"},
    {"strings",
     R"~~({{ '  pad  ' | trim }}|{{ 'ab' ~ 1 ~ none }}|{{ name | upper }}{{ name | lower }}|{{ 'hello wORLD-x(y' | title }}|{{ 'hELLO' | capitalize }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'x\n\ny'.strip() }}|{{ 'xxhixx'.strip('x') }}{{ 'xxhi'.lstrip('x') }}{{ 'hixx'.rstrip('x') }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'a-b' | replace('-', '+') }})~~",
     R"~~(pad|ab1None|WÖRLDwörld|Hello World-X(Y|Hello|['a', 'b', '', 'c']|['a', 'b']|x

y|hihihi|TrueTrue|bba|a+b)~~"},
    {"slicing",
     R"~~({{ [1,2,3,4][1:] }}{{ [1,2,3,4][::-1] }}{{ [1,2,3,4][:-1] }}{{ [1,2,3,4][-2:] }}{{ 'Wörld'[1:3] }}{{ 'Wörld'[::-1] }}{{ [1,2,3,4,5][::2] }}{{ messages[-1].role }})~~",
     R"~~([2, 3, 4][4, 3, 2, 1][1, 2, 3][3, 4]ördlröW[1, 3, 5]assistant)~~"},
    {"tests",
     R"~~({{ name is string }}{{ n is number }}{{ n is integer }}{{ messages is sequence }}{{ messages[0] is mapping }}{{ undefined_thing is defined }}{{ none is none }}{{ n is not none }}{{ n is odd }}{{ n is even }}{{ n is divisibleby 7 }}{{ true is true }}{{ 0 is false }}{{ 'a' is in 'cat' }}{{ 'b' is equalto 'b' }}{{ messages[0].content is string }})~~",
     R"~~(TrueTrueTrueTrueTrueFalseTrueTrueTrueFalseTrueTrueFalseTrueTrueTrue)~~"},
    {"in_operator",
     R"~~({{ 'Hi' in 'Hi there' }}{{ 'x' not in ['a'] }}{{ 'role' in messages[0] }}{{ 'tool_calls' in messages[1] }}{{ 2 in [1,2] }})~~",
     R"~~(TrueTrueTrueFalseTrue)~~"},
    {"ternary_and_or",
     R"~~({{ 'a' if n > 5 else 'b' }}{{ 'c' if n < 5 }}{{ n and 'yes' }}{{ 0 or 'fallback' }}{{ not n }})~~",
     R"~~(ayesfallbackFalse)~~"},
    {"filters_lists",
     R"~~({{ messages | map(attribute='role') | join(', ') }}|{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|{{ messages | rejectattr('role', 'equalto', 'user') | map(attribute='role') | list }}|{{ [3,1,2] | first }}{{ [3,1,2] | last }}{{ 'abc' | first }}|{{ undefined_thing | default('dflt') }}{{ '' | default('e', true) }}|{{ [1,2] | reverse | list }}|{{ ['a', 'b'] | join }}|{{ messages | selectattr('tool_calls', 'defined') | list | length }}|{{ [1,2,2,3] | unique | list }})~~",
     R"~~(system, user, assistant|1|['system', 'assistant']|32a|dflte|[2, 1]|ab|1|[1, 2, 3])~~"},
    {"items_and_dict",
     R"~~({% for k, v in messages[2].tool_calls[0].function.arguments.items() %}{{ k }}:{{ v }};{% endfor %}{{ {'z': 1, 'a': 2} }}{{ {'k': 'v'}.get('k') }}{{ {'k': 'v'}.get('q', 'd') }}{{ dict(a=1) }})~~",
     R"~~(b:1;a:[1, 2.5, None, True];{'z': 1, 'a': 2}vd{'a': 1})~~"},
    {"tojson",
     R"~~({{ messages[2].tool_calls[0].function | tojson }}
{{ {'s': 'Grüße "q"\n', 'e': [], 'd': {}} | tojson(indent=2) }}
{{ [1, {'a': none}] | tojson(indent=4) }}
{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}
{{ 'ü' | tojson(ensure_ascii=true) }})~~",
     R"~~({"name": "f", "arguments": {"b": 1, "a": [1, 2.5, null, true]}}
{
  "s": "Grüße \"q\"\n",
  "e": [],
  "d": {}
}
[
    1,
    {
        "a": null
    }
]
{"a": 2, "b": 1}
"\u00fc")~~"},
    {"string_concat_number",
     R"~~({{ 'n=' ~ n }}{{ (n + 1.5) | string }}{{ '5' | int + 1 }}{{ 'x' | int }}{{ '2.5' | float }}{{ -3 | abs }})~~",
     R"~~(n=78.5602.53)~~"},
    {"indent_filter",
     R"~~({{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }})~~",
     R"~~(a
  b

  c|  a
  b)~~"},
    {"raw_block",
     R"~~({% raw %}{{ not rendered }}{% endraw %})~~",
     R"~~({{ not rendered }})~~"},
    {"undefined_prints_empty",
     R"~~([{{ missing }}][{{ messages[0].missing }}][{{ messages[10] }}])~~",
     R"~~([][][])~~"},
    {"string_methods_more",
     R"~~({{ 'ab' * 3 }}{{ [0] * 2 }}{{ 'Hello'.find('l') }}{{ 'a.b.c'.split('.', 1) }}{{ 'abc'.upper() }}{{ ', '.join(['x', 'y']) }})~~",
     R"~~(ababab[0, 0]2['a', 'b.c']ABCx, y)~~"},
    {"chained_filters_precedence",
     R"~~({{ -1 | abs }}{{ 1 + 2 * 3 }}{{ (1 + 2) * 3 }}{{ 'a' ~ 'b' | upper }}{{ not true == false }})~~",
     R"~~(179aBTrue)~~"},
    {"filter_block",
     R"~~({% filter upper %}ab{{ name }}{% endfilter %}|{%- filter trim -%}  x  {%- endfilter %}|{% filter replace('a', 'o') | upper %}banana{% endfilter %})~~",
     R"~~(ABWÖRLD|x|BONONO)~~"},
    {"generators",
     R"~~({% if messages | selectattr('role', 'equalto', 'nobody') %}gen-true{% endif %}{{ messages | map(attribute='role') | list }}{{ none | map(attribute='x') | list }}{{ messages | selectattr('role', 'equalto', 'user') | first }})~~",
     R"~~(gen-true['system', 'user', 'assistant'][]{'role': 'user', 'content': 'Hi'})~~"},
    {"markup",
     R"~~({{ '<b>'|safe + '<i>' }}{{ '<x>' | e }}{{ ('a'|safe) ~ '<' }}{{ ('<'|e|e) }})~~",
     R"~~(<b>&lt;i&gt;&lt;x&gt;a<&lt;)~~"},
    {"dictsort",
     R"~~({{ {'b': 1, 'A': 2, 'c': 0} | dictsort }}{{ {'b': 'y', 'a': 'x'} | dictsort(by='value', reverse=true) }})~~",
     R"~~([('A', 2), ('b', 1), ('c', 0)][('b', 'y'), ('a', 'x')])~~"},
    {"tuples",
     R"~~({{ (1, 'a') }}{{ {'k': 1}.items() | list }}{{ (1,) }}{% for k, v in {'x': 1}|items %}{{ k }}{{ v }}{% endfor %})~~",
     R"~~((1, 'a')[('k', 1)](1,)x1)~~"},
};

OrderedJson case_messages() {
  return OrderedJson::parse(R"([
    {"role": "system", "content": "Sys"},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Yo",
     "tool_calls": [{"function": {"name": "f", "arguments": {"b": 1, "a": [1, 2.5, null, true]}}}]}])");
}

Expected<std::string> render_source(const std::string& source, const OrderedJson& messages = case_messages(),
                                     OrderedJson extra = OrderedJson::object()) {
  SLIMKV_ASSIGN_OR_RETURN(ChatTemplate chat, ChatTemplate::from_source(source, "<s>", "</s>"));
  if (!extra.contains("name")) extra["name"] = "Wörld";
  if (!extra.contains("n")) extra["n"] = 7;
  return chat.render(messages, false, extra);
}

TEST(ChatTemplateInterpreter, RendersAsJinja2) {
  for (const TemplateCase& c : kCases) {
    const Expected<std::string> rendered = render_source(c.source);
    ASSERT_TRUE(rendered.has_value()) << c.name << ": " << rendered.status().message();
    EXPECT_EQ(*rendered, c.expected) << c.name;
  }
}

TEST(ChatTemplateInterpreter, SpecialTokensAndGenerationPrompt) {
  Expected<ChatTemplate> chat = ChatTemplate::from_source(
      "{{ bos_token }}{% for m in messages %}{{ m.role }}{% endfor %}{% if add_generation_prompt %}>{% endif %}"
      "{{ eos_token is defined }}{{ tools is none }}",
      "<s>", std::nullopt);
  ASSERT_TRUE(chat.has_value());
  const OrderedJson messages = OrderedJson::parse(R"([{"role": "user", "content": "x"}])");
  EXPECT_EQ(*chat->render(messages, true), "<s>user>FalseTrue");
  EXPECT_EQ(*chat->render(messages, false), "<s>userFalseTrue");
}

TEST(ChatTemplateInterpreter, StrftimeNowUsesTheClock) {
  Expected<ChatTemplate> chat = ChatTemplate::from_source("{{ strftime_now('%d %b %Y') }}");
  ASSERT_TRUE(chat.has_value());
  std::tm fixed{};
  fixed.tm_year = 125;
  fixed.tm_mon = 1;
  fixed.tm_mday = 3;
  chat->set_clock([fixed] { return fixed; });
  EXPECT_EQ(*chat->render(OrderedJson::parse(R"([{"role": "user"}])"), true), "03 Feb 2025");
}

TEST(ChatTemplateInterpreter, ContentPartsAndKeyOrder) {
  // Keys print in the order the client sent them (transformers' dicts keep insertion order).
  const OrderedJson messages = OrderedJson::parse(
      R"([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]}])");
  const Expected<std::string> rendered = render_source(
      "{% for p in messages[0].content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}"
      "{{ messages[0].content[0] | tojson }}",
      messages);
  ASSERT_TRUE(rendered.has_value()) << rendered.status().message();
  EXPECT_EQ(*rendered, R"(ab{"type": "text", "text": "a"})");
}

struct ErrorCase {
  const char* name;
  const char* source;
  const char* expected_message;  // the whole Status message
};

const ErrorCase kErrors[] = {
    {"unclosed_if", "x\n{% if true %}y",
     "chat template line 2, column 1: unclosed '{% if %}': expected '{% elif %}' or '{% else %}' or '{% endif %}' "
     "before the end of the template"},
    {"unclosed_for", "{% for m in messages %}{% if true %}{% endif %}",
     "chat template line 1, column 1: unclosed '{% for %}': expected '{% else %}' or '{% endfor %}' before the end of "
     "the template"},
    {"unterminated_expression", "a {{ x ", "chat template line 1, column 3: unterminated tag: expected '}}'"},
    {"unterminated_statement", "{% if x }}", "chat template line 1, column 1: unterminated tag: expected '%}'"},
    {"unterminated_comment", "a\n  {# note", "chat template line 2, column 3: unterminated comment: expected '#}'"},
    {"unterminated_string", "{{ 'abc }}", "chat template line 1, column 4: unterminated string literal"},
    {"stray_end", "{% endfor %}", "chat template line 1, column 1: unexpected '{% endfor %}' with no open block it could close"},
    {"unknown_statement", "{% include 'other.jinja' %}",
     "chat template line 1, column 1: unknown statement '{% include %}' (supported: if, elif, else, for, set, macro, "
     "filter, break, continue, raw, generation)"},
    {"empty_expression", "{{ }}", "chat template line 1, column 4: expected an expression inside '{{ }}', found the end of the tag"},
    {"extra_token", "{{ a b }}", "chat template line 1, column 6: expected the end of the tag, found 'b'"},
    {"bad_character", "{{ a ! b }}", "chat template line 1, column 6: unexpected character '!' in a tag"},
    {"unknown_filter", "{{ 'x' | shout }}",
     "chat template line 1, column 8: unknown filter 'shout' (supported: abs, capitalize, count, default, dictsort, e, "
     "escape, first, float, indent, int, items, join, last, length, list, lower, map, reject, rejectattr, replace, reverse, "
     "safe, select, selectattr, string, title, tojson, trim, unique, upper)"},
    {"unknown_test", "{{ 1 is prime }}",
     "chat template line 1, column 6: unknown test 'prime' (supported: boolean, callable, defined, divisibleby, eq, "
     "equalto, even, false, float, ge, gt, in, integer, iterable, le, lower, lt, mapping, ne, none, number, odd, "
     "sameas, sequence, string, true, undefined, upper)"},
    {"str_plus_int", "{{ 'a' + 1 }}", "chat template line 1, column 8: can only concatenate str (not \"int\") to str"},
    {"undefined_attribute", "{{ nothing.role }}",
     "chat template line 1, column 11: 'nothing' is undefined (reading its attribute 'role')"},
    {"missing_method", "{{ messages[0].content.shout() }}",
     "chat template line 1, column 29: 'str object' has no attribute 'shout' (called as a function)"},
    {"no_len", "{{ n | length }}", "chat template line 1, column 6: object of type 'int' has no len()"},
    {"tojson_undefined", "{{ nothing | tojson }}",
     "chat template line 1, column 12: tojson: Object of type Undefined is not JSON serializable"},
    {"division_by_zero", "{{ n / 0 }}", "chat template line 1, column 6: division by zero"},
    {"set_attribute_not_namespace", "{% set d = {} %}{% set d.x = 1 %}",
     "chat template line 1, column 17: cannot assign attribute 'x' on 'd' (a dict): only a namespace() takes attributes"},
    {"not_iterable", "{% for x in n %}{% endfor %}", "chat template line 1, column 13: 'int' object is not iterable"},
    {"raise_exception", "{% if messages[0].role == 'system' %}\n{{ raise_exception('System role not supported') }}{% endif %}",
     "chat template refused the conversation (line 2): System role not supported"},
    {"range_too_long", "{% for x in range(100000000) %}{% endfor %}",
     "chat template line 1, column 18: range() longer than 1000000 items"},
    {"runaway_recursion", "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}",
     "chat template line 1, column 1: macro 'f' nested deeper than 64 calls (runaway recursion?)"},
    {"break_outside_loop", "{% if true %}{% break %}{% endif %}",
     "chat template line 1, column 14: '{% break %}' outside a for loop"},
    {"recursive_loop", "{% for x in messages recursive %}{% endfor %}",
     "chat template line 1, column 1: recursive for loops are not supported"},
};

TEST(ChatTemplateInterpreter, ErrorsNameThePlaceAndWhatWasExpected) {
  for (const ErrorCase& c : kErrors) {
    const Expected<std::string> rendered = render_source(c.source);
    ASSERT_FALSE(rendered.has_value()) << c.name << " rendered: " << *rendered;
    EXPECT_EQ(rendered.status().message(), c.expected_message) << c.name;
  }
}

TEST(ChatTemplateInterpreter, ARunawayLoopStopsAtTheStepLimit) {
  // A million interpreter steps: 0.6 s in release, 21 s of CPU under ASan, where the loops above and
  // the fixtures already run the same code.
  SKIP_UNDER_ASAN("a million steps of one loop test the limit, not memory safety");
  const Expected<std::string> rendered = render_source(
      "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}{% endfor %}{% endfor %}{% endfor %}");
  ASSERT_FALSE(rendered.has_value());
  EXPECT_EQ(rendered.status().message(),
            "chat template line 1, column 53: template ran more than 1000000 steps (a runaway loop?)");
}

TEST(ChatTemplateInterpreter, UnknownFiltersAndTestsFailWhenLoaded) {
  // Even in a branch that never runs: Jinja2 rejects them when it compiles the template.
  const Expected<ChatTemplate> chat = ChatTemplate::from_source("{% if false %}\n  {{ x | shout }}{% endif %}");
  ASSERT_FALSE(chat.has_value());
  EXPECT_EQ(chat.status().message().rfind("chat template line 2, column 8: unknown filter 'shout'", 0), 0u)
      << chat.status().message();
  EXPECT_FALSE(ChatTemplate::from_source("{{ x is prime }}").has_value());
}

TEST(ChatTemplateInterpreter, DeepNestingIsAnErrorNotACrash) {
  const std::string parens = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  Expected<std::string> rendered = render_source(parens);
  ASSERT_FALSE(rendered.has_value());
  EXPECT_NE(rendered.status().message().find("nested deeper than"), std::string::npos) << rendered.status().message();
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  rendered = render_source(ifs);
  ASSERT_FALSE(rendered.has_value());
  EXPECT_NE(rendered.status().message().find("nested deeper than"), std::string::npos) << rendered.status().message();
}

TEST(ChatTemplateInterpreter, DeeplyNestedInputIsRefused) {
  OrderedJson deep = "leaf";
  for (int i = 0; i < 1000; ++i) deep = OrderedJson::array({deep});
  Expected<ChatTemplate> chat = ChatTemplate::from_source("{{ messages[0].content | tojson }}");
  ASSERT_TRUE(chat.has_value());
  OrderedJson messages = OrderedJson::array({{{"role", "user"}, {"content", deep}}});
  EXPECT_EQ(chat->render(messages, true).status().message(), "messages: nested deeper than 128 levels");
  OrderedJson shallow = "leaf";
  for (int i = 0; i < 100; ++i) shallow = OrderedJson::array({shallow});
  messages[0]["content"] = shallow;
  EXPECT_EQ(*chat->render(messages, true), std::string(100, '[') + "\"leaf\"" + std::string(100, ']'));
}

TEST(ChatTemplateInterpreter, RefusesEmptyAndMalformedConversations) {
  Expected<ChatTemplate> chat = ChatTemplate::from_source("{{ messages | length }}");
  ASSERT_TRUE(chat.has_value());
  EXPECT_EQ(chat->render(OrderedJson::array(), true).status().message(),
            "messages: Cannot apply chat template to an empty conversation. Provide at least one message.");
  EXPECT_EQ(chat->render(OrderedJson::parse(R"({"role": "user"})"), true).status().message(),
            "messages: expected an array of {\"role\", \"content\"} objects, found a object");
  EXPECT_EQ(chat->render(OrderedJson::parse(R"([{"role": "user"}, 3])"), true).status().message(),
            "messages[1]: expected an object, found a number");
}

// ---------------------------------------------------------------------------------------------
// Loading from a model folder
// ---------------------------------------------------------------------------------------------

class ChatTemplateLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("slimkv_chat_template_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  std::string render_user(const ChatTemplate& chat) {
    const Expected<std::string> rendered = chat.render(OrderedJson::parse(R"([{"role": "user", "content": "hi"}])"), true);
    return rendered.has_value() ? *rendered : "ERROR " + rendered.status().message();
  }
  std::filesystem::path dir_;
};

TEST_F(ChatTemplateLoad, StringTemplateAndAddedTokenDicts) {
  write("tokenizer_config.json", R"({"chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{{ pad_token }}",
      "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "pad_token": "<pad>", "unk_token": null})");
  Expected<ChatTemplate> chat = ChatTemplate::load(dir_);
  ASSERT_TRUE(chat.has_value()) << chat.status().message();
  EXPECT_EQ(render_user(*chat), "<s>hi</s><pad>");
}

TEST_F(ChatTemplateLoad, NamedTemplatesUseDefault) {
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "tools"},
      {"name": "default", "template": "default {{ messages[0].role }}"}]})");
  Expected<ChatTemplate> chat = ChatTemplate::load(dir_);
  ASSERT_TRUE(chat.has_value()) << chat.status().message();
  EXPECT_EQ(render_user(*chat), "default user");
}

TEST_F(ChatTemplateLoad, JinjaFileIsPreferred) {
  write("tokenizer_config.json", R"({"chat_template": "from config", "eos_token": "<|im_end|>"})");
  write("chat_template.jinja", "from file{{ eos_token }}{{ bos_token }}");
  Expected<ChatTemplate> chat = ChatTemplate::load(dir_);
  ASSERT_TRUE(chat.has_value()) << chat.status().message();
  EXPECT_EQ(render_user(*chat), "from file<|im_end|>");
}

TEST_F(ChatTemplateLoad, NoTemplateIsItsOwnError) {
  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  Expected<ChatTemplate> chat = ChatTemplate::load(dir_);
  ASSERT_FALSE(chat.has_value());
  EXPECT_TRUE(ChatTemplate::is_no_chat_template(chat.status()));
  EXPECT_NE(chat.status().message().find("has neither chat_template.jinja nor"), std::string::npos);
  // An empty folder too.
  std::filesystem::remove(dir_ / "tokenizer_config.json");
  EXPECT_TRUE(ChatTemplate::is_no_chat_template(ChatTemplate::load(dir_).status()));
}

TEST_F(ChatTemplateLoad, BrokenFilesAreOtherErrors) {
  write("tokenizer_config.json", "{not json");
  Status status = ChatTemplate::load(dir_).status();
  EXPECT_FALSE(status.is_ok());
  EXPECT_FALSE(ChatTemplate::is_no_chat_template(status));
  EXPECT_NE(status.message().find("tokenizer_config.json:1:3: not valid JSON"), std::string::npos) << status.message();

  write("tokenizer_config.json", R"({"chat_template": [{"name": "rag", "template": "x"}]})");
  status = ChatTemplate::load(dir_).status();
  EXPECT_NE(status.message().find("lists templates (rag) but none named \"default\""), std::string::npos) << status.message();

  write("tokenizer_config.json", R"({"chat_template": "{% if %}", "bos_token": 3})");
  status = ChatTemplate::load(dir_).status();
  EXPECT_NE(status.message().find("\"bos_token\": expected a string or an object"), std::string::npos) << status.message();

  write("tokenizer_config.json", R"({"chat_template": "ok {% for %}"})");
  status = ChatTemplate::load(dir_).status();
  EXPECT_NE(status.message().find("tokenizer_config.json: chat template line 1, column 11: expected a loop variable name, found the end of the tag"),
            std::string::npos)
      << status.message();
}

TEST(ChatTemplateLoadReal, Qwen3FromAModelFolderLayout) {
  // The fixture template loaded as a model folder has it, rendered with thinking off.
  const std::filesystem::path dir = slimkv::test::source_dir() + "/tests/data/chat_templates";
  std::ifstream in(dir / "Qwen-Qwen3-0.6B.jinja");
  const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Expected<ChatTemplate> chat = ChatTemplate::from_source(source, std::nullopt, "<|im_end|>");
  ASSERT_TRUE(chat.has_value()) << chat.status().message();
  const Expected<std::string> rendered =
      chat->render(OrderedJson::parse(R"([{"role": "user", "content": "2+2?"}])"), true, {{"enable_thinking", false}});
  ASSERT_TRUE(rendered.has_value()) << rendered.status().message();
  EXPECT_EQ(*rendered, "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

}  // namespace
}  // namespace slimkv
