// Package tokenizer is Kimi K3's tokenizer: a tiktoken-format byte-level
// BPE (a tiktoken.model rank file), Kimi's pre-split pattern, the 256
// special tokens named in tokenizer_config.json, the XTML chat framing and a
// streaming detokenizer.
//
// Encoding follows Moonshot's Python wrapper around tiktoken exactly: the
// text is cut into pieces of at most 400,000 characters and runs of at most
// 25,000 same-class characters, each piece is pre-split by the eight
// alternatives of Kimi's pattern and each pre-split piece is merged by rank.
// Token ids are checked against the npm tiktoken package (a WASM build of the
// reference tokenizer) by golden files under testdata/golden.
//
// Character classes come from Go's unicode tables (Unicode 15.0.0). The
// reference regex engine in npm tiktoken 1.0.22 has Unicode 16.0 tables (it
// knows U+1C89, new in 16.0, and not U+323B0, new in 17.0), so characters
// first assigned in Unicode 15.1 or 16.0 (CJK Extension I, for example) may
// pre-split differently; no other difference is known.
//
// Ill-formed UTF-8 input is replaced by U+FFFD per maximal subpart before
// encoding, as Python's errors="replace" and JavaScript's TextDecoder do.
//
// A Tokenizer is safe for concurrent use.
package tokenizer
