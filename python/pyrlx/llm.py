"""rlx.LLM: a GGUF language model (docs/llm.md).

    llm = rlx.LLM("SmolLM2-135M-Instruct.Q4_1.gguf")
    for token in llm.generate("The capital of France is", max_tokens=16, temperature=0):
        print(llm.detokenize([token]), end="", flush=True)
"""
from __future__ import annotations

from typing import Iterator, Optional, Sequence, Union

import numpy as np

from . import _pyrlx as _C


class LLM:
    """A Llama-family GGUF model with its tokenizer and chat template, on the CPU.

    The weights stay in the file's blocks, read in place from its mapping. The default fast mode rounds each
    activation row per block to 8 bits and takes integer dot products, as llama.cpp does; exact=True feeds the
    quantized matmuls float32 activations instead (each weight row dequantized exactly), for checking.
    context: the positions the KV cache holds (0: min(the model's, 512)).
    """

    def __init__(self, path: str, exact: bool = False, context: int = 0):
        self.exact = exact
        self._llm = _C._Llm.load(str(path), context, exact)
        self.last_generation = None

    @property
    def vocab_size(self) -> int:
        return self._llm.vocab

    @property
    def context(self) -> int:
        return self._llm.context

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self._llm.tokenize(text, add_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._llm.detokenize([int(i) for i in ids])

    def chat_prompt(self, messages: Sequence[dict]) -> str:
        """The conversation ([{"role": ..., "content": ...}]) in the model's chat template, the assistant's turn open."""
        return self._llm.chat_prompt([(m["role"], m["content"]) for m in messages])

    def generate(self, prompt: Union[str, Sequence[int]], max_tokens: int = 64, temperature: float = 0.8,
                 top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0,
                 seed: int = 0, stop_at_end: bool = True) -> Iterator[int]:
        """Yields token ids as they are sampled; temperature=0 is greedy. The prompt is text or a list of ids."""
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
        g = self._llm.start(ids, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, seed, stop_at_end)
        self.last_generation = g
        while True:
            token = g.next()
            if token is None:
                return
            yield token

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """The logits of every position of `ids` as one new sequence: a [len(ids), vocab] float32 array."""
        return self._llm.logits([int(i) for i in ids])
