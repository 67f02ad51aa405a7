#!/usr/bin/env python3
"""Renders the chat templates under tests/data/chat_templates/ with transformers' apply_chat_template
for a fixed set of conversations and writes the JSON fixture that tests/tokenizer/chat_template_test.cc
reads (tests/data/chat_templates/chat_fixtures.json).

Each case is rendered with tokenize=False through a PreTrainedTokenizerFast built from one of
tests/data/tokenizers/*/tokenizer.json, with the model's bos/eos tokens and its chat_template set, so
the template sees exactly the variables transformers gives it. A case whose render raises records
the exception's class and message instead of the text.

Usage: render_chat_fixtures.py [--templates DIR] [--tokenizer FILE] --out FILE
       (--emulate renders with plain jinja2 configured as transformers does, for local iteration only;
       committed fixtures come from transformers.)
"""
import argparse
from datetime import datetime
import copy
import json
import os
import sys

# The models' special tokens, as their tokenizer_config.json has them (None: not set).
TEMPLATES = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": (None, "<|im_end|>"),
    "Qwen-Qwen3-0.6B.jinja": (None, "<|im_end|>"),
    "Qwen-QwQ-32B.jinja": (None, "<|im_end|>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("<s>", "</s>"),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("<s>", "</s>"),
    "google-gemma-2-2b-it.jinja": ("<bos>", "<eos>"),
    "google-gemma-3-it.jinja": ("<bos>", "<eos>"),
    "microsoft-Phi-3.5-mini-instruct.jinja": ("<s>", "<|endoftext|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    # Further templates of llama.cpp's collection, for breadth (tool use, Markup, {% filter %}).
    "deepseek-ai-DeepSeek-V3.1.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": ("<|begin_of_text|>", "<|im_end|>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("<|begin_of_text|>", "<|im_end|>"),
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "ibm-granite-granite-3.3-2B-Instruct.jinja": ("<|end_of_text|>", "<|end_of_text|>"),
    "meetkai-functionary-medium-v3.1.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "meetkai-functionary-medium-v3.2.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "fireworks-ai-llama-3-firefunction-v2.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "openai-gpt-oss-120b.jinja": ("<|startoftext|>", "<|return|>"),
    "moonshotai-Kimi-K2.jinja": ("[BOS]", "[EOS]"),
    "unsloth-mistral-Devstral-Small-2507.jinja": ("<s>", "</s>"),
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city — in °C",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "days": {"type": "integer", "description": "Forecast days"},
            },
            "required": ["city"],
        },
    },
}

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
USER1 = {"role": "user", "content": "Hello! What's 2+2?"}
ASSISTANT1 = {"role": "assistant", "content": "4."}
USER2 = {"role": "user", "content": "  And in Grüße-units, 日本?  \n"}
ASSISTANT2 = {"role": "assistant", "content": "Still \"4\" — obviously."}

TOOL_CALL_TURN = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{
        "id": "call12345",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}},
    }],
}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
               "content": "{\"temp_c\": 21.5, \"sky\": \"clear\"}"}


def cases():
    """(name, messages, add_generation_prompt, extra variables) for every template."""
    out = [
        ("user_only", [USER1], True, {}),
        ("system_user", [SYSTEM, USER1], True, {}),
        ("multi_turn_gen", [SYSTEM, USER1, ASSISTANT1, USER2], True, {}),
        ("multi_turn_no_gen", [SYSTEM, USER1, ASSISTANT1, USER2, ASSISTANT2], False, {}),
        ("no_system_multi_turn", [USER1, ASSISTANT1, USER2], True, {}),
        ("content_parts", [{"role": "user", "content": [{"type": "text", "text": "Describe this."},
                                                        {"type": "text", "text": " Briefly. "}]}],
         True, {}),
        ("system_parts", [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                          {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], True, {}),
        ("user_user_refused", [USER1, USER2], True, {}),
        ("assistant_first", [ASSISTANT1, USER1], True, {}),
        ("tools_gen", [SYSTEM, {"role": "user", "content": "Weather in Zürich?"}], True,
         {"tools": [WEATHER_TOOL]}),
        ("tools_roundtrip",
         [{"role": "user", "content": "Weather in Zürich?"}, TOOL_CALL_TURN, TOOL_RESULT], True,
         {"tools": [WEATHER_TOOL]}),
        ("tools_roundtrip_answer",
         [{"role": "user", "content": "Weather in Zürich?"}, TOOL_CALL_TURN, TOOL_RESULT,
          {"role": "assistant", "content": "21.5 °C and clear."}], False, {"tools": [WEATHER_TOOL]}),
        ("llama_date_builtin", [SYSTEM, USER1], True,
         {"date_string": "03 Feb 2025", "builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]}),
        ("thinking_off", [USER1], True, {"enable_thinking": False}),
        ("thinking_on", [USER1], True, {"enable_thinking": True}),
        ("reasoning_content",
         [USER1, {"role": "assistant", "content": "4.", "reasoning_content": "2+2 is 4."}, USER2], True, {}),
        ("reasoning_last_turn",
         [USER1, {"role": "assistant", "content": "4.", "reasoning_content": "Simple sum."}], False, {}),
        ("think_in_content",
         [USER1, {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4."}], False, {}),
        ("empty_messages", [], True, {}),
        # As OpenAI clients send tool calls: content null, arguments a JSON string, two calls at once.
        ("tools_openai_style",
         [{"role": "user", "content": "Weather in Zürich and Bern?"},
          {"role": "assistant", "content": None, "tool_calls": [
              {"id": "call12345", "type": "function",
               "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\"}"}},
              {"id": "call67890", "type": "function",
               "function": {"name": "get_weather", "arguments": "{\"city\": \"Bern\"}"}}]},
          {"role": "tool", "tool_call_id": "call12345", "content": "21"},
          {"role": "tool", "tool_call_id": "call67890", "content": "19"}], True, {"tools": [WEATHER_TOOL]}),
        ("system_thinking_multi_turn",
         [SYSTEM, USER1, {"role": "assistant", "content": "<think>\nsum\n</think>\n\n4."}, USER2,
          {"role": "assistant", "content": "Still 4.", "reasoning_content": "same sum"}], False,
         {"enable_thinking": True}),
    ]
    return out


def render_with_transformers(template, bos, eos, tokenizer_file):
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:  # a transformers without the class: render with its chat-template module itself
        return render_with_transformers_utils(template, bos, eos)

    kwargs = {}
    if bos is not None:
        kwargs["bos_token"] = bos
    if eos is not None:
        kwargs["eos_token"] = eos
    tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file, **kwargs)
    tok.chat_template = template

    def render(messages, add_generation_prompt, extra):
        extra = dict(extra)
        tools = extra.pop("tools", None)
        return tok.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                       tokenize=False, **extra)
    return render


def render_with_transformers_utils(template, bos, eos):
    from transformers.utils.chat_template_utils import render_jinja_template

    def render(messages, add_generation_prompt, extra):
        extra = dict(extra)
        tools = extra.pop("tools", None)
        special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
        rendered, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                            add_generation_prompt=add_generation_prompt, **special, **extra)
        return rendered[0]
    return render


def render_with_jinja2(template, bos, eos, _tokenizer_file):
    """transformers' environment rebuilt on plain jinja2 (for iterating without transformers)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    compiled = env.from_string(template)

    def render(messages, add_generation_prompt, extra):
        variables = dict(extra)
        # transformers always passes tools and documents, None when the request has none.
        variables.setdefault("tools", None)
        variables.setdefault("documents", None)
        special = {}
        if bos is not None:
            special["bos_token"] = bos
        if eos is not None:
            special["eos_token"] = eos
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               **special, **variables)
    return render


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser()
    parser.add_argument("--templates", default=None, help="folder of the .jinja files")
    parser.add_argument("--tokenizer", default=None, help="a tokenizer.json for PreTrainedTokenizerFast")
    parser.add_argument("--out", required=True)
    parser.add_argument("--emulate", action="store_true", help="plain jinja2, not transformers")
    args = parser.parse_args()

    templates_dir = args.templates
    if templates_dir is None:
        for candidate in (os.path.join(here, "..", "tests", "data", "chat_templates"), here):
            if os.path.exists(os.path.join(candidate, "Qwen-Qwen3-0.6B.jinja")):
                templates_dir = candidate
                break
    tokenizer_file = args.tokenizer
    if tokenizer_file is None:
        for candidate in (os.path.join(here, "..", "tests", "data", "tokenizers", "llama3_style", "tokenizer.json"),
                          os.path.join(here, "tokenizer.json")):
            if os.path.exists(candidate):
                tokenizer_file = candidate
                break

    if args.emulate:
        import jinja2
        make_renderer, renderer_name = render_with_jinja2, f"jinja2 {jinja2.__version__} (emulation)"
    else:
        import transformers
        import jinja2
        make_renderer = render_with_transformers
        renderer_name = f"transformers {transformers.__version__} (jinja2 {jinja2.__version__})"

    fixture = {"renderer": renderer_name, "python": sys.version.split()[0], "cases": []}
    for template_file, (bos, eos) in TEMPLATES.items():
        with open(os.path.join(templates_dir, template_file), encoding="utf-8") as f:
            template = f.read()
        render = make_renderer(template, bos, eos, tokenizer_file)
        for name, messages, add_generation_prompt, extra in cases():
            case = {"template": template_file, "name": name, "bos_token": bos, "eos_token": eos,
                    "messages": messages, "add_generation_prompt": add_generation_prompt, "extra": extra}
            # Templates such as Llama 3.2's print strftime_now("%d %b %Y"): the test replays this clock.
            case["now"] = datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
            try:
                case["expected"] = render(copy.deepcopy(messages), add_generation_prompt, copy.deepcopy(extra))
            except Exception as e:  # the refusal is part of the fixture
                case["error_type"] = type(e).__name__
                case["error"] = str(e)
            fixture["cases"].append(case)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum("error" in c for c in fixture["cases"])
    print(f"{renderer_name}: {len(fixture['cases'])} cases, {errors} refused -> {args.out}")


if __name__ == "__main__":
    main()
