// Kimi's tokenizer wrapper around tiktoken, shared by generate.cjs and
// speed.cjs: the text cuts of Moonshot's Python wrapper and the loading of a
// tokenizer directory (tiktoken.model + tokenizer_config.json).
"use strict";

const fs = require("fs");
const path = require("path");
const crypto = require("crypto");
const { Tiktoken } = require("tiktoken");

const NUM_SPECIAL = 256;
const CHUNK_CHARS = 400000;
const RUN_CHARS = 25000;
const PATTERN = fs.readFileSync(path.join(__dirname, "pattern.txt"), "utf8");

// Python's str.isspace: category Zs or bidi class WS, B or S.
function pySpace(cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp === 0x85 || cp === 0xa0 ||
    cp === 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp === 0x2028 || cp === 0x2029 ||
    cp === 0x202f || cp === 0x205f || cp === 0x3000;
}

// cuts splits text as the wrapper does, over code points as Python indexes
// strings: chunks of CHUNK_CHARS, then runs of same-class characters longer
// than RUN_CHARS.
function cuts(text) {
  const cps = Array.from(text);
  const out = [];
  for (let i = 0; i < cps.length; i += CHUNK_CHARS) {
    const chunk = cps.slice(i, i + CHUNK_CHARS);
    let start = 0, runLen = 0, inSpace = chunk.length > 0 && pySpace(chunk[0].codePointAt(0));
    for (let k = 0; k < chunk.length; k++) {
      const sp = pySpace(chunk[k].codePointAt(0));
      if (sp !== inSpace) {
        inSpace = sp;
        runLen = 1;
      } else if (++runLen > RUN_CHARS) {
        out.push(chunk.slice(start, k).join(""));
        start = k;
        runLen = 1;
      }
    }
    out.push(chunk.slice(start).join(""));
  }
  return out;
}

function sha256(buf) {
  return crypto.createHash("sha256").update(buf).digest("hex");
}

// load reads a tokenizer directory. Special ids follow the ranks; unnamed
// slots are <|reserved_token_ID|>, as in Moonshot's wrapper.
function load(dir) {
  const ranks = fs.readFileSync(path.join(dir, "tiktoken.model"), "utf8");
  const configRaw = fs.readFileSync(path.join(dir, "tokenizer_config.json"));
  const config = JSON.parse(configRaw.toString("utf8"));
  const numRanks = ranks.split("\n").filter((l) => l.trim() !== "").length;
  const specials = {};
  for (let id = numRanks; id < numRanks + NUM_SPECIAL; id++) {
    const entry = (config.added_tokens_decoder || {})[String(id)];
    specials[entry ? entry.content : `<|reserved_token_${id}|>`] = id;
  }
  return {
    encoding: new Tiktoken(ranks, specials, PATTERN),
    numRanks,
    modelSha: sha256(Buffer.from(ranks, "utf8")),
    configSha: sha256(configRaw),
  };
}

// encode encodes text as the wrapper does: each cut piece on its own, as
// ordinary text when allowed is undefined, else with those specials ("all"
// or a list) recognised and the others kept as text.
function encode(enc, text, allowed) {
  const ids = [];
  for (const piece of cuts(text)) {
    const got = allowed === undefined ? enc.encode_ordinary(piece) : enc.encode(piece, allowed, []);
    for (const id of got) ids.push(id);
  }
  return ids;
}

module.exports = { NUM_SPECIAL, PATTERN, cuts, load, encode, sha256 };
