// Drives tandem's grammar-constrained replies with the official openai
// SDK: with thinking off, tool_choice "required" returns a call of a
// declared tool whose arguments validate against its schema, and a strict
// json_schema response validates, on every one of 20 seeds at temperature
// 1 (the synthetic model's weights are random: the grammar alone makes the
// replies valid); with thinking on (K3's default) a stream carries
// reasoning_content deltas, and thinking_budget bounds the thinking before
// a required call. Prints what it saw as one JSON object. Environment:
// TANDEM_URL, TANDEM_MODEL, TANDEM_KEY.
import OpenAI from 'openai';

const model = process.env.TANDEM_MODEL;
const client = new OpenAI({ baseURL: process.env.TANDEM_URL, apiKey: process.env.TANDEM_KEY, maxRetries: 0, timeout: 300000 });
const SEEDS = 20;

function check(ok, what) {
  if (!ok) throw new Error('check failed: ' + what);
}

// validate checks value against the JSON Schema keywords these schemas use
// and returns the first violation, or ''.
function validate(schema, value, path = '$') {
  const type = Array.isArray(value) ? 'array' : value === null ? 'null' : typeof value;
  switch (schema.type) {
    case 'integer':
      if (!Number.isInteger(value)) return `${path}: ${JSON.stringify(value)} is not an integer`;
      break;
    case 'number':
      if (type !== 'number') return `${path}: not a number`;
      break;
    case undefined:
      break;
    default:
      if (type !== schema.type) return `${path}: ${type}, want ${schema.type}`;
  }
  if (schema.enum && !schema.enum.includes(value)) return `${path}: ${JSON.stringify(value)} not in the enum`;
  if (schema.maxLength !== undefined && [...value].length > schema.maxLength) return `${path}: longer than ${schema.maxLength}`;
  if (type === 'array') {
    if (schema.maxItems !== undefined && value.length > schema.maxItems) return `${path}: more than ${schema.maxItems} items`;
    for (let i = 0; i < value.length; i++) {
      const e = validate(schema.items ?? {}, value[i], `${path}[${i}]`);
      if (e) return e;
    }
  }
  if (type === 'object') {
    for (const k of schema.required ?? []) if (!(k in value)) return `${path}: required key ${k} missing`;
    for (const [k, v] of Object.entries(value)) {
      const sub = schema.properties?.[k];
      if (!sub) {
        if (schema.additionalProperties === false) return `${path}: extra key ${k}`;
        continue;
      }
      const e = validate(sub, v, `${path}.${k}`);
      if (e) return e;
    }
  }
  return '';
}

const weather = { type: 'object', additionalProperties: false, required: ['city', 'unit'], properties: {
  city: { type: 'string', maxLength: 12 }, unit: { type: 'string', enum: ['c', 'f'] },
  days: { type: 'integer' }, detailed: { type: 'boolean' } } };
const search = { type: 'object', additionalProperties: false, required: ['query'], properties: {
  query: { type: 'string', maxLength: 16 }, limit: { type: 'integer' } } };
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Current weather', parameters: weather } },
  { type: 'function', function: { name: 'search', description: 'Search the web', parameters: search } },
];
const schemas = { get_weather: weather, search };
const person = { type: 'object', additionalProperties: false, required: ['name', 'age', 'tags', 'ok'], properties: {
  name: { type: 'string', maxLength: 10 }, age: { type: 'integer' },
  tags: { type: 'array', maxItems: 3, items: { type: 'string', enum: ['a', 'b', 'c'] } }, ok: { type: 'boolean' } } };
const ask = [{ role: 'user', content: 'Weather in Paris, or search for it.' }];
const out = { calls: [], json: [] };

// checkCalls checks a reply's calls and returns them.
function checkCalls(choice, what) {
  const calls = choice.message.tool_calls ?? [];
  check(choice.finish_reason === "tool_calls" && calls.length >= 1, `${what}: finish ${choice.finish_reason} with ${calls.length} calls: ${JSON.stringify(choice.message)}`);
  for (const c of calls) {
    check(schemas[c.function.name], `${what}: a call of ${c.function.name}, which is not declared`);
    let args;
    try {
      args = JSON.parse(c.function.arguments);
    } catch (e) {
      throw new Error(`${what}: arguments ${c.function.arguments} are not JSON: ${e}`);
    }
    const err = validate(schemas[c.function.name], args);
    check(!err, `${what}: ${c.function.name}(${c.function.arguments}): ${err}`);
  }
  return calls.map((c) => ({ name: c.function.name, arguments: c.function.arguments }));
}

const seeds = Array.from({ length: SEEDS }, (_, i) => i + 1);
// Required calls, thinking off.
for (const seed of seeds) {
  const r = await client.chat.completions.create({ model, messages: ask, tools, tool_choice: 'required', reasoning_effort: 'none',
    temperature: 1, seed, max_tokens: 480 });
  out.calls.push(checkCalls(r.choices[0], `seed ${seed}`));
}
// A strict json_schema response, thinking off.
for (const seed of seeds) {
  const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'A person, as JSON.' }],
    response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: person } },
    reasoning_effort: 'none', temperature: 1, seed, max_tokens: 480 });
  const c = r.choices[0];
  let v;
  try {
    v = JSON.parse(c.message.content);
  } catch (e) {
    throw new Error(`json seed ${seed}: ${JSON.stringify(c.message.content)} (finish ${c.finish_reason}) is not JSON`);
  }
  const err = validate(person, v);
  check(!err && c.finish_reason === 'stop', `json seed ${seed}: ${c.message.content}: ${err} (finish ${c.finish_reason})`);
  out.json.push(c.message.content);
}
// Thinking on (the default), a required call, streamed: the thinking comes
// as reasoning_content deltas, at most thinking_budget tokens of it, then
// the call.
const budget = 6;
const stream = await client.chat.completions.create({ model, messages: ask, tools, tool_choice: 'required', thinking_budget: budget,
  temperature: 1, seed: 7, max_tokens: 480, stream: true, stream_options: { include_usage: true } });
let reasoning = '';
let reasoningDeltas = 0;
let finish = null;
const calls = [];
for await (const chunk of stream) {
  for (const c of chunk.choices) {
    if (c.delta.reasoning_content) {
      reasoning += c.delta.reasoning_content;
      reasoningDeltas++;
    }
    for (const tc of c.delta.tool_calls ?? []) {
      if (!calls[tc.index]) calls[tc.index] = { name: tc.function.name, arguments: '' };
      calls[tc.index].arguments += tc.function.arguments ?? '';
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
}
check(reasoningDeltas >= 1 && reasoningDeltas <= budget, `thinking on: ${reasoningDeltas} reasoning deltas, want 1..${budget}`);
checkCalls({ finish_reason: finish, message: { tool_calls: calls.map((c) => ({ function: c })) } }, 'thinking on');
out.thinking = { reasoning, reasoningDeltas, calls };
console.log(JSON.stringify(out));
