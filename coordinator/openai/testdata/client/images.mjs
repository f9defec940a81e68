// Drives tandem's OpenAI-compatible API with the official openai SDK about
// an image: a first turn with the image as a data: URL in an image_url
// part, then a second turn about the same image (the first turn's
// messages, its reply and a new question). It prints, per turn, what the
// SDK got (content, usage, tandem's account, the cached tokens header) as
// one JSON object for the Go test to check. Environment: TANDEM_URL (the
// API's /v1 URL), TANDEM_MODEL, TANDEM_KEY, TANDEM_IMAGE (the data: URL).
import OpenAI from 'openai';

const model = process.env.TANDEM_MODEL;
const image = process.env.TANDEM_IMAGE;

function check(ok, what) {
  if (!ok) {
    throw new Error('check failed: ' + what);
  }
}

async function turn(client, messages) {
  const { data, response } = await client.chat.completions
    .create({ model, messages, max_tokens: 6, temperature: 0, reasoning_effort: 'none' })
    .withResponse();
  check(data.object === 'chat.completion' && data.choices.length === 1, 'one chat.completion choice');
  return {
    content: data.choices[0].message.content ?? '',
    finish: data.choices[0].finish_reason,
    usage: data.usage,
    tandem: data.tandem,
    cachedHeader: Number(response.headers.get('x-tandem-cached-tokens') ?? 0),
  };
}

const client = new OpenAI({ baseURL: process.env.TANDEM_URL, apiKey: process.env.TANDEM_KEY, maxRetries: 0, timeout: 300000 });
const first = [
  { role: 'system', content: 'You describe pictures in a few words, plainly and without guessing what is not shown.' },
  { role: 'user', content: [
    { type: 'text', text: 'What is in this picture?' },
    { type: 'image_url', image_url: { url: image, detail: 'high' } },
  ] },
];
const one = await turn(client, first);
const second = [...first, { role: 'assistant', content: one.content }, { role: 'user', content: 'And what colours does it have?' }];
const two = await turn(client, second);
console.log(JSON.stringify({ first: one, second: two }));
