"""Streaming-parser cost on a ~20 kB chat output, for several chunkings.

The parser must stay close to linear: the figure to watch is microseconds per byte, which
should not grow with the chunk size or the output length.

    python -m pegmask.bench.parser_stream
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from pegmask.grammars import Grammar

CHAT_GRAMMAR = r"""
root = reasoning? @content:until(token("<tool_call>")) call*
reasoning = token("<think>") @reasoning:until("</think>") "</think>" "\n"*
call = token("<tool_call>") "\n" @call:value "\n" token("</tool_call>") "\n"?
value = obj | arr | str | num | "true" | "false" | "null"
obj = "{" ws (pair (ws "," ws pair)*)? ws "}"
pair = str ws ":" ws value
arr = "[" ws (value (ws "," ws value)*)? ws "]"
str = "\"" ([^"\\] | "\\" .)* "\""
num = "-"? [0-9]+ ("." [0-9]+)?
ws = [ \n]{0,4}
"""


def chat_output(size: int, seed: int = 0) -> str:
    """Reasoning, content and one large tool call, about `size` bytes in all."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "</thin", "<tool", "gamma", "x", "y", "ünïcode", "数据"]
    third = size // 3
    reasoning = ""
    while len(reasoning.encode()) < third:
        reasoning += rng.choice(words) + " "
    content = ""
    while len(content.encode()) < third:
        content += rng.choice(words) + " "
    items = []
    while len(json.dumps(items)) < third:
        items.append({"name": rng.choice(words), "n": rng.randint(0, 999), "ok": True})
    call = json.dumps({"name": "store", "arguments": {"items": items}}, ensure_ascii=False)
    return f"<think>{reasoning}</think>\n\n{content}<tool_call>\n{call}\n</tool_call>\n"


def measure(grammar: Grammar, text: str, chunk: int, repeats: int = 5) -> list[float]:
    times = []
    for _ in range(repeats):
        parser = grammar.stream_parser()
        start = time.perf_counter()
        for i in range(0, len(text), chunk):
            parser.feed(text[i : i + chunk])
        parser.finish()
        times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # no options
    grammar = Grammar.from_peg(CHAT_GRAMMAR)
    print("| output bytes | chunk | median ms | µs/byte |")
    print("|---|---|---|---|")
    for size in (5_000, 20_000):
        text = chat_output(size)
        nbytes = len(text.encode())
        for chunk in (1, 16, len(text)):
            median = statistics.median(measure(grammar, text, chunk))
            label = "whole" if chunk == len(text) else str(chunk)
            print(f"| {nbytes} | {label} | {median * 1e3:.1f} | {median * 1e6 / nbytes:.2f} |")


if __name__ == "__main__":
    main()
