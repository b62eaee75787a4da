"""A Hugging Face causal LM as a judge: loading, chat formatting and batched generation.

Shared by the pairwise judge (``judge.py``) and the absolute graders (``grading.py``).
Any ``AutoModelForCausalLM`` given by hub id or local directory works; prompts are left
padded, generated in batches with a tqdm progress bar, and decoded without special tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch
from tqdm.auto import tqdm

from leaf_plugins.core.errors import ConfigError
from leaf_plugins.core.interrupts import interrupt_point

if TYPE_CHECKING:
    from transformers import LogitsProcessor

__all__ = ["JudgeDecoding", "JudgeModel", "load_judge", "DTYPES"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The ``--dtype`` names a judge can be loaded with (``auto`` keeps the checkpoint's)."""


@dataclass(frozen=True)
class JudgeDecoding:
    """How a judge model decodes, built once from a caller's settings.

    ``samples`` outputs per prompt; temperature 0 is greedy decoding (one sample only),
    otherwise nucleus sampling at ``temperature``/``top_p``; at most ``max_new_tokens`` new
    tokens; ``batch_size`` prompts per ``generate`` call, each batch seeded from ``seed``
    and its index. ``chat_template``: send each prompt in the judge's chat template when
    it has one (off: the plain prompt). ``logits_processor``: extra ``LogitsProcessor``
    objects passed to ``generate`` (e.g. to constrain the output). Settings the judge
    refuses are a ``ConfigError`` when the object is built, before a judge is loaded."""

    samples: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    batch_size: int = 8
    seed: int = 0
    chat_template: bool = True
    logits_processor: Sequence[LogitsProcessor] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.samples < 1:
            raise ConfigError(f"samples must be >= 1, got {self.samples}")
        if self.temperature == 0 and self.samples > 1:
            raise ConfigError(f"temperature 0 is greedy decoding: {self.samples} samples would be identical; "
                              "give a temperature > 0 or samples=1")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")


@dataclass
class JudgeModel:
    """A loaded judge: the model (eval mode, on ``device``) and its left-padding tokenizer."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    device: torch.device

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def format(self, prompt: str, system: str | None = None, chat: bool = True) -> str:
        """The text the model reads: ``prompt`` in the model's chat template (as one user
        turn after an optional ``system`` turn) when it has one and ``chat`` is on, else the
        plain prompt (the system text, if any, on top). A template that refuses a system
        turn gets the system text at the top of the user turn."""
        if not (chat and self.has_chat_template):
            return f"{system}\n\n{prompt}" if system else prompt
        from jinja2.exceptions import TemplateError

        user = [{"role": "user", "content": prompt}]
        if system:
            try:
                return self.tokenizer.apply_chat_template([{"role": "system", "content": system}, *user],
                                                          tokenize=False, add_generation_prompt=True)
            except TemplateError:  # raised by templates that reject a system role (raise_exception)
                user = [{"role": "user", "content": f"{system}\n\n{prompt}"}]
        return self.tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)

    @torch.inference_mode()
    def generate(self, prompts: Sequence[str], decoding: JudgeDecoding, system: str | None = None,
                 description: str = "judging") -> list[list[str]]:
        """``decoding.samples`` outputs per prompt (``[len(prompts)][samples]``), each prompt
        read as ``format(prompt, system, decoding.chat_template)`` gives it. Temperature 0 is
        greedy decoding; otherwise nucleus sampling at ``temperature``/``top_p``. Each batch
        of ``batch_size`` prompts is seeded from ``seed`` and its index, so a run is
        reproducible; the checkpoint's own sampling defaults (top-k, repetition penalty) are
        switched off, so the decoding is exactly the one asked for. Prompts in the chat
        template already hold its special tokens, so the tokenizer adds none."""
        from transformers import LogitsProcessorList

        chat = decoding.chat_template and self.has_chat_template
        texts = [self.format(prompt, system, decoding.chat_template) for prompt in prompts]
        # the protocol's decoding, not the checkpoint's generation_config defaults (no top-k, no penalty)
        sampling = ({"do_sample": True, "temperature": decoding.temperature, "top_p": decoding.top_p}
                    if decoding.temperature > 0 else {"do_sample": False})
        sampling.update(top_k=0, repetition_penalty=1.0)
        samples, batch_size = decoding.samples, decoding.batch_size
        outputs: list[list[str]] = []
        with tqdm(total=len(texts) * samples, desc=description, unit="judgment") as progress:
            for number, start in enumerate(range(0, len(texts), batch_size)):
                interrupt_point()  # Ctrl-C stops between batches
                chunk = texts[start : start + batch_size]
                inputs = self.tokenizer(chunk, return_tensors="pt", padding=True,
                                        add_special_tokens=not chat).to(self.device)
                torch.manual_seed(decoding.seed * 1_000_003 + number)
                generated = self.model.generate(
                    **inputs, **sampling, num_return_sequences=samples, max_new_tokens=decoding.max_new_tokens,
                    pad_token_id=self.tokenizer.pad_token_id,
                    logits_processor=LogitsProcessorList(decoding.logits_processor),
                )  # [b * samples, P + new], the samples of one text consecutive
                decoded = self.tokenizer.batch_decode(generated[:, inputs["input_ids"].shape[1] :],
                                                      skip_special_tokens=True)
                outputs.extend(decoded[row * samples : (row + 1) * samples] for row in range(len(chunk)))
                progress.update(len(chunk) * samples)
        return outputs


def load_judge(model_id_or_path: str, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None
               ) -> JudgeModel:
    """Load ``model_id_or_path`` (hub id or local directory) with ``AutoModelForCausalLM``
    and its tokenizer (left padding; the EOS token pads when there is no pad token)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(dtype, str):
        if dtype != "auto" and dtype not in DTYPES:
            raise ConfigError(f"unknown dtype {dtype!r}; one of auto, {', '.join(DTYPES)}")
        dtype = None if dtype == "auto" else DTYPES[dtype]
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_id_or_path)
        model = AutoModelForCausalLM.from_pretrained(model_id_or_path, dtype=dtype).to(device).eval()
    except OSError as error:
        raise ConfigError(f"judge model {model_id_or_path!r} could not be loaded: {error}") from error
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return JudgeModel(str(model_id_or_path), model, tokenizer, torch.device(device))
