#!/usr/bin/env node
// Adds token ids to rendered segments: each segment encoded on its own, as
// Moonshot's tokenization_kimi.py does (_encode_chat_segments): markers with
// every special token allowed, other text with specials kept as text.
//
//   node encode.cjs SEGMENTS.json TOKENIZER_DIR > expected.json
"use strict";

const fs = require("fs");
const kimi = require("../golden/kimi.cjs");

const [segsPath, dir] = process.argv.slice(2);
const rendered = JSON.parse(fs.readFileSync(segsPath, "utf8"));
const tok = kimi.load(dir);
const out = { model: { model_sha256: tok.modelSha, config_sha256: tok.configSha }, cases: [] };
for (const c of rendered.cases) {
  const ids = [];
  for (const s of c.segments) {
    for (const id of kimi.encode(tok.encoding, s.text, s.special ? "all" : undefined)) ids.push(id);
  }
  out.cases.push({ name: c.name, segments: c.segments, ids });
}
tok.encoding.free();
process.stdout.write(`{"model": ${JSON.stringify(out.model)},\n"cases": [\n${out.cases.map((c) => JSON.stringify(c)).join(",\n")}\n]}\n`);
