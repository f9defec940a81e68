#!/usr/bin/env node
// Generates the tokenizer golden files from the npm tiktoken package (a WASM
// build of the reference Rust tokenizer), which compiles Kimi's pre-split
// pattern verbatim. Kimi's Python wrapper cuts the text before tiktoken sees
// it (400,000-character chunks, runs of at most 25,000 characters of the
// same str.isspace class); that wrapper is re-implemented here.
//
//   node generate.cjs [--models DIR] [--out DIR]
//
// --models DIR holds one tokenizer directory per model of cases.json
// (DIR/<name>/tiktoken.model and tokenizer_config.json); without it the
// models are written by `go run ./bench tokenize --write-synthetic`.
// --out defaults to ./expected.
"use strict";

const fs = require("fs");
const os = require("os");
const path = require("path");
const { execFileSync } = require("child_process");
const { Tiktoken } = require("tiktoken");

const kimi = require("./kimi.cjs");

const here = __dirname;
const repoRoot = path.resolve(here, "..", "..", "..");
const SPLIT_ORACLE_CHARS = 64;

function args() {
  const a = { models: null, out: path.join(here, "expected") };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--models") a.models = argv[++i];
    else if (argv[i] === "--out") a.out = argv[++i];
    else throw new Error(`unknown argument ${argv[i]}`);
  }
  return a;
}

function caseText(c) {
  if (c.file) {
    // Ill-formed UTF-8 becomes U+FFFD per maximal subpart, as in Python's
    // errors="replace"; the Go tokenizer does the same.
    return new TextDecoder("utf-8", { ignoreBOM: true }).decode(fs.readFileSync(path.join(here, "cases", c.file)));
  }
  return c.parts.map(([t, n]) => t.repeat(n)).join("");
}

// splitPieces recovers the reference pre-split: with every substring of up
// to SPLIT_ORACLE_CHARS characters in the vocabulary, tiktoken encodes each
// piece as the single token it looks up whole, so the tokens are the pieces.
function splitPieces(text) {
  const pieces = [];
  const chunks = kimi.cuts(text);
  const seen = new Set();
  const lines = [];
  for (let b = 0; b < 256; b++) {
    lines.push(`${Buffer.from([b]).toString("base64")} ${lines.length}`);
    seen.add(Buffer.from([b]).toString("base64"));
  }
  for (const chunk of chunks) {
    const cps = Array.from(chunk);
    for (let i = 0; i < cps.length; i++) {
      let s = "";
      for (let k = i; k < cps.length && k - i < SPLIT_ORACLE_CHARS; k++) {
        s += cps[k];
        const key = Buffer.from(s, "utf8").toString("base64");
        if (!seen.has(key)) {
          seen.add(key);
          lines.push(`${key} ${lines.length}`);
        }
      }
    }
  }
  const enc = new Tiktoken(lines.join("\n") + "\n", {}, kimi.PATTERN);
  try {
    for (const chunk of chunks) {
      for (const id of enc.encode_ordinary(chunk)) {
        const bytes = Buffer.from(enc.decode_single_token_bytes(id));
        const piece = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(bytes); // throws on a partial piece
        if (Array.from(piece).length >= SPLIT_ORACLE_CHARS) {
          throw new Error(`a piece of ${SPLIT_ORACLE_CHARS}+ characters may be cut short: raise SPLIT_ORACLE_CHARS`);
        }
        pieces.push(piece);
      }
    }
  } finally {
    enc.free();
  }
  return pieces;
}

// writeJSON writes value indented; compact puts each list of numbers (the
// ids) on one line.
function writeJSON(file, value, compact) {
  let text = JSON.stringify(value, null, 1);
  if (compact) text = text.replace(/\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]/g, (_, inner) => `[${inner.replace(/\s+/g, "")}]`);
  fs.writeFileSync(file, text + "\n");
}

function main() {
  const a = args();
  const manifest = JSON.parse(fs.readFileSync(path.join(here, "cases.json"), "utf8"));
  const version = JSON.parse(fs.readFileSync(path.join(here, "node_modules", "tiktoken", "package.json"), "utf8")).version;
  let modelsDir = a.models;
  if (!modelsDir) {
    modelsDir = fs.mkdtempSync(path.join(os.tmpdir(), "tandem-golden-"));
    for (const m of manifest.models) {
      execFileSync("go", ["run", "./bench", "tokenize", "--write-synthetic", path.join(modelsDir, m.name), "--vocab", String(m.vocab)],
        { cwd: repoRoot, stdio: "inherit" });
    }
  }
  fs.mkdirSync(a.out, { recursive: true });
  const texts = manifest.cases.map(caseText);

  for (const m of manifest.models) {
    const model = kimi.load(path.join(modelsDir, m.name));
    if (model.numRanks + kimi.NUM_SPECIAL !== m.vocab) {
      throw new Error(`model ${m.name}: ${model.numRanks} ranks + ${kimi.NUM_SPECIAL} specials != vocab ${m.vocab}`);
    }
    const enc = model.encoding;
    const cases = [];
    try {
      manifest.cases.forEach((c, i) => {
        const ids = kimi.encode(enc, texts[i], c.allowed);
        const entry = { name: c.name, count: ids.length, sha256: kimi.sha256(Buffer.from(ids.join(","))) };
        if (ids.length <= 4096) entry.ids = ids;
        cases.push(entry);
      });
    } finally {
      enc.free();
    }
    writeJSON(path.join(a.out, `${m.name}.json`), {
      generator: `tiktoken ${version} (npm)`,
      model: m.name, vocab: m.vocab, model_sha256: model.modelSha, config_sha256: model.configSha,
      cases,
    }, true);
  }

  const split = [];
  manifest.cases.forEach((c, i) => {
    if (c.split) split.push({ name: c.name, pieces: splitPieces(texts[i]) });
  });
  writeJSON(path.join(a.out, "split.json"), { generator: `tiktoken ${version} (npm)`, cases: split }, false);
}

main();
