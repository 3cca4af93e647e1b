"""The demo's byte-level tokenizer: token i < 256 is byte i, then BOS and EOS.

It lives in the GGUF under the standard ``tokenizer.ggml.*`` keys, byte
tokens spelled ``<0xNN>`` with token type 6 (BYTE) as llama.cpp's byte
fallback does, BOS ``<s>`` and EOS ``</s>`` with type 3 (CONTROL).
"""
from __future__ import annotations

from typing import Any, Iterable

from ..errors import ChatTemplateError, MetadataError
from .metadata import token_id

MODEL_NAME = "glimmer-bytes"
TYPE_CONTROL, TYPE_BYTE = 3, 6


class ByteTokenizer:
    N_BYTES = 256
    BOS, EOS = 256, 257
    VOCAB_SIZE = 258

    bos_id, eos_id = BOS, EOS
    stop_ids = (EOS,)
    vocab_size = VOCAB_SIZE
    chat_template = None

    def encode(self, text: str | bytes, bos: bool = True, eos: bool = False) -> list[int]:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return ([self.BOS] if bos else []) + list(data) + ([self.EOS] if eos else [])

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of ``ids``; BOS and EOS (and anything past them) are dropped."""
        return bytes(int(i) for i in ids if 0 <= int(i) < self.N_BYTES)

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Any, add_generation_prompt: bool = True,
                            limits: Any = None) -> str:
        raise ChatTemplateError(f"the {MODEL_NAME} tokenizer has no chat template")

    def encode_chat(self, messages: Any, add_generation_prompt: bool = True,
                    limits: Any = None, slot: str | None = None) -> list[int]:
        """The ids of ``apply_chat_template(...)``, BOS left to the template, as
        ``GGUFTokenizer.encode_chat``. Every id here is a byte, so no text can
        spell a control token: the rendered prompt is encoded as it stands."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, limits),
                           bos=False)

    def to_metadata(self) -> dict[str, Any]:
        tokens = [f"<0x{i:02X}>" for i in range(self.N_BYTES)] + ["<s>", "</s>"]
        return {
            "tokenizer.ggml.model": MODEL_NAME,
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [TYPE_BYTE] * self.N_BYTES + [TYPE_CONTROL] * 2,
            "tokenizer.ggml.bos_token_id": self.BOS,
            "tokenizer.ggml.eos_token_id": self.EOS,
        }

    @classmethod
    def from_metadata(cls, md: dict[str, Any]) -> "ByteTokenizer | None":
        """The tokenizer a file carries; None when it has no ``tokenizer.ggml.model``.
        A file that claims this tokenizer but spells it differently is refused."""
        name = md.get("tokenizer.ggml.model")
        if name is None:
            return None
        if name != MODEL_NAME:
            raise MetadataError(f"tokenizer.ggml.model is {name!r}; only {MODEL_NAME!r} is supported")
        expected = cls().to_metadata()
        for key, want in expected.items():
            if key.endswith("_token_id"):
                got = token_id(md, key, cls.VOCAB_SIZE)   # refuses inf, NaN, floats, bools
            else:
                got = md.get(key)
                if isinstance(got, (list, tuple)) or hasattr(got, "tolist"):
                    got = [x.decode() if isinstance(x, bytes) else x for x in list(got)]
            if got != want:
                raise MetadataError(f"{key} does not match the {MODEL_NAME} byte tokenizer")
        return cls()
