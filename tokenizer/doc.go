// Package tokenizer is Kimi K3's tokenizer: a tiktoken-format byte-level
// BPE (a tiktoken.model rank file), Kimi's pre-split pattern, the 256
// special tokens named in tokenizer_config.json, K3's released
// conversation format (RenderChat, a port of the checkpoint's
// encoding_k3.py, and ReplyParser) and a streaming detokenizer.
//
// Encoding follows Moonshot's Python wrapper around tiktoken exactly: the
// text is cut into pieces of at most 400,000 characters and runs of at most
// 25,000 same-class characters, each piece is pre-split by the eight
// alternatives of Kimi's pattern and each pre-split piece is merged by rank.
// Token ids are checked against the npm tiktoken package (a WASM build of the
// reference tokenizer) by golden files under testdata/golden.
//
// Character classes come from Go's unicode tables (Unicode 15.0.0) plus
// unicode_update.go: the 5,055 code points (CJK Extension I, scripts new in
// Unicode 16.0) that the reference's regex engine, with Unicode 16.0 tables,
// classes differently. testdata/golden/unicode.sh regenerates that list by
// asking the reference tokenizer.
//
// Ill-formed UTF-8 input is replaced by U+FFFD per maximal subpart before
// encoding, as Python's errors="replace" and JavaScript's TextDecoder do.
//
// A Tokenizer is safe for concurrent use.
package tokenizer
