#!/usr/bin/env python3
"""Renders conversations.json with Moonshot's released renderer.

    python3 render.py ENCODING_K3_PY > segments.json

ENCODING_K3_PY is encoding_k3.py as released with the Kimi K3 checkpoint
(vLLM carries it verbatim as vllm/tokenizers/encoding_k3.py). It imports one
name from vLLM, VLLMValidationError; a stand-in is provided here so that the
file runs as it is, without vLLM installed.
"""
import importlib.util
import json
import sys
import types


def load(path):
    exc = types.ModuleType("vllm.exceptions")

    class VLLMValidationError(ValueError):
        def __init__(self, message, **_):
            super().__init__(message)

    exc.VLLMValidationError = VLLMValidationError
    sys.modules.setdefault("vllm", types.ModuleType("vllm"))
    sys.modules["vllm.exceptions"] = exc
    spec = importlib.util.spec_from_file_location("encoding_k3", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["encoding_k3"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def main():
    k3 = load(sys.argv[1])
    with open("conversations.json", encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    out = []
    for case in cases:
        req = case["request"]
        kwargs = {}
        for key in ("tool_choice", "response_format", "reasoning_effort"):
            if key in req:
                kwargs[key] = req[key]
        segs = k3.build_chat_segments(
            req["messages"],
            req.get("tools"),
            add_generation_prompt=case.get("add_generation_prompt", True),
            **kwargs,
        )
        out.append({
            "name": case["name"],
            "segments": [{"text": s.text, "special": s.allow_special} for s in segs],
        })
    json.dump({"cases": out}, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
