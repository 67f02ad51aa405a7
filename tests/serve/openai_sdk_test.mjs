// slimkv serve through the official `openai` npm package: completions, chat (the bundled model with a
// ChatML template beside it), streaming of both, stop strings, errors as the SDK's typed exceptions.
// Usage: node openai_sdk_test.mjs BASE_URL (the package is resolved from NODE_PATH's folder).
import assert from "node:assert/strict";
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "sk-node", maxRetries: 0 });
const model = "slimkv-llama-15m";

const models = await client.models.list();
assert.equal(models.data[0].id, model);

const whole = await client.completions.create({ model, prompt: "The river flows", max_tokens: 12, temperature: 0 });
assert.equal(whole.choices[0].finish_reason, "length");
assert.equal(whole.usage.completion_tokens, 12);

let streamed = "", usage = null, finish = null;
const stream = await client.completions.create({
  model, prompt: "The river flows", max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true },
});
for await (const chunk of stream) {
  if (chunk.choices.length) {
    streamed += chunk.choices[0].text;
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  if (chunk.usage) usage = chunk.usage;
}
assert.equal(streamed, whole.choices[0].text, "streaming and non-streaming agree");
assert.equal(finish, "length");
assert.deepEqual(usage, whole.usage);

const stopped = await client.completions.create({
  model, prompt: "The river flows", max_tokens: 12, temperature: 0, stop: [whole.choices[0].text.slice(4, 7)],
});
assert.equal(stopped.choices[0].text, whole.choices[0].text.slice(0, whole.choices[0].text.indexOf(whole.choices[0].text.slice(4, 7))));
assert.equal(stopped.choices[0].finish_reason, "stop");

const messages = [{ role: "system", content: "You are brief." }, { role: "user", content: "Tell me a story" }];
const chat = await client.chat.completions.create({ model, messages, max_completion_tokens: 10, temperature: 0 });
assert.equal(chat.choices[0].message.role, "assistant");
assert.equal(chat.usage.completion_tokens, 10);
let chatStreamed = "", role = null;
for await (const chunk of await client.chat.completions.create({ model, messages, max_completion_tokens: 10, temperature: 0, stream: true })) {
  role = chunk.choices[0]?.delta?.role ?? role;
  chatStreamed += chunk.choices[0]?.delta?.content ?? "";
}
assert.equal(role, "assistant");
assert.equal(chatStreamed, chat.choices[0].message.content, "chat: streaming and non-streaming agree");
await assert.rejects(client.chat.completions.create({ model, messages: [{ role: "wizard", content: "hi" }] }),
  (e) => e instanceof OpenAI.BadRequestError && e.param === "messages[0].role");
await assert.rejects(client.completions.create({ model, prompt: "x", n: 2 }),
  (e) => e instanceof OpenAI.BadRequestError && e.param === "n");
await assert.rejects(client.completions.create({ model: "gpt-4o", prompt: "x" }), (e) => e instanceof OpenAI.NotFoundError);
await assert.rejects(new OpenAI({ baseURL: process.argv[2], apiKey: "wrong", maxRetries: 0 }).models.list(),
  (e) => e instanceof OpenAI.AuthenticationError);
console.log("openai_sdk_test: all checks passed");
