"""Offline tokenizers for the built-in tiny backbones: byte-level BPE trained in-process."""

from __future__ import annotations

from typing import Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

__all__ = ["CORPUS", "CHAT_TEMPLATE", "train_tokenizer"]

# English and German sentences in the style of the built-in tasks, so that generated text
# decodes to plausible words even from random weights.
CORPUS = (
    "what is the name of the city where the story begins",
    "the answer is in the passage you just heard",
    "listen to the audio and answer the following question",
    "translate the audio from english to german",
    "the cat sat on the mat near the small red house",
    "my sister lives in berlin and works at the station",
    "the weather is cold today but tomorrow it will be warm",
    "die katze sitzt auf der matte neben dem kleinen roten haus",
    "meine schwester wohnt in berlin und arbeitet am bahnhof",
    "das wetter ist heute kalt aber morgen wird es warm",
    "one two three four five six seven eight nine ten",
    "eins zwei drei vier fünf sechs sieben acht neun zehn",
    "yes no maybe green blue yellow black white",
    "ja nein vielleicht grün blau gelb schwarz weiß",
)

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer(
    special_tokens: Sequence[str],
    eos_token: str,
    pad_token: str,
    vocab_size: int = 512,
    corpus: Sequence[str] = CORPUS,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``corpus``, with ``special_tokens`` kept whole
    and a ChatML chat template. Deterministic: same inputs, same vocabulary."""
    model = Tokenizer(models.BPE())
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    model.train_from_iterator(list(corpus) * 4, trainer)
    others = [token for token in special_tokens if token not in (eos_token, pad_token)]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=model, eos_token=eos_token, pad_token=pad_token, additional_special_tokens=others
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
