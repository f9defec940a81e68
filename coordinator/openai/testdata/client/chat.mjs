// Drives a running deployment's API (coordinator serve, coordinator demo)
// with the official openai SDK in K3's conversation format: with thinking
// on (the default) a stream carries reasoning_content deltas; with thinking
// off a required tool call is a call of the declared tool whose arguments
// validate, and a strict json_schema reply validates, on three seeds each
// at temperature 1. Prints what it saw as one JSON object. Environment:
// TANDEM_URL (the API's /v1 URL), TANDEM_MODEL, TANDEM_KEY.
import OpenAI from 'openai';

const model = process.env.TANDEM_MODEL;
const client = new OpenAI({ baseURL: process.env.TANDEM_URL, apiKey: process.env.TANDEM_KEY || 'none', maxRetries: 0,
  timeout: 300000 });

function check(ok, what) {
  if (!ok) throw new Error('check failed: ' + what);
}

const out = { reasoningDeltas: 0, calls: [], json: [] };
const stream = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Why split prefill and decode?' }],
  max_tokens: 8, temperature: 0, stream: true });
for await (const chunk of stream) {
  for (const c of chunk.choices) {
    if (c.delta.reasoning_content) out.reasoningDeltas++;
  }
}
check(out.reasoningDeltas >= 1, 'thinking on streams reasoning_content');

const weather = { type: 'object', additionalProperties: false, required: ['city', 'unit'], properties: {
  city: { type: 'string', maxLength: 12 }, unit: { type: 'string', enum: ['c', 'f'] } } };
const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather', parameters: weather } }];
for (const seed of [1, 2, 3]) {
  const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools,
    tool_choice: 'required', reasoning_effort: 'none', temperature: 1, seed, max_tokens: 400 });
  const c = r.choices[0];
  const call = c.message.tool_calls?.[0];
  check(c.finish_reason === 'tool_calls' && call?.function.name === 'get_weather', `seed ${seed}: ${JSON.stringify(c)}`);
  const args = JSON.parse(call.function.arguments);
  check(Object.keys(args).every((k) => k in weather.properties) && typeof args.city === 'string' &&
    [...args.city].length <= 12 && ['c', 'f'].includes(args.unit), `seed ${seed}: arguments ${call.function.arguments}`);
  out.calls.push(call.function.arguments);
}

const person = { type: 'object', additionalProperties: false, required: ['name', 'age'], properties: {
  name: { type: 'string', maxLength: 10 }, age: { type: 'integer' } } };
for (const seed of [1, 2, 3]) {
  const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'A person, as JSON.' }],
    response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: person } },
    reasoning_effort: 'none', temperature: 1, seed, max_tokens: 400 });
  const v = JSON.parse(r.choices[0].message.content);
  check(Object.keys(v).length === 2 && typeof v.name === 'string' && [...v.name].length <= 10 && Number.isInteger(v.age),
    `json seed ${seed}: ${r.choices[0].message.content}`);
  out.json.push(r.choices[0].message.content);
}
console.log(JSON.stringify(out));
