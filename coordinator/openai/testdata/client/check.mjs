// Drives tandem's OpenAI-compatible API with the official openai SDK, as
// an application would: streamed and whole chat, a tool call round trip,
// a text completion, the model list and the error cases. It checks what
// the SDK alone can tell and prints what it saw as one JSON object for the
// Go test to check against the deployment. Environment: TANDEM_URL (the
// API's /v1 URL), TANDEM_MODEL, TANDEM_KEY.
import OpenAI from 'openai';

const baseURL = process.env.TANDEM_URL;
const model = process.env.TANDEM_MODEL;
const client = new OpenAI({ baseURL, apiKey: process.env.TANDEM_KEY, maxRetries: 0, timeout: 120000 });

function check(ok, what) {
  if (!ok) {
    throw new Error('check failed: ' + what);
  }
}

const messages = [
  { role: 'system', content: 'Be brief.' },
  { role: 'user', content: 'Why split prefill and decode?' },
];
const out = {};

// Whole.
const whole = await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0 });
check(whole.object === 'chat.completion' && whole.choices.length === 1, 'chat.completion with one choice');
check(whole.choices[0].message.role === 'assistant', 'assistant message');
out.whole = { content: whole.choices[0].message.content, finish: whole.choices[0].finish_reason, usage: whole.usage, job: whole.tandem.job_id };

// Streamed, with usage.
const stream = await client.chat.completions.create({ model, messages, max_tokens: 10, temperature: 0, stream: true,
  stream_options: { include_usage: true } });
let content = '';
let finish = null;
let usage = null;
let first = true;
for await (const chunk of stream) {
  check(chunk.object === 'chat.completion.chunk', 'chunk object');
  if (first) {
    check(chunk.choices[0].delta.role === 'assistant', 'the first chunk carries the role');
    first = false;
  }
  for (const c of chunk.choices) {
    content += c.delta.content ?? '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  if (chunk.usage) usage = chunk.usage;
}
out.streamed = { content, finish, usage };

// A tool call: forced (the grammar holds the reply to it), whole and streamed; then the call and its result go back in.
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather',
  parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'] } } }];
const ask = [{ role: 'user', content: 'Weather in Paris?' }];
const toolChoice = { type: 'function', function: { name: 'get_weather' } };
const called = await client.chat.completions.create({ model, messages: ask, tools, tool_choice: toolChoice, max_tokens: 80, temperature: 0,
  reasoning_effort: 'none' });
const call = called.choices[0].message.tool_calls?.[0];
check(call && call.type === 'function' && call.function.name === 'get_weather' && call.id, 'a get_weather call');
const callStream = await client.chat.completions.create({ model, messages: ask, tools, tool_choice: toolChoice, max_tokens: 80,
  temperature: 0, reasoning_effort: 'none', stream: true });
const calls = [];
for await (const chunk of callStream) {
  for (const tc of chunk.choices[0]?.delta?.tool_calls ?? []) {
    if (!calls[tc.index]) calls[tc.index] = { id: tc.id, name: tc.function.name, arguments: '' };
    calls[tc.index].arguments += tc.function.arguments ?? '';
  }
}
check(calls.length === 1 && calls[0].name === 'get_weather' && calls[0].arguments === call.function.arguments,
  'the streamed call equals the whole one');
const answered = await client.chat.completions.create({ model, tools, max_tokens: 4, temperature: 0, messages: [
  ...ask,
  { role: 'assistant', content: null, tool_calls: [{ id: call.id, type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
  { role: 'tool', tool_call_id: call.id, content: '{"temp_c": 21}' },
] });
check(answered.choices.length === 1 && answered.usage.prompt_tokens > 0, 'the tool result round');
out.tool = { id: call.id, arguments: call.function.arguments, roundPromptTokens: answered.usage.prompt_tokens };

// A text completion and the model list.
const text = await client.completions.create({ model, prompt: 'Prefill where the compute is', max_tokens: 5, temperature: 0 });
check(text.object === 'text_completion' && text.usage.completion_tokens === 5, 'a text completion of 5 tokens');
const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === model, 'the model list');

// Errors, as the SDK raises them.
async function status(fn) {
  try {
    await fn();
  } catch (e) {
    if (e instanceof OpenAI.APIError) return { status: e.status, code: e.code, type: e.type, cls: e.constructor.name };
    throw e;
  }
  return { status: 200 };
}
out.errors = {
  badKey: await status(() => new OpenAI({ baseURL, apiKey: 'sk-wrong', maxRetries: 0 }).chat.completions.create({ model, messages })),
  unknownModel: await status(() => client.chat.completions.create({ model: 'gpt-4o', messages })),
  n2: await status(() => client.chat.completions.create({ model, messages, n: 2 })),
  tooLong: await status(() => client.chat.completions.create({ model, messages: [{ role: 'user', content: 'tandem '.repeat(1000) }] })),
};
// A failure inside a stream is raised by the SDK's iterator too: not
// tested here (a healthy deployment does not fail mid-stream).
console.log(JSON.stringify(out));
