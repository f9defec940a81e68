// Package grammar constrains generation to a grammar: K3's tool-call
// element with arguments that satisfy the tools' JSON schemas, or JSON that
// satisfies a response schema. A Spec says what the reply must be; Compile
// turns it into a Grammar; a Matcher follows one sequence's tokens and
// gives, before each token, the mask of the vocabulary's ids that keep the
// reply within the grammar.
//
// The package is pure: no I/O, no clocks, no randomness; the same Spec and
// tokens give the same masks.
//
// # The reply
//
// A reply is what the model writes after K3's generation prompt
// (tokenizer.RenderChat), as the released renderer writes an assistant
// turn: with Spec.Thinking the think channel's text (any ordinary token;
// after ThinkBudget tokens only <|close|>) and <|close|>think<|sep|>
// <|open|>response<|sep|>; then
//
//   - ModeToolCall: an empty response channel, <|close|>response<|sep|>,
//     and a tools element of 1 to MaxCalls calls numbered index="1", "2",
//     ... of the declared tools (Spec.Tool only, when set). Each call's
//     arguments are argument elements, one per property, in the order of
//     the parameters schema's properties, with the renderer's type names
//     (string, number for integers too, boolean, null, object, array):
//     a string raw, any other value as Python's json.dumps writes it (", "
//     and ": " separators, no other whitespace).
//   - ModeJSONSchema and ModeJSONObject: the response channel holds one
//     JSON value (an object for ModeJSONObject), written compactly or with
//     one space after "," and ":", and no tools element.
//
// and <|close|>message<|sep|><|end_of_msg|>. Matcher.Done reports the
// message closed; then only <|end_of_msg|> is allowed.
//
// # Schemas
//
// Enforced: type (one or a list) among string, number, integer, boolean,
// null, object, array; enum and const of strings, numbers, booleans and
// null; properties (in their order), required, additionalProperties
// (objects with properties get only declared keys, whatever
// additionalProperties says; an object without properties gets free keys,
// none with additionalProperties false, values valid against
// additionalProperties when it is a schema); items, minItems and maxItems
// (up to MaxItemsBound); maxLength of strings in code points, a JSON escape
// counting as one (up to MaxLengthBound; a larger one is not enforced);
// anyOf, and oneOf read as anyOf. A schema without
// a type allows any value. Free argument keys (a tool without declared
// properties) are [A-Za-z0-9_.-]+.
//
// Ignored (the value may break them): other string and number bounds
// (minLength, pattern, format, minimum, maximum, multipleOf), uniqueItems,
// minProperties, maxProperties, and annotations (title, description,
// default, examples). Refused with an error: $ref and definitions, allOf,
// not, if/then/else, patternProperties, prefixItems and tuple items,
// contains, propertyNames, dependent and unevaluated keywords, enum values
// that are objects or arrays.
//
// Bounds: numbers have at most MaxDigits digits in the integer part and in
// the fraction and two in the exponent (so every number is a finite
// float64); values nest at most 48 deep; schemas at most MaxSchemaDepth;
// a Spec holds at most MaxSchemaNodes schemas; a Grammar determinizes at
// most MaxStates states.
//
// # Design
//
// Compile builds a program for a pushdown Thompson machine over symbols
// (the 256 bytes and the markers <|open|>, <|close|>, <|sep|>,
// <|end_of_msg|>); rules for schemas are called, so nested and recursive
// values share code. A Grammar determinizes it lazily: a state is a set of
// configurations (instruction, return stack), its transitions computed on
// first use and kept. A Vocabulary holds the tokens in a trie in preorder;
// a mask walks it once, a prefix's state one table lookup, skipping the
// subtree of a dead prefix, and is cached by state. Cache compiles each
// distinct Spec once.
package grammar
