#!/usr/bin/env node
// Times the npm tiktoken (WASM) tokenizer with Kimi's wrapper on one text,
// for `bench tokenize --speed`, which runs it beside the Go tokenizer.
//
//   node speed.cjs --model DIR --text FILE [--iters N]
//
// Prints one JSON line: {"mb_per_s", "best_s", "bytes", "count", "sha256"};
// count and sha256 describe the ids, so the caller can check that both
// tokenizers agree on the text they were timed on.
"use strict";

const fs = require("fs");
const kimi = require("./kimi.cjs");

function main() {
  const a = { model: null, text: null, iters: 5 };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--model") a.model = argv[++i];
    else if (argv[i] === "--text") a.text = argv[++i];
    else if (argv[i] === "--iters") a.iters = Number(argv[++i]);
    else throw new Error(`unknown argument ${argv[i]}`);
  }
  if (!a.model || !a.text || !(a.iters >= 1)) throw new Error("usage: speed.cjs --model DIR --text FILE [--iters N]");
  const raw = fs.readFileSync(a.text);
  const text = new TextDecoder("utf-8", { ignoreBOM: true }).decode(raw);
  const { encoding } = kimi.load(a.model);
  // Only tiktoken's work is timed: the wrapper's cuts are made once, up
  // front, which favours the WASM side.
  const pieces = kimi.cuts(text);
  const encodeAll = () => {
    const ids = [];
    for (const p of pieces) for (const id of encoding.encode_ordinary(p)) ids.push(id);
    return ids;
  };
  let ids = encodeAll(); // warm-up
  let best = Infinity;
  for (let i = 0; i < a.iters; i++) {
    const t0 = process.hrtime.bigint();
    ids = encodeAll();
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    if (s < best) best = s;
  }
  encoding.free();
  console.log(JSON.stringify({
    mb_per_s: raw.length / 1e6 / best,
    best_s: best,
    bytes: raw.length,
    count: ids.length,
    sha256: kimi.sha256(Buffer.from(ids.join(","))),
  }));
}

main();
